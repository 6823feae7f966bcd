"""`rlhf rm` end to end on tiny random-init models (test layers b-e, docs/architecture.md).

The toy preference: a prompt names an animal, both answers are sentences of the toy language about it, and
the chosen one is always the *happy* one (``the happy cat sees a dog in the park.``), the rejected one has
another adjective — the rest of each sentence is drawn independently, so only that word separates them.
Runs are real `rlhf.trainers.reward_model.run(config)` calls on the session's tiny models (conftest), a
few steps each (well under a second). The learning tests use a harder task — the correct sum preferred to
a wrong one — and train a tiny Llama from scratch (≈ 12 s) and a tiny BERT with its own WordPiece tokenizer
(≈ 6 s) on it.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import random
import shutil
import time
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from configs import nested
from rlhf import cli
from rlhf.config import ConfigError, config_from_dict
from rlhf.core.preference import bradley_terry_loss
from rlhf.data import DataError, collate_preferences
from rlhf.models.reward import BIAS_KEY, GAIN_KEY, RewardScorer, load_reward_model, reward_normalization, reward_scores
from rlhf.models.tiny import save_tiny, toy_corpus
from rlhf.rollout.rewards import EnsembleReward, RewardError, RewardModelReward, load_reward_source
from rlhf.runlog import train_state
from rlhf.runlog.seeding import seed_everything
from rlhf.trainers import reward_model
from runs import (
    Interrupted,
    assert_rows_match,
    assert_same_checkpoint,
    comparable,
    counting,
    dies_after_checkpoint,
    max_abs_diff,
    metric_rows,
)
from tiny_models import tiny_bert_classifier, train_wordpiece_tokenizer

# The rm metric names (README, "Metrics"): every training row carries these; evaluation rows add EVAL.
TRAIN_METRICS = ["step", "epoch", "train/loss", "train/accuracy", "grad/norm", "lr", "time/step_s"]
EVAL_METRICS = ["eval/loss", "eval/accuracy", "eval/reward_margin"]

ADJECTIVES = ["small", "big", "red", "blue", "quiet", "old", "young", "fast", "slow"]
NOUNS = ["cat", "dog", "bird", "fish", "child", "cow", "robot", "farmer"]
VERBS = ["sees", "likes", "finds", "follows", "helps", "watches"]
PLACES = ["in the park", "by the river", "at home", "under the tree", "on the hill"]


def happy_pairs(n: int, seed: int, margins: bool = False) -> list[dict]:
    """``n`` comparisons of the toy preference (module docstring), each of its own prompt (one pair per prompt: a step
    of ``batch.size`` prompts is that many pairs); ``margins`` adds a "margin" in [0, 1)."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        noun = rng.choice(NOUNS)

        def sentence(adjective: str, noun: str = noun) -> str:
            verb, other, place = rng.choice(VERBS), rng.choice(NOUNS), rng.choice(PLACES)
            return f" the {adjective} {noun} {verb} a {other} {place}."

        row = {"prompt": f"tell me about a {noun}, {i}:", "chosen": sentence("happy")}
        row["rejected"] = sentence(rng.choice(ADJECTIVES))
        if margins:
            row["margin"] = round(rng.random(), 2)
        rows.append(row)
    return rows


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """``train`` (24 pairs), ``eval`` (16), ``margins`` (24 with margins), ``prompts`` (8 prompt rows)."""
    root = tmp_path_factory.mktemp("rm_data")
    prompts = [{"prompt": f"tell me about a {noun}:"} for noun in NOUNS]
    return {
        "train": write_jsonl(root / "train.jsonl", happy_pairs(24, seed=1)),
        "eval": write_jsonl(root / "eval.jsonl", happy_pairs(16, seed=2)),
        "margins": write_jsonl(root / "margins.jsonl", happy_pairs(24, seed=3, margins=True)),
        "prompts": write_jsonl(root / "prompts.jsonl", prompts),
    }


