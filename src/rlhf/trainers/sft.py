"""Supervised fine-tuning (`rlhf sft`): next-token cross-entropy on the response / assistant tokens. `run` loads the
data and the model and trains in the loop SFT, RM and DPO share (`rlhf.trainers.supervised`); this module supplies
one step — micro-batches of ``micro_batch_size`` examples, right-padded or packed into rows of ``max_length``
tokens, each one's summed token loss divided by the label tokens of the WHOLE batch, so that accumulation gives
exactly the batch's gradient — and ``eval/loss``. Its metrics: the README, "The pipeline by hand".

Conventions:
- labels are `IGNORE_INDEX` on prompt, user/system and padding tokens (`rlhf.data.tokenize_sft`); the logits
  at position t predict token t+1, so the loss is ``Σ_t −log p(x_{t+1} | x_≤t) · [label_{t+1} ≠ −100] / N``,
  N = the labelled tokens of the optimizer batch (TRL SFTTrainer's token mean with ``num_items_in_batch``);
- an epoch is ``ceil(len(train) / batch_size)`` steps; its last batch holds the remainder;
- packing passes ``position_ids`` restarting at 0 for every example and no 2-D attention mask: transformers (5.x)
  builds a block-diagonal causal mask from the restarts (``masking_utils.find_packed_sequence_indices``, for
  eager, sdpa and flex; flash attention reads the same boundaries), so the loss and gradient are the unpacked
  batch's; `check_packing` refuses a model that lets packed examples see each other.

Deviations from TRL's SFTTrainer: dropout is off (`load_causal_lm`, LoRA dropout included) rather than the
model's own, so that packing, micro-batching and resuming reproduce a run exactly (modern causal LMs —
Llama, Qwen2, Mistral — ship with dropout 0 anyway); ``final/config.json`` gets the model's own dropout
settings back, so the saved model is the input model, trained.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch import nn

from rlhf import planning
from rlhf.config import ConfigError, SFTConfig
from rlhf.core.logprobs import selective_log_softmax
from rlhf.core.losses import aggregate
from rlhf.data import IGNORE_INDEX, TokenizedSFT, collate_sft, held_out, load_sft, position_ids_from_mask
from rlhf.data.stream import fingerprint_of
from rlhf.models.loading import load_tokenizer
from rlhf.models.precision import compute_dtype
from rlhf.models.sharding import load_lm, preparation, unsharded
from rlhf.runlog import distributed, rundir
from rlhf.runlog.distributed import SINGLE, Dist
from rlhf.trainers import supervised, update
from rlhf.trainers.update import Trainable

MAX_HELD_OUT = 200
HELD_OUT_FRACTION = 20  # without eval_data, 1 example in 20 (≤ MAX_HELD_OUT) is held out; none below 20


@distributed.entry
@rundir.claims_output_dir
def run(config: SFTConfig) -> Path:
    """Fine-tune ``config.model.name`` on ``config.data.train``; returns the ``final/`` directory."""
    d = supervised.start(config)
    tokenizer = load_tokenizer(config.model.name, config.data.chat_template_kwargs)
    filler = int(tokenizer.eos_token_id)  # any real id: padding is never attended to nor trained on
    train, eval_examples = _examples(config, tokenizer)
    planning.check(config, d, planning.sequence_positions(train + eval_examples))  # before any weights
    model = load_lm(config.model.name, config.model.dtype, d, preparation(config.model, d.device))
    if config.sft.packing:
        check_packing(model, train, filler, d.device)
    batches = Batcher(config.effective_micro_batch_size, config.sft.packing, config.data.max_length, filler, d.device)
    trainable = Trainable(model, d)
    task = supervised.Task(
        trainable,
        supervised.OneModel("model", model, model),
        step=functools.partial(train_step, trainable, train, batches),
        evaluate=functools.partial(evaluate, model, eval_examples, batches, d) if eval_examples else None,
        tokens=lambda rows: sum(len(train[i].input_ids) for i in rows),
    )
    fingerprint = fingerprint_of((e.input_ids, e.labels) for e in train)
    supervised.train(config, task, len(train), fingerprint, config.sft.epochs, d)
    return write_final(config, model, tokenizer, d)


def train_step(
    trainable: Trainable, train: Sequence[TokenizedSFT], batches: Batcher, rows: list[int]
) -> dict[str, float]:
    """Forward + backward of this rank's share of the step's examples ``rows``, in micro-batches (padded or
    packed), each micro-batch's summed token loss divided by the label tokens of the whole step's batch."""
    d = trainable.d
    batch = [train[i] for i in rows]
    num_tokens = sum(label_tokens(e) for e in batch)  # of the whole batch, over all ranks

    def micro_step(micro: Rows) -> tuple[torch.Tensor, dict[str, float]]:
        per_token, mask = token_losses(trainable.forward, micro)
        micro_loss = aggregate(per_token, mask, "token-mean", num_tokens=num_tokens)
        return micro_loss, {"train/loss": micro_loss.item()}

    mine = batches(batch[d.rank :: d.world_size])  # a rank with none runs the first example, at weight 0
    stats = update.accumulate(trainable, mine, lambda: batches(batch[:1])[0], micro_step)
    return {"train/loss": update.reduce_stats(stats, d).get("train/loss", 0.0)}


def _examples(config: SFTConfig, tokenizer: Any) -> tuple[list[TokenizedSFT], list[TokenizedSFT]]:
    """Training examples, and held-out ones: ``data.eval``, else a small deterministic slice of ``data.train``."""
    train = load_sft(config.data.train, tokenizer, config.data.max_length)
    if config.data.eval:
        return train, load_sft(config.data.eval, tokenizer, config.data.max_length)
    return held_out(train, min(MAX_HELD_OUT, len(train) // HELD_OUT_FRACTION), seed=config.run.seed)


def label_tokens(example: TokenizedSFT) -> int:
    """Tokens ``example`` is trained on. Label 0 never counts: no logit predicts the first token."""
    return sum(label != IGNORE_INDEX for label in example.labels[1:])


class Rows(NamedTuple):
    """One forward pass: ``input_ids``, ``position_ids``, ``labels`` (R, L) int64 on the device; ``attention_mask``
    (R, L) int64 for right-padded rows, None for packed rows, where ``position_ids`` restarting at 0 mark each
    example's start (and the trailing padding is one more block of its own)."""

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    labels: torch.Tensor
    attention_mask: torch.Tensor | None


