"""`rlhf sample` and `rlhf eval` end to end on the session's tiny random-init models (test layers c-d, docs/architecture.md).

Each run samples 6 prompts (two batches: 4 + 2) k times, 8 tokens each: well under a second. Judges are the
deterministic functions of ``sample_rewards.py`` beside this file (``file.py:function``), or the tiny reward
model. Every mode draws the same completions for the same seed, so a `candidates` file is the ground truth
the other modes are checked against.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import torch

from configs import nested
from ensembles import MEMBERS, write_ensemble
from rlhf import cli, evaluate, sample
from rlhf.config import ConfigError, config_from_dict
from rlhf.data import load_preferences, load_sft, read_prompts
from rlhf.models.loading import load_tokenizer
from rlhf.models.tiny import toy_corpus
from rlhf.rollout.rewards import RewardModelReward

REWARDS = Path(__file__).resolve().parent / "sample_rewards.py"
K = 4


def judge(name: str) -> str:
    return f"{REWARDS}:{name}"


@pytest.fixture(scope="module")
def prompts_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """6 plain prompts of 3-4 words, each with an ``idx`` column."""
    path = tmp_path_factory.mktemp("sample_prompts") / "prompts.jsonl"
    rows = [{"prompt": " ".join(line.split()[: 3 + i % 2]), "idx": i} for i, line in enumerate(toy_corpus(6, 7))]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@pytest.fixture(scope="module")
def chat_prompts_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("sample_chat") / "chat.jsonl"
    rows = [
        {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "count to 3"}]},
        {"messages": [{"role": "user", "content": "the cat sees"}]},
    ]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def sample_config(policy: Path, prompts: Path, output: Path, **overrides: object):
    values = {
        "model.name": str(policy),
        "prompts": str(prompts),
        "output": str(output),
        "num_samples": K,
        "batch_size": 4,
        "sampling.max_new_tokens": 8,
        "progress": False,
    }
    return config_from_dict("sample", nested(values | overrides))


def eval_config(policy: Path, prompts: Path, **overrides: object):
    values = {
        "model.name": str(policy),
        "eval_data": str(prompts),
        "reward.source": judge("length"),
        "batch_size": 4,
        "sampling.max_new_tokens": 8,
        "progress": False,
    }
    return config_from_dict("eval", nested(values | overrides))


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def candidates_file(tiny_llama_dir: Path, prompts_file: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The k completions of every prompt at seed 0 (what every mode samples at that seed)."""
    out = tmp_path_factory.mktemp("candidates") / "candidates.jsonl"
    sample.run(sample_config(tiny_llama_dir, prompts_file, out))
    return out


@pytest.fixture
def candidates(candidates_file: Path) -> list[dict]:
    return read_jsonl(candidates_file)


# --------------------------------------------------------------------------------------------------------------
# rlhf sample
# --------------------------------------------------------------------------------------------------------------


def test_candidates_format_and_same_seed_same_file(tiny_llama_dir, prompts_file, candidates_file, candidates, tmp_path):
    prompts = read_prompts(prompts_file)
    assert [row["prompt"] for row in candidates] == [p.prompt for p in prompts]
    assert [row["idx"] for row in candidates] == list(range(6))  # extra columns are copied
    for row in candidates:
        assert set(row) == {"prompt", "completions", "idx"}
        assert len(row["completions"]) == K and all(isinstance(c, str) for c in row["completions"])
        assert len(set(row["completions"])) > 1  # k independent samples, not one repeated
    again, other = tmp_path / "again.jsonl", tmp_path / "other.jsonl"
    sample.run(sample_config(tiny_llama_dir, prompts_file, again))
    sample.run(sample_config(tiny_llama_dir, prompts_file, other, seed=1))
    assert candidates_file.read_bytes() == again.read_bytes()
    assert candidates_file.read_bytes() != other.read_bytes()