@pytest.fixture(scope="module")
def tiny_bert_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny BERT classifier (one output, 2 layers, hidden 64, 128 positions) with its own WordPiece tokenizer.

    The tokenizer is trained on the toy corpus and on sentences of the toy preference — "happy" included,
    as a real encoder's vocabulary would hold it.
    """
    texts = toy_corpus(2000, seed=0) + [row[k] for row in happy_pairs(200, seed=9) for k in ("prompt", "chosen")]
    tokenizer = train_wordpiece_tokenizer(texts, vocab_size=400, model_max_length=128)
    model = tiny_bert_classifier(tokenizer, seed=0)
    return save_tiny(model, tokenizer, tmp_path_factory.mktemp("bert") / "tiny_bert")


def make_config(model: Path, data: dict[str, Path], out: Path, **overrides: object):
    """A small, fast rm config: 24 training pairs, batches of 8 (3 steps per epoch), lr 1e-3, no checkpoints."""
    values = {
        "model.name": str(model),
        "data.train": str(data["train"]),
        "data.eval": str(data["eval"]),
        "output_dir": str(out),
        "batch.size": 8,
        "optim.learning_rate": 1e-3,
        "rm.epochs": 1,
        "run.eval_every": 0,
        "run.save_every": 0,
        "run.progress": False,
    }
    return config_from_dict("rm", nested(values | overrides))


def held_out_accuracy(final: Path, path: Path) -> float:
    """Strict accuracy of a saved reward model on a preference file, scored as consumers score (RewardModelReward)."""
    rm = RewardModelReward.load(str(final))
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    prompts = [row["prompt"] for row in rows]
    chosen = torch.tensor(rm.score(prompts, [row["chosen"] for row in rows], {}))
    rejected = torch.tensor(rm.score(prompts, [row["rejected"] for row in rows], {}))
    return (chosen > rejected).float().mean().item()


# --------------------------------------------------------------------------------------------------------------
# model loading: head init, pad token, encoder detection
# --------------------------------------------------------------------------------------------------------------


def test_causal_lm_gets_a_fresh_head_with_the_reference_init(tiny_llama_dir):
    rm = load_reward_model(str(tiny_llama_dir))
    assert rm.is_decoder and rm.fresh_head and rm.max_positions == 512
    head = rm.model.score
    assert head.out_features == 1 and head.bias is None  # Llama's score head has no bias
    # checklist item 15: W ~ N(0, 1/sqrt(H+1)), H = 64 → std 0.124; 64 draws: ±35% is > 3.9 σ of the estimate
    assert head.weight.std().item() == pytest.approx(1 / math.sqrt(65), rel=0.35)
    assert head.weight.mean().abs().item() < 0.07
    assert rm.model.config.num_labels == 1 and rm.model.config.pad_token_id == rm.tokenizer.pad_token_id
    assert rm.tokenizer.padding_side == "right"


def test_a_head_from_the_checkpoint_is_kept_and_a_mismatched_one_reinitialised(tiny_reward_model_dir, tmp_path):
    saved = AutoModelForSequenceClassification.from_pretrained(tiny_reward_model_dir)
    rm = load_reward_model(str(tiny_reward_model_dir))
    assert not rm.fresh_head
    torch.testing.assert_close(rm.model.score.weight, saved.score.weight, rtol=0, atol=0)

    # a 3-label BERT classifier: its head has the wrong size → fresh, N(0, 1/sqrt(H+1)) and bias 0
    tokenizer = train_wordpiece_tokenizer(toy_corpus(200), vocab_size=200)
    path = save_tiny(tiny_bert_classifier(tokenizer, hidden_size=256, num_labels=3), tokenizer, tmp_path / "b")
    bert = load_reward_model(str(path))
    assert not bert.is_decoder and bert.fresh_head and bert.model.config.num_labels == 1
    assert bert.model.classifier.bias.abs().max().item() == 0.0
    assert bert.model.classifier.weight.std().item() == pytest.approx(1 / math.sqrt(257), rel=0.15)


def test_a_tokenizer_without_pad_gets_one_and_the_embeddings_hold_it(tiny_llama_dir, tmp_path):
    """GPT-2 style: no pad token in the vocabulary. The saved reward model must embed the pad id it uses."""
    path = tmp_path / "no_pad"
    shutil.copytree(tiny_llama_dir, path)
    for name in ("tokenizer.json", "tokenizer_config.json"):  # rename the pad token away, drop the setting
        text = (path / name).read_text().replace("<|pad|>", "<|spare|>")
        (path / name).write_text(text)
    tokenizer_config = json.loads((path / "tokenizer_config.json").read_text())
    tokenizer_config["pad_token"] = None
    (path / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    assert AutoTokenizer.from_pretrained(path).pad_token is None

    rows = json.loads((path / "config.json").read_text())["vocab_size"]
    rm = load_reward_model(str(path))
    pad = rm.tokenizer.pad_token_id
    assert rm.tokenizer.pad_token == "<|pad|>" and pad == rows  # appended past the ids the model had
    assert rm.model.get_input_embeddings().num_embeddings == rows + 1 and rm.model.config.pad_token_id == pad
    # the plain transformers way (tokenizer padding + the model's own pooling) now works on the saved model
    final = reward_model.run(make_config(path, small_data(tmp_path), tmp_path / "run", **{"rm.epochs": 1}))
    tok = AutoTokenizer.from_pretrained(final)
    model = AutoModelForSequenceClassification.from_pretrained(final)
    batch = tok(["tell me about a cat: the cat.", "a"], padding=True, return_tensors="pt")
    assert model(**batch).logits.shape == (2, 1)


def small_data(tmp_path: Path) -> dict[str, Path]:
    return {
        "train": write_jsonl(tmp_path / "t.jsonl", happy_pairs(8, seed=4)),
        "eval": write_jsonl(tmp_path / "e.jsonl", happy_pairs(4, seed=5)),
    }


# --------------------------------------------------------------------------------------------------------------
# (d) smoke runs
# --------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ["llama", "gpt2", "qwen2"])
def test_smoke_one_epoch(tiny_model_dir_factory, data, tmp_path, arch):
    source = tiny_model_dir_factory(arch)
    out = tmp_path / "run"
    final = reward_model.run(make_config(source, data, out, **{"run.eval_every": 2}))

    rows = metric_rows(out)
    # before training (step 0), every step, eval at step 2 (eval_every) and at the end of the epoch (3)
    assert [row["step"] for row in rows] == [0, 1, 2, 3]
    assert ["eval/accuracy" in row for row in rows] == [True, False, True, True]
    assert set(EVAL_METRICS) <= rows[0].keys() and "train/loss" not in rows[0]
    for row in rows[1:]:
        assert set(TRAIN_METRICS) <= row.keys()
        assert all(math.isfinite(row[k]) for k in TRAIN_METRICS + (EVAL_METRICS if "eval/loss" in row else []))
    assert [row["epoch"] for row in rows] == pytest.approx([0, 1 / 3, 2 / 3, 1])
    assert rows[1]["lr"] == pytest.approx(1e-3) and rows[3]["lr"] < rows[2]["lr"]  # linear decay to 0
    for row in rows:
        if "eval/accuracy" in row:
            assert row["eval/accuracy"] * 16 == pytest.approx(round(row["eval/accuracy"] * 16))  # k of 16 pairs

    # final/: one output, loads as is; the trunk and the head were trained
    model = AutoModelForSequenceClassification.from_pretrained(final)
    assert model.config.num_labels == 1 and AutoTokenizer.from_pretrained(final).pad_token is not None
    assert GAIN_KEY not in json.loads((final / "config.json").read_text())  # no normalisation asked
    initial = load_reward_model(str(source)).model.state_dict()
    trained = model.state_dict()
    head = next(k for k in trained if k.startswith("score."))
    trunk = [k for k in trained if not k.startswith("score.")]
    assert max_abs_diff({k: trained[k] for k in trunk}, {k: initial[k] for k in trunk}) > 1e-4
    assert (trained[head] - initial[head]).abs().max() > 1e-4
    assert yaml.safe_load((out / "config.yaml").read_text())["model"]["name"] == str(source)


def test_loss_is_bradley_terry_with_margin_and_centering(tiny_llama_dir, data, tmp_path):
    """Step 1's train/loss is the core loss of the untouched model on all 24 pairs (one step = the whole set), each
    pair's two answers forwarded together as the pairwise trainer did: one pair per prompt, the grouped loss is
    exactly the pairwise one."""
    fields = {"data.train": str(data["margins"]), "data.eval": None, "batch.size": 24, "batch.micro_size": 6,
              "rm.center_rewards_coefficient": 0.01, "run.seed": 3}  # fmt: skip
    config = make_config(tiny_llama_dir, data, tmp_path / "run", **fields)
    reward_model.run(config)
    (row,) = metric_rows(tmp_path / "run")

    seed_everything(3)  # the run's seed: the same fresh head
    rm = load_reward_model(str(tiny_llama_dir))
    pairs, _ = reward_model.load_pairs(config, rm)
    with torch.no_grad():
        chosen, rejected, margin = pairwise_rewards(RewardScorer(rm.model), pairs, rm.tokenizer.pad_token_id)
    assert margin.abs().sum() > 0  # the file's margins arrived
    loss, stats = bradley_terry_loss(chosen, rejected, margin, center_coef=0.01)
    assert row["train/loss"] == pytest.approx(loss.item(), rel=1e-5)
    assert row["train/accuracy"] == pytest.approx(stats["accuracy"].item(), abs=1e-6)
    without_margin, _ = bradley_terry_loss(chosen, rejected, None, center_coef=0.01)
    assert abs(without_margin.item() - loss.item()) > 1e-3  # the margin made a difference

    reward_model.run(
        dataclasses.replace(
            config, rm=dataclasses.replace(config.rm, use_margin=False), output_dir=str(tmp_path / "no_margin")
        )
    )
    (row,) = metric_rows(tmp_path / "no_margin")
    assert row["train/loss"] == pytest.approx(without_margin.item(), rel=1e-5)


def pairwise_rewards(scorer, pairs, pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(r_chosen, r_rejected, margin) of each pair, chosen and rejected in one (2b, L) forward: how a pairwise
    trainer scores them (the reference the grouped trainer is held to)."""
    batch = collate_preferences(pairs, pad_id)
    ids = torch.cat([batch.chosen_input_ids, batch.rejected_input_ids])
    scores = scorer(ids, torch.cat([batch.chosen_attention_mask, batch.rejected_attention_mask]))
    return scores[: len(pairs)], scores[len(pairs) :], batch.margin


