"""`rlhf demo`: the gold judge of the advice task, and the "tiny" preset run end to end through the CLI."""

from __future__ import annotations

import html
import itertools
import json
import math
import os
import random
import statistics
from pathlib import Path

import pytest
import torch
import yaml

from rlhf.demo import task

SUMMARY_KEYS = (
    "gold/sft_mean",
    "gold/ppo_mean",
    "gold/grpo_mean",
    "gold/win_rate_vs_sft",
    "gold/grpo_win_rate_vs_sft",
    "gold/dpo_mean",
    "gold/dpo_win_rate_vs_sft",
    "gold/best_of_n_mean",
    "gold/best_of_n_win_rate_vs_sft",
    "rm/accuracy",
    "rm/ensemble_accuracy_mean",
    "rm/ensemble_accuracy_wco",
    "kl/final",
    "ppo_no_kl_ensemble/held_out_gold_last",
    "ppo_no_kl_ensemble/kl_last",
    "seconds",
)


# ---------------------------------------------------------------------------------------------------------------
# The task and its gold judge
# ---------------------------------------------------------------------------------------------------------------


def test_prompts_cover_every_topic_and_split_without_overlap():
    prompts = task.prompts()
    assert len(prompts) == len(set(prompts)) == 240
    assert {task.topic_of(p) for p in prompts} == set(task.TOPICS)
    train, held_out = task.split_prompts(seed=0)
    assert not set(train) & set(held_out)
    assert len(held_out) == 48 and sorted(train + held_out) == sorted(prompts)


def test_quality_classes_are_ordered_by_the_gold_judge():
    rng = random.Random(0)
    prompts = task.prompts()
    means = {}
    for quality in task.QUALITIES:
        scores = []
        for _ in range(400):
            prompt = rng.choice(prompts)
            scores.append(task.gold_score(prompt, task.response(prompt, quality, rng)))
        means[quality] = statistics.mean(scores)
    # QUALITIES lists the classes best first: helpful > vague > rambling > off_topic > rude
    ordered = [means[q] for q in task.QUALITIES]
    assert ordered == sorted(ordered, reverse=True), means
    assert means["helpful"] - means["vague"] > 1.5  # a clear gap for the reward model to learn


def test_gold_terms_read_relevance_from_the_prompt():
    prompt = "Q: any tips for sleep?\nA:"
    on = " sure. keep a dark room and a fixed bed time each night. hope this helps."
    off = " sure. keep a clean oven and a good recipe for each night. hope this helps."
    assert task.gold_terms(prompt, on)["relevance"] == 2  # capped at two keywords
    assert task.gold_terms(prompt, off)["relevance"] == 1 - 0.5 * 2  # night; oven, recipe from cooking
    assert task.gold_score(prompt, on) > task.gold_score(prompt, off)
    rude = " that is a stupid question, idiot."
    assert task.gold_terms(prompt, rude)["politeness"] == -3.0
    assert task.gold_terms(prompt, " good luck")["ending"] == 0.0
    assert task.gold_terms(prompt, "")["repetition"] == -1.0  # an empty answer scores, it does not crash


def test_gold_reward_function_scores_each_completion():
    prompts = ["Q: any tips for cooking?\nA:"] * 2
    completions = [" try a simple recipe and keep the salt in mind. good luck!", " ugh, go away."]
    scores = task.gold(prompts, completions, extra_column=[1, 2])
    assert scores == [task.gold_score(p, c) for p, c in zip(prompts, completions, strict=True)]
    assert scores[0] > scores[1]


@pytest.mark.parametrize("a_text", [" sure. hope this helps.", " plan your budget first, then your bills."])
def test_bradley_terry_noise_flips_labels_at_the_documented_rate(a_text):
    prompt = "Q: any tips for saving money?\nA:"
    b_text = " it depends on a lot of things, so just see what works for you."
    delta = task.gold_score(prompt, a_text) - task.gold_score(prompt, b_text)
    expected = 1 / (1 + math.exp(-delta / task.BT_TEMPERATURE))  # σ(Δ / T)
    assert task.preference_probability(delta, 0.0) == pytest.approx(expected)
    rng, n = random.Random(1), 4000
    labels = [task.gold_label((prompt, a_text, b_text), rng) for _ in range(n)]
    a_chosen = sum(row["chosen"] == a_text for row in labels) / n
    # binomial standard error ≤ 0.5/√4000 ≈ 0.008; allow four of them
    assert a_chosen == pytest.approx(expected, abs=0.032)
    for row in labels:  # the margin is the gold gap of the label as given: negative exactly when flipped
        sign = 1 if row["chosen"] == a_text else -1
        assert row["gold_margin"] == pytest.approx(sign * delta)


