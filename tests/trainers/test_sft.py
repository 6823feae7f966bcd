"""`rlhf sft` end to end on tiny random-init models (test layers b-e, docs/architecture.md).

The data: 64 questions from the toy language, "what is 2 + 3?" → " 5" (61 trained on, 3 held out for
eval/loss), or 10 of them for the single-step equivalence runs (no held-out slice below 20 examples).
Each run is a real `rlhf.trainers.sft.run(config)`; the loss-level checks call the trainer's own
`token_losses` and `Batcher`, the functions its loop uses.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml
from safetensors.torch import load_file
from torch import nn
from transformers import AutoModelForCausalLM

from chat_models import chat_tokenizer
from configs import nested
from rlhf import cli
from rlhf.config import ConfigError, config_from_dict
from rlhf.data import IGNORE_INDEX, SFTExample, chat, load_sft, tokenize_sft
from rlhf.models.loading import load_causal_lm, load_tokenizer
from rlhf.models.tiny import toy_corpus
from rlhf.runlog.distributed import SINGLE, Dist
from rlhf.trainers import sft
from runs import (
    assert_rows_match,
    assert_same_checkpoint,
    comparable,
    counting,
    dies_after_checkpoint,
    max_abs_diff,
    metric_rows,
)
from tiny_models import tiny_family_lm

LORA = {"r": 4, "alpha": 8.0, "target_modules": ["q_proj", "v_proj"]}
SFT_METRICS = ["step", "epoch", "train/loss", "grad/norm", "lr", "time/step_s", "throughput/tokens_per_s"]


def questions(n: int, seed: int = 3) -> list[dict]:
    rows = []
    for line in toy_corpus(8 * n, seed=seed):
        if line.startswith("what is"):
            question, answer = line.split("?")
            rows.append({"prompt": question + "?", "response": answer})
    return rows[:n]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("sft_data")
    write_jsonl(root / "train.jsonl", questions(64))
    write_jsonl(root / "small.jsonl", questions(10, seed=4))
    chat = [
        {"messages": [
            {"role": "system", "content": "answer with a number"},
            {"role": "user", "content": row["prompt"]},
            {"role": "assistant", "content": row["response"].strip()},
            {"role": "user", "content": "and plus one?"},
            {"role": "assistant", "content": str(int(row["response"]) + 1)},
        ]}
        for row in questions(24, seed=5)
    ]  # fmt: skip
    write_jsonl(root / "chat.jsonl", chat)
    return root


def make_config(model: Path, data: Path, out: Path, **overrides: object):
    """A small, fast SFT config: batches of 8, a high learning rate, no checkpoints, no progress bar."""
    values = {
        "model.name": str(model),
        "data.train": str(data),
        "output_dir": str(out),
        "sft.epochs": 1,
        "batch.size": 8,
        "optim.learning_rate": 3e-3,
        "data.max_length": 64,
        "run.eval_every": 0,
        "run.save_every": 0,
        "run.progress": False,
    }
    return config_from_dict("sft", nested(values | overrides))


def run_recording_gradients(config, clipped_gradients: list[torch.Tensor]) -> tuple[Path, list]:
    """Run; also return the gradient of every trainable parameter at each optimizer step (before clipping),
    as the ``clipped_gradients`` fixture records them."""
    clipped_gradients.clear()
    final = sft.run(config)
    return final, list(clipped_gradients)


# --------------------------------------------------------------------------------------------------------------
# (e) learning, with the eval schedule and final/
# --------------------------------------------------------------------------------------------------------------


def test_loss_falls_and_eval_runs_before_training_every_eval_every_and_per_epoch(tiny_llama_dir, data_dir, tmp_path):
    """Observed (torch 2.13 CPU, ≈0.4 s for the 32 steps): eval/loss 5.92 at step 0 → 1.73 after 4 epochs;
    train/loss 5.99 at step 1 → 1.6-1.8 in the last epoch (the digit of a sum is ≈ ln 10 = 2.3 nats to a
    model that has not learnt to add; the eos after it is free). The margin asserted is 2.5 nats."""
    out = tmp_path / "run"
    final = sft.run(
        make_config(tiny_llama_dir, data_dir / "train.jsonl", out, **{"sft.epochs": 4, "run.eval_every": 5})
    )

    rows = metric_rows(out)
    # 61 training examples / 8 per step = 8 steps per epoch (the last one of 5); 3 held out for eval/loss
    assert [row["step"] for row in rows] == list(range(33))
    evals = [row["step"] for row in rows if "eval/loss" in row]
    assert evals == [0, 5, 8, 10, 15, 16, 20, 24, 25, 30, 32]  # before, every 5, at each epoch's end (8k)
    assert rows[0] == {"step": 0, "epoch": 0.0, "eval/loss": rows[0]["eval/loss"]}
    for row in rows[1:]:
        assert all(key in row for key in SFT_METRICS), row
        assert row["epoch"] == pytest.approx(row["step"] / 8)
    first, last = rows[0]["eval/loss"], rows[-1]["eval/loss"]
    assert last < first - 2.5, (first, last)
    assert sum(row["train/loss"] for row in rows[-8:]) / 8 < rows[1]["train/loss"] - 2.5
    assert rows[1]["lr"] == 3e-3 and rows[-1]["lr"] == pytest.approx(3e-3 / 32)  # linear decay over 32 steps

    # final/ is an ordinary checkpoint: AutoModelForCausalLM + tokenizer, the trained weights
    model = AutoModelForCausalLM.from_pretrained(final)
    assert max_abs_diff(model.state_dict(), load_file(tiny_llama_dir / "model.safetensors")) > 1e-3
    tokenizer = load_tokenizer(str(final))
    assert tokenizer.eos_token_id == load_tokenizer(str(tiny_llama_dir)).eos_token_id
    assert yaml.safe_load((out / "config.yaml").read_text())["sft"]["epochs"] == 4


# --------------------------------------------------------------------------------------------------------------
# (b) prompt tokens carry no loss
# --------------------------------------------------------------------------------------------------------------


class NoiseAt(nn.Module):
    """The model, with large random numbers added to the logits of the positions ``where`` (R, L) is True."""

    def __init__(self, model: nn.Module, where: torch.Tensor):
        super().__init__()
        self.model, self.where = model, where

    def forward(self, **inputs):
        logits = self.model(**inputs).logits
        return SimpleNamespace(logits=logits + 100 * torch.randn_like(logits) * self.where[..., None])


@pytest.mark.parametrize("packing", [False, True], ids=["padded", "packed"])
def test_prompt_tokens_carry_no_loss(tiny_llama_dir, data_dir, packing):
    tokenizer = load_tokenizer(str(tiny_llama_dir))
    examples = load_sft(data_dir / "small.jsonl", tokenizer, max_length=64)
    rows_in_file = [json.loads(line) for line in (data_dir / "small.jsonl").read_text().splitlines()]
    # the labels: IGNORE_INDEX on every prompt token, the response and its eos labelled
    for example, row in zip(examples, rows_in_file, strict=True):
        n_prompt = len(tokenizer(row["prompt"], add_special_tokens=False)["input_ids"])
        assert example.labels[:n_prompt] == [IGNORE_INDEX] * n_prompt
        assert example.labels[n_prompt:] == example.input_ids[n_prompt:]
        assert tokenizer.decode(example.labels[n_prompt:]) == row["response"] + tokenizer.eos_token
    # ... and they survive collation: the labelled tokens of the rows are exactly the responses
    batcher = sft.Batcher(len(examples), packing, 64, tokenizer.eos_token_id, "cpu")
    (rows,) = batcher(examples)
    labelled = rows.labels[rows.labels != IGNORE_INDEX].tolist()
    assert sorted(labelled) == sorted(t for e in examples for t in e.labels if t != IGNORE_INDEX)
    assert rows.input_ids.shape[0] == (2 if packing else len(examples))  # 10 × 11-12 tokens in rows of 64

    # the loss: logits that predict a prompt (or padding) token may be anything; the others may not
    model = load_causal_lm(str(tiny_llama_dir))
    predicts_prompt = torch.ones_like(rows.labels, dtype=torch.bool)
    predicts_prompt[:, :-1] = rows.labels[:, 1:] == IGNORE_INDEX
    per_token, mask = sft.token_losses(model, rows)
    noisy, noisy_mask = sft.token_losses(NoiseAt(model, predicts_prompt), rows)
    assert torch.equal(mask, noisy_mask) and mask.sum() == sum(sft.label_tokens(e) for e in examples)
    assert torch.equal(per_token[mask], noisy[mask])
    assert not torch.equal(per_token[~mask], noisy[~mask])  # the noise did reach the prompt positions
    elsewhere, _ = sft.token_losses(NoiseAt(model, ~predicts_prompt), rows)
    assert (elsewhere[mask] - per_token[mask]).abs().min() > 0  # noise on response positions changes all

    # and the gradient flows into response predictions only
    logits = model(input_ids=rows.input_ids, attention_mask=rows.attention_mask, position_ids=rows.position_ids,
                   use_cache=False).logits.detach().requires_grad_()  # fmt: skip
    per_token, mask = sft.token_losses(lambda **_: SimpleNamespace(logits=logits), rows)
    (per_token * mask).sum().backward()
    grad_norm = logits.grad.abs().sum(-1)
    assert grad_norm[predicts_prompt].max() == 0
    assert grad_norm[~predicts_prompt].min() > 0


def test_chat_messages_train_on_the_assistant_turns(tiny_llama_dir, data_dir, tmp_path):
    tokenizer = load_tokenizer(str(tiny_llama_dir))
    examples = load_sft(data_dir / "chat.jsonl", tokenizer, max_length=64)
    first = json.loads((data_dir / "chat.jsonl").read_text().splitlines()[0])["messages"]
    trained = tokenizer.decode([t for t in examples[0].labels if t != IGNORE_INDEX])
    assert trained == f"{first[2]['content']}<|eos|>{first[4]['content']}<|eos|>"  # both answers, nothing else

    out = tmp_path / "run"
    final = sft.run(make_config(tiny_llama_dir, data_dir / "chat.jsonl", out, **{"sft.epochs": 2}))
    rows = metric_rows(out)
    assert [row["step"] for row in rows] == [0, 1, 2, 3, 4, 5, 6]  # 23 examples, 1 held out: 3 steps/epoch
    assert rows[-1]["eval/loss"] < rows[0]["eval/loss"]
    assert (final / "chat_template.jinja").is_file()


# --------------------------------------------------------------------------------------------------------------
# (b) equivalences: micro-batching, packing, resume
# --------------------------------------------------------------------------------------------------------------


def test_micro_batching_gives_the_same_update(tiny_llama_dir, data_dir, tmp_path, clipped_gradients, adam_steps):
    # one optimizer step on all 10 examples: in one pass, or in micro-batches of 4, 4 and 2 of other lengths
    fields = {"batch.size": 16, "data.eval": str(data_dir / "small.jsonl")}
    small = data_dir / "small.jsonl"
    whole, whole_grads = run_recording_gradients(
        make_config(tiny_llama_dir, small, tmp_path / "whole", **fields), clipped_gradients
    )
    micro, micro_grads = run_recording_gradients(
        make_config(tiny_llama_dir, small, tmp_path / "micro", **{"batch.micro_size": 4}, **fields), clipped_gradients
    )
    # the accumulated gradient is the whole batch's: float32 sums over ≤ 10 examples of ≤ 64 tokens in
    # another grouping differ by a few ulp of the partial sums (|g| ≤ 1), far inside rtol 1e-5 / atol 1e-7
    assert len(micro_grads) == len(whole_grads) > 0
    for g_micro, g_whole in zip(micro_grads, whole_grads, strict=True):
        torch.testing.assert_close(g_micro, g_whole, rtol=1e-5, atol=1e-7)
    # ... and each run's weights are exactly what one clipped AdamW step makes of its gradient
    initial = load_file(tiny_llama_dir / "model.safetensors")
    names = [name for name, _ in AutoModelForCausalLM.from_pretrained(tiny_llama_dir).named_parameters()]
    for out, grads in ((whole, whole_grads), (micro, micro_grads)):
        predicted, tolerance = adam_steps(initial, [dict(zip(names, grads, strict=True))], [3e-3], 1.0)
        final = load_file(out / "model.safetensors")
        for name in names:
            assert ((final[name] - predicted[name]).abs() <= tolerance[name]).all(), (out.parent.name, name)
    assert max_abs_diff(load_file(whole / "model.safetensors"), initial) > 1e-3  # the step moved the weights
    a, b = metric_rows(tmp_path / "whole"), metric_rows(tmp_path / "micro")
    # the logged loss, norm and means sum 10 examples × ≤ 12 tokens in another grouping (per micro-batch, then added):
    # float32 sums of ≤ 120 terms of one sign differ by ≲ 120·2⁻²⁴ ≈ 7e-6 relative, inside rel 1e-5
    for key in ("train/loss", "grad/norm", "eval/loss"):
        assert b[1][key] == pytest.approx(a[1][key], rel=1e-5), key


@pytest.mark.parametrize("arch", ["llama", "gpt2", "qwen2"])
def test_packing_gives_the_same_loss_and_gradient(tiny_model_dir_factory, data_dir, tmp_path, clipped_gradients, arch):
    model_dir = tiny_model_dir_factory(arch)
    small = data_dir / "small.jsonl"
    fields = {"batch.size": 16, "batch.micro_size": 8, "data.eval": str(small)}  # micro-batches of 8 and 2
    _, padded_grads = run_recording_gradients(
        make_config(model_dir, small, tmp_path / "padded", **fields), clipped_gradients
    )
    _, packed_grads = run_recording_gradients(
        make_config(model_dir, small, tmp_path / "packed", **{"sft.packing": True, "data.max_length": 32}, **fields),
        clipped_gradients,
    )
    for g_packed, g_padded in zip(packed_grads, padded_grads, strict=True):
        torch.testing.assert_close(g_packed, g_padded, rtol=1e-4, atol=1e-6)
    a, b = metric_rows(tmp_path / "padded"), metric_rows(tmp_path / "packed")
    for row_a, row_b in zip(a, b, strict=True):
        for key in ("eval/loss", "train/loss", "grad/norm"):
            if key in row_a:
                assert row_b[key] == pytest.approx(row_a[key], abs=1e-5), (row_a["step"], key)

    # token by token, and the rows really were packed: 8 examples of 11-12 tokens, two per row of 32
    tokenizer = load_tokenizer(str(model_dir))
    examples = load_sft(small, tokenizer, max_length=32)[:8]
    model = load_causal_lm(str(model_dir))
    padded = sft.Batcher(8, False, 32, tokenizer.eos_token_id, "cpu")(examples)[0]
    packed = sft.Batcher(8, True, 32, tokenizer.eos_token_id, "cpu")(examples)[0]
    assert packed.input_ids.shape[0] == 4 and packed.attention_mask is None
    loss_padded, mask_padded = sft.token_losses(model, padded)
    loss_packed, mask_packed = sft.token_losses(model, packed)
    # first-fit decreasing reorders the examples; compare the sorted per-token losses
    torch.testing.assert_close(
        loss_packed[mask_packed].sort().values, loss_padded[mask_padded].sort().values, rtol=0, atol=1e-5
    )


TOOL_CALL = {"type": "function", "function": {"name": "calculator", "arguments": {"expression": "2 + 3"}},
             "id": "call00000"}  # fmt: skip


def tool_conversation(a: int, b: int, trace: bool) -> list[dict]:
    """A call, its result and the answer, then a follow-up question; with ``trace``, reasoning in the call turn."""
    call = {"role": "assistant", "content": "", "tool_calls": [TOOL_CALL]}
    if trace:
        call["reasoning_content"] = "use the calculator"
    return [
        {"role": "user", "content": f"what is {a} + {b}?"},
        call,
        {"role": "tool", "name": "calculator", "content": str(a + b), "tool_call_id": "call00000"},
        {"role": "assistant", "content": str(a + b)},
        {"role": "user", "content": "and plus one?"},
        {"role": "assistant", "content": str(a + b + 1), "reasoning_content": "one more" if trace else None},
    ]


@pytest.mark.parametrize("thinking", [{}, {"enable_thinking": False}], ids=["thinking", "not-thinking"])
def test_packing_tool_conversations_gives_the_same_per_token_loss(thinking):
    """Qwen3's tool conversations, labelled on the whole conversation's rendering: packed into shared rows, every
    labelled token keeps the loss it has in its own padded row (packing only concatenates labelled rows)."""
    tokenizer = chat_tokenizer("qwen3")
    chat.set_template_kwargs(tokenizer, thinking)
    try:
        rows = [SFTExample(f"t:{i}", messages=tool_conversation(i % 3, i % 4, trace=not thinking)) for i in range(6)]
        examples = tokenize_sft(rows, tokenizer)
    finally:
        chat.set_template_kwargs(tokenizer, {})  # the tokenizer is shared between tests
    model = tiny_family_lm("qwen2", tokenizer)
    longest = max(len(e.input_ids) for e in examples)
    padded = sft.Batcher(6, False, 2 * longest, tokenizer.eos_token_id, "cpu")(examples)[0]
    packed = sft.Batcher(6, True, 2 * longest, tokenizer.eos_token_id, "cpu")(examples)[0]
    assert packed.input_ids.shape[0] == 3 and packed.attention_mask is None  # two conversations a row
    loss_padded, mask_padded = sft.token_losses(model, padded)
    loss_packed, mask_packed = sft.token_losses(model, packed)
    labelled = sorted(t for e in examples for t in e.labels if t != IGNORE_INDEX)
    assert sorted(packed.labels[packed.labels != IGNORE_INDEX].tolist()) == labelled  # the same labels, all of them
    assert mask_packed.sum() == mask_padded.sum() == len(labelled)
    # the same float32 logits from rows of other lengths and positions: a ~400-way cross-entropy of magnitude ~6 apart
    # by rounding alone (1e-5 is ~100 ulps), as the plain packing test above bounds it
    torch.testing.assert_close(
        loss_packed[mask_packed].sort().values, loss_padded[mask_padded].sort().values, rtol=0, atol=1e-5
    )


class IgnoresPacking(nn.Module):
    """A model whose attention spans the whole row whatever the position ids: what packing must never train."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model, self.config = model, model.config

    def forward(self, input_ids, attention_mask=None, **kwargs):
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        return self.model(input_ids=input_ids, attention_mask=attention_mask, **kwargs)


