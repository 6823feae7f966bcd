"""The named choices of the algorithms, as string enums: the config's fields take these values.

Pure Python (no torch), so the config can import them without loading the tensor code; each enum's
module in ``rlhf.core`` re-exports it beside the functions it selects.
"""

from enum import StrEnum


class KLEstimator(StrEnum):
    """Per-token estimator of KL(π_θ ‖ π_ref) from one sample."""

    K1 = "k1"
    K2 = "k2"
    K3 = "k3"


class KLControl(StrEnum):
    """How the KL coefficient β evolves between rollouts (checklist item 39)."""

    FIXED = "fixed"  # N+ (β=0.05), TRL PPO, OAI TL;DR (β=0.03)
    ADAPTIVE = "adaptive"  # OAI sentiment (0.15, target 6, horizon 1e4), TRL-legacy (0.2, 6, 1e4)


class KLPlacement(StrEnum):
    """Where the KL penalty enters: the per-token rewards (−β·KL, InstructGPT/PPO) or the loss (+β·k3, GRPO)."""

    REWARD = "reward"
    LOSS = "loss"


class GroupEstimator(StrEnum):
    """Critic-free advantage estimators; :data:`GROUP_ESTIMATORS` maps each to its function."""

    GRPO = "grpo"
    DR_GRPO = "dr_grpo"
    RLOO = "rloo"
    REINFORCE_PP = "reinforce_pp"


class RewardScale(StrEnum):
    """GRPO's divisor (TRL ``scale_rewards``): per-group std, one std over the whole batch, or none."""

    GROUP = "group"
    BATCH = "batch"
    NONE = "none"


class LossAggregation(StrEnum):
    """How a per-token loss ``ℓ (B, T)`` with mask ``m`` becomes a scalar.

    =========================== ==================================== ==================================
    mode                        formula                              TRL ``loss_type`` / verl name
    =========================== ==================================== ==================================
    ``token-mean``              Σ ℓ·m / num_tokens                   ``bnpo`` (local), ``dapo`` (global);
                                                                     verl ``token-mean``
    ``seq-mean-token-mean``     Σ_i (Σ_t ℓ·m / Σ_t m) / num_seqs     ``grpo`` (DeepSeekMath);
                                                                     verl ``seq-mean-token-mean``
    ``seq-mean-token-sum``      Σ ℓ·m / num_seqs                     verl ``seq-mean-token-sum``
    ``seq-mean-token-sum-norm`` Σ ℓ·m / (num_seqs · max_len)         ``dr_grpo`` (Dr. GRPO, oat
                                                                     ``masked_sum(...)/generate_max_len``)
    =========================== ==================================== ==================================

    Per-token gradient weights (reference 2-K): grpo 1/(G·|o_i|), dapo 1/Σ|o|, dr_grpo 1/(G·L_max).
    Source: TRL grpo_trainer L3124-3150, docs ``grpo_trainer.md`` "loss types"; checklist item 43.
    """

    TOKEN_MEAN = "token-mean"
    SEQ_MEAN_TOKEN_MEAN = "seq-mean-token-mean"
    SEQ_MEAN_TOKEN_SUM = "seq-mean-token-sum"
    SEQ_MEAN_TOKEN_SUM_NORM = "seq-mean-token-sum-norm"


class PolicyObjective(StrEnum):
    """What the policy loss does with the importance ratio ρ (`rlhf.core.losses.clipped_policy_loss`)."""

    CLIP = "clip"  # PPO's clipped surrogate (Schulman et al. 2017): tokens past the clip pass no gradient
    CISPO = "cispo"  # MiniMax-M1 (2025): the weight sg(min(ρ, 1 + ε_high)) on log π; every token passes gradient
    SAPO = "sapo"  # Soft Adaptive Policy Optimization (2025): a sigmoid gate in place of the hard clip
    VESPO = "vespo"  # VESPO (2026): a gamma kernel φ(W) of the whole sequence's ratio weighs −A·log π


class ImportanceLevel(StrEnum):
    """Where the ratio lives (TRL ``importance_sampling_level``): each token's own, or one per sequence (GSPO)."""

    TOKEN = "token"  # ρ_t = π(y_t) / π_old(y_t)
    SEQUENCE = "sequence"  # GSPO: s = exp(mean_t log ρ_t), one per sequence, its gradient through the mean
    SEQUENCE_TOKEN = "sequence_token"  # GSPO-token: the value of s, the gradient of each token's own log π


class MissingEosPenalty(StrEnum):
    """How a score is penalised when its response has no stop token (checklist item 5)."""

    REPLACE = "replace"  # OAI lm_tasks.py L58-65 / train_policy.py L385-390, N+ ppo.py L665-667
    SUBTRACT = "subtract"  # TRL ppo_trainer.py L757-759 (missing_eos_penalty)


class ScoreConvention(StrEnum):
    """Which response token receives the terminal score (checklist item 25; sources disagree)."""

    AFTER_EOS = "after_eos"  # TRL experimental/ppo L776-779, N+ ppo.py L683-685: first PAD after EOS
    EOS = "eos"  # TRL-legacy compute_rewards L1135-1146 (last real token); OAI last token of a fixed length


class DPOLoss(StrEnum):
    """The offline preference losses of `rlhf.core.dpo` (its docstring has the formulas)."""

    SIGMOID = "sigmoid"  # DPO, Rafailov et al. 2023 (label_smoothing > 0: conservative DPO)
    IPO = "ipo"  # Azar et al. 2023, on length-normalised log-ratios
    ROBUST = "robust"  # Chowdhury et al. 2024, unbiased under label noise ε
    SIMPO = "simpo"  # Meng et al. 2024, reference-free, length-normalised, margin γ
