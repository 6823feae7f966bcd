"""Policy and value losses, their diagnostics, and loss aggregation (the length-bias knob).

Shapes (notation in ``rlhf.core``): ``logp``, ``old_logp``, ``values``, ``returns``, ``mask`` are ``(B, T)``;
advantages are ``(B, T)`` or ``(B,)`` (one per sequence, broadcast over its tokens).

The loss functions return a *per-token* loss ``(B, T)`` and a stats dict; the caller reduces it once with
:func:`aggregate`, which takes the global denominators explicitly so that gradient accumulation and data
parallelism need no other rescaling (docs/architecture.md, conventions).

Masked positions never matter: every input is replaced by a neutral value there *before* any arithmetic
(logp, old_logp, ref_logp → 0 so the ratio is 1 and k3 is 0; advantages, values, returns → 0), so NaN/inf
garbage in padding can change neither the loss nor its gradient, and the per-token loss is exactly 0 there.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from rlhf.core.choices import ImportanceLevel, LossAggregation, PolicyObjective
from rlhf.core.kl import KLEstimator, kl_estimate
from rlhf.core.masked import masked_mean, masked_sum, masked_var

Denominator = int | float | torch.Tensor


def aggregate(
    per_token: torch.Tensor,
    mask: torch.Tensor,
    mode: LossAggregation | str,
    *,
    num_tokens: Denominator | None = None,
    num_seqs: Denominator | None = None,
    max_len: Denominator | None = None,
) -> torch.Tensor:
    """Reduce a per-token loss ``(B, T)`` to a scalar by the formula of ``mode`` (:class:`LossAggregation`).

    Args:
        per_token: ``(B, T)`` loss per token; masked entries are ignored (NaN/inf there is harmless, their
            gradient is exactly 0).
        mask: ``(B, T)`` bool or {0, 1}.
        num_tokens: unmasked tokens of the WHOLE batch (all micro-batches and ranks); default this batch's.
        num_seqs: sequences of the whole batch; default ``B``.
        max_len: ``L_max`` of ``seq-mean-token-sum-norm``, normally ``max_new_tokens``; default ``T``.

    Every formula is a sum over sequences divided by a denominator that does not depend on how the batch is
    split, so Σ over micro-batches of ``aggregate(mb, mode, <global denominators>)`` equals ``aggregate`` of
    the full batch (up to float rounding) for every mode — do NOT also divide by the number of accumulation
    steps. Under DDP, whose all-reduce *averages* gradients, multiply the loss by ``world_size`` in the one
    place that owns the backward call. Source: TRL grpo_trainer L3124-3150 (``dapo`` uses the global
    ``num_items_in_batch``); torchtune PR #1875 ("(x1/n1)+(x2/n2) ≠ (x1+x2)/(n1+n2)").
    """
    mode = LossAggregation(mode)
    num_seqs = mask.shape[0] if num_seqs is None else num_seqs
    if mode == LossAggregation.TOKEN_MEAN:  # every token of the global batch weighs the same
        return masked_sum(per_token, mask) / (mask.to(per_token.dtype).sum() if num_tokens is None else num_tokens)
    if mode == LossAggregation.SEQ_MEAN_TOKEN_MEAN:
        # |o_i| is local to the sequence, so splitting by sequences is exact. An empty row contributes 0 but still
        # counts in N_seqs (TRL clamps |o_i| at 1).
        lengths = mask.to(per_token.dtype).sum(-1).clamp(min=1)
        return (masked_sum(per_token, mask, dim=-1) / lengths).sum() / num_seqs
    if mode == LossAggregation.SEQ_MEAN_TOKEN_SUM:  # longer sequences get proportionally more weight
        return masked_sum(per_token, mask) / num_seqs
    # seq-mean-token-sum-norm: a constant normaliser, no length bias (Dr. GRPO)
    return masked_sum(per_token, mask) / (num_seqs * (mask.shape[-1] if max_len is None else max_len))


def _neutral(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``x`` with masked entries replaced by 0 (a new tensor). ``where`` passes a zero gradient to the
    replaced entries, so garbage there can reach neither the loss nor the gradient."""
    return torch.where(mask.bool(), x, torch.zeros_like(x))


