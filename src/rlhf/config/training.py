"""The training commands' configs: the base of every command config, sft, rm and dpo, and the policy-gradient
family (ppo, grpo) with each trainer's own section."""

from typing import Annotated, Any, ClassVar, Literal, Self

import pydantic
from pydantic import Field

from rlhf.config.base import ConfigError, Count, NonNegative, NonNegativeInt, Positive, Text, _defaults, section
from rlhf.config.sections import (
    BatchSection,
    DataSection,
    DoctorSection,
    KLSection,
    OptimSection,
    PolicyBatch,
    PolicyModel,
    PolicyReward,
    PolicySampling,
    RankingBatch,
    RolloutSection,
    RunSection,
    TextData,
    TrainModel,
    _check_divides,
    _check_sources,
)
from rlhf.core.choices import DPOLoss, GroupEstimator, ImportanceLevel, LossAggregation, ScoreConvention

# TRL's GRPO `loss_type`: the aggregation each one reduces the per-token loss with (its objective: cispo and sapo
# their own, the others PPO's clip); PPO's own loss types aggregate by token-mean.
_LOSS_TYPE_AGGREGATION = {
    "dapo": "token-mean", "bnpo": "token-mean", "cispo": "token-mean", "vespo": "token-mean",
    "grpo": "seq-mean-token-mean", "sapo": "seq-mean-token-mean", "luspo": "seq-mean-token-sum",
    "dr_grpo": "seq-mean-token-sum-norm", "ppo": "token-mean",
}  # fmt: skip
# The loss types whose objective is not PPO's clip (`rlhf.core.choices.PolicyObjective`).
_OWN_OBJECTIVE = ("cispo", "sapo", "vespo")
CISPO_CLIP_RANGE_HIGH = 4.0
"""ε_high under ``loss_type: cispo`` when clip_range_high is unset: weights capped at 5 (ScaleRL's and TRL's advice)."""

# How each estimator scales its advantages when `scale_rewards` is "auto".
_ESTIMATOR_SCALING = {"grpo": "group", "dr_grpo": "none", "rloo": "none", "reinforce_pp": "batch"}


@section
class SFTSection:
    """Supervised fine-tuning on demonstrations."""

    epochs: Count = 3
    """Passes over the training data."""
    packing: bool = False
    """Concatenate each micro-batch's examples into rows of up to max_length tokens instead of padding each one; position ids restart and attention stays within every example, so the loss and gradient are those of the unpacked batch (models that cannot keep packed examples apart are refused)."""


@section
class RMSection:
    """The Bradley–Terry reward model."""

    epochs: Count = 1
    """Passes over the training data (reward models overfit after about one epoch)."""
    use_margin: bool = True
    """When a pair has a "margin" column, subtract it inside the sigmoid: −log σ(r_c − r_r − margin)."""
    center_rewards_coefficient: NonNegative | None = None
    """Weight of the auxiliary loss coef·mean((r_c + r_r)²) that keeps rewards centred at 0; None = off."""
    ensemble: Count = 1
    """Members of a reward-model ensemble, trained one after another alike but for run.seed (member m: seed + m; it draws the new head and the order of the pairs), into members/member_<m>/; final/ is then the ensemble (ensemble.json and each member's model), one reward.source (docs/ensembles.md). 1 = one reward model."""


@section
class DPOSection:
    """Direct preference optimisation: the loss and its strength (formulas in docs/dpo.md)."""

    epochs: Count = 1
    """Passes over the training pairs."""
    loss: DPOLoss = DPOLoss.SIGMOID
    """sigmoid (DPO; with label_smoothing > 0 conservative DPO), robust (unbiased under label noise), ipo (squared loss on length-normalised log-ratios) or simpo (reference-free, length-normalised, margin simpo_gamma)."""
    beta: Positive = 0.1
    """β: how far from the reference the policy may move (larger = closer); SimPO is usually run with β ≈ 2."""
    label_smoothing: Annotated[float, Field(ge=0, lt=0.5)] = 0.0
    """ε, the assumed share of flipped labels (sigmoid: conservative DPO; robust: its noise rate); 0 = none."""
    simpo_gamma: NonNegative = 0.5
    """γ, SimPO's target margin between the length-normalised rewards (loss simpo only)."""