def test_clear_pairs_are_rarely_flipped_and_close_pairs_often():
    prompt = "Q: any tips for travel?\nA:"
    helpful = " sure. start with the map and check the ticket each day. good luck!"
    rude = " nobody cares, stop asking dumb things, idiot."
    rng = random.Random(2)
    flips = sum(task.gold_label((prompt, helpful, rude), rng)["chosen"] != helpful for _ in range(2000))
    assert flips == 0  # Δ ≈ 7: σ(−14) ≈ 1e-6
    same = sum(task.gold_label((prompt, helpful, helpful + " "), rng)["chosen"] == helpful for _ in range(2000))
    assert 900 < same < 1100  # Δ = 0: a coin flip


def test_plackett_luce_rankings_come_at_the_documented_rates():
    prompt = "Q: any tips for saving money?\nA:"
    texts = [" sure. hope this helps.", " plan your budget first, then your bills.", " it depends, just see."]
    weights = [math.exp(task.gold_score(prompt, t) / task.BT_TEMPERATURE) for t in texts]

    def probability(order):  # Plackett–Luce by hand: each place a softmax over the answers left
        p, left = 1.0, list(order)
        for i in order:
            p *= weights[i] / sum(weights[j] for j in left)
            left.remove(i)
        return p

    rng, n = random.Random(3), 6000
    rows = [task.gold_ranking(prompt, [*texts, "", texts[0]], rng) for _ in range(n)]
    assert all(row["completions"] == texts for row in rows)  # the empty answer and the repeat left out
    for order in itertools.permutations(range(3)):
        seen = sum(row["ranking"] == list(order) for row in rows) / n
        # binomial standard error ≤ 0.5/√6000 ≈ 0.0065; allow four of them
        assert seen == pytest.approx(probability(order), abs=0.026), order
    # two answers: the ranking is the Bradley–Terry label
    a_first = sum(task.gold_ranking(prompt, texts[:2], rng)["ranking"][0] == 0 for _ in range(n)) / n
    delta = task.gold_score(prompt, texts[0]) - task.gold_score(prompt, texts[1])
    assert a_first == pytest.approx(task.preference_probability(delta, 0.0), abs=0.026)


def test_demo_labels_rank_each_prompt_or_pair_its_answers(tmp_path):
    from rlhf.data import read_preferences
    from rlhf.demo import pipeline

    prompt = "Q: any tips for travel?\nA:"
    answers = [" sure. start with the map and check the ticket each day. good luck!", " idiot.", " maybe.", ""]
    for name in ("candidates", "eval_candidates"):
        (tmp_path / f"{name}.jsonl").write_text(json.dumps({"prompt": prompt, "completions": answers}) + "\n")
    ranked = pipeline.label(tmp_path, tmp_path / "ranking", seed=0)
    rows = _read_jsonl(tmp_path / "ranking" / "preferences.jsonl")
    assert len(rows) == 1 and sorted(rows[0]["ranking"]) == [0, 1, 2]  # the empty answer is left out
    assert ranked["label/train_rankings"] == 1 and ranked["label/train_pairs"] == 3
    assert len(read_preferences(tmp_path / "ranking" / "preferences.jsonl")) == 3  # read as its C(3, 2) pairs
    paired = pipeline.label(tmp_path, tmp_path / "pairs", seed=0, kind="pairs")
    assert paired["label/train_rankings"] == 0 and paired["label/train_pairs"] == 3
    assert paired["label/eval_pairs"] == ranked["label/eval_pairs"] == 3  # held out: noiseless pairs either way
    assert paired["label/eval_gold_agreement"] == 1.0


# ---------------------------------------------------------------------------------------------------------------
# The tiny preset end to end, through `rlhf demo`
# ---------------------------------------------------------------------------------------------------------------


def _read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory) -> Path:
    from rlhf.cli import main

    out = tmp_path_factory.mktemp("demo")
    assert main(["demo", "--output_dir", str(out), "--preset", "tiny", "--no-progress"]) == 0
    return out