def test_lora_run_saves_a_plain_merged_model(tiny_llama_dir, data, tmp_path):
    final = reward_model.run(
        make_config(tiny_llama_dir, data, tmp_path / "run", **{"model.lora": {"r": 4, "alpha": 8}})
    )
    assert not (final / "adapter_config.json").exists()
    trained = AutoModelForSequenceClassification.from_pretrained(final).state_dict()
    initial = load_reward_model(str(tiny_llama_dir)).model.state_dict()
    assert trained.keys() == initial.keys()
    attention = [k for k in trained if "q_proj" in k]  # adapted, then merged into the weights
    assert max_abs_diff({k: trained[k] for k in attention}, {k: initial[k] for k in attention}) > 1e-5
    assert (trained["score.weight"] - initial["score.weight"]).abs().max() > 1e-4  # the head trains in full
    embeddings = [k for k in trained if "embed_tokens" in k]  # not adapted: untouched
    assert max_abs_diff({k: trained[k] for k in embeddings}, {k: initial[k] for k in embeddings}) == 0


def test_cli_runs_rm_from_a_yaml_file(tiny_llama_dir, data, tmp_path):
    out = tmp_path / "run"
    config = {"model.name": str(tiny_llama_dir), "data.train": str(data["train"]), "output_dir": str(out),
              "batch.size": 8, "rm.epochs": 2}  # fmt: skip
    path = tmp_path / "rm.yaml"
    path.write_text(yaml.safe_dump(nested(config)))
    assert cli.main(["rm", "--config", str(path), "--rm.epochs", "1", "--run.no-progress"]) == 0
    assert [row["step"] for row in metric_rows(out)] == [1, 2, 3]  # no eval_data: no step-0 row
    assert (out / "final" / "model.safetensors").is_file()


def test_config_refuses_normalisation_settings_without_a_policy(tiny_llama_dir, data, tmp_path):
    with pytest.raises(ConfigError, match="normalize.prompts is set but normalize.policy is None"):
        make_config(tiny_llama_dir, data, tmp_path, **{"normalize.prompts": str(data["prompts"])})
    with pytest.raises(ConfigError, match=r"normalize.samples=1: input should be greater than or equal to 2"):
        make_config(tiny_llama_dir, data, tmp_path, **{"normalize.policy": "x", "normalize.samples": 1})


# --------------------------------------------------------------------------------------------------------------
# data errors: file:line, before anything is trained or written
# --------------------------------------------------------------------------------------------------------------