@section
class NormalizeSection:
    """Reward normalisation after training: gain and bias so the policy's responses score mean 0, std 1."""

    policy: Text | None = None
    """Causal LM (hub id or directory; usually the SFT/reference policy) whose responses are sampled and scored; the gain and bias are stored with the model for every consumer; an ensemble's members are all normalised on the same responses. None = no normalisation."""
    prompts: Text | None = None
    """Prompts file ({"prompt"} or {"messages"} rows) to sample the responses for; None = the prompts of the training data."""
    samples: Annotated[int, Field(ge=2)] = 256
    """How many responses are sampled and scored (OAI: 256; a std needs two)."""
    max_new_tokens: Count = 64
    """Longest response in tokens."""
    temperature: Positive = 1.0
    """Sampling temperature of the responses."""


@section
class PolicyGradientSection:
    """The outer loop and the clipped surrogate shared by ppo and grpo."""

    steps: Count = 500
    """Outer iterations: sample a batch, score it, update the policy."""
    num_minibatches: Count = 1
    """Minibatches per pass over a batch, one optimizer step each; must divide the iteration's sequences."""
    clip_range: Annotated[float, Field(gt=0, lt=1)] = 0.2
    """ε of the clipped surrogate: the ratio is clipped to [1 − ε, 1 + clip_range_high]."""
    clip_range_high: Positive | None = None
    """Upper clip ε_high (DAPO clip-higher, e.g. 0.28); None = clip_range."""
    entropy_coef: NonNegative = 0.0
    """Weight of the entropy bonus subtracted from the loss."""
    whiten_advantages: bool = True
    """Normalise advantages to mean 0 and variance 1 over the batch's response tokens (grpo: again, after the group-relative ones)."""
    warmup_pg_steps: NonNegativeInt = 0
    """Vanilla policy-gradient warm-up: the first N steps use the unclipped loss −A·ratio (REINFORCE with the advantages' baseline; same rollouts, advantages, KL and logging), then the clipped surrogate takes over; 0 = clipped from the start. Logged as policy/clipped (0 or 1)."""
    importance_sampling_level: ImportanceLevel = ImportanceLevel.TOKEN
    """The ratio the objective clips (TRL's name): token (each token's own), sequence (GSPO: one per sequence, the geometric mean of its token ratios, clipped as a whole; the paper pairs it with the per-sequence mean, grpo.loss_type grpo, and a far tighter clip, clip_range 3e-4 / clip_range_high 4e-4), sequence_token (GSPO-token: the sequence's value, each token's own gradient, for per-token advantages)."""
    sapo_temperature_pos: Positive = 1.0
    """τ of SAPO's gate for tokens with a positive advantage (loss_type sapo; TRL's default)."""
    sapo_temperature_neg: Positive = 1.05
    """τ of SAPO's gate for tokens with a zero or negative advantage (loss_type sapo; a little steeper: negative updates are the ones that destabilise). TRL builds both temperatures in float32 (its 1.05 is 1.0499999523), rlhf in the loss's dtype: their losses differ in the 8th digit."""
    vespo_k_pos: NonNegative = 2.0
    """k of VESPO's kernel φ(W) = e^λ·W^k·e^(−λW) for sequences with a non-negative advantage (loss_type vespo; TRL's name and default): the larger, the more a sequence the policy has made less likely (W < 1) is damped."""
    vespo_lambda_pos: Positive = 3.0
    """λ of VESPO's kernel for sequences with a non-negative advantage: the larger, the more a sequence the policy has made more likely (W > 1) is damped; φ peaks at W = k/λ."""
    vespo_k_neg: NonNegative = 3.0
    """k of VESPO's kernel for sequences with a negative advantage."""
    vespo_lambda_neg: Positive = 2.0
    """λ of VESPO's kernel for sequences with a negative advantage."""
    delta: Annotated[float, Field(gt=1)] | None = None
    """δ, the upper bound of two-sided clipping (INTELLECT-2; TRL's name): a token with a negative advantage whose ratio exceeds δ passes no gradient and its loss stays at −δ·A, where PPO's clip would let it grow without bound (the dual clip of Ye et al. 2020, verl's clip_ratio_c). Must exceed 1 + clip_range_high; e.g. 4; None = off. The clip objective only (not cispo, sapo, vespo). Logged as clip_ratio/dual."""
    use_bias_correction_kl: bool = True
    """Multiply the KL term in the loss by the importance ratio (DeepSeek-V3.2; TRL's name and default): β·ρ·k3 instead of β·k3, whose gradient is then the unbiased gradient of KL(π‖π_ref) on- and off-policy (the plain k3's is not, even at ρ = 1). Acts when the KL is in the loss (kl.add_to loss, kl.coef > 0); kl/loss_mean then logs the mean of ρ·k3, as TRL's kl."""
    top_entropy_quantile: Annotated[float, Field(ge=0, le=1)] = 1.0
    """ρ of "Beyond the 80/20 rule" (Wang et al. 2025; TRL's name): the policy loss only on the share ρ of response tokens with the highest entropy under the policy that sampled them, chosen over the whole rollout batch (the KL term stays on every token); 0.2 is the paper's; 1 = every token. Under grpo with one update per rollout this costs the policy's no-grad pass it otherwise skips. Logged as policy/entropy_masked_fraction."""
    off_policy_mask_threshold: Positive | None = None
    """δ of DeepSeek-V3.2's off-policy sequence mask (TRL's name): a sequence whose mean per-token log π_behaviour − log π over its tokens exceeds δ leaves the loss on its negative-advantage tokens (the behaviour policy: the sampler's log-probs when the engine reports them, else the rollout's); e.g. 0.5; None = off. Logged as policy/off_policy_masked."""


