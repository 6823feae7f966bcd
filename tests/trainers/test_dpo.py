"""`rlhf dpo` end to end on the session's tiny random-init Llama (test layers c-e, docs/architecture.md).

Data: the toy preference of test_reward_model.py — the chosen sentence is the *happy* one — 24 training pairs
and 16 held out. Each run is a real `rlhf.trainers.dpo.run(config)`, a few steps (about a second).
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from test_reward_model import assert_rankings_train_as_their_pairs, happy_pairs, rankings_and_pairs, write_jsonl
from transformers import AutoModelForCausalLM

from configs import nested
from rlhf.config import ConfigError, LoRAConfig, config_from_dict
from rlhf.data import TokenizedSFT, load_preferences
from rlhf.data.groups import group_preferences
from rlhf.data.tokenization import IGNORE_INDEX
from rlhf.models.loading import apply_lora, load_tokenizer
from rlhf.models.sharding import load_lm
from rlhf.runlog.distributed import SINGLE
from rlhf.trainers import dpo
from rlhf.trainers.sft import Batcher, token_losses
from runs import (
    assert_rows_match,
    assert_same_checkpoint,
    comparable,
    counting,
    dies_after_checkpoint,
    max_abs_diff,
    metric_rows,
)

TRAIN_METRICS = ["train/loss", "rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies",
                 "logps/chosen", "logps/rejected", "grad/norm", "lr"]  # fmt: skip
EVAL_METRICS = [f"eval/{name}" for name in dpo.METRICS]


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("dpo_data")
    return {
        "train": write_jsonl(root / "train.jsonl", happy_pairs(24, seed=1)),
        "eval": write_jsonl(root / "eval.jsonl", happy_pairs(16, seed=2)),
        "many": write_jsonl(root / "many.jsonl", happy_pairs(96, seed=3)),
    }


def make_config(model: Path, data: dict[str, Path], out: Path, **overrides: object):
    values = {
        "model.name": str(model), "data.train": str(data["train"]), "data.eval": str(data["eval"]),
        "output_dir": str(out), "batch.size": 8, "optim.learning_rate": 1e-3, "dpo.epochs": 1,
        "run.eval_every": 0, "run.save_every": 0, "run.progress": False,
    }  # fmt: skip
    return config_from_dict("dpo", nested(values | overrides))


def test_a_run_logs_the_usual_metrics_and_saves_a_model_transformers_loads(tiny_llama_dir, data, tmp_path):
    final = dpo.run(make_config(tiny_llama_dir, data, tmp_path / "run"))
    rows = metric_rows(tmp_path / "run")
    assert [row["step"] for row in rows] == [0, 1, 2, 3]
    assert all(key in rows[0] for key in EVAL_METRICS)
    assert all(key in row for row in rows[1:] for key in TRAIN_METRICS)
    assert all(key in rows[-1] for key in EVAL_METRICS)  # end of the epoch
    # step 0: the policy is the reference, so every implicit reward is 0 and the loss is log 2. The tolerance:
    # reference and policy log-probs are float32 sums over ≤ 20 tokens of the same forward, padded to other
    # lengths (another batch), a few ulp of values ≲ 60 apart: ≲ 1e-4 nats, times β = 0.1
    assert rows[0]["eval/rewards/margins"] == pytest.approx(0.0, abs=1e-4)
    assert rows[0]["eval/loss"] == pytest.approx(0.6931471805599453, abs=1e-4)
    model = AutoModelForCausalLM.from_pretrained(final)
    assert model.config.model_type == "llama"


def test_dpo_raises_the_margin_and_held_out_accuracy(tiny_llama_dir, data, tmp_path):
    out = tmp_path / "learn"
    dpo.run(make_config(tiny_llama_dir, data | {"train": data["many"]}, out, **{"dpo.epochs": 2, "batch.size": 16}))
    rows = metric_rows(out)
    first, last = rows[0], rows[-1]
    assert last["eval/rewards/margins"] > first["eval/rewards/margins"] + 0.1
    assert last["eval/rewards/accuracies"] > 0.5 and last["eval/loss"] < first["eval/loss"]


def test_a_large_beta_keeps_the_policy_near_the_reference(tiny_llama_dir, data, tmp_path):
    moved = {}
    for beta in (0.1, 10.0):
        out = tmp_path / f"beta{beta}"
        dpo.run(
            make_config(tiny_llama_dir, data | {"train": data["many"]}, out, **{"dpo.beta": beta, "batch.size": 16})
        )
        rows = metric_rows(out)
        # |Δ log π| of the held-out chosen answers: rewards/chosen is β·Δ, so divide β out
        moved[beta] = abs(rows[-1]["eval/rewards/chosen"]) / beta + abs(rows[-1]["eval/rewards/rejected"]) / beta
    assert moved[10.0] < moved[0.1]


@pytest.mark.parametrize("loss", ["sigmoid", "robust", "ipo", "simpo"])
def test_every_loss_trains(tiny_llama_dir, data, tmp_path, loss):
    smoothing = 0.1 if loss in ("sigmoid", "robust") else 0.0
    dpo.run(make_config(tiny_llama_dir, data, tmp_path / loss, **{"dpo.loss": loss, "dpo.label_smoothing": smoothing}))
    rows = metric_rows(tmp_path / loss)
    assert all(row["train/loss"] == row["train/loss"] for row in rows[1:])  # finite, not NaN


def test_the_reference_of_a_lora_run_is_the_base_model(tiny_llama_dir, data):
    tokenizer = load_tokenizer(str(tiny_llama_dir))
    groups = group_preferences(load_preferences(data["eval"], tokenizer, 64))
    batches = Batcher(8, False, 64, int(tokenizer.eos_token_id), torch.device("cpu"))
    lora = apply_lora(load_lm(str(tiny_llama_dir), "float32", SINGLE), LoRAConfig(r=4, alpha=8))
    base = load_lm(str(tiny_llama_dir), "float32", SINGLE, None)
    # LoRA's B matrices start at 0: the adapted model computes the base model's function, up to float32
    # rounding of the extra (zero) terms
    torch.testing.assert_close(torch.cat(dpo.reference_logps(lora, groups, batches)),
                               torch.cat(dpo.reference_logps(base, groups, batches)), rtol=1e-6, atol=1e-5)  # fmt: skip


def test_the_cached_reference_equals_a_frozen_copy_scoring_each_answer_alone(
    tiny_llama_dir, data, tmp_path, monkeypatch
):
    """The reference log-probs are computed once, before training, one per answer, and every step gets the same
    ones: each must equal what a separate frozen copy of the starting model gives for that answer alone."""
    seen: list[tuple[list, list]] = []
    original = dpo.train_step

    def recording(config, trainable, groups, reference, batches, indices):
        seen.append((groups, reference))
        return original(config, trainable, groups, reference, batches, indices)

    monkeypatch.setattr(dpo, "train_step", recording)
    rankings, _ = rankings_and_pairs(seed=7)
    train = write_jsonl(tmp_path / "rankings.jsonl", rankings)
    dpo.run(make_config(tiny_llama_dir, data | {"train": train}, tmp_path / "run", **{"batch.micro_size": 2}))
    groups, reference = seen[0]
    assert len(seen) == 1 and len(groups) == 8 and [len(r) for r in reference] == [3] * 8
    tokenizer = load_tokenizer(str(tiny_llama_dir))
    frozen = load_lm(str(tiny_llama_dir), "float32", SINGLE, None)
    batches = Batcher(8, False, 64, int(tokenizer.eos_token_id), torch.device("cpu"))
    for group, values in zip(groups, reference, strict=True):
        for answer, value in zip(group.answers, values, strict=True):
            ids = group.prompt_ids + answer
            example = TokenizedSFT("x", ids, [IGNORE_INDEX] * len(group.prompt_ids) + answer)
            with torch.no_grad():
                per_token, mask = token_losses(frozen, batches.padded([example]))
            # the same float32 forward, unpadded instead of padded: a few ulps of a sum ≲ 60 nats
            assert value.item() == pytest.approx(-(per_token * mask).sum().item(), abs=1e-4)


@pytest.mark.parametrize("micro_size", [2, 1])
def test_passes_of_fewer_answers_give_the_same_run(tiny_llama_dir, data, tmp_path, micro_size):
    """Passes of 2 answers (a prompt's pair in one pass) or 1 (each prompt split over two passes, its gradient through
    the log-probs scored first) train as one pass of the step's 16 answers does."""
    dpo.run(make_config(tiny_llama_dir, data, tmp_path / "whole"))
    dpo.run(make_config(tiny_llama_dir, data, tmp_path / "micro", **{"batch.micro_size": micro_size}))
    # float32 sums over 8 pairs grouped otherwise, and padding to other lengths: a few ulp of the terms (≤ ~60 nats
    # for log-probs), carried through 3 AdamW steps
    assert_rows_match(comparable(metric_rows(tmp_path / "whole")), comparable(metric_rows(tmp_path / "micro")),
                      rel=1e-4, abs=1e-4)  # fmt: skip