GOOD = {"prompt": "tell me about a cat:", "chosen": " the happy cat.", "rejected": " the old cat."}
BAD_ROWS = [  # (row, regex of the problem)
    ({"prompt": "p", "chosen": "a"}, r'missing "rejected" \(keys present: prompt, chosen\)'),
    ({"prompt": "p", "chosen": 3, "rejected": "b"}, '"chosen" must be a non-empty string, got int'),
    ({"prompt": "", "chosen": "a", "rejected": "b"}, '"prompt" must be a non-empty string, got an empty string'),
    ({"prompt": "p", "chosen": " same", "rejected": " same"}, '"chosen" and "rejected" are the same text'),
    ({"prompt": "p", "chosen": "a", "rejected": "b", "margin": "1"}, '"margin" must be a number, got str'),
    ({"prompt": "the red cat sees a dog. " * 100, "chosen": "a", "rejected": "b"},
     r"the prompt takes \d+ tokens, leaving no room for a response within the model's 512 positions"),
    ({"prompt": "p", "chosen": " the cat." * 200, "rejected": "b"},
     r'prompt \+ "chosen" takes \d+ tokens, more than the model\'s 512 positions'),
]  # fmt: skip


@pytest.mark.parametrize(("bad", "expected"), BAD_ROWS, ids=[f"row-{i}" for i in range(len(BAD_ROWS))])
@pytest.mark.parametrize("which", ["train_data", "eval_data"])
def test_a_bad_row_stops_the_run_with_file_and_line(tiny_llama_dir, tmp_path, bad, expected, which):
    path = write_jsonl(tmp_path / "bad.jsonl", [GOOD, GOOD, bad, GOOD])
    good = write_jsonl(tmp_path / "good.jsonl", [GOOD] * 4)
    files = {"train": good, "eval": good} | ({"train": path} if which == "train_data" else {"eval": path})
    out = tmp_path / "run"
    config = make_config(tiny_llama_dir, files, out, **{"data.max_length": 4096 if "positions" in expected else 1024})
    with pytest.raises(DataError, match=rf"^{path}:3: {expected}"):
        reward_model.run(config)
    assert not out.exists()  # nothing trained, nothing written


def test_every_bad_row_is_listed_in_one_error(tiny_llama_dir, tmp_path):
    rows = [GOOD, BAD_ROWS[0][0], GOOD, BAD_ROWS[3][0], BAD_ROWS[1][0]]
    path = write_jsonl(tmp_path / "bad.jsonl", rows)
    with pytest.raises(DataError) as error:
        reward_model.run(make_config(tiny_llama_dir, {"train": path, "eval": path}, tmp_path / "run"))
    assert error.value.count == 3
    assert [p.split(": ")[0] for p in error.value.problems] == [f"{path}:2", f"{path}:4", f"{path}:5"]


def test_responses_cut_to_the_same_tokens_are_refused(tiny_llama_dir, tmp_path):
    row = {"prompt": "cat:", "chosen": " the happy cat sees a dog.", "rejected": " the happy cat."}
    tok = AutoTokenizer.from_pretrained(tiny_llama_dir)
    # cut after prompt + " the happy cat", the two responses are the same tokens
    length = len(tok("cat: the happy cat", add_special_tokens=False)["input_ids"])
    path = write_jsonl(tmp_path / "cut.jsonl", [row | {"rejected": " a cow."}, row])
    config = make_config(tiny_llama_dir, {"train": path, "eval": path}, tmp_path / "run", **{"data.max_length": length})
    with pytest.raises(DataError, match=rf"{path}:2: \"chosen\" and \"rejected\" encode to the same tokens once cut"):
        reward_model.run(config)


# --------------------------------------------------------------------------------------------------------------
# (b) equivalences: micro-batching, resume
# --------------------------------------------------------------------------------------------------------------


def run_recording_gradients(config, monkeypatch) -> tuple[Path, list[dict[str, torch.Tensor]], dict]:
    """Run; returns final/, per optimizer step the accumulated gradients before clipping (by parameter
    name), and the weights before the first step."""
    grads: list[dict[str, torch.Tensor]] = []
    initial: dict[str, torch.Tensor] = {}
    train_step = reward_model.train_step

    def recording(config, rm, trainable, pairs, rows):
        if not initial:  # on the CPU, beside the saved weights it is compared with (the run may be on a GPU)
            initial.update({name: p.detach().to("cpu", copy=True) for name, p in rm.model.named_parameters()})
        stats = train_step(config, rm, trainable, pairs, rows)
        grads.append({n: p.grad.clone() for n, p in rm.model.named_parameters() if p.grad is not None})
        return stats

    with monkeypatch.context() as patch:
        patch.setattr(reward_model, "train_step", recording)
        return reward_model.run(config), grads, initial


def test_micro_batching_gives_the_same_gradient(tiny_llama_dir, data, tmp_path, monkeypatch, adam_steps):
    """One step on all 24 pairs (responses of different lengths: padding varies): in one pass or 6 × 4."""
    fields = {"batch.size": 24, "data.eval": None}
    whole, whole_grads, initial = run_recording_gradients(
        make_config(tiny_llama_dir, data, tmp_path / "whole", **fields), monkeypatch
    )
    micro, micro_grads, micro_initial = run_recording_gradients(
        make_config(tiny_llama_dir, data, tmp_path / "micro", **{"batch.micro_size": 4}, **fields), monkeypatch
    )
    assert len(whole_grads) == len(micro_grads) == 1 and len(whole_grads[0]) > 0
    # the same start, the fresh head included
    assert all(torch.equal(initial[n], micro_initial[n]) for n in initial)
    # float32 sums over 24 pairs of ≤ 40 tokens grouped 6 × 4 instead of once: a few ulp of partial sums
    # whose terms are up to ~100× the result, hence rtol 1e-4 / atol 1e-6 rather than ulp-level bounds
    assert whole_grads[0].keys() == micro_grads[0].keys()
    for name, g_whole in whole_grads[0].items():
        torch.testing.assert_close(micro_grads[0][name], g_whole, rtol=1e-4, atol=1e-6)
    # each run's weights are exactly what one clipped AdamW step makes of its own gradient
    for out, (grads,) in ((whole, whole_grads), (micro, micro_grads)):
        trained = {name: initial[name] for name in grads}
        predicted, tolerance = adam_steps(trained, [grads], [1e-3], 1.0)
        final = load_file(out / "model.safetensors")
        for name in grads:
            assert ((final[name] - predicted[name]).abs() <= tolerance[name]).all(), (out.parent.name, name)
    (a,), (b,) = metric_rows(tmp_path / "whole"), metric_rows(tmp_path / "micro")
    # the logged values sum 24 pairs in another grouping (per micro-batch, then added): float32 sums of
    # ≤ 24 terms, apart by ≲ 24·2⁻²⁴ of the terms' magnitudes; rel 1e-5 holds where the result is not
    # much smaller than them (losses, norms, entropy, KL), abs 1e-7 where it is near 0
    for key in ("train/loss", "train/accuracy", "train/reward_margin", "grad/norm"):
        assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-7), key