@section
class PPOSection(PolicyGradientSection):
    """PPO with a learned critic: GAE advantages, clipped policy and value losses."""

    epochs: Count = 4
    """Passes over each rollout batch."""
    loss_type: Literal["ppo", "cispo", "sapo", "vespo"] = "ppo"
    """The policy objective: ppo (the clipped surrogate), cispo (MiniMax-M1: the importance weight capped at 1 + clip_range_high, 5 unless set, and never a token's gradient dropped), sapo (a smooth gate, sapo_temperature_pos/neg, instead of the hard clip), vespo (the policy gradient weighed by a kernel of the whole response's ratio, vespo_k_*/vespo_lambda_*; the kernel of each token chosen by its own advantage's sign). Aggregated by token-mean."""
    whiten_rewards: bool = False
    """Rescale the per-token rewards of the batch to unit variance (mean kept) before GAE."""
    critic: Literal["auto", "shared", "separate"] = "auto"
    """Value function: a zero-initialised head on the policy's trunk (shared: one forward gives log-probs and values, no second model), or a separate model (separate: initialised from the reward model when the reward is a model that reads the policy's tokens, else from the policy); auto = separate when such a reward model can start it, else shared. Over 10 runs of the demo (docs/ppo_study.md) the critic started from the reward model gave a higher gold score at a lower KL than the shared head, which starts knowing nothing; it costs a second model's memory and its forward and backward in every update."""
    vf_coef: Positive = 0.1
    """Weight of the value loss in the total loss (the critic only learns through it)."""
    critic_warmup_steps: NonNegativeInt = 0
    """Value-only iterations before the policy moves (OpenRLHF's freezing_actor_steps, verl's critic_warmup): the first N steps sample, score and fit the value function (the shared head, or the separate critic) on their rollouts while the policy's parameters are held, so the policy's first updates get advantages from a critic that has learnt something. Logged as policy/frozen (1, then 0); 0 = the policy trains from the first step."""
    value_clip_range: Positive = 0.2
    """ε_v: new values are clipped to old ± ε_v in the value loss."""
    gamma: Annotated[float, Field(gt=0, le=1)] = 1.0
    """Discount γ of GAE."""
    lam: Annotated[float, Field(ge=0, le=1)] = 0.95
    """λ of GAE."""
    score_position: ScoreConvention = ScoreConvention.AFTER_EOS
    """Token that receives the sequence score: after_eos = the first padding after the EOS when there is room (TRL / N+ convention), else the last token; eos = the EOS (last real) token."""


