"""The GRPO family's policy objectives in rlhf.core.losses — GSPO's sequence ratios, CISPO, SAPO — and the entropy and
off-policy masks: hand-computed vectors (arithmetic in the comments), gradient checks, and the loop-form definitions
with hypothesis (ragged rows, empty rows, garbage in padding)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlhf.core.choices import ImportanceLevel, PolicyObjective
from rlhf.core.losses import aggregate, clipped_policy_loss, importance_log_ratio, off_policy_mask, top_entropy_mask
from vectors import F64, close, t

# ---------------------------------------------------------------- GSPO: one ratio per sequence
# rows: log ρ = [0.2, −0.1] (len 2), [0.3, 0.3, 0.6] (len 3), empty, [0.1, −0.1] (len 2), [−0.3, −0.3] (len 2);
# A = [1, 0.5, −1, −0.5, −1]. log s = the row's mean: 0.05, 0.4, (empty: 0), 0, −0.3 →
# s = 1.0512711, 1.4918247 (past 1 + ε_high = 1.2 with A > 0), 1, 1 (a row exactly at ratio 1), 0.7408182 (past
# 1 − ε_low = 0.8 with A < 0)
G_LOG_RATIO = t(
    [[0.2, -0.1, 9.0], [0.3, 0.3, 0.6], [7.0, 7.0, 7.0], [0.1, -0.1, 5.0], [-0.3, -0.3, 3.0]]
)  # 9, 7, 5, 3: padding
G_MASK = torch.tensor([[1, 1, 0], [1, 1, 1], [0, 0, 0], [1, 1, 0], [1, 1, 0]], dtype=torch.bool)
G_A = t([1.0, 0.5, -1.0, -0.5, -1.0])
S0, S1, S4 = math.exp(0.05), math.exp(0.4), math.exp(-0.3)


def g_loss(level, **kw):
    logp = G_LOG_RATIO.clone().requires_grad_()
    per_token, stats = clipped_policy_loss(logp, torch.zeros_like(logp), G_A, G_MASK, importance_level=level, **kw)
    return logp, per_token, stats


@pytest.mark.parametrize("level", ["sequence", "sequence_token"])
def test_gspo_sequence_ratio_clipped_per_sequence(level):
    logp, per_token, stats = g_loss(level)
    ratios = torch.exp(importance_log_ratio(logp, torch.zeros_like(logp), G_MASK, level))[:, 0]
    close(ratios, [S0, S1, 1.0, 1.0, S4])
    # row 0: −A·s = −1.0512711 (inside the clip); row 1: −0.5·clip(s) = −0.5·1.2 = −0.6 on each token; row 3: s = 1
    # → −A = 0.5; row 4: max(−A·s, −A·0.8) = max(0.7408182, 0.8) = 0.8; padding and the empty row 0
    close(per_token, [[-S0, -S0, 0.0], [-0.6, -0.6, -0.6], [0.0, 0.0, 0.0], [0.5, 0.5, 0.0], [0.8, 0.8, 0.0]])
    # seq-mean-token-mean (GSPO's own): (−1.0512711 − 0.6 + 0 + 0.5 + 0.8) / 5 = −0.0702542
    close(aggregate(per_token, G_MASK, "seq-mean-token-mean"), (-S0 - 0.6 + 0.5 + 0.8) / 5)
    # a sequence is clipped whole: rows 1 (3 tokens, high) and 4 (2 tokens, low) of the 9 tokens
    close(stats["clipfrac"], 5 / 9)
    close(stats["clip_ratio/high"], 3 / 9)
    close(stats["clip_ratio/low"], 2 / 9)
    close(stats["approx_kl"], 0.5 * (0.04 + 0.01 + 0.09 + 0.09 + 0.36 + 0.01 + 0.01 + 0.09 + 0.09) / 9)  # token log ρ


@pytest.mark.parametrize("level", ["sequence", "sequence_token"])
def test_gspo_gradient_is_the_sequence_level_formula(level):
    # GSPO's gradient of −A·s/N (N = 5 sequences): −A·s·(1/|y|)·Σ_t ∇log π_t / N, so each token of row 0 gets
    # −1·1.0512711/2/5 = −0.1051271; the clipped rows 1 and 4 none; row 3 (s = 1): +0.5/2/5 = 0.05; padding none.
    logp, per_token, _ = g_loss(level)
    aggregate(per_token, G_MASK, "seq-mean-token-mean").backward()
    expected = [[-S0 / 10, -S0 / 10, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.05, 0.05, 0.0], [0.0, 0.0, 0.0]]
    close(logp.grad, expected)


def test_sequence_token_level_follows_each_tokens_own_advantage():
    # with per-token advantages the two levels part: GSPO-token's gradient is −A_t·s·∇log π_t (token's own A),
    # GSPO's −s·mean_t(A_t)·∇log π_t... spread evenly. Row log ρ = [0.1, −0.1] → s = 1; A = [1, −1], one sequence,
    # token-sum: sequence_token → [−1, 1]; sequence → −(1·s + −1·s)/2 per token = [0, 0].
    logp = t([[0.1, -0.1]]).requires_grad_()
    mask = torch.ones(1, 2, dtype=torch.bool)
    for level, expected in (("sequence_token", [[-1.0, 1.0]]), ("sequence", [[0.0, 0.0]])):
        logp.grad = None
        loss, _ = clipped_policy_loss(logp, torch.zeros_like(logp), t([[1.0, -1.0]]), mask, importance_level=level)
        loss.sum().backward()
        close(logp.grad, expected)


# ---------------------------------------------------------------- CISPO: the weight is clipped, not the update
# ρ = [1.5, 6, 0.5, 6], A = [1, 1, −1, −1], ε_high = 4 (a cap of 5): w = sg(min(ρ, 5)) = [1.5, 5, 0.5, 5]
# log π = log ρ (old = 0) = [0.4054651, 1.7917595, −0.6931472, 1.7917595]; ℓ = −w·A·log π
C_RATIO = t([[1.5, 6.0, 0.5, 6.0]])
C_A = t([[1.0, 1.0, -1.0, -1.0]])
C_MASK = torch.ones(1, 4, dtype=torch.bool)


def test_cispo_loss_and_stats():
    logp = torch.log(C_RATIO)
    per_token, stats = clipped_policy_loss(logp, torch.zeros_like(logp), C_A, C_MASK, objective="cispo", clip_high=4)
    close(per_token, [[-1.5 * 0.4054651081, -5 * 1.7917594692, -0.5 * 0.6931471806, 5 * 1.7917594692]])
    close(stats["clipfrac"], 0.5)  # tokens 1 and 3: weight capped at 5 (their gradient scaled, not dropped)
    close(stats["clip_ratio/high"], 0.25)  # capped with A > 0 (TRL's cispo_clip_ratio)
    close(stats["clip_ratio/low"], 0.0)  # no lower bound


def test_cispo_passes_gradient_to_clipped_tokens():
    # ∂ℓ/∂log π = −w·A = [−1.5, −5, 0.5, 5]: every token moves. PPO's clip at the same cap gives 0 at token 1
    # (ρ = 6 > 5 with A > 0: the flat side) — the gradient CISPO keeps.
    logp = torch.log(C_RATIO).requires_grad_()
    per_token, _ = clipped_policy_loss(logp, torch.zeros_like(logp), C_A, C_MASK, objective="cispo", clip_high=4)
    per_token.sum().backward()
    close(logp.grad, [[-1.5, -5.0, 0.5, 5.0]])
    logp.grad = None
    per_token, _ = clipped_policy_loss(logp, torch.zeros_like(logp), C_A, C_MASK, clip_high=4)
    per_token.sum().backward()
    assert logp.grad[0, 1] == 0 and logp.grad[0, 3] != 0  # the clip drops token 1; A < 0 is not capped above


# ---------------------------------------------------------------- SAPO: a soft gate instead of the clip
# ρ = [1, 2, 0.5, 4], A = [1, −1, 2, 1]; τ = 1 for A > 0, 1.05 for A ≤ 0. σ = sigmoid(τ(ρ − 1)):
# σ = [0.5, σ(1.05) = 0.7407749, σ(−0.5) = 0.3775407, σ(3) = 0.9525741]; ℓ = −(4/τ)·σ·A =
# [−2, +2.8220, −3.0203, −3.8103]; gradient −A·4σ(1−σ)·ρ = [−1, 1.5362, −0.9400, −0.7228]; gate 4σ(1−σ) =
# [1, 0.7681, 0.9400, 0.1807] → one token (ρ = 4) damped below ½.
S_RATIO = t([[1.0, 2.0, 0.5, 4.0]])
S_A = t([[1.0, -1.0, 2.0, 1.0]])


def test_sapo_loss_gradient_and_stats():
    logp = torch.log(S_RATIO).requires_grad_()
    per_token, stats = clipped_policy_loss(logp, torch.zeros_like(logp), S_A, C_MASK, objective="sapo")
    close(per_token, [[-2.0, 2.822000, -3.020325, -3.810297]], atol=2e-6)  # 7 digits written above
    per_token.sum().backward()
    close(logp.grad, [[-1.0, 1.53622, -0.940015, -0.722827]], atol=2e-6)
    close(stats["clipfrac"], 0.25)
    close(stats["clip_ratio/high"], 0.25)  # the damped token has ρ > 1
    close(stats["clip_ratio/low"], 0.0)


def test_every_objective_is_plain_policy_gradient_at_ratio_one():
    # At ρ = 1 (the first pass over a rollout) clip, CISPO and SAPO all give ∂ℓ/∂log π = −A.
    adv = t([[1.0, -2.0, 0.5]])
    mask = torch.ones(1, 3, dtype=torch.bool)
    for objective in PolicyObjective:
        logp = t([[-0.3, -1.2, -2.0]]).requires_grad_()
        per_token, stats = clipped_policy_loss(logp, logp.detach(), adv, mask, objective=objective)
        per_token.sum().backward()
        close(logp.grad, -adv)
        assert stats["clipfrac"] == 0


def test_dual_clip_is_refused_outside_the_clip():
    with pytest.raises(ValueError, match="dual_clip"):
        clipped_policy_loss(t([[0.0]]), t([[0.0]]), t([[1.0]]), C_MASK[:, :1], objective="cispo", dual_clip=3.0)


# ---------------------------------------------------------------- the masks
def test_off_policy_mask_drops_drifted_sequences_with_negative_advantage():
    # behaviour − current per token; mean over the row's tokens: row 0 [0.6, 0.8] → 0.7 > 0.5 with A < 0: masked;
    # row 1 the same drift with A > 0: kept; row 2 [0.2, 0.4] → 0.3 ≤ 0.5: kept; row 3 [0.5, garbage] → 0.5 (the
    # padding is not counted): kept, at the threshold exactly.
    behaviour = t([[0.6, 0.8], [0.6, 0.8], [0.2, 0.4], [0.5, 1e9]])
    mask = torch.tensor([[1, 1], [1, 1], [1, 1], [1, 0]], dtype=torch.bool)
    keep = off_policy_mask(torch.zeros(4, 2, dtype=F64), behaviour, t([-1.0, 1.0, -1.0, -1.0]), mask, 0.5)
    assert keep.tolist() == [[False, False], [True, True], [True, True], [True, False]]
    # per-token advantages (PPO): only the negative tokens of a drifted row go
    keep = off_policy_mask(torch.zeros(1, 2, dtype=F64), behaviour[:1], t([[1.0, -1.0]]), mask[:1], 0.5)
    assert keep.tolist() == [[True, False]]


def test_top_entropy_mask_by_hand_and_against_torch_quantile():
    # valid entropies [0.1, 0.9, 0.5, 0.3, 0.7] → sorted [0.1, 0.3, 0.5, 0.7, 0.9]; top 20 %: the 0.8 quantile at
    # position 0.8·4 = 3.2 → 0.7 + 0.2·(0.9 − 0.7) = 0.74 → only 0.9 kept; top 50 %: position 2 → 0.5 and above.
    entropy = t([[0.1, 0.9, 0.5, 99.0], [0.3, 0.7, 99.0, 99.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]], dtype=torch.bool)
    assert top_entropy_mask(entropy, mask, 0.2).tolist() == [[False, True, False, False], [False, False, False, False]]
    assert top_entropy_mask(entropy, mask, 0.5).tolist() == [[False, True, True, False], [False, True, False, False]]
    assert top_entropy_mask(entropy, mask, 1.0).equal(mask)
    assert top_entropy_mask(entropy, mask, 0.0).sum() == 1  # only the highest
    assert not top_entropy_mask(entropy, torch.zeros_like(mask), 0.2).any()
    g = torch.Generator().manual_seed(0)
    values = torch.rand(7, 9, generator=g, dtype=F64)
    ragged = torch.rand(7, 9, generator=g) < 0.7
    for q in (0.05, 0.2, 0.37, 0.8):
        threshold = torch.quantile(values[ragged], 1 - q)
        assert top_entropy_mask(values, ragged, q).equal(ragged & (values >= threshold))


# ---------------------------------------------------------------- the loop-form definitions
def loop_loss(logp, old, adv, lengths, objective, level, low=0.2, high=0.28, taus=(1.0, 1.05)):
    """Σ over sequences and tokens of the per-token objective written one token at a time."""
    total = logp.sum() * 0.0  # a graph even when every row is empty
    for i, n in enumerate(lengths):
        if n == 0:
            continue
        log_s = sum(logp[i, k] - old[i, k] for k in range(n)) / n
        for k in range(n):
            log_r = {
                "token": logp[i, k] - old[i, k],
                "sequence": log_s,
                "sequence_token": log_s.detach() + logp[i, k] - logp[i, k].detach(),
            }[level]
            r, a = torch.exp(log_r), adv[i]
            if objective == "clip":
                term = torch.maximum(-a * r, -a * torch.clamp(r, 1 - low, 1 + high))
            elif objective == "cispo":
                term = -torch.clamp(r, max=1 + high).detach() * a * logp[i, k]
            else:
                tau = taus[0] if a > 0 else taus[1]
                term = -(4 / tau) * torch.sigmoid(tau * (r - 1)) * a
            total = total + term
    return total


@pytest.mark.parametrize("objective", list(PolicyObjective))
@pytest.mark.parametrize("level", list(ImportanceLevel))
@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), b=st.integers(1, 5), width=st.integers(1, 5))
def test_objectives_equal_their_loop_form(objective, level, seed, b, width):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, width + 1, (b,), generator=g).tolist()
    mask = torch.arange(width) < torch.tensor(lengths).unsqueeze(1)
    old = -torch.rand(b, width, generator=g, dtype=F64) * 3
    logp = (old + torch.randn(b, width, generator=g, dtype=F64) * 0.4).masked_fill(~mask, math.nan)
    adv = torch.randn(b, generator=g, dtype=F64)
    vec_in, loop_in = logp.clone().requires_grad_(), logp.nan_to_num(0.0).requires_grad_()
    per_token, _ = clipped_policy_loss(
        vec_in, old, adv, mask, clip_high=0.28, objective=objective, importance_level=level
    )  # NaN in the padding (garbage) changes nothing
    vectorised = aggregate(per_token, mask, "seq-mean-token-sum", num_seqs=1)
    loop = loop_loss(loop_in, old, adv, lengths, str(objective), str(level))
    vectorised.backward()
    loop.backward()
    # float64 sums of at most 25 terms: equal to rounding (1e-12 relative)
    torch.testing.assert_close(vectorised, loop, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(vec_in.grad, loop_in.grad.masked_fill(~mask, 0.0), rtol=1e-10, atol=1e-12)