def test_packing_is_refused_for_a_model_that_lets_examples_see_each_other(tiny_llama_dir, data_dir):
    tokenizer = load_tokenizer(str(tiny_llama_dir))
    examples = load_sft(data_dir / "small.jsonl", tokenizer, max_length=64)
    model = load_causal_lm(str(tiny_llama_dir))
    sft.check_packing(model, examples, tokenizer.eos_token_id, "cpu")  # the real model passes
    with pytest.raises(ConfigError, match=r"packing=true, but this llama model lets packed examples see"):
        sft.check_packing(IgnoresPacking(model), examples, tokenizer.eos_token_id, "cpu")


@pytest.mark.parametrize(
    "variant", [{}, {"model.lora": LORA, "sft.packing": True, "batch.micro_size": 4}], ids=["full", "lora-packed-micro"]
)
def test_resume_reproduces_the_uninterrupted_run(tiny_llama_dir, data_dir, tmp_path, monkeypatch, variant):
    # 2 epochs of 8 steps; interrupted after the checkpoint of step 6 (mid-epoch), resumed to the end
    fields = {"sft.epochs": 2, "run.save_every": 3, "run.eval_every": 4, **variant}
    train = data_dir / "train.jsonl"
    whole = sft.run(make_config(tiny_llama_dir, train, tmp_path / "whole", **fields))
    with dies_after_checkpoint(monkeypatch, 6):
        sft.run(make_config(tiny_llama_dir, train, tmp_path / "resumed", **fields))
    with counting(monkeypatch, sft, "token_losses") as steps:
        resumed = sft.run(make_config(tiny_llama_dir, train, tmp_path / "resumed", **{"run.resume": True}, **fields))
    # steps 7-16 only: 10 steps × 1 or 2 micro-batches, + eval at 8, 12, 16 (3 examples: one micro-batch)
    # (+ the 3 forwards of the start-up packing probe)
    micro_batches = 2 if "batch.micro_size" in variant else 1
    assert len(steps) == 10 * micro_batches + 3 + (3 if variant.get("sft.packing") else 0)

    expected, got = comparable(metric_rows(tmp_path / "whole")), comparable(metric_rows(tmp_path / "resumed"))
    assert [row["step"] for row in got] == [row["step"] for row in expected] == list(range(17))
    # the resumed run repeats the uninterrupted run's float32 operations in the same order, so it gives the
    # same bits; the bounds (a few ulp of values ≤ 8: 8·2⁻²³ ≈ 1e-6) are not a measured noise level
    assert_rows_match(expected, got, rel=1e-6, abs=1e-6)
    assert max_abs_diff(load_file(resumed / "model.safetensors"), load_file(whole / "model.safetensors")) <= 1e-6
    assert_same_checkpoint(tmp_path / "whole", tmp_path / "resumed")  # a continuation from either is the same