@section
class GRPOSection(PolicyGradientSection):
    """The critic-free GRPO family: group-relative advantages, DAPO's overlong shaping and dynamic sampling."""

    group_size: Annotated[int, Field(ge=2)] = 8
    """G, samples per prompt (≥ 2: advantages compare samples of the same prompt)."""
    estimator: GroupEstimator = GroupEstimator.GRPO
    """Advantage estimator: grpo (r − group mean, / group std), dr_grpo (r − group mean), rloo (leave-one-out baseline), reinforce_pp (r − group mean, / batch std)."""
    scale_rewards: Literal["auto", "group", "batch", "none"] = "auto"
    """Divisor of grpo's advantages: group std, batch std or none; auto = the estimator's own. Other estimators fix their own scaling, so only 'auto' is allowed with them."""
    loss_type: Literal["dapo", "grpo", "dr_grpo", "bnpo", "cispo", "sapo", "luspo", "vespo"] = "dapo"
    """TRL's loss_type: the objective and its aggregation. dapo (the clip; token-mean over the minibatch's tokens on all ranks), bnpo (the same here: TRL's normalises by each device's micro-batch, ours by the minibatch), grpo (the clip; seq-mean-token-mean), dr_grpo (the clip; seq-mean-token-sum-norm), cispo (MiniMax-M1: the importance weight capped at 1 + clip_range_high, 5 unless set, every token's gradient kept; token-mean), sapo (a smooth gate, sapo_temperature_pos/neg, instead of the clip; seq-mean-token-mean), luspo (Length-Unbiased Sequence Policy Optimization: the clip; seq-mean-token-sum, each sequence's loss scaled by its length — the paper's setting adds importance_sampling_level sequence), vespo (Variational Sequence-level Soft Policy Optimization: −φ(W)·A·log π with φ a kernel of the whole response's ratio W, vespo_k_*/vespo_lambda_*, instead of the clip; token-mean; importance_sampling_level token)."""
    loss_aggregation: LossAggregation | None = None
    """Reduction of the per-token loss, overriding loss_type's (verl's loss_agg_mode): token-mean (all tokens of the minibatch), seq-mean-token-mean (GRPO paper), seq-mean-token-sum, seq-mean-token-sum-norm (Dr. GRPO: sum / max_new_tokens); None = loss_type's."""
    num_iterations: Count = 1
    """μ, passes over each sampled batch (1 = on-policy: the ratio is exactly 1 and clipping never applies)."""
    overlong_buffer: NonNegativeInt = 0
    """DAPO overlong shaping: responses longer than max_new_tokens − overlong_buffer get a penalty growing linearly to −overlong_penalty_factor at max_new_tokens; 0 = off."""
    overlong_penalty_factor: NonNegative = 1.0
    """Largest overlong penalty (reached at max_new_tokens)."""
    dynamic_sampling: bool = False
    """DAPO dynamic sampling: drop groups whose rewards are all equal (no signal) and sample more prompts until the batch is full."""
    mask_truncated_completions: bool = False
    """Leave completions cut at max_new_tokens (no stop token) out of the loss (DAPO); they still count in the group statistics."""