def _per_token_advantages(advantages: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    # (B,) sequence-level advantages are broadcast to every token of their sequence.
    return advantages.unsqueeze(-1).expand_as(like) if advantages.dim() == 1 else advantages


def importance_log_ratio(
    logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor, level: ImportanceLevel | str = "token"
) -> torch.Tensor:
    """``log ρ`` (B, T) at ``level`` (:class:`ImportanceLevel`), 0 at masked positions.

    ``token``: ``log ρ_t = logp_t − old_t``. ``sequence`` (GSPO, Zheng et al. 2025, arXiv 2507.18071): one per
    sequence, ``log s = Σ_t m_t (logp_t − old_t) / Σ_t m_t`` — the geometric mean of the token ratios, so its size
    does not grow with the length — broadcast to the sequence's tokens; its gradient flows through the mean (TRL
    ``importance_sampling_level: sequence``). ``sequence_token`` (the paper's GSPO-token): the same value,
    ``log s_t = sg(log s) + logp_t − sg(logp_t)``, whose gradient is each token's own ∇log π_t (verl's ``gspo``); with
    one advantage per sequence and ``seq-mean-token-mean`` both give GSPO's gradient. Inputs must already be 0 where
    masked (as :func:`clipped_policy_loss` makes them); an empty row has ratio 1.
    """
    log_ratio = logp - old_logp
    level = ImportanceLevel(level)
    if level == ImportanceLevel.TOKEN:
        return log_ratio
    m = mask.to(log_ratio.dtype)
    per_sequence = ((log_ratio * m).sum(-1, keepdim=True) / m.sum(-1, keepdim=True).clamp(min=1)).expand_as(logp)
    if level == ImportanceLevel.SEQUENCE:
        return per_sequence * m
    return (per_sequence.detach() + logp - logp.detach()) * m


def _clip_surrogate(
    ratio: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, low: float, high: float
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    # PPO: max(−Aρ, −A·clip(ρ, 1−ε_low, 1+ε_high)); a token past its side of the clip passes no gradient
    pg1 = -adv * ratio
    pg2 = -adv * torch.clamp(ratio, 1.0 - low, 1.0 + high)
    with torch.no_grad():
        below, above = (ratio < 1.0 - low) & (adv < 0), (ratio > 1.0 + high) & (adv > 0)
        stats = _clip_stats(pg2 > pg1, below, above, mask, ratio.dtype)
    return torch.maximum(pg1, pg2), stats


def _cispo_surrogate(
    ratio: torch.Tensor, logp: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, high: float
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    # CISPO: −sg(min(ρ, 1+ε_high))·A·log π — the weight is capped, the token's gradient A·w·∇log π never dropped
    weight = torch.clamp(ratio, max=1.0 + high).detach()
    with torch.no_grad():
        capped = ratio > 1.0 + high
        stats = _clip_stats(capped, torch.zeros_like(capped), capped & (adv > 0), mask, ratio.dtype)
    return -weight * adv * logp, stats


def _sapo_surrogate(
    ratio: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, temperatures: tuple[float, float]
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    # SAPO: −(4/τ)·σ(τ(ρ−1))·A, τ = τ_pos for A > 0 else τ_neg. Its gradient is the plain −A·ρ·∇log π times the
    # gate 4σ(1−σ) (1 at ρ = 1, falling smoothly as ρ leaves 1): a soft trust region instead of a hard clip.
    tau = torch.where(adv > 0, ratio.new_tensor(temperatures[0]), ratio.new_tensor(temperatures[1]))
    sig = torch.sigmoid(tau * (ratio - 1.0))
    with torch.no_grad():
        damped = 4.0 * sig * (1.0 - sig) < 0.5  # the gate passes less than half the gradient
        stats = _clip_stats(damped, damped & (ratio < 1), damped & (ratio > 1), mask, ratio.dtype)
    return -(4.0 / tau) * sig * adv, stats


VESPO_LOG_W_RANGE = (math.log(1e-8), 20.0)
"""Bounds of VESPO's log W (its authors' code and TRL's): φ is computed in range; past them it is ~0 anyway."""


def _vespo_surrogate(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    kernels: tuple[tuple[float, float], tuple[float, float]],
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    # VESPO: −sg(φ(W))·A·log π, W = Π_t ρ_t — a product, not GSPO's geometric mean: the kernel is derived for the true
    # sequence weight; φ(W) = e^λ·W^k·e^{−λW} ((k, λ) = kernels[0] where A ≥ 0, else [1]) as log φ = λ + k·log W − λ·W,
    # each token's log ρ clamped to ±20 and log W to VESPO_LOG_W_RANGE (the authors' bounds: exp never overflows).
    with torch.no_grad():
        m = mask.to(logp.dtype)
        log_w = ((logp - old_logp).clamp(-20.0, 20.0) * m).sum(-1, keepdim=True).clamp(*VESPO_LOG_W_RANGE)
        positive = adv >= 0
        k = torch.where(positive, adv.new_tensor(kernels[0][0]), adv.new_tensor(kernels[1][0]))
        lam = torch.where(positive, adv.new_tensor(kernels[0][1]), adv.new_tensor(kernels[1][1]))
        phi = torch.exp(lam + k * log_w - lam * log_w.exp())
        damped = phi < 0.5  # the kernel passes less than half the gradient
        stats = _clip_stats(damped, damped & (log_w < 0), damped & (log_w > 0), mask, logp.dtype)
        stats["vespo_phi_mean"] = masked_mean(phi, mask)
    return -phi * adv * logp, stats


def _clip_stats(
    clipped: torch.Tensor, low: torch.Tensor, high: torch.Tensor, mask: torch.Tensor, dtype: torch.dtype
) -> dict[str, torch.Tensor]:
    return {
        "clipfrac": masked_mean(clipped.to(dtype), mask),
        "clip_ratio/low": masked_mean(low.to(dtype), mask),
        "clip_ratio/high": masked_mean(high.to(dtype), mask),
        "clip_ratio/region": masked_mean((low | high).to(dtype), mask),
    }


@dataclasses.dataclass(frozen=True)
class Objective:
    """The policy's surrogate in :func:`clipped_policy_loss` and its settings (the trainers build one from their config
    section: `rlhf.trainers.rl.updates.objective`). Checked when made.

    kind: :class:`PolicyObjective` (clip, cispo, sapo, vespo).
    clip_low, clip_high: ε_low, ε_high; ``clip_high=None`` means ε_high = ε_low. DAPO: 0.2 / 0.28; CISPO uses
        ε_high only (ScaleRL and TRL recommend a cap of 5, ε_high = 4).
    dual_clip: c > 1, or None for no dual clip (verl default when enabled: 3.0); ``clip`` only. TRL's and
        INTELLECT-2's two-sided clip δ (ρ clamped at δ before the min) is this cap for δ > 1 + ε_high.
    importance_level: :class:`ImportanceLevel` of the ratio (token, sequence, sequence_token).
    sapo_temperatures: (τ_pos, τ_neg), TRL's defaults (1.0, 1.05).
    vespo_kernels: ((k_pos, λ_pos), (k_neg, λ_neg)), TRL's and the paper's code's defaults ((2, 3), (3, 2)).
    kl_bias_correction: weight the KL term by ρ; the logged ``kl`` is then the mean of ρ·k3.
    """

    kind: PolicyObjective = PolicyObjective.CLIP
    clip_low: float = 0.2
    clip_high: float | None = None
    dual_clip: float | None = None
    importance_level: ImportanceLevel = ImportanceLevel.TOKEN
    sapo_temperatures: tuple[float, float] = (1.0, 1.05)
    vespo_kernels: tuple[tuple[float, float], tuple[float, float]] = ((2.0, 3.0), (3.0, 2.0))
    kl_bias_correction: bool = False

    def __post_init__(self) -> None:
        kind, level, c = PolicyObjective(self.kind), ImportanceLevel(self.importance_level), self.dual_clip
        object.__setattr__(self, "kind", kind)  # a plain string (a config value) becomes the enum
        object.__setattr__(self, "importance_level", level)
        if c is not None and (c <= 1.0 or kind != PolicyObjective.CLIP):
            why = "caps the loss at -c*A for A < 0" if c <= 1.0 else f"is a cap of the clip, not of {kind}"
            raise ValueError(f"dual_clip must be > 1 with objective 'clip' (it {why}), got {c}")
        if kind == PolicyObjective.VESPO and level != ImportanceLevel.TOKEN:
            raise ValueError(
                f"vespo weighs by the product of the token ratios itself; importance_level must be 'token', "
                f"not {level.value!r}"
            )

    @property
    def eps_high(self) -> float:
        return self.clip_low if self.clip_high is None else self.clip_high


def clipped_policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    objective: Objective = Objective(),
    ref_logp: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    clipped: bool = True,
    is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The policy's surrogate loss per token — PPO's clip, CISPO's clipped weight, SAPO's soft gate or VESPO's
    sequence kernel — on token or sequence ratios (GSPO), optionally dual-clipped, weighted and with a KL term. Why
    each, and where it differs from TRL and verl: docs/grpo_variants.md.

    ``ρ = exp(log ρ)`` with ``log ρ`` from :func:`importance_log_ratio` at ``importance_level``. By ``objective``:

    - ``clip``: ``pg1 = −A·ρ``; ``pg2 = −A·clip(ρ, 1−ε_low, 1+ε_high)``; ``ℓ = max(pg1, pg2)`` (= −min(ρA,
      clip(ρ)A), TRL's ``coef_1``/``coef_2`` form); dual clip (Ye et al. 2020, c > 1): for A < 0,
      ``ℓ = min(ℓ, −c·A)`` (caps the loss of a very large ratio on a negative advantage; verl clip_ratio_c).
    - ``cispo`` (the MiniMax-M1 report, 2025, arXiv 2506.13585): ``ℓ = −sg(min(ρ, 1+ε_high))·A·log π``, no lower
      bound; its gradient ``−w·A·∇log π`` reaches every token, the capped ones with weight 1+ε_high.
    - ``sapo`` (Soft Adaptive Policy Optimization, 2025, arXiv 2511.20347): ``ℓ = −(4/τ)·σ(τ(ρ−1))·A``,
      τ = ``sapo_temperatures[0]`` for A > 0 else ``[1]``.
    - ``vespo`` (Variational Sequence-level Soft Policy Optimization, 2026, arXiv 2602.10693):
      ``ℓ = −sg(φ(W))·A·log π`` with ``W = Π_t ρ_t`` the product of the sequence's token ratios (``importance_level``
      ``token`` only) and ``φ(W) = e^λ·W^k·e^{−λW}`` (φ(1) = 1), (k, λ) = ``vespo_kernels[0]`` where A ≥ 0, else
      ``[1]``.

    Then the weights w (the sampler correction, `rlhf.core.mismatch.importance_weights`, and the entropy and
    off-policy masks): ``ℓ = w·ℓ``, before the KL term (TRL's order); KL in the loss (GRPO): ``ℓ += β · k3``,
    ``k3 = exp(ref − logp) − (ref − logp) − 1`` (Schulman's k3, via ``rlhf.core.kl``; TRL grpo_trainer
    L3069-3076), whose gradient is not the gradient of reverse KL off-policy (trl#3025, #4637; checklist item 40).
    ``kl_bias_correction`` (DeepSeek-V3.2, arXiv 2512.02556; TRL's ``use_bias_correction_kl``) makes it so:
    ``ℓ += β · ρ · k3`` with ρ the ratio above, gradient and all (the derivation: docs/grpo_variants.md, "The KL
    term in the loss"); at a sequence level ρ is the sequence's, as in TRL.

    Args:
        logp, old_logp: ``(B, T)`` log-probs of the sampled tokens under the current / rollout policy.
        advantages: ``(B, T)`` or ``(B,)``; treated as constants by the caller (detach them).
        mask: ``(B, T)``; the returned loss is exactly 0 at masked positions.
        objective: the surrogate and its settings (:class:`Objective`).
        ref_logp, kl_coef: optional ``(B, T)`` reference-policy log-probs and β; no KL term when None.
        clipped: False gives the vanilla policy-gradient loss ``ℓ = −A·ρ`` whatever the objective (the KL term
            as above), the warm-up objective of ``warmup_pg_steps``. Its gradient is ``−A·ρ·∇logp``: at ρ = 1 (the
            first pass over a rollout) exactly REINFORCE with the advantages' baseline. The stats are the same,
            so ``clipfrac`` tells how much the objective would have acted.
        is_weights: optional ``(B, T)`` weights of the surrogate, without gradient.

    Returns:
        ``(per_token_loss (B, T), stats)``; reduce the loss with :func:`aggregate`. Stats are masked means over
        this batch's tokens, detached. ``clipfrac``: the tokens whose gradient the objective drops or damps —
        ``clip``: pg2 > pg1 (OAI train_policy.py L355, TRL ppo_trainer L852-854; CleanRL's |ρ−1| > ε differs,
        reference 2-E 0.4 vs 0.8); ``cispo``: ρ > 1+ε_high (their weight capped; none is dropped); ``sapo``: the
        gate 4σ(1−σ) below ½; ``vespo``: φ(W) below ½. ``clip_ratio/low`` / ``clip_ratio/high``: ``clip`` ρ <
        1−ε_low with A < 0 / ρ > 1+ε_high with A > 0 (TRL grpo_trainer); ``cispo`` 0 / capped with A > 0 (TRL's
        ``cispo_clip_ratio``); ``sapo`` damped with ρ < 1 / ρ > 1, ``vespo`` damped with W < 1 / W > 1;
        ``clip_ratio/region`` either; ``vespo_phi_mean`` (vespo) the mean φ(W) over the tokens. Under a sequence
        level a sequence's tokens share its ratio, so these count the tokens of the sequences concerned.
        ``approx_kl`` = ½·mean((logp − old_logp)²) of the token log-ratios (OAI L360, TRL L857), and when used
        ``clip_ratio/dual`` (the −c·A cap is active) and ``kl`` (mean k3). Vectors: reference 2-E, 2-K;
        tests/core/test_losses.py.
    """
    kind, eps_high, dual_clip = objective.kind, objective.eps_high, objective.dual_clip
    logp = _neutral(logp, mask)
    old_logp = _neutral(old_logp, mask)
    adv = _neutral(_per_token_advantages(advantages, logp), mask)

    ratio = torch.exp(importance_log_ratio(logp, old_logp, mask, objective.importance_level))
    if kind == PolicyObjective.CLIP:
        surrogate, stats = _clip_surrogate(ratio, adv, mask, objective.clip_low, eps_high)
    elif kind == PolicyObjective.CISPO:
        surrogate, stats = _cispo_surrogate(ratio, logp, adv, mask, eps_high)
    elif kind == PolicyObjective.SAPO:
        surrogate, stats = _sapo_surrogate(ratio, adv, mask, objective.sapo_temperatures)
    else:
        surrogate, stats = _vespo_surrogate(logp, old_logp, adv, mask, objective.vespo_kernels)
    per_token = surrogate if clipped else -adv * ratio
    with torch.no_grad():
        stats["approx_kl"] = 0.5 * masked_mean((logp - old_logp) ** 2, mask)
    if dual_clip is not None and clipped:
        # Without the cap, ρ → ∞ on A < 0 gives an unbounded loss (ρ is not clipped from above for A < 0).
        cap = -dual_clip * adv
        with torch.no_grad():
            stats["clip_ratio/dual"] = masked_mean(((adv < 0) & (per_token > cap)).to(logp.dtype), mask)
        per_token = torch.where(adv < 0, torch.minimum(per_token, cap), per_token)
    if is_weights is not None:
        per_token = per_token * is_weights.detach()
    if ref_logp is not None:
        # k3 on inputs already neutralised: computed from raw padding, exp(garbage)·0 in the backward pass
        # would put NaN into the gradient even though the loss ignores those positions.
        kl = kl_estimate(logp, _neutral(ref_logp, mask), KLEstimator.K3)
        if objective.kl_bias_correction:
            kl = ratio * kl  # ρ is 1 where masked, and k3 is 0 there
        with torch.no_grad():
            stats["kl"] = masked_mean(kl, mask)
        per_token = per_token + kl_coef * kl
    return _neutral(per_token, mask), stats


def off_policy_mask(
    logp: torch.Tensor, behaviour_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, threshold: float
) -> torch.Tensor:
    """DeepSeek-V3.2's off-policy sequence mask (its eq. 9; TRL ``off_policy_mask_threshold``): ``(B, T)`` bool, False
    on the tokens of a sequence whose policy has drifted from the one that sampled it — the mean over its tokens
    of ``behaviour_logp − logp`` (a KL estimate, detached) above ``threshold`` — where the advantage is negative.
    A drifted sample with a positive advantage still teaches; pushing down one the current policy would hardly
    produce any more is what destabilises. ``behaviour_logp``: the sampler's log-probs when the engine reports
    them, else the rollout's old ones. ``advantages`` (B,) or (B, T). False at masked positions."""
    m = mask.to(logp.dtype)
    drift = _neutral(behaviour_logp, mask) - _neutral(logp.detach(), mask)  # 0 where masked
    mean_drift = drift.sum(-1, keepdim=True) / m.sum(-1, keepdim=True).clamp(min=1)
    adv = _per_token_advantages(advantages, logp)
    return mask.bool() & ((adv >= 0) | (mean_drift <= threshold))


def top_entropy_mask(entropy: torch.Tensor, mask: torch.Tensor, quantile: float) -> torch.Tensor:
    """The tokens of the highest entropy, ``(B, T)`` bool: those at or above the ``1 − quantile`` quantile (linear
    interpolation, as ``torch.quantile``) of ``entropy`` over the masked tokens (Wang et al. 2025, "Beyond the
    80/20 rule": training on the top 20 % "forking" tokens alone matches or beats all tokens; TRL
    ``top_entropy_quantile``). ``quantile`` 1 keeps every token, 0 only the highest. A sort rather than
    ``torch.quantile``, which refuses more than 2²⁴ elements."""
    values = entropy[mask.bool()].sort().values
    if values.numel() == 0:
        return torch.zeros_like(mask, dtype=torch.bool)
    position = (1.0 - quantile) * (values.numel() - 1)
    lower = values[int(position)]
    upper = values[min(int(position) + 1, values.numel() - 1)]
    threshold = lower + (upper - lower) * (position - int(position))
    return mask.bool() & (entropy >= threshold)


def clipped_value_loss(
    values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor, clip: float | None = 0.2
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO value loss per token: ``½·max((V − R)², (V_clip − R)²)``, ``V_clip = clip(V, V_old ± ε_v)``.

    Args:
        values: ``(B, T)`` current value predictions; old_values: ``(B, T)`` from the rollout; returns:
            ``(B, T)`` GAE returns (constants). mask: ``(B, T)`` (TRL/N+ use ``~padding_mask_p1``).
        clip: ε_v (OAI/TRL/N+ 0.2), or None for the unclipped ``½·(V − R)²``.

    Returns:
        ``(per_token_loss (B, T), {"clipfrac"})``; ``clipfrac`` = masked mean of ``(V_clip − R)² > (V − R)²``
        (0 when ``clip`` is None). Reduce with :func:`aggregate` (token-mean reproduces OAI/TRL).
        Sources: OAI train_policy.py L343-348, N+ ppo.py L739-748, TRL ppo_trainer L827-840; CleanRL's
        ``V_old + clamp(V − V_old, −c, c)`` is the same quantity. Vector: reference 2-F.
    """
    values = _neutral(values, mask)
    returns = _neutral(returns, mask)
    unclipped = (values - returns) ** 2
    if clip is None:
        return _neutral(0.5 * unclipped, mask), {"clipfrac": values.new_zeros(())}
    old_values = _neutral(old_values, mask)
    v_clip = torch.clamp(values, old_values - clip, old_values + clip)
    clipped = (v_clip - returns) ** 2
    with torch.no_grad():
        stats = {"clipfrac": masked_mean((clipped > unclipped).to(values.dtype), mask)}
    return _neutral(0.5 * torch.maximum(unclipped, clipped), mask), stats


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``1 − Var(R − V) / Var(R)`` over the masked entries (a detached scalar; NaN when Var(R) = 0). 1 = perfect critic,
    0 = no better than predicting the mean, < 0 = worse. Population variances (the n cancels). Shapes ``(B, T)``.
    Sources: CleanRL ppo.py L295-297, OAI train_policy.py ``var_explained`` L241."""
    with torch.no_grad():
        var_r = masked_var(returns, mask, unbiased=False)
        var_err = masked_var(returns - values, mask, unbiased=False)
        # CleanRL returns NaN when Var(R) = 0; 0/0 or x/0 here would give NaN or −inf.
        return torch.where(var_r == 0, torch.full_like(var_r, float("nan")), 1.0 - var_err / var_r)
