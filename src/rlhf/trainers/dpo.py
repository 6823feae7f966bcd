"""Direct preference optimisation (`rlhf dpo`): the policy learns from preference pairs without a reward model.

`run` reads top to bottom: (1) the pairs, read, validated and tokenised whole (``prompt + response + eos``, as
``rlhf rm`` does; a labels file of ``rlhf label`` gives its live preferences) → (2) the policy → (3) the
reference log-probs of every pair, computed once with the policy *before* training: the reference is the
starting point, so no second model is held (under LoRA the starting point is the base model, the adapters
being zero at first) → (4) the epoch loop SFT and RM share (`rlhf.trainers.supervised`): per step, this rank's
share of the pairs in micro-batches, chosen and rejected in one right-padded forward, the summed log-probs of
the response tokens, the loss of `rlhf.core.dpo` → (5) ``final/`` (LoRA merged), which loads in transformers.

The micro-batches' mean losses are weighted by their share of the step's pairs, so accumulation gives the
gradient of the step's mean (docs/architecture.md, conventions). Metrics, named as other libraries name them:
``train/loss``, ``rewards/chosen``, ``rewards/rejected``, ``rewards/margins``, ``rewards/accuracies`` (the
implicit rewards β·(log π − log π_ref) of `rlhf.core.dpo`), ``logps/chosen``, ``logps/rejected`` (mean summed
log-probs of the responses under the policy), and ``eval/`` versions of all of them.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from rlhf.config import DPOConfig
from rlhf.core.dpo import DPOLoss, dpo_loss
from rlhf.data import TokenizedPreference, TokenizedSFT, load_preferences
from rlhf.data.stream import EpochOrder, fingerprint_of
from rlhf.data.tokenization import IGNORE_INDEX
from rlhf.models.loading import load_tokenizer
from rlhf.models.sharding import adapters, gathered, load_lm
from rlhf.runlog import distributed, rundir
from rlhf.runlog.distributed import SINGLE, Dist
from rlhf.runlog.seeding import seed_everything
from rlhf.trainers import supervised, update
from rlhf.trainers.sft import Batcher, token_losses, write_final
from rlhf.trainers.update import Trainable

METRICS = (
    "loss",
    "rewards/chosen",
    "rewards/rejected",
    "rewards/margins",
    "rewards/accuracies",
    "logps/chosen",
    "logps/rejected",
)
"""Each is logged as ``train/loss`` and the others bare during training, and as ``eval/<name>`` on held-out pairs."""


@distributed.entry
@rundir.claims_output_dir
def run(config: DPOConfig) -> Path:
    """Train ``config.model.name`` on the preference pairs of ``config.data.train``; returns ``final/``."""
    from rlhf.inputs import check_inputs

    check_inputs(config)  # every model path before anything loads
    d = distributed.current()
    seed_everything(config.run.seed)
    # 1. every pair, before any step
    tokenizer = load_tokenizer(config.model.name)
    train = load_preferences(config.data.train, tokenizer, config.data.max_length)
    held_out = load_preferences(config.data.eval, tokenizer, config.data.max_length) if config.data.eval else []
    # 2. the policy; 3. the reference: the policy's own log-probs before any step
    model = load_lm(config.model.name, config.model.dtype, d, adapters(config.model.lora))
    # micro_batch_size counts pairs here: DPO builds each micro-batch itself (`sequence_logps`, chosen and
    # rejected in one `Batcher.padded` call), so the Batcher's own splitting is not used
    batches = Batcher(
        config.effective_micro_batch_size, False, config.data.max_length, int(tokenizer.eos_token_id), d.device
    )
    needs_reference = config.dpo.loss != DPOLoss.SIMPO
    reference = None
    if needs_reference:
        # sharded: one all-gather for the whole pass, and every module resharded after it — a root left gathered
        # would hand the optimizer its gathered copies instead of the sharded parameters
        with gathered(model):
            reference = reference_logps(model, train + held_out, batches)
    print(
        f"dpo: {len(train)} training pairs, {len(held_out)} held out; loss {config.dpo.loss}, β {config.dpo.beta}; "
        + ("reference log-probs computed from the starting policy" if needs_reference else "no reference (simpo)"),
        file=sys.stderr,
    )
    ref_train = None if reference is None else reference[: len(train)]
    ref_held = None if reference is None else reference[len(train) :]
    # 4. the epoch loop: micro-batched DPO loss, AdamW, evaluation, checkpoints
    trainable = Trainable(model, d)
    loss_of = functools.partial(pair_loss, config)
    task = supervised.Task(
        trainable,
        supervised.OneModel("model", model, model),
        step=functools.partial(train_step, loss_of, trainable, train, ref_train, batches),
        evaluate=functools.partial(evaluate, loss_of, model, held_out, ref_held, batches, d) if held_out else None,
        tokens=lambda rows: sum(
            2 * len(train[i].prompt_ids) + len(train[i].chosen_ids) + len(train[i].rejected_ids) for i in rows
        ),
    )
    fingerprint = fingerprint_of((p.prompt_ids, p.chosen_ids, p.rejected_ids) for p in train)
    order = EpochOrder(len(train), config.batch.size, config.run.seed, fingerprint, "dpo")
    supervised.train(config, task, order, config.dpo.epochs, d)
    # 5. final/, LoRA merged
    return write_final(config, model, tokenizer, d)


def sides(pairs: Sequence[TokenizedPreference]) -> list[TokenizedSFT]:
    """Each pair's chosen sequences, then its rejected ones: ``prompt + response``, labels on the response only."""

    def side(pair: TokenizedPreference, response: list[int]) -> TokenizedSFT:
        return TokenizedSFT(pair.where, pair.prompt_ids + response, [IGNORE_INDEX] * len(pair.prompt_ids) + response)

    return [side(p, p.chosen_ids) for p in pairs] + [side(p, p.rejected_ids) for p in pairs]