@section
class CommandConfig:
    """Base of every command config: after pydantic's field checks, `_check` runs the cross-field rules."""

    COMMAND: ClassVar[str] = ""

    def __init_subclass__(cls, command: str = "", **kwargs: Any) -> None:
        """`class SFTConfig(TrainingConfig, command="sft")` sets `COMMAND`, the command's name."""
        super().__init_subclass__(**kwargs)
        cls.COMMAND = command or cls.COMMAND

    @pydantic.model_validator(mode="after")
    def _run_check(self, info: pydantic.ValidationInfo) -> Self:
        if (info.context or {}).get("check", True):  # tyro's default, built from the YAML, waits for the flags
            try:
                self._check()
            except ConfigError as e:
                raise ConfigError(f"{self.COMMAND}: {e}") from None
        return self

    def _check(self) -> None:
        """Rules that span fields; each raises ConfigError naming the fields (the command's name is added)."""


@section
class TrainingConfig(CommandConfig):
    """Sections shared by the four training commands (sft, rm, ppo, grpo)."""

    output_dir: Text
    """Run directory: config.yaml, metrics.jsonl, samples/, checkpoints/ and final/ are written here."""
    model: TrainModel
    """The model to start from."""
    data: DataSection
    """Training and held-out data."""
    optim: OptimSection = _defaults(OptimSection)
    """AdamW and its schedule."""
    batch: BatchSection = _defaults(BatchSection)
    """Batch and micro-batch sizes."""
    run: RunSection = _defaults(RunSection)
    """Seed, logging, checkpoints, resuming, parallelism."""

    def _check(self) -> None:
        if self.run.resume and self.run.overwrite:
            raise ConfigError(
                "run.resume and run.overwrite are both set; resume continues the run in output_dir, "
                "overwrite replaces it — choose one"
            )
        self._check_micro_size()

    def _check_micro_size(self) -> None:
        _check_divides("batch.micro_size", self.batch.micro_size, self.minibatch_size, self._minibatch_text)

    @property
    def minibatch_size(self) -> int:
        """Sequences per optimizer step."""
        return self.batch.size

    @property
    def _sequences_text(self) -> str:
        return f"batch.size={self.batch.size}"

    @property
    def _minibatch_text(self) -> str:
        return self._sequences_text  # without minibatches the batch is the minibatch

    @property
    def effective_micro_batch_size(self) -> int:
        """Sequences per forward/backward pass (batch.micro_size, or the whole minibatch when it is None)."""
        return self.batch.micro_size or self.minibatch_size


@section
class SFTConfig(TrainingConfig, command="sft"):
    """Supervised fine-tuning: next-token loss on the response (assistant) tokens only."""

    data: TextData
    """Demonstrations ({"prompt", "response"} or {"messages"} rows)."""
    optim: OptimSection = _defaults(OptimSection, learning_rate=2e-5)
    """AdamW and its schedule."""
    sft: SFTSection = _defaults(SFTSection)
    """Epochs and packing."""


@section
class RMConfig(TrainingConfig, command="rm"):
    """Bradley–Terry reward model on preference pairs: loss −log σ(r_chosen − r_rejected [− margin])."""

    model: TrainModel
    """The model to start from (a causal LM gets a fresh one-output score head)."""
    data: TextData
    """Preference pairs ({"prompt", "chosen", "rejected"} rows), rankings ({"prompt", "completions", "ranking"} rows) or a labels file of rlhf label; the pairs of one prompt are trained together, each answer forwarded once (docs/rankings.md)."""
    batch: RankingBatch = _defaults(RankingBatch)
    """Prompts per step, answers per pass."""
    rm: RMSection = _defaults(RMSection)
    """Epochs, margin and centring."""
    normalize: NormalizeSection = _defaults(NormalizeSection)
    """Reward normalisation after training."""

    def _check_micro_size(self) -> None:
        pass  # batch.micro_size counts answers, batch.size prompts: a prompt's answers may take several passes

    def _check(self) -> None:
        super()._check()
        if self.normalize.prompts is not None and self.normalize.policy is None:
            raise ConfigError(
                "normalize.prompts is set but normalize.policy is None; set normalize.policy to the "
                "model whose responses the normalisation samples, or drop normalize.prompts"
            )