def test_every_stage_writes_its_run(demo_dir):
    for model in ("pretrain", "sft", "dpo", "ppo", "ppo_no_kl", "ppo_no_kl_ensemble", "grpo"):
        assert (demo_dir / model / "final" / "config.json").is_file(), model
    for run in ("sft", "dpo", "ppo", "grpo"):
        assert (demo_dir / run / f"{run}.yaml").is_file()  # the config the stage ran, for `rlhf <cmd> --config`
        assert _read_jsonl(demo_dir / run / "metrics.jsonl")
    # the reward models: an ensemble of the tiny preset's two members, each a run of its own
    assert (demo_dir / "rm" / "rm.yaml").is_file()
    manifest = json.loads((demo_dir / "rm" / "final" / "ensemble.json").read_text())
    assert manifest["members"] == ["member_0", "member_1"]
    for member in manifest["members"]:
        assert (demo_dir / "rm" / "final" / member / "config.json").is_file()
        assert _read_jsonl(demo_dir / "rm" / "members" / member / "metrics.jsonl")
    assert _read_jsonl(demo_dir / "sample" / "candidates.jsonl")
    assert _read_jsonl(demo_dir / "label" / "preferences.jsonl")
    assert _read_jsonl(demo_dir / "label" / "eval_preferences.jsonl")
    assert (demo_dir / "report.html").is_file()
    for name in ("best_of_n", "dpo", "ppo", "grpo"):
        assert (demo_dir / "eval" / f"{name}.json").is_file()
        assert _read_jsonl(demo_dir / "eval" / f"{name}_samples.jsonl")


def test_summary_is_computed_from_the_runs(demo_dir):
    summary = json.loads((demo_dir / "summary.json").read_text())
    for key in SUMMARY_KEYS:
        assert isinstance(summary[key], int | float) and math.isfinite(summary[key]), key
    # rm/accuracy is member 0's, the reward model of every later stage; the ensemble's are in its manifest
    rm_rows = [row for row in _read_jsonl(demo_dir / "rm" / "members" / "member_0" / "metrics.jsonl")
               if "eval/accuracy" in row]  # fmt: skip
    assert summary["rm/accuracy"] == rm_rows[-1]["eval/accuracy"]
    accuracy = json.loads((demo_dir / "rm" / "final" / "ensemble.json").read_text())["held_out_accuracy"]
    # the same count of pairs over the same total, one in float32 (its rounding: 6e-8 relative)
    assert accuracy["member_0"] == pytest.approx(summary["rm/accuracy"], rel=1e-7)
    assert summary["rm/ensemble_accuracy_mean"] == accuracy["mean"]
    assert summary["rm/ensemble_accuracy_wco"] == accuracy["wco"]
    ppo_rows = [row for row in _read_jsonl(demo_dir / "ppo" / "metrics.jsonl") if "kl/mean" in row]
    assert summary["kl/final"] == ppo_rows[-1]["kl/mean"]
    no_kl_rows = _read_jsonl(demo_dir / "ppo_no_kl" / "metrics.jsonl")[1:]  # after step 0's held-out answers
    assert all(row["kl/coef"] == 0.0 for row in no_kl_rows)  # the unleashed run: β = 0 throughout
    assert summary["ppo_no_kl/kl_last"] == no_kl_rows[-1]["kl/mean"]
    assert summary["ppo_no_kl/held_out_gold_last"] == no_kl_rows[-1]["eval/reward/gold/mean"]
    ensemble_rows = _read_jsonl(demo_dir / "ppo_no_kl_ensemble" / "metrics.jsonl")[1:]
    assert all(row["kl/coef"] == 0.0 for row in ensemble_rows)
    assert summary["ppo_no_kl_ensemble/kl_last"] == ensemble_rows[-1]["kl/mean"]
    assert summary["ppo_no_kl_ensemble/held_out_gold_last"] == ensemble_rows[-1]["eval/reward/gold/mean"]
    ppo_eval = json.loads((demo_dir / "eval" / "ppo.json").read_text())
    grpo_eval = json.loads((demo_dir / "eval" / "grpo.json").read_text())
    assert summary["gold/win_rate_vs_sft"] == ppo_eval["win_rate"]
    assert summary["gold/grpo_win_rate_vs_sft"] == grpo_eval["win_rate"]
    # the gold means, recomputed from the completions with the gold rule itself
    rows = _read_jsonl(demo_dir / "eval" / "ppo_samples.jsonl")
    ppo_gold = [task.gold_score(r["prompt"], r["completion"]) for r in rows]
    sft_gold = [task.gold_score(r["prompt"], r["baseline_completion"]) for r in rows]
    assert summary["gold/ppo_mean"] == pytest.approx(statistics.mean(ppo_gold), abs=1e-5)
    assert summary["gold/sft_mean"] == pytest.approx(statistics.mean(sft_gold), abs=1e-5)
    assert 0 <= summary["gold/win_rate_vs_sft"] <= 1 and 0 <= summary["rm/accuracy"] <= 1
    assert summary["seconds"] >= sum(v for k, v in summary.items() if k.startswith("time/")) - 1e-6