def sequence_logps(
    model: Callable[..., Any], pairs: Sequence[TokenizedPreference], batches: Batcher
) -> tuple[torch.Tensor, torch.Tensor]:
    """(summed log-probs of the responses (2b,), response lengths (2b,)) of ``b`` pairs, chosen first: one
    right-padded forward (`rlhf.trainers.sft.token_losses`, float32 log-softmax)."""
    rows = batches.padded(sides(pairs))
    per_token, mask = token_losses(model, rows)
    return -(per_token * mask).sum(-1), mask.sum(-1).to(per_token.dtype)


@torch.no_grad()
def reference_logps(model: torch.nn.Module, pairs: Sequence[TokenizedPreference], batches: Batcher) -> torch.Tensor:
    """Summed log-probs ``(n, 2)`` (chosen, rejected) of every pair under ``model`` as it is now — the reference.

    Every rank computes all of them in the same order (sharded runs need every rank in every forward; the caller
    gathers a sharded model around the pass).
    """
    model.eval()
    out = []
    size = batches.micro_batch_size
    for start in range(0, len(pairs), size):
        chunk = pairs[start : start + size]
        logps, _ = sequence_logps(model, chunk, batches)
        out.append(torch.stack([logps[: len(chunk)], logps[len(chunk) :]], dim=1).cpu())
    model.train()
    return torch.cat(out) if out else torch.zeros(0, 2)


def pair_loss(
    config: DPOConfig,
    model: Callable[..., Any],
    pairs: Sequence[TokenizedPreference],
    reference: torch.Tensor | None,
    batches: Batcher,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The mean loss of ``pairs`` (``reference`` their (b, 2) reference log-probs) and its stats (`METRICS`)."""
    b = len(pairs)
    logps, lengths = sequence_logps(model, pairs, batches)
    ref = None if reference is None else reference.to(logps.device, logps.dtype)
    loss, stats = dpo_loss(
        logps[:b],
        logps[b:],
        None if ref is None else ref[:, 0],
        None if ref is None else ref[:, 1],
        beta=config.dpo.beta,
        loss_type=config.dpo.loss,
        label_smoothing=config.dpo.label_smoothing,
        chosen_lengths=lengths[:b],
        rejected_lengths=lengths[b:],
        simpo_gamma=config.dpo.simpo_gamma,
    )
    values = {
        "loss": loss.item(),
        "rewards/chosen": stats["rewards_chosen"].item(),
        "rewards/rejected": stats["rewards_rejected"].item(),
        "rewards/margins": stats["margins"].item(),
        "rewards/accuracies": stats["accuracy"].item(),
        "logps/chosen": logps[:b].mean().item(),
        "logps/rejected": logps[b:].mean().item(),
    }
    return loss, values


def train_step(
    loss_of: Callable[..., tuple[torch.Tensor, dict[str, float]]],
    trainable: Trainable,
    pairs: Sequence[TokenizedPreference],
    reference: torch.Tensor | None,
    batches: Batcher,
    indices: list[int],
) -> dict[str, float]:
    """Backward of the mean loss over the step's pairs ``indices`` (this rank's share, in micro-batches of
    ``batch.micro_size`` pairs); returns the step's stats over all ranks."""
    rows = torch.tensor(indices)
    n, d = len(rows), trainable.d
    size = batches.micro_batch_size

    def micro_step(micro: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        chosen = [pairs[i] for i in micro]
        loss, values = loss_of(trainable.forward, chosen, None if reference is None else reference[micro], batches)
        share = len(micro) / n  # micro-batch mean × its share = its part of the step's mean
        return loss * share, {("train/loss" if key == "loss" else key): value * share for key, value in values.items()}

    mine = rows[d.rank :: d.world_size]
    stats = update.accumulate(trainable, list(mine.split(size)), lambda: rows[:1], micro_step)
    return update.reduce_stats(stats, d)


@torch.no_grad()
def evaluate(
    loss_of: Callable[..., tuple[torch.Tensor, dict[str, float]]],
    model: torch.nn.Module,
    pairs: Sequence[TokenizedPreference],
    reference: torch.Tensor | None,
    batches: Batcher,
    d: Dist = SINGLE,
) -> dict[str, float]:
    """The `METRICS` over all held-out pairs as ``eval/<name>`` (each rank scores its share; sums over ranks)."""
    model.eval()
    totals = {f"eval/{key}": 0.0 for key in METRICS}
    size = batches.micro_batch_size
    mine = list(range(d.rank, len(pairs), d.world_size))
    micro_batches = [mine[start : start + size] for start in range(0, len(mine), size)]
    for micro, real, _ in update.evenly(micro_batches, lambda: [0], d):
        _, values = loss_of(model, [pairs[i] for i in micro], None if reference is None else reference[micro], batches)
        if real:
            for key, value in values.items():
                totals[f"eval/{key}"] += value * len(micro) / len(pairs)
    model.train()
    return d.sum_values(totals)