@section
class DPOConfig(TrainingConfig, command="dpo"):
    """Direct preference optimisation of a causal LM on preference pairs, against its own starting point as the reference: DPO, conservative DPO, robust DPO, IPO or SimPO."""

    model: TrainModel
    """The policy to train (usually the SFT model); its log-probs before training are the reference's."""
    data: TextData
    """Preference pairs ({"prompt", "chosen", "rejected"} rows), rankings ({"prompt", "completions", "ranking"} rows) or a labels file of rlhf label; the pairs of one prompt are trained together, each answer forwarded once (docs/rankings.md)."""
    batch: RankingBatch = _defaults(RankingBatch)
    """Prompts per step, answers per pass."""
    dpo: DPOSection = _defaults(DPOSection)
    """The loss."""

    def _check_micro_size(self) -> None:
        pass  # batch.micro_size counts answers, batch.size prompts: a prompt's answers may take several passes

    def _check(self) -> None:
        super()._check()
        if self.dpo.label_smoothing > 0 and self.dpo.loss == DPOLoss.IPO:
            raise ConfigError(
                f"dpo.label_smoothing={self.dpo.label_smoothing} has no meaning for dpo.loss='ipo'; "
                "use loss sigmoid or robust for noisy labels, or set label_smoothing: 0"
            )


@section
class PolicyGradientConfig(TrainingConfig):
    """Sections shared by ppo and grpo: the policy, the reward, sampling, the KL penalty."""

    model: PolicyModel
    """The policy to train (usually the SFT model); the reference starts as a frozen copy of it."""
    data: DataSection
    """Prompts ({"prompt"} or {"messages"} rows; other keys are columns, passed to the reward); eval = held-out prompts sampled into output_dir/samples/."""
    reward: PolicyReward
    """The reward and the missing-EOS penalty."""
    sampling: PolicySampling = _defaults(PolicySampling, max_new_tokens=64, temperature=0.7)
    """Response generation."""
    kl: KLSection = _defaults(KLSection)
    """The KL penalty against the reference."""
    batch: PolicyBatch = _defaults(PolicyBatch)
    """Rollout batch and micro-batch sizes."""
    run: RunSection = _defaults(RunSection, eval_every=50, save_every=100)
    """Seed, logging, checkpoints, resuming, parallelism."""
    doctor: DoctorSection = _defaults(DoctorSection)
    """Live alarms of the training doctor, and whether a finding stops the run."""
    rollout: RolloutSection = _defaults(RolloutSection)
    """Multi-turn episodes: an environment and tools (none: one response per prompt)."""

    @property
    def algorithm(self) -> Any:
        """The command's own section (``ppo`` or ``grpo``)."""
        return getattr(self, self.COMMAND)

    @property
    def steps(self) -> int:
        """Outer iterations."""
        return self.algorithm.steps

    @property
    def clip_range_upper(self) -> float:
        """ε_high: clip_range_high, or when it is None clip_range (cispo: :data:`CISPO_CLIP_RANGE_HIGH`)."""
        if self.algorithm.clip_range_high is not None:
            return self.algorithm.clip_range_high
        return CISPO_CLIP_RANGE_HIGH if self.algorithm.loss_type == "cispo" else self.algorithm.clip_range

    @property
    def policy_objective(self) -> str:
        """The objective of the policy loss (`rlhf.core.choices.PolicyObjective`): cispo, sapo, vespo, else the clip."""
        return self.algorithm.loss_type if self.algorithm.loss_type in _OWN_OBJECTIVE else "clip"

    @property
    def loss_aggregation(self) -> str:
        """How the per-token policy loss is reduced: grpo.loss_aggregation when set, else the loss type's."""
        explicit = getattr(self.algorithm, "loss_aggregation", None)
        return str(explicit) if explicit is not None else _LOSS_TYPE_AGGREGATION[self.algorithm.loss_type]

    @property
    def response_tokens(self) -> int:
        """Longest response after the prompt: sampling.max_new_tokens, or a multi-turn episode's token budget."""
        rollout = self.rollout
        if not rollout.multi_turn:
            return self.sampling.max_new_tokens
        return rollout.max_episode_tokens or 2 * rollout.max_turns * self.sampling.max_new_tokens

    @property
    def num_sequences(self) -> int:
        """Sequences sampled per iteration."""
        return self.batch.size

    @property
    def minibatch_size(self) -> int:
        """Sequences per optimizer step: the iteration's sequences / num_minibatches."""
        return self.num_sequences // self.algorithm.num_minibatches

    def _check(self) -> None:
        _check_sources("reward", self.reward)
        _check_rollout(self)
        if self.kl.control == "adaptive" and self.kl.coef == 0:
            raise ConfigError(
                "kl.control='adaptive' scales kl.coef, which is 0 so it would stay 0; "
                "set kl.coef > 0 (e.g. 0.15) or use kl.control='fixed'"
            )
        if self.kl.reference_ema is not None and (self.kl.coef == 0 or self.model.lora is not None):
            why = (
                "kl.coef is 0, so there is no reference"
                if self.kl.coef == 0
                else "with model.lora the reference is the policy's own base weights (the adapter switched off), "
                "not a copy"
            )
            raise ConfigError(
                f"kl.reference_ema moves the reference towards the policy, but {why}; "
                "drop kl.reference_ema, or train without lora and with kl.coef > 0"
            )
        _check_objective(self)
        _check_staleness(self)
        name = f"{self.COMMAND}.num_minibatches"
        _check_divides(name, self.algorithm.num_minibatches, self.num_sequences, self._sequences_text)
        super()._check()

    @property
    def _minibatch_text(self) -> str:
        return (
            f"the minibatch of {self.minibatch_size} sequences ({self._sequences_text} / "
            f"{self.COMMAND}.num_minibatches={self.algorithm.num_minibatches})"
        )