def test_the_methods_table_is_computed_from_the_evaluations(demo_dir):
    summary = json.loads((demo_dir / "summary.json").read_text())
    methods = summary["methods"]
    assert list(methods) == ["sft", "best_of_n", "dpo", "ppo", "grpo"]
    sft_gold = [task.gold_score(r["prompt"], r["baseline_completion"])
                for r in _read_jsonl(demo_dir / "eval" / "ppo_samples.jsonl")]  # fmt: skip
    assert methods["sft"]["gold_mean"] == pytest.approx(statistics.mean(sft_gold), abs=1e-5)
    assert methods["sft"]["kl"] == 0.0 and methods["sft"]["win_rate"] is None
    for name in ("best_of_n", "dpo", "ppo", "grpo"):
        result = json.loads((demo_dir / "eval" / f"{name}.json").read_text())
        rows = _read_jsonl(demo_dir / "eval" / f"{name}_samples.jsonl")
        gold = [task.gold_score(r["prompt"], r["completion"]) for r in rows]  # the gold rule itself, again
        m = methods[name]
        assert m["prompts"] == len(rows) == result["num_prompts"]
        assert m["gold_mean"] == pytest.approx(statistics.mean(gold), abs=1e-5)
        # 95 % normal interval of the mean: 1.96 · sample std / √n
        assert m["gold_ci95"] == pytest.approx(1.96 * statistics.stdev(gold) / math.sqrt(len(gold)), rel=1e-3)
        assert m["win_rate"] == result["win_rate"]
        low, high = m["win_rate_ci95"]
        assert 0 <= low <= m["win_rate"] <= high <= 1
        assert m["seconds"] > 0
        if name == "best_of_n":  # N SFT samples per prompt: KL from SFT is the bound, its cost the sampling
            n = m["n"]
            assert m["kl"] == pytest.approx(math.log(n) - (n - 1) / n) and m["kl_is_bound"]
            assert m["samples"] == n * len(rows) and m["seconds"] == result["time/policy_s"]
        else:  # the mean per-answer KL from the SFT reference, as rlhf eval measured it
            assert m["kl"] == result["kl/mean"] == pytest.approx(statistics.mean(r["kl"] for r in rows), abs=1e-5)
            assert m["seconds"] == summary[f"time/{name}_s"]


def test_the_demo_data_fits_its_own_max_length(demo_dir):
    """Every demonstration and labelled answer is trained on whole: none is cut at data.max_length (the command
    would warn that they "lose their end")."""
    from transformers import AutoTokenizer

    from rlhf.demo.pipeline import MAX_LENGTH

    tokenizer = AutoTokenizer.from_pretrained(demo_dir / "pretrain" / "final")
    for name in ("sft", "rm", "dpo"):
        assert yaml.safe_load((demo_dir / name / f"{name}.yaml").read_text())["data"]["max_length"] == MAX_LENGTH
    texts = [row["prompt"] + row["response"] for name in ("sft", "sft_eval")
             for row in _read_jsonl(demo_dir / "data" / f"{name}.jsonl")]  # fmt: skip
    # the rater's rankings, and the held-out gold pairs
    texts += [row["prompt"] + answer for row in _read_jsonl(demo_dir / "label" / "preferences.jsonl")
              for answer in row["completions"]]  # fmt: skip
    texts += [row["prompt"] + row[side] for row in _read_jsonl(demo_dir / "label" / "eval_preferences.jsonl")
              for side in ("chosen", "rejected")]  # fmt: skip
    longest = max(len(tokenizer(text)["input_ids"]) + 1 for text in texts)  # + EOS
    assert longest <= MAX_LENGTH