def test_resume_reproduces_the_uninterrupted_run(tiny_llama_dir, data, tmp_path, monkeypatch):
    # 2 epochs of 3 steps (a reshuffle at the boundary), linear decay, evaluations: the state to restore
    fields = {"rm.epochs": 2, "run.save_every": 2, "run.eval_every": 2}
    whole = reward_model.run(make_config(tiny_llama_dir, data, tmp_path / "whole", **fields))
    with dies_after_checkpoint(monkeypatch, 4):
        reward_model.run(make_config(tiny_llama_dir, data, tmp_path / "resumed", **fields))
    with counting(monkeypatch, reward_model, "train_step") as steps:
        resumed = reward_model.run(
            make_config(tiny_llama_dir, data, tmp_path / "resumed", **{"run.resume": True}, **fields)
        )
    assert len(steps) == 2  # steps 5 and 6 only

    expected, got = comparable(metric_rows(tmp_path / "whole")), comparable(metric_rows(tmp_path / "resumed"))
    assert [row["step"] for row in got] == [row["step"] for row in expected] == [0, 1, 2, 3, 4, 5, 6]
    # the resumed run repeats the uninterrupted run's float32 operations in the same order, so it gives the
    # same bits; the bounds (a few ulp of values ≤ 8: 8·2⁻²³ ≈ 1e-6) are not a measured noise level
    assert_rows_match(expected, got, rel=1e-6, abs=1e-7)
    assert max_abs_diff(load_file(resumed / "model.safetensors"), load_file(whole / "model.safetensors")) <= 1e-6
    assert_same_checkpoint(tmp_path / "whole", tmp_path / "resumed")  # a continuation from either is the same


# --------------------------------------------------------------------------------------------------------------
# normalisation: stored with the model, applied by every consumer
# --------------------------------------------------------------------------------------------------------------


def test_reward_model_reward_applies_a_stored_normalisation(tiny_reward_model_dir, tmp_path):
    raw = RewardModelReward.load(str(tiny_reward_model_dir))
    assert (raw.gain, raw.bias) == (1.0, 0.0)
    path = tmp_path / "normalised"
    shutil.copytree(tiny_reward_model_dir, path)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps(config | {GAIN_KEY: 0.5, BIAS_KEY: -2.0}))
    normalised = load_reward_source(str(path))  # the way ppo / grpo / eval / sample load a reward
    prompts, completions = ["what is 2 + 3?", "count to 3:"], [" 5", " 1 2 3"]
    expected = [0.5 * s - 2.0 for s in raw.score(prompts, completions, {})]
    assert normalised.score(prompts, completions, {}) == pytest.approx(expected, abs=1e-6)
    ids = torch.tensor([normalised.encode(prompts[:1], completions[:1])[0]])
    assert normalised.score_ids(ids, torch.ones_like(ids)).tolist() == pytest.approx(expected[:1], abs=1e-6)

    (path / "config.json").write_text(json.dumps(config | {GAIN_KEY: 0.0, BIAS_KEY: 1.0}))
    with pytest.raises(RewardError, match=r"rlhf_reward_gain=0.0.*must be a finite non-zero number"):
        load_reward_source(str(path))


def test_normalisation_gives_policy_samples_mean_0_std_1_for_consumers(tiny_llama_dir, data, tmp_path):
    out = tmp_path / "run"
    fields = {"normalize.policy": str(tiny_llama_dir), "normalize.prompts": str(data["prompts"]),
              "normalize.samples": 24, "normalize.max_new_tokens": 8, "batch.micro_size": 4}  # fmt: skip
    final = reward_model.run(make_config(tiny_llama_dir, data, out, **fields))

    stored = json.loads((final / "config.json").read_text())
    gain, bias = stored[GAIN_KEY], stored[BIAS_KEY]
    assert gain > 0 and (gain, bias) == reward_normalization(
        AutoModelForSequenceClassification.from_pretrained(final).config
    )
    samples = [json.loads(line) for line in (out / reward_model.NORMALIZATION_FILE).read_text().splitlines()]
    assert len(samples) == 24 and {s["prompt"] for s in samples} <= {f"tell me about a {n}:" for n in NOUNS}
    assert len({s["completion"] for s in samples}) > 12  # really sampled, not one answer repeated
    # re-scored by a consumer loading final/: mean 0, population std 1 (OAI, checklist item 19)
    consumer = RewardModelReward.load(str(final))
    scores = torch.tensor(consumer.score([s["prompt"] for s in samples], [s["completion"] for s in samples], {}))
    assert scores.mean().item() == pytest.approx(0.0, abs=1e-5)
    assert scores.std(correction=0).item() == pytest.approx(1.0, abs=1e-5)
    assert scores.tolist() == pytest.approx([s["normalized"] for s in samples], abs=1e-5)
    # plain transformers gets the raw head; gain·raw + bias is the consumer's score
    model = AutoModelForSequenceClassification.from_pretrained(final).eval()
    ids = consumer.encode([samples[0]["prompt"]], [samples[0]["completion"]])[0]
    with torch.no_grad():
        raw = model(input_ids=torch.tensor([ids])).logits[0, 0].item()
    assert raw == pytest.approx(samples[0]["score"], abs=1e-5)
    assert gain * raw + bias == pytest.approx(scores[0].item(), abs=1e-5)


