"""A step's scored samples (`Sampled`), the rollout an update learns from (`Rollout`), and the passes between them:
sampling and scoring, the no-grad pass in the first update's micro-batches, and the rollout's masks and stats."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from rlhf.config import PolicyGradientConfig
from rlhf.core.logprobs import INVALID_LOGPROB
from rlhf.core.losses import top_entropy_mask
from rlhf.core.masked import masked_sum
from rlhf.core.mismatch import logprob_mismatch
from rlhf.core.sequences import ResponseMasks, penalize_missing_eos, response_masks
from rlhf.data.stream import PromptBatch
from rlhf.models.policy import ScoredTokens
from rlhf.rollout import generation, scoring
from rlhf.runlog import samples
from rlhf.runlog.distributed import Dist
from rlhf.trainers import update
from rlhf.trainers.rl.inputs import Inputs
from rlhf.trainers.rl.models import Models


@dataclasses.dataclass(frozen=True)
class Sampled:
    """One step's scored samples: ``generated`` (B rows), their ``scores``, the ``rewards`` (B,) float32 the update
    learns from (NaN: no source could score the row), each row's prompt and the sampler's own ``stats``."""

    generated: generation.Generated
    scores: scoring.Scores
    rewards: torch.Tensor
    prompts: list[str]
    stats: dict[str, float] = dataclasses.field(default_factory=dict)

    def write(self, folder: str, out: Path, step: int) -> None:
        """The samples as ``out/<folder>/step_NNNNNN.jsonl`` (`rlhf.runlog.samples.write_step`)."""
        generated = self.generated
        samples.write_step(folder, out, step, self.prompts, generated.completions, self.scores, generated.episodes)


@dataclasses.dataclass(frozen=True)
class Rollout:
    """What an update needs about one sampled batch, on the training device: ``query_responses``, ``attention_mask``
    (B, C+T) long; ``logprobs``, ``ref_logprobs`` (B, T) float32 at the sampling temperature, INVALID_LOGPROB at
    padding (None: taken from the training forward, or no reference); ``advantages`` (B, T) float32;
    ``sampler_logprobs`` (B, T) the engine's own log-probs of its tokens (`Generated.sampler_logprobs`);
    ``entropy_keep`` (B, T) bool, the tokens ``top_entropy_quantile`` trains the policy loss on (None: all)."""

    query_responses: torch.Tensor
    attention_mask: torch.Tensor
    logprobs: torch.Tensor | None
    ref_logprobs: torch.Tensor | None
    advantages: torch.Tensor
    sampler_logprobs: torch.Tensor | None
    entropy_keep: torch.Tensor | None

    @classmethod
    def of(
        cls,
        generated: generation.Generated,
        passed: NoGradPass,
        *,
        advantages: torch.Tensor,
        entropy_keep: torch.Tensor | None,
        **fields: torch.Tensor,
    ) -> Rollout:
        """The rollout of ``generated`` with ``passed``'s log-probs, ``advantages`` and ``entropy_keep``; an algorithm's
        own ``fields`` beside them."""
        return cls(
            query_responses=generated.query_responses,
            attention_mask=generated.attention_mask,
            logprobs=passed.logprobs,
            ref_logprobs=passed.ref_logprobs,
            sampler_logprobs=generated.sampler_logprobs,
            advantages=advantages,
            entropy_keep=entropy_keep,
            **fields,
        )

    @property
    def response_length(self) -> int:
        return self.advantages.shape[1]

    def micro_inputs(self, micro: update.MicroBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """``query_responses`` and ``attention_mask`` of ``micro``: its rows, its own columns only (the cut ones are
        padding, outside every mask)."""
        cols = micro.columns(self.query_responses.shape[1] - self.response_length)
        return self.query_responses[micro.rows, cols], self.attention_mask[micro.rows, cols]

    def sampler_at(self, micro: update.MicroBatch) -> torch.Tensor | None:
        """``sampler_logprobs`` of ``micro``'s rows and response columns."""
        logprobs = self.sampler_logprobs
        return None if logprobs is None else logprobs[micro.rows, : micro.response_length]