class Batcher:
    """``batcher(examples)`` → the `Rows` of each micro-batch of ``micro_batch_size`` examples (packed: into rows of
    ≤ ``max_length`` tokens, `pack`)."""

    def __init__(self, micro_batch_size: int, packing: bool, max_length: int, filler: int, device: Any):
        self.micro_batch_size, self.packing, self.max_length = micro_batch_size, packing, max_length
        self.filler, self.device = filler, device

    def __call__(self, examples: Sequence[TokenizedSFT]) -> list[Rows]:
        micro = [examples[i : i + self.micro_batch_size] for i in range(0, len(examples), self.micro_batch_size)]
        return [self.rows_of(pack(m, self.max_length)) if self.packing else self.padded(m) for m in micro]

    def padded(self, examples: Sequence[TokenizedSFT]) -> Rows:
        """Right-padded rows, one example each (padding ids replaced by ``filler``, labels `IGNORE_INDEX`)."""
        batch = collate_sft(examples, self.filler)
        position_ids = position_ids_from_mask(batch.attention_mask)
        return self._to_device(Rows(batch.input_ids, position_ids, batch.labels, batch.attention_mask))

    def rows_of(self, bins: Sequence[Sequence[TokenizedSFT]]) -> Rows:
        """One row per bin: its examples concatenated, positions restarting at 0, right-padded with a block. Each
        example's first label becomes `IGNORE_INDEX`: in a packed row the previous example's last logit would
        otherwise be trained to predict it, which nothing predicts unpacked."""
        ids = [[t for e in b for t in e.input_ids] for b in bins]
        labels = [[t for e in b for t in [IGNORE_INDEX, *e.labels[1:]]] for b in bins]
        positions = [[p for e in b for p in range(len(e.input_ids))] for b in bins]
        width = max(len(row) for row in ids)
        for row_ids, row_labels, row_positions in zip(ids, labels, positions, strict=True):
            pad = width - len(row_ids)
            row_ids += [self.filler] * pad
            row_labels += [IGNORE_INDEX] * pad
            row_positions += range(pad)  # the padding restarts at 0 too: a block that attends only to itself
        return self._to_device(Rows(torch.tensor(ids), torch.tensor(positions), torch.tensor(labels), None))

    def _to_device(self, rows: Rows) -> Rows:
        return Rows(*(None if t is None else t.to(self.device) for t in rows))


def pack(examples: Sequence[TokenizedSFT], capacity: int) -> list[list[TokenizedSFT]]:
    """Bins of examples with ≤ ``capacity`` tokens each: first-fit decreasing (longest first, ties in data order)."""
    bins: list[list[TokenizedSFT]] = []
    used: list[int] = []
    for e in sorted(examples, key=lambda e: -len(e.input_ids)):
        n = len(e.input_ids)
        k = next((k for k, u in enumerate(used) if u + n <= capacity), len(bins))
        if k == len(bins):
            bins.append([])
            used.append(0)
        bins[k].append(e)
        used[k] += n
    return bins