def test_candidates_with_a_judge_carry_its_scores_and_the_judge_gets_the_columns(
    tiny_llama_dir, prompts_file, candidates, tmp_path
):
    out = tmp_path / "scored.jsonl"
    sample.run(sample_config(tiny_llama_dir, prompts_file, out, **{"judge.source": judge("length")}))
    rows = read_jsonl(out)
    assert [row["completions"] for row in rows] == [row["completions"] for row in candidates]
    for row in rows:
        assert row["rewards"] == [float(len(c)) for c in row["completions"]]
    # a judge reading the prompt's `idx` column gets it once per completion
    sample.run(
        sample_config(tiny_llama_dir, prompts_file, out, **{"judge.source": judge("column_idx")}, overwrite=True)
    )
    assert [row["rewards"] for row in read_jsonl(out)] == [[float(i)] * K for i in range(6)]


@pytest.mark.parametrize("pairing", ["adjacent", "all"])
def test_pairs_for_labelling(tiny_llama_dir, prompts_file, candidates, tmp_path, pairing):
    out = tmp_path / "pairs.jsonl"
    summary = sample.run(sample_config(tiny_llama_dir, prompts_file, out, mode="pairs", pairing=pairing))
    index = [(0, 1), (2, 3)] if pairing == "adjacent" else [(i, j) for i in range(K) for j in range(i + 1, K)]
    expected = [
        {"prompt": row["prompt"], "a": row["completions"][i], "b": row["completions"][j], "idx": row["idx"]}
        for row in candidates
        for i, j in index
        if row["completions"][i] != row["completions"][j]
    ]
    assert read_jsonl(out) == expected
    assert summary["rows"] == len(expected)
    assert summary["rows"] + summary["skipped"]["identical"] == 6 * len(index)


def test_sample_judge_rm_round_trip(tiny_llama_dir, prompts_file, candidates, tmp_path, capsys):
    """sample → judge → a preferences file `rlhf rm` accepts and trains on, through the command line."""
    out = tmp_path / "prefs.jsonl"
    argv = ["sample", "--model.name", str(tiny_llama_dir), "--prompts", str(prompts_file), "--output", str(out),
            "--mode", "preferences", "--judge.source", judge("length"), "--num_samples", str(K), "--batch_size", "4",
            "--sampling.max_new_tokens", "8", "--summary", "--no-progress"]  # fmt: skip
    assert cli.main(argv) == 0
    assert f"sample: wrote 6 preferences rows to {out}" in capsys.readouterr().err

    rows = read_jsonl(out)
    for row, cands in zip(rows, candidates, strict=True):
        lengths = [len(c) for c in cands["completions"]]
        assert row["prompt"] == cands["prompt"]
        assert row["chosen"] == cands["completions"][lengths.index(max(lengths))]  # the first best
        assert row["rejected"] == cands["completions"][lengths.index(min(lengths))]
        assert (row["chosen_reward"], row["rejected_reward"]) == (max(lengths), min(lengths))
    loaded = load_preferences(out, load_tokenizer(str(tiny_llama_dir)))
    assert len(loaded) == len(rows) == 6

    summary = json.loads(Path(f"{out}.summary.json").read_text())
    assert summary["rows"] == 6 and summary["skipped"] == {"tie": 0, "unscored": 0}
    assert summary["prompts"] == 6 and summary["samples"] == 6 * K
    all_scores = [len(c) for row in candidates for c in row["completions"]]
    assert summary["judge/mean"] == pytest.approx(sum(all_scores) / len(all_scores))

    # ... and `rlhf rm` trains on it for one epoch
    argv = ["rm", "--model.name", str(tiny_llama_dir), "--data.train", str(out),
            "--output_dir", str(tmp_path / "rm"), "--rm.epochs", "1", "--batch.size", "2", "--run.save_every", "0",
            "--run.no-progress"]  # fmt: skip
    assert cli.main(argv) == 0
    metrics = read_jsonl(tmp_path / "rm" / "metrics.jsonl")
    assert any(math.isfinite(row.get("train/loss", math.nan)) for row in metrics)
    assert (tmp_path / "rm" / "final" / "config.json").is_file()