def sample_and_score(
    config: PolicyGradientConfig,
    inputs: Inputs,
    models: Models,
    batch: PromptBatch,
    generator: torch.Generator,
    trainer_state: Any,
    *,
    repeat: int = 1,
    max_rows: int | None = None,
) -> Sampled:
    """Answer ``batch`` with the policy through ``models.engine`` (``repeat`` answers per prompt, consecutive rows; at most ``max_rows`` in
    one forward) and score the answers (GDPO within each prompt's ``repeat`` rows); ``rewards``: the combined
    scores. Each rank samples and scores its share of the prompts; every rank returns the whole batch."""
    d = inputs.d
    generated = generation.generate(
        models.policy,
        inputs.tokenizer,
        batch,
        inputs.sampling,
        inputs.stops,
        generator,
        d.device,
        repeat=repeat,
        d=d,
        max_rows=max_rows,
        engine=models.engine,
        episodes=inputs.episodes,
    )
    prompts = generation.repeat_each(batch.texts, repeat)
    columns = {name: generation.repeat_each(values, repeat) for name, values in batch.columns.items()}
    context = scoring.reward_context(batch, generated, repeat=repeat, trainer_state=trainer_state)
    scores = scoring.score(
        inputs.rewards,
        prompts,
        generated.completions,
        columns,
        config.reward.aggregation,
        group_size=repeat,
        token_ids=generated.token_ids,
        context=context,
        d=d,
    )
    return Sampled(generated, scores, scores.combined, prompts)


def micro_plan(config: PolicyGradientConfig, mask: torch.Tensor, T: int) -> Callable[[torch.Tensor], list]:
    """``rows → micro-batches`` under ``batch.micro_size`` and ``batch.micro_tokens``, padding cut: the same plan
    for the rollout's passes and every update, so the first update's ratio is exactly 1 (checklist item 34)."""
    size, budget = config.effective_micro_batch_size, config.batch.micro_tokens
    return lambda rows: update.plan_micro_batches(rows, mask, T, size, budget)


def first_pass(
    config: PolicyGradientConfig, generated: generation.Generated, unit: int, d: Dist
) -> Iterator[tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor], int, bool]]:
    """(rows, (ids, mask), T', real) of this rank's micro-batches of the first pass of `updates.update_passes`, ids and
    mask cut to their columns: the rollout's no-grad passes run exactly these forwards. Under FSDP (every forward a
    collective) filler passes (``real`` False: drop the output) even out the count."""
    ids, mask = generated.query_responses, generated.attention_mask
    (B, L), T = ids.shape, generated.responses.shape[1]
    plan = micro_plan(config, mask, T)
    micro_batches = []
    for minibatch in torch.arange(B).split(config.minibatch_size):
        micro_batches += update.own_micro_batches(minibatch, unit, plan, d)
    passes = ((micro, True, None) for micro in micro_batches)
    if d.sharded:
        passes = update.evenly(micro_batches, lambda: plan(update.own_row(B, unit, d))[0], d)
    for micro, real, _ in passes:
        cols = micro.columns(L - T)
        yield micro.rows, (ids[micro.rows, cols], mask[micro.rows, cols]), micro.response_length, real


@dataclasses.dataclass(frozen=True)
class NoGradPass:
    """The rollout's pass over the whole batch (every rank's rows): the responses' ``masks``; ``logprobs`` (the old
    ones) and ``ref_logprobs`` (B, T) float32 with INVALID_LOGPROB at padding, on both sides of every ratio and KL
    (KL = 0 and ratio = 1 there, checklist item 13); the policy's ``values`` and ``entropy`` (B, T) float32 as its
    forward gave them; each None where not computed. ``first``: the first update's forward when fused."""

    masks: ResponseMasks
    logprobs: torch.Tensor | None
    ref_logprobs: torch.Tensor | None
    values: torch.Tensor | None
    entropy: torch.Tensor | None
    first: ScoredTokens | None = None


@torch.no_grad()
def no_grad_pass(
    config: PolicyGradientConfig,
    models: Models,
    generated: generation.Generated,
    *,
    unit: int,
    d: Dist,
    policy: bool = True,
    fused: Callable[[torch.Tensor], ScoredTokens] | None = None,
) -> NoGradPass:
    """Phase 3: the reference's log-probs (when there is one) and, with ``policy``, the old log-probs, values and
    entropies (these only for ``top_entropy_quantile``'s mask), without gradients, in the very forwards of the first
    update's first pass (:func:`first_pass`; ``unit``: rows that share a rank). Each rank fills its own rows; the
    buffers are summed over ranks. ``fused(rows)``: the policy's side is the first update's forward over this rank's
    rows instead, run after the reference pass so the two never hold memory together, its graph kept in ``first``
    (`rlhf.trainers.rl.ppo.fuses_first_update`)."""
    B, T = generated.responses.shape
    entropy = policy and config.algorithm.top_entropy_quantile < 1
    wanted = {
        "logprobs": policy,
        "ref_logprobs": models.reference is not None,
        "values": policy and models.value_module() is not None,
        "entropy": entropy,
    }
    out = {name: torch.zeros(B, T, device=generated.query_responses.device) for name, on in wanted.items() if on}
    temperature = config.sampling.temperature
    for rows, inputs, t, real in first_pass(config, generated, unit, d):
        ref = models.reference.logprobs(*inputs, t, temperature) if wanted["ref_logprobs"] else None
        old = models.old_scores(*inputs, t, temperature, entropy=entropy) if policy and fused is None else None
        if real:
            _fill(out, (rows, slice(None, t)), ref, old)
    first = None
    if fused is not None:
        own = torch.tensor(d.shard(B))
        with torch.enable_grad():
            first = fused(own)
        _fill(out, own, None, first)
    out = {name: d.sum(x) for name, x in out.items()}
    masks = response_masks(generated.responses, pad_token_id=generated.pad_token_id)
    for name in ("logprobs", "ref_logprobs"):
        if name in out:
            out[name] = out[name].masked_fill(masks.padding_mask, INVALID_LOGPROB)
    return NoGradPass(masks=masks, first=first, **{name: out.get(name) for name in wanted})