def token_losses(model: Callable[..., Any], rows: Rows) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token cross-entropy ``(R, L−1)`` float32 and its mask ``(R, L−1)`` bool (label ≠ `IGNORE_INDEX`):
    ``loss[r, t] = −log p(x_{t+1} | x_≤t)``, the logits at t scored against the label at t+1."""
    logits = model(
        input_ids=rows.input_ids,
        attention_mask=rows.attention_mask,
        position_ids=rows.position_ids,
        use_cache=False,  # a cache would also switch off transformers' packed-sequence masking
    ).logits
    labels = rows.labels[:, 1:]
    mask = labels != IGNORE_INDEX
    # float32 log-softmax whatever the model's dtype (as transformers' own loss); masked labels → any valid id
    logp = selective_log_softmax(logits[:, :-1].float(), labels.masked_fill(~mask, 0))
    return -logp, mask


@torch.no_grad()
def evaluate(
    model: nn.Module, examples: Sequence[TokenizedSFT], batches: Batcher, d: Dist = distributed.SINGLE
) -> dict[str, float]:
    """``eval/loss``: the token-mean cross-entropy over every labelled token of ``examples`` (each rank
    scores its share; the sums are added over ranks)."""
    model.eval()
    num_tokens = sum(label_tokens(e) for e in examples)
    total = 0.0
    for rows, real, _ in update.evenly(batches(examples[d.rank :: d.world_size]), lambda: batches(examples[:1])[0], d):
        per_token, mask = token_losses(model, rows)
        total += aggregate(per_token, mask, "token-mean", num_tokens=num_tokens).item() if real else 0.0
    model.train()
    return {"eval/loss": d.sum_values({"eval/loss": total})["eval/loss"]}


@torch.no_grad()
def check_packing(model: nn.Module, examples: Sequence[TokenizedSFT], filler: int, device: Any) -> None:
    """Refuse packing for a model that does not keep packed examples apart: two examples scored on every token,
    each alone and both packed in one row, must agree to float rounding. A leak of attention or positions changes
    the second one's log-probs by far more (≈0.2-0.5 nats on the tiny random models, nearly flat)."""
    a, b = (examples[0], examples[1]) if len(examples) > 1 else (examples[0], examples[0])
    a, b = (TokenizedSFT(e.where, e.input_ids, list(e.input_ids)) for e in (a, b))  # train on every token
    batcher = Batcher(1, False, 0, filler, device)
    alone = [token_losses(model, batcher.padded([e]))[0][0] for e in (a, b)]
    packed = token_losses(model, batcher.rows_of([[a, b]]))[0][0]
    n = len(a.input_ids)
    # the packed row loses one target: the first token of b, predicted from a's last position
    packed = torch.cat([packed[: n - 1], packed[n:]])
    deviation = (packed - torch.cat(alone)).abs().max().item()
    dtype = compute_dtype(model) or next(model.parameters()).dtype  # bfloat16 under mixed precision
    tolerance = 1e-4 if dtype in (torch.float32, torch.float64) else 2e-2
    if not deviation <= tolerance:
        kind = getattr(getattr(model, "config", None), "model_type", type(model).__name__)
        raise ConfigError(
            f"sft: packing=true, but this {kind} model lets packed examples see each other (log-probs change "
            f"by {deviation:.3g} when another example precedes one in its row; its attention "
            f"({getattr(model.config, '_attn_implementation', '?')}) ignores restarting position_ids); "
            "set packing: false"
        )


def write_final(config: SFTConfig, model: nn.Module, tokenizer: Any, d: Dist) -> Path:
    """``output_dir/final`` of a trained causal LM (sft, dpo): ``save_pretrained`` (LoRA merged in) + tokenizer, with
    the source model's dropout settings. Gathered when sharded; written by rank 0 alone (another would race it)
    through a staging directory (a crash keeps the previous final/); returns its path on every rank."""
    from transformers import AutoConfig

    final = Path(config.output_dir) / "final"
    shell = functools.partial(
        load_lm, config.model.name, config.model.dtype, SINGLE, preparation(config.model, d.device)
    )
    model = unsharded(model, shell, d)
    if model is None or not d.is_main:
        return final
    model = model.merge_and_unload() if hasattr(model, "merge_and_unload") else model
    for key, value in vars(AutoConfig.from_pretrained(config.model.name)).items():  # load_causal_lm zeroed them
        if ("dropout" in key or key.endswith("pdrop")) and isinstance(value, float):
            setattr(model.config, key, value)  # restore what the user had
    with rundir.staged(final) as staging:
        model.save_pretrained(staging / "final")
        tokenizer.save_pretrained(staging / "final")
    return final