def test_reward_model_never_sees_the_gold_rule(demo_dir):
    rm_config = (demo_dir / "rm" / "rm.yaml").read_text()
    assert "rlhf.demo.task" not in rm_config  # it trains on the labelled pairs only
    ensemble, member_0 = demo_dir / "rm" / "final", demo_dir / "rm" / "final" / "member_0"
    # the policy optimises one reward model (the ensemble's member 0), or the ensemble in the ensemble stage; gold
    # rides with weight 0, and beside one reward model the ensemble too (its members' disagreement is logged)
    optimised = {"ppo": member_0, "ppo_no_kl": member_0, "grpo": member_0, "ppo_no_kl_ensemble": ensemble}
    for run, source in optimised.items():
        command = run.partition("_")[0]
        config = yaml.safe_load((demo_dir / run / f"{command}.yaml").read_text())
        weights = {entry["source"]: entry["weight"] for entry in config["reward"]["source"]}
        monitors = {"rlhf.demo.task:gold": 0.0} | ({str(ensemble): 0.0} if source == member_0 else {})
        assert weights == {str(source): 1.0} | monitors
        rows = _read_jsonl(demo_dir / run / "metrics.jsonl")[1:]  # the training steps
        for row in rows:  # so reward/mean is the reward model's score alone
            assert row["reward/mean"] == pytest.approx(row["reward/rm/mean"], abs=1e-6)
        assert all("reward/gold/mean" in row for row in rows)
        disagreement = "reward/ensemble/ensemble_std" if source == member_0 else "reward/rm/ensemble_std"
        assert all(row[disagreement] >= 0 for row in rows)


def test_report_shows_every_part_of_the_demo(demo_dir):
    page = (demo_dir / "report.html").read_text()
    assert page.startswith("<!DOCTYPE html>") and 'src="http' not in page
    for heading in ("Pipeline", "Methods on equal labels", "Results", "Training curves",
                    "Held-out answers: SFT, best-of-N, DPO, PPO, GRPO", "Configs"):  # fmt: skip
        assert f"<h2>{heading}</h2>" in page, heading
    # (clip fraction and response length may be flat lines in a 2-step run, and flat charts are left out)
    for title in ("Reward source 'gold'", "Reward source 'rm'", "KL to the reference", "Entropy", "Value loss",
                  "Seconds per step — PPO", "Methods compared", "Disagreement of the ensemble 'ensemble'",
                  "Seconds per step — PPO, β = 0, ensemble"):  # fmt: skip
        assert f'alt="{html.escape(title)}"' in page, title
    # Reward against KL needs a step whose KL estimate rose above 0: after one update of a 2-step run the batch's
    # estimate is noise around 0 and may be negative in every run (the samples decide, so the CPU's kernels do too)
    rose = any(row.get("kl/mean", 0) > 0 for run in ("ppo", "ppo_no_kl", "ppo_no_kl_ensemble", "grpo")
               for row in _read_jsonl(demo_dir / run / "metrics.jsonl"))  # fmt: skip
    assert ("<h2>Reward against KL</h2>" in page) == rose and ('alt="Reward against KL"' in page) == rose
    assert "<th>SFT</th><th>best-of-N</th><th>DPO</th><th>PPO</th><th>GRPO</th>" in page
    assert html.escape("The grey line is PPO's path") in page  # held-out gold against KL, from step 0 (KL 0) on
    from rlhf.report import demo as demo_page
    from rlhf.report import runs

    path = demo_page.gold_path(runs.load_run(demo_dir / "ppo"), "PPO")
    ppo_rows = _read_jsonl(demo_dir / "ppo" / "metrics.jsonl")
    assert path.steps == tuple(row["step"] for row in ppo_rows if "eval/reward/gold/mean" in row)
    assert (
        path.steps[0] == 0
        and path.kls[0] == 0.0
        and path.kls[1:] == tuple(row["kl/mean"] for row in ppo_rows[1:] if "eval/reward/gold/mean" in row)
    )
    answers = {name: {row["prompt"]: row for row in _read_jsonl(demo_dir / "eval" / f"{name}_samples.jsonl")}
               for name in ("best_of_n", "dpo", "ppo", "grpo")}  # fmt: skip
    for prompt, row in list(answers["best_of_n"].items())[:12]:  # each prompt with its five answers
        assert html.escape(prompt) in page and html.escape(row["baseline_completion"]) in page
        for name in answers:
            assert html.escape(answers[name][prompt]["completion"]) in page
    assert html.escape((demo_dir / "ppo" / "ppo.yaml").read_text()) in page
    # `rlhf report` on the demo directory rebuilds the same page
    from rlhf import report

    assert report.build(demo_dir) == page