def test_resume_reproduces_the_uninterrupted_run(tiny_llama_dir, data, tmp_path, monkeypatch):
    fields = {"dpo.epochs": 2, "run.save_every": 2, "run.eval_every": 2}
    dpo.run(make_config(tiny_llama_dir, data, tmp_path / "whole", **fields))
    with dies_after_checkpoint(monkeypatch, 4):
        dpo.run(make_config(tiny_llama_dir, data, tmp_path / "resumed", **fields))
    with counting(monkeypatch, dpo, "train_step") as steps:
        dpo.run(make_config(tiny_llama_dir, data, tmp_path / "resumed", **{"run.resume": True}, **fields))
    assert len(steps) == 2
    # the same float32 operations in the same order: the bounds are a few ulp of values ≲ 60
    assert_rows_match(comparable(metric_rows(tmp_path / "whole")), comparable(metric_rows(tmp_path / "resumed")),
                      rel=1e-6, abs=1e-5)  # fmt: skip
    assert_same_checkpoint(tmp_path / "whole", tmp_path / "resumed")  # a continuation from either is the same


def test_a_labels_file_trains_as_it_is(tiny_llama_dir, data, tmp_path):
    rows = [{"kind": "session"}]
    for i, row in enumerate(happy_pairs(8, seed=5)):
        rows.append({"kind": "preference", "id": f"l{i}", "pair": f"p{i}", **row})
    rows.append({"kind": "retraction", "id": "r", "retracts": "l0"})
    labels = write_jsonl(tmp_path / "labels.jsonl", rows)
    dpo.run(make_config(tiny_llama_dir, {"train": labels, "eval": data["eval"]}, tmp_path / "run", **{"batch.size": 7}))
    assert [row["step"] for row in metric_rows(tmp_path / "run")] == [0, 1]  # 7 live pairs: one step of 7