@section
class PPOConfig(PolicyGradientConfig, command="ppo"):
    """PPO with a learned critic: per-token KL-shaped rewards, GAE advantages, clipped policy and value losses."""

    optim: OptimSection = _defaults(OptimSection, learning_rate=3e-6)
    """AdamW and its schedule (policy and critic)."""
    ppo: PPOSection = _defaults(PPOSection)
    """Epochs, clipping, the critic and GAE."""


@section
class GRPOConfig(PolicyGradientConfig, command="grpo"):
    """The critic-free GRPO family: G samples per prompt, group-relative advantages (GRPO, Dr. GRPO, RLOO, REINFORCE++), the clipped per-token loss, optional DAPO overlong shaping and dynamic sampling."""

    optim: OptimSection = _defaults(OptimSection, learning_rate=1e-6)
    """AdamW and its schedule."""
    sampling: PolicySampling = _defaults(PolicySampling, max_new_tokens=256)
    """Response generation."""
    kl: KLSection = _defaults(KLSection, coef=0.0, estimator="k3", add_to="loss")
    """The KL penalty against the reference; coef 0 = no penalty and no reference model."""
    batch: PolicyBatch = _defaults(PolicyBatch, size=16)
    """Rollout batch (prompts; each sampled group_size times) and micro-batch sizes."""
    grpo: GRPOSection = _defaults(GRPOSection, whiten_advantages=False)
    """Group size, estimator, loss aggregation, DAPO options."""

    @property
    def num_sequences(self) -> int:
        """Sequences sampled per iteration: batch.size · grpo.group_size."""
        return self.batch.size * self.grpo.group_size

    @property
    def reward_scaling(self) -> str:
        """The advantage divisor actually used: 'group', 'batch' or 'none' (scale_rewards with 'auto' resolved)."""
        scale = self.grpo.scale_rewards
        return _ESTIMATOR_SCALING[self.grpo.estimator] if scale == "auto" else scale

    @property
    def _sequences_text(self) -> str:
        return (
            f"the {self.num_sequences} sequences of an iteration (batch.size={self.batch.size} × "
            f"grpo.group_size={self.grpo.group_size})"
        )

    def _check(self) -> None:
        if self.grpo.estimator != "grpo" and self.grpo.scale_rewards != "auto":
            raise ConfigError(
                f"grpo.scale_rewards={self.grpo.scale_rewards!r} applies to grpo.estimator='grpo' only; "
                f"estimator={str(self.grpo.estimator)!r} scales by {_ESTIMATOR_SCALING[self.grpo.estimator]!r} "
                "itself, so leave scale_rewards='auto'"
            )
        if self.grpo.overlong_buffer >= self.sampling.max_new_tokens:
            raise ConfigError(
                f"grpo.overlong_buffer={self.grpo.overlong_buffer} must be below "
                f"sampling.max_new_tokens={self.sampling.max_new_tokens}"
            )
        super()._check()