# ---------------------------------------------------------------------------------------------------------------
# The honest targets of the default preset (issue 6): the real demo, `make test-demo`
# ---------------------------------------------------------------------------------------------------------------


# Marked `demo` (`make test-demo` runs it alone, on every core) and `longest`: `make test` and CI run it, its file
# handed out first. With the grouped reward models it took 272 s alone on 2 cores (2026-12-07); the demo itself took
# 553-1,099 s before them. Run it after changing a trainer, the demo or its presets, and `python tools/demo_figures.py`
# for the README's figures over seeds and kernels.
@pytest.mark.slow
@pytest.mark.demo
@pytest.mark.longest
def test_default_demo_meets_its_targets(tmp_path):
    from rlhf.cli import main

    # Its share of the cores, as `rlhf demo` has every core on its own: the suite's one thread (conftest.py) guards
    # the short tests against a busy machine, but this one runs for minutes (5.5 against 8.7 on 2 idle cores).
    # Beside other test processes (pytest-xdist) a thread more than its share spins and crawls (conftest.py).
    # The figures are the same with 1 and 2 threads (docs/reproducibility.md).
    threads = torch.get_num_threads()
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", 1))))
    try:
        assert main(["demo", "--output_dir", str(tmp_path), "--no-progress"]) == 0
    finally:
        torch.set_num_threads(threads)
    summary = json.loads((tmp_path / "summary.json").read_text())
    # One seed's figures depend on the machine's float kernels (docs/reproducibility.md), so the bounds sit well
    # inside the spread over seeds 0-4 × both kernel families (README): win rate 0.82 ± 0.05 (min 0.74), rm accuracy
    # 0.81 ± 0.03 (min 0.77)
    assert summary["gold/win_rate_vs_sft"] >= 0.6
    assert summary["gold/ppo_mean"] > summary["gold/sft_mean"]
    assert summary["rm/accuracy"] >= 0.75
    assert math.isfinite(summary["kl/final"]) and summary["kl/final"] < 20  # the KL leash holds
    # without the leash the policy runs far from the reference and its gold score falls below the leashed one's
    assert summary["ppo_no_kl/kl_last"] > 2 * summary["kl/final"]
    assert summary["ppo_no_kl/held_out_gold_last"] < summary["ppo/held_out_gold_last"]
    # every method beats the SFT model it starts from under the gold judge (the README's runs give the spread)
    for method in ("dpo", "best_of_n", "grpo"):
        assert summary[f"gold/{method}_mean"] > summary["gold/sft_mean"], method
        assert summary[f"gold/{method}_win_rate_vs_sft"] > 0.5, method
    # PPO holds its own against DPO on the same labels: over seeds 0-4 × both kernel families (README) PPO − DPO on
    # the same base is +0.55 ± 0.31, −0.16 at the least (AVX2 seed 2), within a 48-prompt mean's sampling error
    # (about ±0.3 at 95 %); seed 0 on AVX-512: 2.30 against 1.60
    assert summary["gold/ppo_mean"] >= summary["gold/dpo_mean"] - 0.3
    # (its wall time is a benchmark figure, not a test: README and `python tools/demo_figures.py` report it)
    # the training doctor: no warning on the demo's own runs, and it names the β = 0 run's reward hacking (seeds 0-4
    # all do: tests/doctor/fixtures holds seeds 0 and 3). An info note is no failure: on an AMD EPYC (avx512
    # kernels) seed 0's rm run has one gradient spike, 12× the median at step 190, which max_grad_norm clips
    from rlhf.doctor.checkup import examine

    verdicts = {str(checkup.record.path.relative_to(tmp_path)): checkup for checkup in examine(tmp_path)}
    members = [f"rm/members/member_{m}" for m in range(4)]
    for name in ("sft", *members, "dpo", "ppo", "grpo"):
        serious = [f.rule.name for f in verdicts[name].findings if f.rule.severity != "info"]
        assert serious == [], (name, serious)
    assert "over_optimisation" in {f.rule.name for f in verdicts["ppo_no_kl"].findings}