def test_ties_and_unscored_prompts_are_skipped_and_counted(tiny_llama_dir, prompts_file, tmp_path):
    out = tmp_path / "prefs.jsonl"
    summary = sample.run(
        sample_config(tiny_llama_dir, prompts_file, out, mode="preferences", **{"judge.source": judge("constant")})
    )
    assert out.read_text() == ""
    assert summary["rows"] == 0 and summary["skipped"] == {"tie": 6, "unscored": 0}
    # only the first completion of each batch is scored: prompts 0 and 4 have one, the rest none
    summary = sample.run(
        sample_config(
            tiny_llama_dir,
            prompts_file,
            out,
            mode="best_of_n",
            **{"judge.source": judge("unscored_after_first")},
            overwrite=True,
        )
    )
    assert summary["rows"] == 2 and summary["skipped"]["unscored"] == 4
    assert [row["idx"] for row in read_jsonl(out)] == [0, 4]


def test_best_of_n_keeps_the_highest_scored_sample(tiny_llama_dir, prompts_file, candidates, tmp_path):
    out = tmp_path / "best.jsonl"
    summary = sample.run(
        sample_config(tiny_llama_dir, prompts_file, out, mode="best_of_n", **{"judge.source": judge("length")})
    )
    rows = read_jsonl(out)
    assert summary["rows"] == len(rows) == 6
    for row, cands in zip(rows, candidates, strict=True):
        assert set(row) == {"prompt", "response", "reward", "idx"}
        rescored = [float(len(c)) for c in cands["completions"]]  # rescoring all N candidates of the same seed
        assert row["reward"] == max(rescored) == len(row["response"])
        assert row["response"] == cands["completions"][rescored.index(max(rescored))]
    assert len(load_sft(out, load_tokenizer(str(tiny_llama_dir)))) == 6  # an SFT file, ready for `rlhf sft`


def test_chat_prompts_keep_the_chat_form(tiny_llama_dir, chat_prompts_file, tmp_path):
    tokenizer = load_tokenizer(str(tiny_llama_dir))
    prefs, best = tmp_path / "prefs.jsonl", tmp_path / "best.jsonl"
    sample.run(
        sample_config(tiny_llama_dir, chat_prompts_file, prefs, mode="preferences", **{"judge.source": judge("length")})
    )
    sample.run(
        sample_config(tiny_llama_dir, chat_prompts_file, best, mode="best_of_n", **{"judge.source": judge("length")})
    )
    messages = [json.loads(line)["messages"] for line in chat_prompts_file.read_text().splitlines()]
    for row, prompt in zip(read_jsonl(prefs), messages, strict=True):
        assert row["prompt"] == prompt
        assert row["chosen"][0]["role"] == row["rejected"][0]["role"] == "assistant"
    for row, prompt in zip(read_jsonl(best), messages, strict=True):
        assert row["messages"][:-1] == prompt and row["messages"][-1]["role"] == "assistant"
    assert len(load_preferences(prefs, tokenizer)) == 2
    assert len(load_sft(best, tokenizer)) == 2


def test_a_reward_model_judges_too(tiny_llama_dir, tiny_reward_model_dir, prompts_file, candidates, tmp_path):
    out = tmp_path / "prefs.jsonl"
    summary = sample.run(
        sample_config(
            tiny_llama_dir, prompts_file, out, mode="preferences", **{"judge.source": str(tiny_reward_model_dir)}
        )
    )
    rows = read_jsonl(out)
    assert summary["rows"] == len(rows) == 6  # continuous scores: no ties
    for row, cands in zip(rows, candidates, strict=True):
        assert {row["chosen"], row["rejected"]} <= set(cands["completions"])
        assert row["chosen_reward"] > row["rejected_reward"]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"mode": "preferences"}, "sample: mode='preferences' needs a judge"),
        ({"mode": "best_of_n"}, "sample: mode='best_of_n' needs a judge"),
        ({"mode": "pairs", "judge.source": judge("length")}, "sample: judge is not used by mode='pairs'"),
        ({"mode": "pairs", "num_samples": 1}, "sample: num_samples=1 is out of range; it must be ≥ 2"),
        (
            {"mode": "best_of_n", "judge.source": "rewards.py"},
            "sample: judge.source='rewards.py': names a file but no function",
        ),
        (
            {"judge.source": judge("length"), "judge.aggregation": "gdpo"},
            "sample: judge.aggregation='gdpo' combines several rewards but judge.source is a single source",
        ),
    ],  # fmt: skip
)
def test_sample_config_errors_name_the_field(tmp_path, overrides, message):
    with pytest.raises(ConfigError, match="^" + re.escape(message)):
        sample_config(tmp_path / "m", tmp_path / "p.jsonl", tmp_path / "o.jsonl", **overrides)