def test_resume_refuses_other_data(tiny_llama_dir, data_dir, tmp_path):
    out, train = tmp_path / "run", tmp_path / "train.jsonl"
    shutil.copy(data_dir / "small.jsonl", train)
    sft.run(make_config(tiny_llama_dir, train, out, **{"run.save_every": 1}))
    # another file: the config check names the field
    with pytest.raises(ConfigError, match=r"differs .* in data.train: '.*train.jsonl' → '.*train.jsonl'"):
        sft.run(make_config(tiny_llama_dir, data_dir / "train.jsonl", out, **{"run.resume": True}))
    # the same file with other contents: the checkpoint's fingerprint of the data
    shutil.copy(data_dir / "train.jsonl", train)
    with pytest.raises(ConfigError, match=r"other num_examples \(10, now 61\), fingerprint"):
        sft.run(make_config(tiny_llama_dir, train, out, **{"run.resume": True}))


# --------------------------------------------------------------------------------------------------------------
# LoRA, the command line
# --------------------------------------------------------------------------------------------------------------


def test_lora_is_merged_into_final_with_the_models_own_dropout(tiny_gpt2_dir, data_dir, tmp_path):
    out = tmp_path / "run"
    final = sft.run(
        make_config(tiny_gpt2_dir, data_dir / "train.jsonl", out, **{"model.lora": {"r": 4}}, **{"run.save_every": 4})
    )
    assert not (final / "adapter_config.json").exists()
    model = AutoModelForCausalLM.from_pretrained(final)  # a plain GPT-2, the adapters merged in
    assert max_abs_diff(model.state_dict(), AutoModelForCausalLM.from_pretrained(tiny_gpt2_dir).state_dict()) > 0
    assert model.config.resid_pdrop == 0.1  # trained without dropout, saved with the model's own
    # checkpoints hold the adapters only
    state = torch.load(out / "checkpoints" / "step_000004" / "state.pt", weights_only=False)
    weights = state["models"]["model"]
    assert weights and all("lora_" in name for name in weights)