def test_rankings_train_as_the_pairs_they_imply(tiny_llama_dir, data, tmp_path):
    """As for the reward model (tests/trainers/test_reward_model.py): a ranking is read as its pairs, in order."""
    config = functools.partial(make_config, tiny_llama_dir)
    assert_rankings_train_as_their_pairs(dpo.run, config, data, tmp_path, seed=5)


def test_refused_combinations(tiny_llama_dir, data, tmp_path):
    with pytest.raises(ConfigError, match="no meaning for dpo.loss='ipo'"):
        make_config(tiny_llama_dir, data, tmp_path / "x", **{"dpo.loss": "ipo", "dpo.label_smoothing": 0.1})


def test_a_lora_run_saves_a_plain_merged_model(tiny_llama_dir, data, tmp_path):
    final = dpo.run(make_config(tiny_llama_dir, data, tmp_path / "lora", **{"model.lora": {"r": 4, "alpha": 8}}))
    assert not (final / "adapter_config.json").exists()
    assert AutoModelForCausalLM.from_pretrained(final).config.model_type == "llama"


def test_gradient_checkpointing_gives_the_same_model(tiny_llama_dir, data, tmp_path):
    plain = dpo.run(make_config(tiny_llama_dir, data, tmp_path / "plain"))
    recomputed = dpo.run(make_config(tiny_llama_dir, data, tmp_path / "ckpt", **{"model.gradient_checkpointing": True}))
    # the backward pass replays the forward's own operations: the same floats, the same steps
    assert max_abs_diff(load_file(plain / "model.safetensors"), load_file(recomputed / "model.safetensors")) == 0