def test_cli_refuses_preferences_without_judge(tmp_path, capsys):
    argv = ["sample", "--model.name", "m", "--prompts", "p.jsonl", "--output", "o.jsonl", "--mode", "preferences"]
    assert cli.main(argv) == 2
    assert "error: sample: mode='preferences' needs a judge" in capsys.readouterr().err


# --------------------------------------------------------------------------------------------------------------
# rlhf eval
# --------------------------------------------------------------------------------------------------------------


def test_eval_results_and_samples(tiny_llama_dir, prompts_file, tmp_path):
    reward = [{"source": judge("length"), "weight": 0.5}, {"source": judge("digits"), "weight": 2.0}]
    out, rows_file = tmp_path / "results.json", tmp_path / "rows.jsonl"
    results = evaluate.run(eval_config(tiny_llama_dir, prompts_file, **{"reward.source": reward}, output=str(out),
                                       samples_output=str(rows_file)))  # fmt: skip
    assert json.loads(out.read_text()) == results
    rows = read_jsonl(rows_file)
    assert len(rows) == results["num_prompts"] == 6
    combined = [0.5 * len(r["completion"]) + 2.0 * sum(ch.isdigit() for ch in r["completion"]) for r in rows]
    assert [r["reward"] for r in rows] == pytest.approx(combined)
    assert results["reward/mean"] == pytest.approx(sum(combined) / 6)
    assert results["reward/std"] == pytest.approx(torch.tensor(combined).std(unbiased=False).item())
    assert results["reward/length/mean"] == pytest.approx(sum(len(r["completion"]) for r in rows) / 6)
    assert rows[0]["rewards"].keys() == {"length", "digits"}
    assert 1 <= results["response/length_mean"] <= 8 and 0 <= results["response/eos_rate"] <= 1
    assert "win_rate" not in results

    again = evaluate.run(
        eval_config(tiny_llama_dir, prompts_file, **{"reward.source": reward})
    )  # same seed, same results
    drop_times = lambda r: {k: v for k, v in r.items() if not k.startswith("time/")}  # noqa: E731
    assert drop_times(again) == drop_times(results)


def test_win_rate_against_itself_is_one_half(tiny_llama_dir, prompts_file, capsys):
    argv = ["eval", "--model.name", str(tiny_llama_dir), "--baseline", str(tiny_llama_dir),
            "--eval_data", str(prompts_file), "--reward.source", judge("length"), "--sampling.max_new_tokens", "8",
            "--no-progress"]  # fmt: skip
    assert cli.main(argv) == 0
    results = json.loads(capsys.readouterr().out)  # no output file: the JSON goes to stdout, alone
    assert results["win_rate"] == 0.5
    assert (results["wins"], results["losses"], results["ties"], results["compared"]) == (0, 0, 6, 6)
    assert results["baseline/reward/mean"] == results["reward/mean"] == results["reward/length/mean"]


def test_win_rate_on_two_models_matches_the_judge(tiny_llama_dir, tiny_gpt2_dir, prompts_file, tmp_path):
    rows_file = tmp_path / "rows.jsonl"
    # temperature 0.3 so the two random-init models' near-uniform samples part ways
    config = eval_config(tiny_llama_dir, prompts_file, baseline=str(tiny_gpt2_dir), **{"judge.source": judge("length")},
                         **{"reward.source": judge("digits"), "sampling.temperature": 0.3}, samples_output=str(rows_file))  # fmt: skip
    results = evaluate.run(config)
    rows = read_jsonl(rows_file)
    a = [len(r["completion"]) for r in rows]
    b = [len(r["baseline_completion"]) for r in rows]
    wins = sum(x > y for x, y in zip(a, b, strict=True))
    losses = sum(x < y for x, y in zip(a, b, strict=True))
    ties = 6 - wins - losses
    assert (results["wins"], results["losses"], results["ties"]) == (wins, losses, ties)
    # some pair decided (two random-init models' answers part ways). Which model wins how often is the samples'
    # draw, which moves with the device and the library versions (the CPU drew a win and a loss, CUDA and
    # transformers 5.0 four wins), so the test asks for the judge's counts, not for both outcomes
    assert wins + losses > 0
    assert results["win_rate"] == (wins + ties / 2) / 6
    assert [r["outcome"] for r in rows] == [
        "win" if x > y else "loss" if x < y else "tie" for x, y in zip(a, b, strict=True)
    ]
    assert [r["judge_policy"] for r in rows] == a
    assert [r["reward"] for r in rows] == [float(sum(ch.isdigit() for ch in r["completion"])) for r in rows]