def test_cli_runs_sft_from_a_yaml_file(tiny_llama_dir, data_dir, tmp_path):
    out = tmp_path / "run"
    config = {"model.name": str(tiny_llama_dir), "data.train": str(data_dir / "train.jsonl"), "output_dir": str(out),
              "sft.epochs": 3, "batch.size": 16, "data.max_length": 64}  # fmt: skip
    path = tmp_path / "sft.yaml"
    path.write_text(yaml.safe_dump(nested(config)))
    assert cli.main(["sft", "--config", str(path), "--sft.epochs", "1", "--sft.packing", "--run.no-progress"]) == 0
    assert [row["step"] for row in metric_rows(out)] == [0, 1, 2, 3, 4]  # the flag won over the file
    assert (out / "final" / "model.safetensors").is_file()
    written = yaml.safe_load((out / "config.yaml").read_text())
    assert written["sft"] == {"epochs": 1, "packing": True}


def test_final_is_written_by_rank_0_alone(tiny_llama_dir, data_dir, tmp_path):
    """Under DDP every rank holds the whole model; a second writer would race rank 0 for final/ (a torchrun run
    once ended with a final/ of tokenizer files only). Here rank 1 of a 2-rank DDP run writes nothing."""
    config = make_config(tiny_llama_dir, data_dir / "train.jsonl", tmp_path / "run")
    (tmp_path / "run").mkdir()  # the run's claim made it
    model, tokenizer = load_causal_lm(str(tiny_llama_dir)), load_tokenizer(str(tiny_llama_dir))
    rank_1 = Dist(rank=1, world_size=2, parallelism="ddp")
    assert sft.write_final(config, model, tokenizer, rank_1) == tmp_path / "run" / "final"
    assert not (tmp_path / "run" / "final").exists()
    sft.write_final(config, model, tokenizer, SINGLE)
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {
        p.name for p in (tmp_path / "run" / "final").iterdir()
    }


def test_gradient_checkpointing_gives_the_same_model(tiny_llama_dir, data_dir, tmp_path):
    small = data_dir / "small.jsonl"
    plain = sft.run(make_config(tiny_llama_dir, small, tmp_path / "plain"))
    fields = {"model.gradient_checkpointing": True, "model.lora": {"r": 4, "alpha": 8}}
    lora = sft.run(make_config(tiny_llama_dir, small, tmp_path / "lora", **fields))
    recomputed = sft.run(
        make_config(tiny_llama_dir, small, tmp_path / "ckpt", **{"model.gradient_checkpointing": True})
    )
    # the backward pass replays the forward's own operations: the same floats, the same steps
    assert max_abs_diff(load_file(plain / "model.safetensors"), load_file(recomputed / "model.safetensors")) == 0
    assert max_abs_diff(load_file(plain / "model.safetensors"), load_file(lora / "model.safetensors")) > 0
