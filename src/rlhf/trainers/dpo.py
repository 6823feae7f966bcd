"""Direct preference optimisation (`rlhf dpo`): the policy learns from preference pairs without a reward model.

`run` reads top to bottom: (1) the pairs, tokenised whole (``prompt + response + eos``, as ``rlhf rm`` does) →
(2) the policy → (3) the reference log-probs of every pair, computed once with the policy *before* training (why:
docs/dpo.md, "The reference") → (4) the epoch loop SFT, RM and DPO share (`rlhf.trainers.supervised`): per step,
this rank's pairs in micro-batches (`rlhf.trainers.supervised.pair_step`), chosen and rejected in one
right-padded forward, the loss of `rlhf.core.dpo` → (5) ``final/`` (LoRA merged). The metrics (named as other
libraries name them): docs/dpo.md, "Metrics".
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from rlhf import planning
from rlhf.config import DPOConfig
from rlhf.core.dpo import DPOLoss, dpo_loss
from rlhf.data import TokenizedPreference, TokenizedSFT, load_preferences
from rlhf.data.stream import fingerprint_of
from rlhf.data.tokenization import IGNORE_INDEX
from rlhf.models.loading import load_tokenizer
from rlhf.models.sharding import gathered, load_lm, preparation
from rlhf.runlog import distributed, rundir
from rlhf.runlog.distributed import SINGLE, Dist
from rlhf.trainers import supervised
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
    d = supervised.start(config)
    # 1. every pair, before any step
    tokenizer = load_tokenizer(config.model.name, config.data.chat_template_kwargs)
    train = load_preferences(config.data.train, tokenizer, config.data.max_length)
    held_out = load_preferences(config.data.eval, tokenizer, config.data.max_length) if config.data.eval else []
    planning.check(config, d, planning.sequence_positions(train + held_out))  # before any weights
    # 2. the policy; 3. the reference: the policy's own log-probs before any step
    model = load_lm(config.model.name, config.model.dtype, d, preparation(config.model, d.device))
    # micro_batch_size counts pairs here: DPO builds each micro-batch itself (`sequence_logps`, chosen and
    # rejected in one `Batcher.padded` call), so the Batcher's own splitting is not used
    batches = Batcher(
        config.effective_micro_batch_size, False, config.data.max_length, int(tokenizer.eos_token_id), d.device
    )
    reference = None
    if config.dpo.loss != DPOLoss.SIMPO:
        # sharded: one all-gather for the whole pass, and every module resharded after it — a root left gathered
        # would hand the optimizer its gathered copies instead of the sharded parameters
        with gathered(model):
            reference = reference_logps(model, train + held_out, batches)
    print(
        f"dpo: {len(train)} training pairs, {len(held_out)} held out; loss {config.dpo.loss}, β {config.dpo.beta}; "
        + ("no reference (simpo)" if reference is None else "reference log-probs computed from the starting policy"),
        file=sys.stderr,
    )
    ref_train, ref_held = (None, None) if reference is None else (reference[: len(train)], reference[len(train) :])
    # 4. the epoch loop: micro-batched DPO loss, AdamW, evaluation, checkpoints
    trainable = Trainable(model, d)
    task = supervised.Task(
        trainable,
        supervised.OneModel("model", model, model),
        step=functools.partial(train_step, config, trainable, train, ref_train, batches),
        evaluate=functools.partial(evaluate, config, model, held_out, ref_held, batches, d) if held_out else None,
        tokens=functools.partial(supervised.pair_tokens, train),
    )
    fingerprint = fingerprint_of((p.prompt_ids, p.chosen_ids, p.rejected_ids) for p in train)
    supervised.train(config, task, len(train), fingerprint, config.dpo.epochs, d)
    # 5. final/, LoRA merged
    return write_final(config, model, tokenizer, d)


def sides(pairs: Sequence[TokenizedPreference]) -> list[TokenizedSFT]:
    """Each pair's chosen sequences, then its rejected ones: ``prompt + response``, labels on the response only."""
    responses = [(p, p.chosen_ids) for p in pairs] + [(p, p.rejected_ids) for p in pairs]
    return [TokenizedSFT(p.where, p.prompt_ids + r, [IGNORE_INDEX] * len(p.prompt_ids) + r) for p, r in responses]


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
    """Summed log-probs ``(n, 2)`` (chosen, rejected) of every pair under ``model`` as it is now: the reference.
    Every rank computes all of them (sharded, every rank is in every forward; the caller gathers the model)."""
    model.eval()
    size = batches.micro_batch_size
    out = []
    for chunk in (pairs[start : start + size] for start in range(0, len(pairs), size)):
        logps, _ = sequence_logps(model, chunk, batches)  # (2b,): the chosen sides, then the rejected ones
        out.append(torch.stack(logps.split(len(chunk)), dim=1).cpu())
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
    ref = (None, None) if reference is None else reference.to(logps.device, logps.dtype).unbind(1)
    loss, stats = dpo_loss(
        logps[:b],
        logps[b:],
        *ref,
        beta=config.dpo.beta,
        loss_type=config.dpo.loss,
        label_smoothing=config.dpo.label_smoothing,
        chosen_lengths=lengths[:b],
        rejected_lengths=lengths[b:],
        simpo_gamma=config.dpo.simpo_gamma,
    )
    return loss, {
        "loss": loss.item(),
        "rewards/chosen": stats["rewards_chosen"].item(),
        "rewards/rejected": stats["rewards_rejected"].item(),
        "rewards/margins": stats["margins"].item(),
        "rewards/accuracies": stats["accuracy"].item(),
        "logps/chosen": logps[:b].mean().item(),
        "logps/rejected": logps[b:].mean().item(),
    }


def train_step(
    config: DPOConfig,
    trainable: Trainable,
    pairs: Sequence[TokenizedPreference],
    reference: torch.Tensor | None,
    batches: Batcher,
    indices: list[int],
) -> dict[str, float]:
    """Backward of the mean loss over the step's pairs ``indices`` (`rlhf.trainers.supervised.pair_step`, in
    micro-batches of ``batch.micro_size`` pairs); returns the step's stats over all ranks."""

    def micro_loss(micro: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        ref = None if reference is None else reference[micro]
        loss, values = pair_loss(config, trainable.forward, [pairs[i] for i in micro], ref, batches)
        return loss, {("train/loss" if key == "loss" else key): value for key, value in values.items()}

    return supervised.pair_step(trainable, indices, batches.micro_batch_size, micro_loss)


@torch.no_grad()
def evaluate(
    config: DPOConfig,
    model: torch.nn.Module,
    pairs: Sequence[TokenizedPreference],
    reference: torch.Tensor | None,
    batches: Batcher,
    d: Dist = SINGLE,
) -> dict[str, float]:
    """The `METRICS` over all held-out pairs as ``eval/<name>`` (each rank scores its share; sums over ranks)."""
    model.eval()
    totals = {f"eval/{key}": 0.0 for key in METRICS}
    for micro, real, _ in supervised.held_out_batches(len(pairs), batches.micro_batch_size, d):
        ref = None if reference is None else reference[micro]
        _, values = pair_loss(config, model, [pairs[i] for i in micro], ref, batches)
        if real:
            for key, value in values.items():
                totals[f"eval/{key}"] += value * len(micro) / len(pairs)
    model.train()
    return d.sum_values(totals)