def test_win_rate_counts() -> None:
    nan = math.nan
    a = torch.tensor([1.0, 2.0, 3.0, 3.0, nan, 0.0])
    b = torch.tensor([0.0, 2.0, 4.0, 1.0, 1.0, nan])
    # wins: rows 0, 3; tie: row 1; loss: row 2; rows 4-5 unscored → (2 + 0.5) / 4
    assert evaluate.win_rate(a, b) == {
        "win_rate": 0.625, "wins": 2, "losses": 1, "ties": 1, "compared": 4, "unscored": 2,
    }  # fmt: skip


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"judge.source": judge("length")}, "eval: judge decides the win rate against baseline, which is not set"),
        ({"output": "x.json", "samples_output": "x.json"}, "eval: output and samples_output are both 'x.json'"),
        (
            {
                "baseline": "b",
                "judge.source": judge("length"),
                "judge.aggregation": "gdpo",
                "reward.source": [{"source": judge("length")}, {"source": judge("digits")}],
            },
            "but judge.source is a single source",
        ),
        ({"reference": "r", "best_of.n": 4}, "a best-of-4 answer is not one"),
    ],  # fmt: skip
)
def test_eval_config_errors_name_the_field(tmp_path, overrides, message):
    with pytest.raises(ConfigError, match=message):
        eval_config(tmp_path / "m", tmp_path / "p.jsonl", **overrides)


def test_best_of_n_answers_are_the_selectors_best_of_the_same_samples(tiny_llama_dir, prompts_file, tmp_path):
    candidates_path, rows_file = tmp_path / "candidates.jsonl", tmp_path / "rows.jsonl"
    same_sampling = {"sampling.temperature": 1.0, "batch_size": 4}  # sample and eval then draw the same samples
    sample.run(sample_config(tiny_llama_dir, prompts_file, candidates_path, **same_sampling))
    results = evaluate.run(eval_config(
        tiny_llama_dir, prompts_file, **same_sampling, **{"best_of.n": K, "best_of.source": judge("length"),
                                                          "reward.source": judge("digits")},
        samples_output=str(rows_file),
    ))  # fmt: skip
    candidates, rows = read_jsonl(candidates_path), read_jsonl(rows_file)
    best = []
    for row, cands in zip(rows, candidates, strict=True):
        lengths = [len(c) for c in cands["completions"]]
        best.append(max(lengths))
        assert row["completion"] == cands["completions"][lengths.index(max(lengths))]  # the earliest longest
        assert row["reward"] == sum(ch.isdigit() for ch in row["completion"])  # the reward scores the kept one
    every = [len(c) for cands in candidates for c in cands["completions"]]
    assert results["best_of/n"] == K
    assert results["best_of/selector_mean"] == pytest.approx(sum(best) / len(best))
    assert results["best_of/selector_sample_mean"] == pytest.approx(sum(every) / len(every))
    assert results["kl/best_of_n_bound"] == pytest.approx(math.log(K) - (K - 1) / K)  # 0.636…
    assert "kl/mean" not in results


