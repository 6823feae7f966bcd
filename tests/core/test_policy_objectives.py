"""The GRPO family's policy objectives in rlhf.core.losses — GSPO's sequence ratios, CISPO, SAPO, VESPO, the bias-corrected
KL term — and the entropy and off-policy masks: hand-computed vectors (arithmetic in the comments), gradient checks,
and the loop-form definitions with hypothesis (ragged rows, empty rows, garbage in padding)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlhf.core.choices import ImportanceLevel, PolicyObjective
from rlhf.core.losses import (
    Objective,
    aggregate,
    clipped_policy_loss,
    importance_log_ratio,
    off_policy_mask,
    top_entropy_mask,
)
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
    per_token, stats = clipped_policy_loss(
        logp, torch.zeros_like(logp), G_A, G_MASK, objective=Objective(importance_level=level, **kw)
    )
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
        loss, _ = clipped_policy_loss(
            logp, torch.zeros_like(logp), t([[1.0, -1.0]]), mask, objective=Objective(importance_level=level)
        )
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
    per_token, stats = clipped_policy_loss(
        logp, torch.zeros_like(logp), C_A, C_MASK, objective=Objective(kind="cispo", clip_high=4)
    )
    close(per_token, [[-1.5 * 0.4054651081, -5 * 1.7917594692, -0.5 * 0.6931471806, 5 * 1.7917594692]])
    close(stats["clipfrac"], 0.5)  # tokens 1 and 3: weight capped at 5 (their gradient scaled, not dropped)
    close(stats["clip_ratio/high"], 0.25)  # capped with A > 0 (TRL's cispo_clip_ratio)
    close(stats["clip_ratio/low"], 0.0)  # no lower bound


def test_cispo_passes_gradient_to_clipped_tokens():
    # ∂ℓ/∂log π = −w·A = [−1.5, −5, 0.5, 5]: every token moves. PPO's clip at the same cap gives 0 at token 1
    # (ρ = 6 > 5 with A > 0: the flat side) — the gradient CISPO keeps.
    logp = torch.log(C_RATIO).requires_grad_()
    per_token, _ = clipped_policy_loss(
        logp, torch.zeros_like(logp), C_A, C_MASK, objective=Objective(kind="cispo", clip_high=4)
    )
    per_token.sum().backward()
    close(logp.grad, [[-1.5, -5.0, 0.5, 5.0]])
    logp.grad = None
    per_token, _ = clipped_policy_loss(logp, torch.zeros_like(logp), C_A, C_MASK, objective=Objective(clip_high=4))
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
    per_token, stats = clipped_policy_loss(logp, torch.zeros_like(logp), S_A, C_MASK, objective=Objective(kind="sapo"))
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
        per_token, stats = clipped_policy_loss(logp, logp.detach(), adv, mask, objective=Objective(kind=objective))
        per_token.sum().backward()
        close(logp.grad, -adv)
        assert stats["clipfrac"] == 0


def test_dual_clip_is_refused_outside_the_clip():
    with pytest.raises(ValueError, match="dual_clip"):
        clipped_policy_loss(
            t([[0.0]]), t([[0.0]]), t([[1.0]]), C_MASK[:, :1], objective=Objective(kind="cispo", dual_clip=3.0)
        )


# ---------------------------------------------------------------- VESPO: a kernel of the sequence's whole ratio
# rows (old = 0, so log π = log ρ): [0.1, 0.2] A = 1; [−0.2, 0, −0.3] A = −0.5; empty; [0, 0] A = 0; [1.5] A = 2.
# log W = Σ_t log ρ_t (a product of ratios, not a mean): 0.3, −0.5, 0, 0, 1.5. φ = exp(λ + k·log W − λ·W):
# row 0 (A ≥ 0: k = 2, λ = 3): W = 1.3498588; log φ = 3 + 0.6 − 4.0495764 = −0.4495764 → φ = 0.6378983
# row 1 (A < 0: k = 3, λ = 2): W = 0.6065307; log φ = 2 − 1.5 − 1.2130613 = −0.7130613 → φ = 0.4901414 (< ½, W < 1)
# row 3 (A = 0 counts as ≥ 0): W = 1 → φ = e³·e⁻³ = 1; row 4: W = 4.4816891; log φ = 3 + 3 − 13.4450672 =
# −7.4450672 → φ = 0.0005843 (< ½, W > 1). ℓ = −φ·A·log π; ∂ℓ/∂log π = −φ·A.
V_LOG_RATIO = t([[0.1, 0.2, 9.0], [-0.2, 0.0, -0.3], [5.0, 5.0, 5.0], [0.0, 0.0, 7.0], [1.5, 3.0, 3.0]])  # 9, 7…: pad
V_MASK = torch.tensor([[1, 1, 0], [1, 1, 1], [0, 0, 0], [1, 1, 0], [1, 0, 0]], dtype=torch.bool)
V_A = t([1.0, -0.5, 1.0, 0.0, 2.0])
PHI = [0.637898293623749, 0.4901414189451187, 1.0, 1.0, 0.0005843168265570742]


def test_vespo_loss_gradient_and_stats():
    logp = V_LOG_RATIO.clone().requires_grad_()
    per_token, stats = clipped_policy_loss(logp, torch.zeros_like(logp), V_A, V_MASK, objective=Objective(kind="vespo"))
    p0, p1, _, _, p4 = PHI
    expected = [[-p0 * 0.1, -p0 * 0.2, 0.0], [0.5 * p1 * -0.2, 0.0, 0.5 * p1 * -0.3], [0.0] * 3, [0.0] * 3,
                [-2 * p4 * 1.5, 0.0, 0.0]]  # fmt: skip
    close(per_token, expected)
    per_token.sum().backward()
    close(logp.grad, [[-p0, -p0, 0.0], [0.5 * p1] * 3, [0.0] * 3, [0.0, 0.0, 0.0], [-2 * p4, 0.0, 0.0]])
    # 8 tokens: rows 1 (3 tokens, W < 1) and 4 (1 token, W > 1) have φ < ½
    close(stats["clipfrac"], 4 / 8)
    close(stats["clip_ratio/low"], 3 / 8)
    close(stats["clip_ratio/high"], 1 / 8)
    close(stats["vespo_phi_mean"], (2 * p0 + 3 * p1 + 2 * 1.0 + p4) / 8)


def test_vespo_kernels_peak_at_k_over_lambda_and_clamp_log_w():
    # one token, A = 1, kernel (k, λ) = (2, 4): φ is largest at W = k/λ = ½: e⁴·¼·e⁻² = e²/4 = 1.8472640
    logp = t([[math.log(0.5)]])
    one = torch.ones(1, 1, dtype=torch.bool)
    _, stats = clipped_policy_loss(
        logp, t([[0.0]]), t([1.0]), one, objective=Objective(kind="vespo", vespo_kernels=((2, 4), (3, 2)))
    )
    close(stats["vespo_phi_mean"], math.exp(2) / 4)
    # log ρ = [25, −30]: each token clamped to ±20 first, so log W = 0 and φ = 1 (unclamped, −5 would give
    # φ = e³·e⁻¹⁰·e^(−3e⁻⁵) ≈ 9e-4)
    logp = t([[25.0, -30.0]])
    _, stats = clipped_policy_loss(
        logp, torch.zeros_like(logp), t([1.0]), torch.ones(1, 2, dtype=torch.bool), objective=Objective(kind="vespo")
    )
    close(stats["vespo_phi_mean"], 1.0)


def test_vespo_takes_the_token_level_only():
    with pytest.raises(ValueError, match="importance_level must be 'token'"):
        clipped_policy_loss(
            t([[0.0]]),
            t([[0.0]]),
            t([1.0]),
            C_MASK[:, :1],
            objective=Objective(kind="vespo", importance_level="sequence"),
        )


# ---------------------------------------------------------------- the KL term, plain and bias-corrected
# logp = [−1, −2], ref = [−1.5, −1]: log r = ref − logp = [−0.5, 1], r = [0.6065307, 2.7182818],
# k3 = r − 1 − log r = [0.1065307, 0.7182818] (vector 2-G). β = 0.1, A = 0 (the KL term alone).
# plain: ∂(β·k3)/∂log π = β·(1 − r) = [0.0393469, −0.1718282]
# corrected, off-policy with old = [−1.2, −2] (ρ = [e^0.2 = 1.2214028, 1]): ℓ = β·ρ·k3 =
#   [0.0130117, 0.0718282]; ∂/∂log π = β·ρ·(log π − ref) = [0.1·1.2214028·0.5, 0.1·1·(−1)] = [0.0610701, −0.1]
# corrected, on-policy (old = sg(log π), ρ = 1 with gradient): β·(log π − ref) = [0.05, −0.1], the plain
#   gradient + β·k3 = [0.0393469 + 0.0106531, −0.1718282 + 0.0718282]
K_LOGP, K_REF = t([[-1.0, -2.0]]), t([[-1.5, -1.0]])
K3 = [math.exp(-0.5) + 0.5 - 1, math.e - 2]


def kl_term(old, level="token", **kw):
    logp = K_LOGP.clone().requires_grad_()
    mask = torch.ones(1, 2, dtype=torch.bool)
    old = logp.detach() if old is None else old
    loss, stats = clipped_policy_loss(
        logp, old, t([0.0]), mask, ref_logp=K_REF, kl_coef=0.1, objective=Objective(importance_level=level, **kw)
    )
    loss.sum().backward()
    return loss, logp.grad, stats


def test_bias_corrected_kl_by_hand_off_and_on_policy():
    loss, grad, stats = kl_term(t([[-1.2, -2.0]]))
    close(loss, [[0.1 * K3[0], 0.1 * K3[1]]])
    close(grad, [[0.1 * (1 - math.exp(-0.5)), 0.1 * (1 - math.e)]])
    rho = math.exp(0.2)
    loss, grad, stats = kl_term(t([[-1.2, -2.0]]), kl_bias_correction=True)
    close(loss, [[0.1 * rho * K3[0], 0.1 * K3[1]]])
    close(grad, [[0.1 * rho * 0.5, -0.1]])
    close(stats["kl"], (rho * K3[0] + K3[1]) / 2)  # the term as it enters the loss (TRL's logged kl)
    _, plain, _ = kl_term(None)
    loss, grad, _ = kl_term(None, kl_bias_correction=True)
    close(loss, [[0.1 * K3[0], 0.1 * K3[1]]])  # ρ = 1: the same value…
    close(grad, [[0.05, -0.1]])  # …and a gradient larger by β·k3 per token
    close(grad - plain, [[0.1 * K3[0], 0.1 * K3[1]]])


# A token the policy moved |log r| = 5 from the reference (β = 0.1, on-policy, A = 0): k3 is not clamped
# (docs/ppo_checklist.md, item 40). log r = ref − logp = [5, −5]: k3 = [e⁵ − 6, e⁻⁵ + 4] = [142.4131591, 4.0067379];
# plain: ∂/∂log π = β·(1 − e^(log r)) = [−14.7413159, 0.0993262] — unbounded where π ≪ π_ref;
# corrected (ρ = 1): β·(log π − ref) = [−0.5, 0.5] — linear in the drift; a clamp of k3 at 10 (verl's) would make
# both 0 at the first token, where the pull back to the reference is wanted most.
def test_k3_is_not_clamped_and_its_corrected_gradient_is_linear_in_the_drift():
    logp = t([[-6.0, -1.0]]).requires_grad_()
    ref, mask = t([[-1.0, -6.0]]), torch.ones(1, 2, dtype=torch.bool)
    grads = []
    for corrected in (False, True):
        loss, _ = clipped_policy_loss(
            logp, logp.detach(), t([0.0]), mask, ref_logp=ref, kl_coef=0.1,
            objective=Objective(kl_bias_correction=corrected),
        )  # fmt: skip
        close(loss, [[0.1 * (math.exp(5) - 6), 0.1 * (math.exp(-5) + 4)]])
        (grad,) = torch.autograd.grad(loss.sum(), logp)
        grads.append(grad)
    close(grads[0], [[0.1 * (1 - math.exp(5)), 0.1 * (1 - math.exp(-5))]])
    close(grads[1], [[-0.5, 0.5]])


@pytest.mark.parametrize("level", ["sequence", "sequence_token"])
def test_bias_corrected_kl_at_a_sequence_level(level):
    # old = [−1.2, −2.4]: log s = (0.2 + 0.4)/2 = 0.3, s = 1.3498588 for both tokens; ℓ_t = β·s·k3_t.
    # sequence: s depends on both tokens (∂s/∂log π_t = s/2), so ∂(Σ_u β·s·k3_u)/∂log π_t = β·s·((1 − r_t) +
    # ½·Σ_u k3_u); sequence_token: s's value, each token's own gradient: β·s·((1 − r_t) + k3_t).
    s = math.exp(0.3)
    loss, grad, _ = kl_term(t([[-1.2, -2.4]]), level, kl_bias_correction=True)
    close(loss, [[0.1 * s * K3[0], 0.1 * s * K3[1]]])
    one_minus_r = [1 - math.exp(-0.5), 1 - math.e]
    extra = [sum(K3) / 2] * 2 if level == "sequence" else K3
    close(grad, [[0.1 * s * (one_minus_r[i] + extra[i]) for i in range(2)]])


def test_bias_corrected_kl_gradient_is_the_reverse_kl_gradient_in_expectation():
    # One-token responses from a 5-way softmax: the expectation over y ~ π_old of the KL term's gradient is an
    # exact sum, Σ_y π_old(y)·∇ℓ(y). Corrected, it equals ∇KL(π‖π_ref) for any π_old (off-policy) and at π_old = π;
    # the plain k3's does not (on-policy it is the gradient of KL(π_ref‖π), the forward KL).
    g = torch.Generator().manual_seed(0)
    theta, ref_logits, old_logits = (torch.randn(5, generator=g, dtype=F64) for _ in range(3))
    theta.requires_grad_()
    ref = torch.log_softmax(ref_logits, -1)
    target = torch.autograd.grad((theta.softmax(-1) * (theta.log_softmax(-1) - ref)).sum(), theta)[0]

    def expected_gradient(old_probs: torch.Tensor, old_logp: torch.Tensor, corrected: bool) -> torch.Tensor:
        logp = theta.log_softmax(-1).unsqueeze(-1)  # (5, 1): five one-token "sequences"
        per_token, _ = clipped_policy_loss(logp, old_logp.unsqueeze(-1), torch.zeros(5, dtype=F64),
                                           torch.ones(5, 1, dtype=torch.bool), ref_logp=ref.unsqueeze(-1),
                                           kl_coef=1.0, objective=Objective(kl_bias_correction=corrected))  # fmt: skip
        return torch.autograd.grad((old_probs.detach() * per_token[:, 0]).sum(), theta)[0]

    old_logp = torch.log_softmax(old_logits, -1)
    close(expected_gradient(old_logp.exp(), old_logp, True), target)
    on = theta.log_softmax(-1).detach()
    close(expected_gradient(on.exp(), on, True), target)  # old = sg(log π): ρ = 1, its gradient
    forward_kl = torch.autograd.grad((ref.exp() * (ref - theta.log_softmax(-1))).sum(), theta)[0]
    close(expected_gradient(on.exp(), on, False), forward_kl)
    assert (expected_gradient(old_logp.exp(), old_logp, False) - target).abs().max() > 1e-3


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
def loop_loss(
    logp, old, adv, lengths, objective, level, low=0.2, high=0.28, taus=(1.0, 1.05), ref=None, corrected=False
):
    """Σ over sequences and tokens of the per-token objective written one token at a time, with β = 0.1 times the
    KL term k3 (times the ratio: ``corrected``) when ``ref`` is given."""
    total = logp.sum() * 0.0  # a graph even when every row is empty
    for i, n in enumerate(lengths):
        if n == 0:
            continue
        log_s = sum(logp[i, k] - old[i, k] for k in range(n)) / n
        log_w = sum(logp[i, k] - old[i, k] for k in range(n)).detach()  # VESPO: the product of the ratios
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
            elif objective == "sapo":
                tau = taus[0] if a > 0 else taus[1]
                term = -(4 / tau) * torch.sigmoid(tau * (r - 1)) * a
            else:
                kappa, lam = (2.0, 3.0) if a >= 0 else (3.0, 2.0)
                phi = torch.exp(lam + kappa * log_w - lam * torch.exp(log_w))  # e^λ·W^k·e^(−λW)
                term = -phi * a * logp[i, k]
            if ref is not None:
                log_q = ref[i, k] - logp[i, k]  # log π_ref/π
                k3 = torch.exp(log_q) - 1 - log_q
                term = term + 0.1 * (r * k3 if corrected else k3)
            total = total + term
    return total


@pytest.mark.parametrize("objective", list(PolicyObjective))
@pytest.mark.parametrize("level", list(ImportanceLevel))
@pytest.mark.parametrize("kl", [None, "plain", "corrected"])
@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), b=st.integers(1, 5), width=st.integers(1, 5))
def test_objectives_equal_their_loop_form(objective, level, kl, seed, b, width):
    if objective == "vespo" and level != "token":
        return  # refused (test_vespo_takes_the_token_level_only)
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, width + 1, (b,), generator=g).tolist()
    mask = torch.arange(width) < torch.tensor(lengths).unsqueeze(1)
    old = -torch.rand(b, width, generator=g, dtype=F64) * 3
    logp = (old + torch.randn(b, width, generator=g, dtype=F64) * 0.4).masked_fill(~mask, math.nan)
    ref = (old + torch.randn(b, width, generator=g, dtype=F64) * 0.4).masked_fill(~mask, math.nan)
    adv = torch.randn(b, generator=g, dtype=F64)
    vec_in, loop_in = logp.clone().requires_grad_(), logp.nan_to_num(0.0).requires_grad_()
    per_token, _ = clipped_policy_loss(
        vec_in,
        old,
        adv,
        mask,
        ref_logp=None if kl is None else ref,
        kl_coef=0.1,
        objective=Objective(
            clip_high=0.28, kind=objective, importance_level=level, kl_bias_correction=kl == "corrected"
        ),
    )  # NaN in the padding (garbage) changes nothing
    vectorised = aggregate(per_token, mask, "seq-mean-token-sum", num_seqs=1)
    loop_ref = None if kl is None else ref.nan_to_num(0.0)
    loop = loop_loss(loop_in, old, adv, lengths, str(objective), str(level), ref=loop_ref, corrected=kl == "corrected")
    vectorised.backward()
    loop.backward()
    # float64 sums of at most 25 terms: equal to rounding (1e-12 relative)
    torch.testing.assert_close(vectorised, loop, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(vec_in.grad, loop_in.grad.masked_fill(~mask, 0.0), rtol=1e-10, atol=1e-12)