def _fill(
    out: dict[str, torch.Tensor],
    index: torch.Tensor | tuple[torch.Tensor, slice],
    ref: torch.Tensor | None,
    old: ScoredTokens | None,
) -> None:
    """Write one forward's outputs into the pass's buffers ``out`` at ``index`` (detached: a fused forward keeps its
    graph for the update)."""
    parts = {"ref_logprobs": ref} | ({} if old is None else old._asdict())
    for name, part in parts.items():
        if name in out and part is not None:
            out[name][index] = part.detach()


def pass_stats(
    passed: NoGradPass,
    generated: generation.Generated,
    kl: torch.Tensor | None,
    mask: torch.Tensor,
    scored: torch.Tensor,
) -> dict[str, float]:
    """With a reference, ``kl/mean``: per-sequence Σ (log π − log π_ref) over ``mask``, averaged over the scored
    sequences (the name users know it by; NaN when none was), and ``kl/estimator_mean``: the same of the estimator's
    per-token ``kl``; with old log-probs, ``rollout/logprob_diff_*`` (:func:`mismatch_stats`)."""
    stats = {}
    if passed.ref_logprobs is not None:
        stats["kl/mean"] = masked_sum(passed.logprobs - passed.ref_logprobs, mask, dim=-1)[scored].mean().item()
        stats["kl/estimator_mean"] = masked_sum(kl, mask, dim=-1)[scored].mean().item()
    if passed.logprobs is not None:
        stats |= mismatch_stats(passed.logprobs, generated.sampler_logprobs, mask)
    return stats


def missing_eos_penalized(config: PolicyGradientConfig, scores: torch.Tensor, has_stop: torch.Tensor) -> torch.Tensor:
    """``scores`` (B,) with ``reward.missing_eos_penalty`` applied to the responses that did not stop (when set)."""
    reward = config.reward
    if reward.missing_eos_penalty is None:
        return scores
    return penalize_missing_eos(scores, has_stop, reward.missing_eos_mode, reward.missing_eos_penalty)


MISMATCH_THRESHOLD = 0.5
"""``rollout/logprob_diff_frac``: the share of tokens whose |log π_trainer − log π_sampler| exceeds this (a
probability off by a factor e^0.5 ≈ 1.65)."""


def mismatch_stats(trainer: torch.Tensor, sampler: torch.Tensor | None, mask: torch.Tensor) -> dict[str, float]:
    """``rollout/logprob_diff_mean``, ``_max`` and ``_frac`` of the trainer's log-probs of the sampled tokens against
    the engine's, over ``mask`` (`rlhf.core.mismatch.logprob_mismatch`); none when the engine's are unknown."""
    if sampler is None:
        return {}
    mean, largest, above = logprob_mismatch(trainer.detach(), sampler, mask, MISMATCH_THRESHOLD)
    return {
        "rollout/logprob_diff_mean": mean.item(),
        "rollout/logprob_diff_max": largest.item(),
        "rollout/logprob_diff_frac": above.item(),
    }


def top_entropy_tokens(
    config: PolicyGradientConfig, entropy: torch.Tensor | None, mask: torch.Tensor
) -> tuple[torch.Tensor | None, dict[str, float]]:
    """The tokens the policy loss trains on under ``top_entropy_quantile`` (`rlhf.core.losses.top_entropy_mask`):
    chosen once per rollout from the sampling policy's entropies over the whole batch (every rank's rows), so
    neither the micro-batching nor the number of ranks changes them; None when every token trains. With
    ``policy/entropy_masked_fraction``, the share of ``mask``'s tokens left out."""
    quantile = config.algorithm.top_entropy_quantile
    if quantile >= 1.0:
        return None, {}
    if entropy is None:
        raise RuntimeError("top_entropy_quantile needs the rollout's entropies, and the no-grad pass gave none")
    keep = top_entropy_mask(entropy, mask, quantile)
    return keep, {"policy/entropy_masked_fraction": 1.0 - keep.sum().item() / max(int(mask.sum()), 1)}