def test_kl_to_the_policy_itself_is_zero_and_to_another_model_matches_a_row_by_row_loop(
    tiny_llama_dir, tiny_gpt2_dir, prompts_file, tmp_path
):
    rows_file = tmp_path / "rows.jsonl"
    itself = evaluate.run(eval_config(tiny_llama_dir, prompts_file, reference=str(tiny_llama_dir),
                                      samples_output=str(rows_file)))  # fmt: skip
    assert itself["kl/mean"] == 0.0 and all(row["kl"] == 0.0 for row in read_jsonl(rows_file))

    # answer_kl on a ragged batch (left-padded prompts, right-padded responses) against a loop over the rows,
    # each scored alone without padding by a plain transformers forward
    from transformers import AutoModelForCausalLM

    from rlhf.data import TokenizedPrompt
    from rlhf.data.stream import PromptBatch
    from rlhf.data.tokenization import stop_token_ids
    from rlhf.rollout import generation
    from rlhf.rollout.engine import SamplingParams

    tokenizer = load_tokenizer(str(tiny_llama_dir))
    policy = AutoModelForCausalLM.from_pretrained(tiny_llama_dir).eval()
    reference = AutoModelForCausalLM.from_pretrained(tiny_gpt2_dir).eval()
    texts = ["the cat", "a dog sees the", "one"]
    prompts = [TokenizedPrompt(f"row {i}", t, tokenizer(t)["input_ids"]) for i, t in enumerate(texts)]
    params = SamplingParams(max_new_tokens=6, temperature=0.8)
    generated = generation.generate(policy, tokenizer, PromptBatch.of(prompts, range(3)), params,
                                    stop_token_ids(tokenizer, "eos"), torch.Generator().manual_seed(3), torch.device("cpu"))  # fmt: skip
    kl = evaluate.answer_kl(policy, reference, generated, 0.8)
    for i in range(3):
        prompt_ids = prompts[i].input_ids
        response = [t for t in generated.responses[i].tolist() if t != generated.pad_token_id]
        ids = torch.tensor([prompt_ids + response])
        with torch.no_grad():
            lp = torch.log_softmax(policy(ids).logits[0, :-1] / 0.8, -1)
            lr = torch.log_softmax(reference(ids).logits[0, :-1] / 0.8, -1)
        targets = ids[0, 1:]
        diff = (lp - lr).gather(1, targets[:, None]).squeeze(1)[len(prompt_ids) - 1 :]
        # float32 log-softmax over the vocabulary, padding and position ids changing the reduction order: the
        # per-token error is ~1e-6 relative, summed over ≤ 6 tokens
        assert kl[i].item() == pytest.approx(diff.sum().item(), rel=1e-4, abs=1e-4)
    assert kl.abs().sum() > 0  # two different models: the test can tell


def test_reference_with_another_vocabulary_is_refused(tiny_llama_dir, other_tokenizer_dir, prompts_file, tmp_path):
    from transformers import AutoTokenizer

    from rlhf.models.tiny import save_tiny, tiny_causal_lm

    tok = AutoTokenizer.from_pretrained(other_tokenizer_dir)
    other = save_tiny(tiny_causal_lm("gpt2", tok, seed=0), tok, tmp_path / "other")
    with pytest.raises(ConfigError, match="has another vocabulary than the policy"):
        evaluate.run(eval_config(tiny_llama_dir, prompts_file, reference=str(other)))


def test_an_ensemble_judges_best_of_n_by_its_worst_member_and_eval_logs_its_spread(
    tiny_llama_dir, tokenizer_dir, prompts_file, candidates, tmp_path
):
    """`judge.source` an ensemble (wco): the kept answer is the candidate whose lowest member score is highest,
    each member scoring as it does alone; `rlhf eval` with one as `reward.source` reports the members' spread."""
    ensemble = write_ensemble(tmp_path / "rm", tokenizer_dir)
    out = tmp_path / "best.jsonl"
    sample.run(sample_config(tiny_llama_dir, prompts_file, out, mode="best_of_n", **{"judge.source": str(ensemble)}))
    members = [RewardModelReward.load(str(ensemble / f"member_{m}")) for m in range(MEMBERS)]
    for row, cands in zip(read_jsonl(out), candidates, strict=True):
        prompts = [row["prompt"]] * len(cands["completions"])
        worst = torch.tensor([m.score(prompts, cands["completions"]) for m in members]).amin(0)
        assert row["response"] == cands["completions"][int(worst.argmax())]
        # the judge's float32 scores against the members' own, read back through JSON: a few float32 ulp
        assert row["reward"] == pytest.approx(worst.max().item(), rel=1e-6)
    results = evaluate.run(eval_config(tiny_llama_dir, prompts_file, **{"reward.source": str(ensemble)}))
    assert results["reward/rm/ensemble_std"] > 0 and "reward/rm/member_2" in results