def _check_objective(config: PolicyGradientConfig) -> None:
    """``delta`` caps the clip's ratio above its own upper bound; VESPO takes its own sequence ratio (the product of
    the token ratios), so it needs the token level and folds no per-token sampler weight."""
    section, name = config.algorithm, config.COMMAND
    if section.delta is not None:
        if section.loss_type in _OWN_OBJECTIVE:
            raise ConfigError(
                f"{name}.delta caps PPO's clipped ratio; loss_type {section.loss_type!r} has no such ratio: "
                f"drop {name}.delta or use a clipped loss type"
            )
        if section.delta <= 1 + config.clip_range_upper:
            raise ConfigError(
                f"{name}.delta={section.delta} must exceed 1 + clip_range_high = {1 + config.clip_range_upper} (it "
                "bounds the ratios past the clip, for negative advantages); e.g. 4"
            )
    if section.loss_type == "vespo":
        if section.importance_sampling_level != "token":
            raise ConfigError(
                f"{name}.loss_type 'vespo' weighs each response by the product of its token ratios itself; "
                f"set {name}.importance_sampling_level to token, not {str(section.importance_sampling_level)!r}"
            )
        if config.sampling.is_correction != "none":
            raise ConfigError(
                f"{name}.loss_type 'vespo' with sampling.is_correction={config.sampling.is_correction!r}: TRL folds "
                "the sampler's ratio into VESPO's sequence ratio instead of weighting each token, which rlhf does "
                "not; set sampling.is_correction: none or choose another loss type"
            )


def _check_staleness(config: PolicyGradientConfig) -> None:
    """``sampling.max_staleness`` > 0 trains on samples of older weights: the loss needs their log-probs' weight
    (the decoupled objective), and the sampler must be a worker of its own (or a vLLM server the worker drives)."""
    sampling = config.sampling
    if sampling.max_staleness == 0:
        return
    if sampling.is_correction == "none":
        raise ConfigError(
            f"sampling.max_staleness={sampling.max_staleness} trains on samples drawn by weights up to that many "
            "updates old; the loss must weigh them by π_proximal/π_behaviour: set sampling.is_correction to token "
            "(PPO's decoupled objective) or sequence"
        )
    if sampling.engine == "vllm" and sampling.vllm.url is None:
        raise ConfigError(
            "sampling.max_staleness > 0 samples in a worker process, with rlhf's own engines (lean, hf, auto) or a "
            "vLLM server (sampling.vllm.url); a vLLM engine in the trainer's process (no url) cannot sample while "
            "that process trains: set sampling.vllm.url, another engine, or sampling.max_staleness: 0"
        )


def _check_rollout(config: PolicyGradientConfig) -> None:
    """``reward.source: environment`` needs an environment; DAPO's length shaping is for single responses."""
    reward = config.reward.source
    sources = [reward] if isinstance(reward, str) else [spec.source for spec in reward]
    if "environment" in [s.strip() for s in sources] and config.rollout.environment is None:
        raise ConfigError(
            "reward.source 'environment' is the rewards of a multi-turn environment, and rollout.environment is "
            "not set; name the environment (path/to/env.py:make_env) or choose another reward source"
        )
    if config.rollout.multi_turn and getattr(config.algorithm, "overlong_buffer", 0) > 0:
        raise ConfigError(
            "grpo.overlong_buffer shapes the length of single responses; a multi-turn episode's length is bounded "
            "by rollout.max_episode_tokens and rollout.max_turns instead: set grpo.overlong_buffer to 0"
        )