def test_normalisation_prompts_default_to_the_distinct_prompts_of_train_data(tiny_llama_dir, data, tmp_path):
    rows = happy_pairs(6, seed=1)
    train = write_jsonl(tmp_path / "train.jsonl", rows + happy_pairs(3, seed=1))  # 3 prompts again
    fields = {"normalize.policy": str(tiny_llama_dir), "data.train": str(train)}
    config = make_config(tiny_llama_dir, data, tmp_path, **fields)
    tokenizer = AutoTokenizer.from_pretrained(tiny_llama_dir)
    prompts = reward_model.normalization_prompts(config, tokenizer, positions=512)
    assert [p.text for p in prompts] == [row["prompt"] for row in rows]


# --------------------------------------------------------------------------------------------------------------
# (e) learning
# --------------------------------------------------------------------------------------------------------------


def sum_pairs(n: int, seed: int) -> list[dict]:
    """The learning task: ``what is a + b?`` with the correct sum chosen over a wrong one (0..18), a, b < 10, each
    question asked by its own user (``user 17: what is …``): one pair per prompt, so a step of 32 prompts is 32 pairs
    of as many questions (the grouping of a prompt's pairs is tested on rankings above)."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        a, b = rng.randrange(10), rng.randrange(10)
        wrong = rng.choice([x for x in range(19) if x != a + b])
        rows.append({"prompt": f"user {i}: what is {a} + {b}?", "chosen": f" {a + b}", "rejected": f" {wrong}"})
    return rows


@pytest.fixture(scope="module")
def sums(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """2000 training comparisons and 200 held-out ones (drawn apart: the same (a, b) may occur in both)."""
    root = tmp_path_factory.mktemp("rm_sums")
    return {
        "train": write_jsonl(root / "train.jsonl", sum_pairs(2000, seed=1)),
        "eval": write_jsonl(root / "eval.jsonl", sum_pairs(200, seed=2)),
    }


def learn(model: Path, sums: dict[str, Path], out: Path, epochs: int) -> tuple[Path, list[dict], float]:
    """Train on the sums (batches of 32, lr 1e-3 decaying linearly); (final/, evaluation rows, seconds)."""
    start = time.perf_counter()
    final = reward_model.run(make_config(model, sums, out, **{"batch.size": 32, "rm.epochs": epochs}))
    seconds = time.perf_counter() - start
    return final, [row for row in metric_rows(out) if "eval/accuracy" in row], seconds


@pytest.mark.slow
def test_tiny_llama_from_scratch_learns_to_prefer_correct_sums(tiny_llama_dir, sums, tmp_path):
    """≥ 90% strict held-out accuracy within a CPU minute: 10 epochs of 2000 pairs (630 steps).

    Measured (2 threads): 48.5% before training, 91.5% after the 10th epoch. (Without the ``user i:`` tag, the 100
    questions asked ~20 times each, the same run reached 99%; grouped by prompt, each question is then one example
    and 4 a step take 30 epochs to reach 92%: docs/rankings.md.)
    """
    final, rows, seconds = learn(tiny_llama_dir, sums, tmp_path / "run", epochs=10)
    assert [row["step"] for row in rows] == [63 * e for e in range(11)]  # before training, each epoch
    assert rows[0]["eval/accuracy"] < 0.6 and rows[-1]["eval/accuracy"] >= 0.9, (rows, seconds)
    assert rows[-1]["eval/loss"] < rows[0]["eval/loss"] / 4
    # the saved model, scored the way ppo / eval score with it (text re-encoded, eos appended), agrees
    assert held_out_accuracy(final, sums["eval"]) == pytest.approx(rows[-1]["eval/accuracy"], abs=1e-6)


@pytest.mark.slow
def test_tiny_bert_with_its_own_wordpiece_tokenizer_learns_the_same_task(tiny_bert_dir, sums, tmp_path):
    """The encoder path: ``[CLS] prompt+response [SEP]``, BERT's own pooling and classifier, no eos.

    Measured, held-out accuracy before training and after each of 8 epochs (504 steps): 43%, 68, 91.5,
    97, 97.5, 98, 97, 98, 98% — ≈ 6.5 s.
    """
    final, rows, seconds = learn(tiny_bert_dir, sums, tmp_path / "run", epochs=8)
    assert rows[0]["eval/accuracy"] < 0.6 and rows[-1]["eval/accuracy"] >= 0.9, (rows, seconds)
    rm = RewardModelReward.load(str(final))
    tok = rm.tokenizer
    assert rm.eos_id is None and rm.encode(["what is 1 + 2?"], [" 3"])[0] == tok("what is 1 + 2? 3")["input_ids"]
    assert tok.convert_ids_to_tokens(rm.encode(["what is 1 + 2?"], [" 3"])[0][-2:]) == ["3", "[SEP]"]
    assert held_out_accuracy(final, sums["eval"]) == pytest.approx(rows[-1]["eval/accuracy"], abs=1e-6)


def test_reward_is_read_at_the_last_real_token_whatever_the_padding(tiny_llama_dir, tiny_bert_dir):
    for path in (tiny_llama_dir, tiny_bert_dir):
        rm = load_reward_model(str(path))
        tok = rm.tokenizer
        rows = [tok("tell me about a cat: the happy cat.")["input_ids"], tok("a dog")["input_ids"]]
        with torch.no_grad():
            alone = [reward_scores(rm.model, torch.tensor([r]), torch.ones(1, len(r), dtype=torch.long)).item()
                     for r in rows]  # fmt: skip
            width = max(map(len, rows)) + 3
            ids = torch.full((2, width), tok.pad_token_id)
            mask = torch.zeros((2, width), dtype=torch.long)
            for i, r in enumerate(rows):
                ids[i, : len(r)], mask[i, : len(r)] = torch.tensor(r), 1
            padded = reward_scores(rm.model, ids, mask).tolist()
        assert padded == pytest.approx(alone, abs=1e-5)


def test_gradient_checkpointing_gives_the_same_model(tiny_llama_dir, data, tmp_path):
    plain = reward_model.run(make_config(tiny_llama_dir, data, tmp_path / "plain"))
    fields = {"model.gradient_checkpointing": True}
    recomputed = reward_model.run(make_config(tiny_llama_dir, data, tmp_path / "ckpt", **fields))
    # the backward pass replays the forward's own operations: the same floats, the same steps
    assert max_abs_diff(load_file(plain / "model.safetensors"), load_file(recomputed / "model.safetensors")) == 0


def rankings_and_pairs(seed: int) -> tuple[list[dict], list[dict]]:
    """8 ranking rows (one per noun: a happy, a calm and a sad answer, listed worst first and ranked [2, 1, 0]) and
    the 24 pairs they imply, written out in the order a ranking is read (best against each worse, then the next)."""
    rng, rankings, pairs = random.Random(seed), [], []
    for noun in NOUNS:
        prompt = f"tell me about a {noun}:"
        answers = [
            f" the {mood} {noun} {rng.choice(VERBS)} a {rng.choice(NOUNS)}." for mood in ("happy", "calm", "sad")
        ]
        rankings.append({"prompt": prompt, "completions": answers[::-1], "ranking": [2, 1, 0]})
        pairs += [{"prompt": prompt, "chosen": answers[i], "rejected": answers[j]} for i, j in ((0, 1), (0, 2), (1, 2))]
    return rankings, pairs


def assert_rankings_train_as_their_pairs(run, config, data: dict[str, Path], tmp_path: Path, seed: int) -> None:
    """``run(config(train=…))`` on a file of rankings and on the file of their pairs gives the same model, bit for bit:
    the same pairs in the same order, the same float32 operations."""
    rankings, pairs = rankings_and_pairs(seed)
    finals = [
        run(config(data | {"train": write_jsonl(tmp_path / f"{name}.jsonl", rows)}, tmp_path / name))
        for name, rows in (("rankings", rankings), ("pairs", pairs))
    ]
    assert max_abs_diff(*(load_file(final / "model.safetensors") for final in finals)) == 0


def test_rankings_train_as_the_pairs_they_imply(tiny_llama_dir, data, tmp_path):
    """A file of rankings (k = 3: C(3,2) = 3 pairs each) trains the same reward model as the file of its pairs."""
    config = functools.partial(make_config, tiny_llama_dir)
    assert_rankings_train_as_their_pairs(reward_model.run, config, data, tmp_path, seed=4)


def test_a_step_forwards_each_answer_once_and_its_loss_averages_each_prompts_pairs(tiny_llama_dir, data, tmp_path):
    """InstructGPT's grouping: 8 rankings of 3 answers (24 pairs) in one step forward 24 sequences, not 48, and
    step 1's loss is the mean over the prompts of the mean of each prompt's Bradley–Terry losses, with every reward
    as a pairwise forward of the pair gives it (the untouched model, the run's seed)."""
    rankings, _ = rankings_and_pairs(seed=5)
    rankings[0] |= {"completions": [*rankings[0]["completions"], " a fourth answer."], "ranking": [2, 1, 3, 0]}
    train = write_jsonl(tmp_path / "rankings.jsonl", rankings)
    fields = {"data.train": str(train), "data.eval": None, "batch.size": 8, "run.seed": 3}
    config = make_config(tiny_llama_dir, data, tmp_path / "run", **fields)
    sequences: list[int] = []
    original = reward_model.answer_rewards

    def counted(scorer, groups, pad_id, device, chunk=None):
        rewards = original(scorer, groups, pad_id, device, chunk)
        sequences.append(len(rewards))
        return rewards

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(reward_model, "answer_rewards", counted)
        reward_model.run(config)
    assert sequences == [25]  # one pass: 7 prompts × 3 answers + 4 answers, each once
    (row,) = metric_rows(tmp_path / "run")

    seed_everything(3)  # the run's seed: the same fresh head
    rm = load_reward_model(str(tiny_llama_dir))
    pairs, _ = reward_model.load_pairs(config, rm)
    assert len(pairs) == 7 * 3 + 6
    with torch.no_grad():
        chosen, rejected, _ = pairwise_rewards(RewardScorer(rm.model), pairs, rm.tokenizer.pad_token_id)
    losses = -torch.nn.functional.logsigmoid(chosen - rejected)
    per_prompt = [losses[6:9].mean()] + [losses[i : i + 3].mean() for i in range(9, 27, 3)] + [losses[:6].mean()]
    assert row["train/loss"] == pytest.approx(torch.stack(per_prompt).mean().item(), rel=1e-5)
    assert row["train/accuracy"] == pytest.approx((chosen > rejected).float().mean().item(), abs=1e-6)


@pytest.mark.parametrize("micro_size", [5, 2, 1])
def test_passes_of_fewer_answers_train_the_same_model(tiny_llama_dir, data, tmp_path, micro_size):
    """Rankings of 3 and 4 answers in passes of 5 answers (prompts packed whole), 2 or 1 (every prompt split over
    passes, its gradient through the rewards scored first) train the model one pass trains. Tolerance: the same
    float32 sums regrouped by other padding widths and accumulation order, a few ulp per term (≲ 1e-6 relative)
    and over 2 AdamW steps at lr 1e-3 at most ~1e-5 apart where a gradient is near 0."""
    rankings, _ = rankings_and_pairs(seed=6)
    rankings[3] |= {"completions": [*rankings[3]["completions"], " the end."], "ranking": [2, [1, 3], 0]}
    train = write_jsonl(tmp_path / "rankings.jsonl", rankings)
    fields = {"data.train": str(train), "batch.size": 4, "rm.center_rewards_coefficient": 0.01}
    whole = reward_model.run(make_config(tiny_llama_dir, data, tmp_path / "whole", **fields))
    fields["batch.micro_size"] = micro_size
    passes = reward_model.run(make_config(tiny_llama_dir, data, tmp_path / "passes", **fields))
    assert max_abs_diff(load_file(whole / "model.safetensors"), load_file(passes / "model.safetensors")) < 2e-5
    assert_rows_match(*(comparable(metric_rows(tmp_path / run)) for run in ("whole", "passes")), rel=1e-4, abs=1e-6)


def test_an_ensemble_normalises_its_members_on_one_shared_sample(tiny_llama_dir, data, tmp_path):
    """With normalize.policy, every member is normalised on the same responses of the policy (the same prompts and
    answers, sampled once after the last member): under each member they score mean 0, std 1, so wco and uwo compare
    the members on one scale. The members' own runs are trained without normalising."""
    out = tmp_path / "ensemble"
    fields = {"rm.ensemble": 2, "normalize.policy": str(tiny_llama_dir), "normalize.prompts": str(data["prompts"]),
              "normalize.samples": 12, "normalize.max_new_tokens": 8, "batch.micro_size": 4}  # fmt: skip
    final = reward_model.run(make_config(tiny_llama_dir, data, out, **fields))
    runs = [out / "members" / f"member_{m}" for m in range(2)]
    rows = [
        [json.loads(line) for line in (run / reward_model.NORMALIZATION_FILE).read_text().splitlines()] for run in runs
    ]
    assert [(r["prompt"], r["completion"]) for r in rows[0]] == [(r["prompt"], r["completion"]) for r in rows[1]]
    assert len({r["completion"] for r in rows[0]}) > 6  # really sampled, not one answer repeated
    assert [r["score"] for r in rows[0]] != [r["score"] for r in rows[1]]  # two models: two raw scales
    for m, run in enumerate(runs):
        assert yaml.safe_load((run / "config.yaml").read_text())["normalize"]["policy"] is None
        # the ensemble's copy of the member (a hard link) carries the normalisation a consumer applies
        assert (final / f"member_{m}" / "config.json").stat().st_ino == (run / "final" / "config.json").stat().st_ino
        consumer = RewardModelReward.load(str(final / f"member_{m}"))
        scores = torch.tensor(consumer.score([r["prompt"] for r in rows[m]], [r["completion"] for r in rows[m]], {}))
        # re-scored in other batches than the measurement's: float32 rounding of the forward only
        assert scores.mean().item() == pytest.approx(0.0, abs=1e-5)
        assert scores.std(correction=0).item() == pytest.approx(1.0, abs=1e-5)


def test_an_ensemble_is_its_members_runs_and_resumes_member_by_member(tiny_llama_dir, data, tmp_path, monkeypatch):
    """`rm.ensemble 3`: member m is the run of run.seed + m in members/member_<m>/ (member 1 here against a single
    run of seed 1, bit for bit); final/ is the ensemble, one reward source, its members hard links. Killed after
    member 1's checkpoint, `--run.resume` keeps member 0 untouched, continues member 1 and trains member 2 into the
    same ensemble; a resume with another config is refused naming the finished member."""
    fields = {"rm.ensemble": 3, "run.save_every": 2}
    whole = reward_model.run(make_config(tiny_llama_dir, data, tmp_path / "whole", **fields))
    manifest = json.loads((whole / "ensemble.json").read_text())
    assert manifest["members"] == ["member_0", "member_1", "member_2"] and manifest["seeds"] == [0, 1, 2]
    accuracy = manifest["held_out_accuracy"]
    assert set(accuracy) == {"member_0", "member_1", "member_2", "mean", "wco"}
    assert all(0 <= value <= 1 for value in accuracy.values())
    single = reward_model.run(make_config(tiny_llama_dir, data, tmp_path / "single", **{"run.seed": 1}))
    weights = [load_file(whole / f"member_{m}" / "model.safetensors") for m in range(3)]
    assert max_abs_diff(weights[1], load_file(single / "model.safetensors")) == 0
    assert max_abs_diff(weights[0], weights[1]) > 0 and max_abs_diff(weights[1], weights[2]) > 0
    trained = tmp_path / "whole" / "members" / "member_1" / "final" / "model.safetensors"
    assert (whole / "member_1" / "model.safetensors").stat().st_ino == trained.stat().st_ino
    assert isinstance(load_reward_source(str(whole)), EnsembleReward)

    out, original = tmp_path / "resumed", train_state.save_checkpoint

    def dies_in_member_1(output_dir, step, *args, **kwargs):
        path = original(output_dir, step, *args, **kwargs)
        if Path(output_dir).name == "member_1" and step == 2:
            raise Interrupted
        return path

    with monkeypatch.context() as patch, pytest.raises(Interrupted):
        patch.setattr(train_state, "save_checkpoint", dies_in_member_1)
        reward_model.run(make_config(tiny_llama_dir, data, out, **fields))
    with pytest.raises(ConfigError, match="ensemble member member_0 was trained with optim.learning_rate"):
        reward_model.run(
            make_config(tiny_llama_dir, data, out, **fields, **{"run.resume": True, "optim.learning_rate": 5e-4})
        )
    kept = out / "members" / "member_0" / "final" / "model.safetensors"
    before = kept.stat().st_mtime_ns
    with counting(monkeypatch, reward_model, "train_step") as steps:
        resumed = reward_model.run(make_config(tiny_llama_dir, data, out, **fields, **{"run.resume": True}))
    assert len(steps) == 1 + 3 and kept.stat().st_mtime_ns == before  # member 1's step 3, member 2's three
    for m in range(3):  # continued from a checkpoint, as the single-run resume above: the same float32 operations
        assert max_abs_diff(load_file(resumed / f"member_{m}" / "model.safetensors"), weights[m]) <= 1e-6
