"""The sections commands share — model, data, sampling, judge, reward, kl, optim, batch, doctor, run — with
LoRA adapters and reward sources, and the cross-field rules the command configs call."""

import urllib.parse
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BeforeValidator, Discriminator, Field, Tag

from rlhf.config.base import (
    ConfigError,
    Count,
    NonNegative,
    NonNegativeInt,
    Positive,
    Text,
    _defaults,
    _flag,
    _yaml_flag,
    section,
)
from rlhf.core.choices import KLControl, KLEstimator, KLPlacement, MissingEosPenalty

DType = Literal["float32", "bfloat16", "float16"]


@section
class LoRAConfig:
    """LoRA adapters (peft) instead of full fine-tuning. YAML: a mapping under ``model.lora``."""

    r: Count = 8
    """Rank of the adapter matrices."""
    alpha: Positive = 16.0
    """Scaling numerator: the adapter's update is multiplied by alpha / r."""
    dropout: Annotated[float, Field(ge=0, lt=1)] = 0.05
    """Dropout on the adapter input, in [0, 1)."""
    target_modules: Annotated[tuple[Text, ...], Field(min_length=1)] | None = None
    """Module names to adapt; None = peft's default for the architecture, or every linear layer of the decoder (not the output head) where peft has none (e.g. Phi-3); ['all-linear'] = every linear layer except the output head. Names that match no module are refused, listing the model's linear layers."""


OptionalLoRA = Annotated[
    LoRAConfig | None, _flag("None|{r,alpha,dropout,target_modules}", _yaml_flag, LoRAConfig, optional=True)
]


def _default_reward_name(source: str) -> str:
    """A short, readable name for a reward source (used for the `reward/<name>/mean` metric)."""
    text = source.strip().rstrip("/")
    if text.startswith(("http://", "https://")):
        return urllib.parse.urlsplit(text).hostname or text
    if ":" in text:  # path/file.py:function or package.module:function
        return text.rsplit(":", 1)[1]
    return Path(text).name or text


def _source(text: str) -> str:
    if text.strip().endswith(".py"):
        raise ValueError(f"names a file but no function; write '{text}:function_name'")
    return text


Source = Annotated[Text, AfterValidator(_source)]


@section
class RewardSpec:
    """One entry of a reward list: a source, its weight in the combination, and the name it is logged under."""

    source: Source
    """A reward-model directory, `path/file.py:function`, `package.module:function` or an http(s):// URL."""
    weight: float = 1.0
    """Weight of this reward in the combination."""
    name: Text | None = None
    """Metric name (`reward/<name>/mean`); null = derived from the source (function name, directory name or host)."""

    def __post_init__(self) -> None:
        if self.name is None:
            object.__setattr__(self, "name", _default_reward_name(self.source))


def _reward_shape(value: Any) -> Any:
    """A list entry may be a source string alone; anything but a string or a list is refused here."""
    if isinstance(value, list | tuple):
        return tuple({"source": item} if isinstance(item, str) else item for item in value)
    if not isinstance(value, str):
        raise ValueError("expected a source string or a list of {source, weight, name}")
    return value


def _sources_from_text(text: str) -> Any:
    """A source, or in YAML a list of {source, weight, name} or one of them."""
    if not text.lstrip().startswith(("[", "{")):
        return text
    value = _yaml_flag(text)
    return [value] if isinstance(value, Mapping) else value


RewardSources = Annotated[
    Annotated[Source, Tag("str")] | Annotated[tuple[RewardSpec, ...], Tag("list")],
    Discriminator(lambda value: "str" if isinstance(value, str) else "list"),  # pydantic checks only that branch
    BeforeValidator(_reward_shape),
    _flag("SOURCE|[{source,weight,name},...]", _sources_from_text, str | tuple),
]
OptionalRewardSources = Annotated[
    RewardSources | None,
    _flag("SOURCE|[{source,weight,name},...]|None", _sources_from_text, str | tuple, optional=True),
]


@section
class ModelSection:
    """The model a command loads."""

    name: Text
    """A hub id or a local model directory."""
    dtype: DType = "float32"
    """The weights' dtype (TRL's model_init_kwargs dtype): with bf16 mixed precision the float32 master weights and optimizer state, else the compute dtype as well. bfloat16 without bf16 is pure bfloat16: an AdamW step smaller than a weight's bfloat16 spacing (1.2e-4 near 0.02) is rounded away, so small learning rates barely move the model (update/changed_frac shows it; README "GPUs and precision")."""
    bf16: bool | None = None
    """bfloat16 mixed precision (TRL's and HF Trainer's bf16): the weights stay in dtype, every forward computes in bfloat16 under torch.autocast, frozen models (the reference copy, reward models) are held in bfloat16. None = on for a CUDA GPU with bfloat16 support, off on CPU (where most processors have no bfloat16 units and runs stay comparable)."""
    use_kernels: bool = False
    """Let transformers replace layers (rotary embedding, RMSNorm, attention, …) with kernels it fetches from the Hub at run time (transformers' use_kernels, TRL's model_init_kwargs use_kernels; transformers 5.25 turns them on by default): needs the network, runs code downloaded at run time, and changes the numerics, so a run resumes bit for bit only with the same kernels. False = every model of the command runs its own torch code, whatever the transformers version (docs/dependencies.md)."""

    def __post_init__(self) -> None:
        if self.bf16 and self.dtype == "float16":
            raise ValueError("bf16: mixed precision with float16 weights mixes two half precisions; use dtype float32")


@section
class TrainModel(ModelSection):
    """The model a trainer starts from, trained whole or through LoRA adapters."""

    lora: OptionalLoRA = None
    """LoRA adapters instead of full fine-tuning: a mapping {r, alpha, dropout, target_modules} (on the command line as YAML, e.g. --model.lora '{r: 16, alpha: 32}'); None = full fine-tuning."""
    gradient_checkpointing: bool = False
    """Recompute each decoder layer's activations in the backward pass instead of keeping them from the forward (non-reentrant): the update's activation memory no longer grows with the number of layers, for about one more forward per backward. The same gradients. ppo: the separate critic too."""


@section
class PolicyModel(TrainModel):
    """The policy of ppo and grpo; the reference starts as a frozen copy of it."""

    reference_dtype: DType | None = None
    """dtype of the frozen reference copy; None = bfloat16 under bf16 mixed precision, else dtype. bfloat16 halves the copy's memory; its log-probs then differ from float32's by about 0.01 nats per token (python benchmarks/reference_precision.py measures it), and CPUs without bf16 units run it several times slower. Not with lora: the reference is then the policy's own base weights, no copy."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.reference_dtype is not None and self.lora is not None:
            raise ValueError(
                "reference_dtype: with lora the reference is the policy's own base weights (the adapter switched "
                "off), not a copy, so it has no dtype of its own; drop reference_dtype or lora"
            )

    compile: bool = False
    """torch.compile the transformer blocks of the policy, reference and critic: on the 2-core CPU benchmark the updates ran 9-10% faster (a PPO step 4-10%), after a one-time compile of 8-10 s with inductor's cache warm and about 35 s cold; it pays in runs of a few hundred steps. Needs a C++ compiler on CPU."""


TemplateKwargs = Annotated[dict[str, Any] | None, _flag("None|{name: value,...}", _yaml_flag, dict, optional=True)]
"""Chat-template arguments (TRL's chat_template_kwargs), on the command line as YAML: '{enable_thinking: false}'."""


@section
class DataSection:
    """Training and held-out data: a JSONL, JSON or Parquet file, or a `datasets` directory."""

    train: Text
    """Training data: a file or directory of the command's records (prompts; prompt/response; chosen/rejected pairs)."""
    eval: Text | None = None
    """Held-out data in the same format as train; None = no evaluation."""
    chat_template_kwargs: TemplateKwargs = None
    """Extra variables of the chat template at every render (TRL's chat_template_kwargs), e.g. {enable_thinking: false} for Qwen3's non-thinking mode: the SFT labels, preference pairs, prompts and multi-turn episodes all render with them. The trained model's tokenizer_config.json records them, and rlhf sample and eval render with them. None = what the model's tokenizer records (a model trained by rlhf with them), else the template's defaults; {} = the template's defaults."""


@section
class TextData(DataSection):
    """Training and held-out examples, each prompt + response."""

    max_length: Annotated[int, Field(ge=2)] = 1024
    """Longest prompt + response in tokens."""


@section
class VLLMSection:
    """vLLM as the engine (``sampling.engine: vllm``; the ``vllm`` extra): docs/vllm.md."""

    url: Text | None = None
    """A running vLLM server (e.g. http://127.0.0.1:8000; started as docs/vllm.md says): generation goes over its API and the policy's weights are pushed to it after every update. None = colocate: a vLLM engine inside this process (per rank under torchrun)."""
    memory_fraction: Annotated[float, Field(gt=0, lt=1)] = 0.3
    """Colocate: the share of the device's memory vLLM takes for its weights and KV cache (its gpu_memory_utilization; on a CPU build, of the machine's memory); the trainer's models need the rest."""
    sleep: bool = False
    """Colocate on a GPU: between rollouts vLLM's weights wait in CPU memory and its KV cache is freed (its sleep mode), so the update has the device to itself, at the cost of copying the weights back for each rollout. CUDA, ROCm and XPU only (refused elsewhere)."""
    timeout: Positive = 300.0
    """Server: seconds to wait for one reply (a generation or a weight push) before retrying; after 3 failed tries the run stops (exit 2) naming the URL and each try."""


@section
class SamplingSection:
    """How responses are generated."""

    max_prompt_length: Count = 512
    """Longest prompt in tokens; longer prompts keep their end."""
    max_new_tokens: Count = 128
    """Longest response in tokens; responses end at the stop token or here."""
    temperature: Positive = 1.0
    """Sampling temperature (log-probabilities for a loss use the same temperature); 1.0 samples the model as is."""
    top_k: NonNegativeInt = 0
    """Sample only from the k most likely tokens; 0 = off."""
    top_p: Annotated[float, Field(gt=0, le=1)] = 1.0
    """Nucleus sampling: sample from the smallest set of tokens with this much probability; 1.0 = off."""
    stop: Annotated[str, Field(min_length=1)] = "eos"
    """What ends a response: 'eos' (the tokenizer's end-of-sequence token) or a literal text such as '\\n'."""
    engine: Literal["auto", "lean", "hf", "vllm"] = "auto"
    """What samples: lean = rlhf's own decoder (Llama-family layouts: Llama, Qwen2, Mistral, SmolLM; refused for others), hf = the model's own forward with its KV cache, auto = lean where it covers the model, else hf; vllm = vLLM (sampling.vllm; the vllm extra). All draw from the same distribution; the trainer's log-probs of the samples against the engine's: rollout/logprob_diff_*."""
    cuda_graphs: bool = False
    """On a CUDA GPU, the lean decoder captures one decode step (every layer, the draw, the log-prob) as a CUDA graph per rollout and replays it per token, instead of launching each kernel from Python; the same samples as the eager loop (tested on CPU). Off by default: not yet measured on a GPU (benchmarks/gpu_rollout.py). No effect on a CPU, or where the lean decoder does not cover the model (engine auto falls back to hf, which it leaves eager)."""
    vllm: VLLMSection = _defaults(VLLMSection)
    """With engine vllm: in this process or a server."""

    def __post_init__(self) -> None:
        if self.cuda_graphs and self.engine in ("hf", "vllm"):
            raise ValueError(
                f"cuda_graphs captures the lean decoder's step; engine {self.engine!r} has none: use auto or lean"
            )
        changed = [f"vllm.{k}" for k, v in vars(self.vllm).items() if v != getattr(VLLMSection(), k)]
        if changed and self.engine != "vllm":
            raise ValueError(f"{', '.join(changed)} set, but engine is {self.engine!r}: set engine: vllm")
        if self.vllm.url is not None and self.vllm.sleep:
            raise ValueError("vllm.sleep is for a vLLM engine in this process; a server (vllm.url) manages its own")


@section
class PolicySampling(SamplingSection):
    """How ppo and grpo sample, and how they correct for an engine that samples from a slightly different distribution than the trainer computes."""

    is_correction: Literal["none", "token", "sequence"] = "none"
    """Truncated importance sampling against the sampler/trainer mismatch (TRL's vllm_importance_sampling_correction, verl's rollout correction): each token's policy loss is weighted by π_trainer/π_sampler of its token (token) or of its whole response (sequence), capped at is_cap. none = no weight (with rlhf's own engines the mismatch is float rounding)."""
    is_cap: Annotated[float, Field(ge=1)] = 3.0
    """The cap C of the importance weights (TRL's vllm_importance_sampling_cap)."""
    is_mode: Literal["truncate", "mask"] = "truncate"
    """What happens above the cap: truncate = the weight is C; mask = the weight is 0 (the token or sequence is left out)."""
    max_staleness: NonNegativeInt = 0
    """Asynchronous RL (TRL's name): the batch trained at step s is sampled, in a worker process with its own copy of the policy, by the weights of step s − 1 − max_staleness, so the next batches sample while this one trains (with rlhf's engines, or a vLLM server the worker pushes the weights to: vllm.url); 0 = sample, then train (no worker). Needs is_correction (the decoupled objective: docs/async.md)."""
    worker_threads: Count = 1
    """CPU threads of the sampling worker under max_staleness > 0; the trainer keeps the rest."""
    worker_device: Annotated[str, Field(pattern=r"^(auto|cpu|cuda(:\d+)?)$")] = "auto"
    """Where the sampling worker under max_staleness > 0 holds its policy and samples: auto = the CPU in a CPU run; beside a GPU, a GPU the trainer does not use when the machine has one (the next), else the trainer's own (two processes share it); or cpu, cuda, cuda:N."""

    @property
    def worker_drives_vllm(self) -> bool:
        """At max_staleness > 0 a vLLM server (the only vLLM taken there) is the worker's: it pushes the weights and samples there, and the trainer answers its held-out prompts with its own engine (auto)."""
        return self.max_staleness > 0 and self.engine == "vllm"


@section
class RolloutSection:
    """Multi-turn episodes of ppo and grpo: an environment the policy talks with and tools it may call (docs/episodes.md); neither set = one response per prompt."""

    environment: Text | None = None
    """An environment class or factory, path/to/env.py:make_env or module:Class, made once per episode: reset(row) -> opening messages (None: the row's prompt), step(assistant_message) -> (messages, reward or None, done); optional tools, get_reward(), close(). None = no environment: with tools, an episode ends at the first turn without a tool call."""
    tools: tuple[Text, ...] = ()
    """Tools the model may call: path/to/file.py:function or module:function, each with type hints and a Google-style docstring (built in: rlhf.rollout.tools:calculator). The chat template must write tool calls in a format rlhf reads: Hermes/Qwen <tool_call> JSON (Qwen2.5, Qwen3), Llama-3.1/3.2 JSON, Mistral v0.3 [TOOL_CALLS], Qwen3-Coder XML."""
    max_turns: Count = 4
    """Most model turns per episode; an episode not over after its last is truncated (episode/truncated)."""
    max_episode_tokens: Count | None = None
    """Longest episode after its opening, in tokens (the model's and the environment's); None = 2 × max_turns × sampling.max_new_tokens (as much room for the environment's turns as for the model's)."""
    tool_timeout: Positive = 10.0
    """Seconds a tool call may take; one still running after it gets an error message, and its thread is left to finish (Python cannot stop a thread)."""
    max_tool_calls: Count = 4
    """Most tool calls run in one turn; the ones after get an error message."""

    @property
    def multi_turn(self) -> bool:
        """Whether episodes have several turns: an environment or tools."""
        return self.environment is not None or bool(self.tools)


@section
class EnsembleSection:
    """How a reward-model ensemble (a directory `rlhf rm --rm.ensemble K` wrote) becomes one reward: its members' scores, each normalised on its own, combined by a conservative objective (docs/ensembles.md)."""

    objective: Literal["mean", "wco", "uwo"] = "wco"
    """mean of the members; wco = worst case, their minimum; uwo = uncertainty-weighted, mean − uwo_lambda · their variance (Coste et al. 2024)."""
    uwo_lambda: NonNegative = 0.5
    """λ of uwo: how much the members' disagreement (their variance) costs."""


@section
class RewardSection:
    """The reward: one source or a weighted list, and how a list is combined."""

    source: RewardSources
    """A reward-model directory, file.py:function, module:function, URL, or a list of {source, weight, name} (on the command line as YAML, e.g. --reward.source '[{source: rewards.py:f, weight: 2}]')."""
    aggregation: Literal["sum", "gdpo"] = "sum"
    """How a list is combined: weighted sum, or gdpo (normalise each reward, sum, normalise the sum)."""
    ensemble: EnsembleSection = _defaults(EnsembleSection)
    """How a source that is a reward-model ensemble combines its members."""


@section
class JudgeSection(RewardSection):
    """A reward source that scores or compares responses, and how a list of them is combined."""

    source: OptionalRewardSources = None
    """A reward-model directory, file.py:function, module:function, URL, or a list of {source, weight, name} (on the command line as YAML); None = none."""


@section
class BestOfSection(JudgeSection):
    """Best-of-N sampling: n answers per prompt, of which the one this source scores highest is kept."""

    n: Count = 1
    """Answers sampled per prompt; the source's highest-scored one becomes the model's answer (ties, and all unscored: the earliest sample); 1 = one sample. Sampling and selection cost n times one sample."""
    source: OptionalRewardSources = None
    """Picks the best of n: a reward-model directory, file.py:function, module:function, URL or a list of {source, weight, name}; None = reward.source."""


def llm_judge(source: Any) -> tuple[str, str] | None:
    """(chat-completions URL, model) of an LLM judge source ``openai:URL#MODEL``; None for any other source.
    URL is the API's base (``http://host:8000/v1``; ``/chat/completions`` is added) or the full endpoint."""
    if not isinstance(source, str) or not source.startswith("openai:"):
        return None
    url, _, model = source.removeprefix("openai:").partition("#")
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname or not model.strip():
        raise ConfigError(
            f"LLM judge {source!r} must look like openai:http://host:port/v1#model-name (an OpenAI-compatible "
            "chat-completions server and the model it serves)"
        )
    return url.rstrip("/").removesuffix("/chat/completions") + "/chat/completions", model.strip()


@section
class LLMJudgeSection:
    """How an LLM judge (a judge source openai:URL#MODEL) is asked, over any OpenAI-compatible chat-completions API."""

    template: Text | None = None
    """A text file with the judge's prompt: for a pair, holding {prompt}, {answer_a} and {answer_b}, asking for A, B or tie; for k answers at once (label mode ranking), holding {prompt} and {answers} ({k} and {example} optional), asking for their order best first; None = the built-in template (docs/labelling.md)."""
    system: str | None = None
    """The system message; None = the built-in one (an impartial judge)."""
    api_key_env: Text = "OPENAI_API_KEY"
    """Environment variable holding the API key (sent as a Bearer token); unset = no key (a local server)."""
    both_orders: bool = True
    """Ask with the answers in both orders (k answers at once: as given, then reversed) and record a tie when the verdicts disagree (the pair's) or the mean ranks are equal (k answers'); controls position bias."""
    timeout: Positive = 60.0
    """Seconds to wait for each reply."""
    tries: Count = 4
    """Attempts per request: timeouts, refused connections, 408/429/5xx and unreadable replies are retried."""
    backoff: NonNegative = 1.0
    """Seconds before the second try, doubled before each further one."""
    concurrency: Count = 4
    """Requests in flight at once."""
    chat_template_kwargs: TemplateKwargs = None
    """Sent as the request's chat_template_kwargs (vLLM's and SGLang's servers pass them to the judge model's chat template), e.g. {enable_thinking: false} for a Qwen3 judge that should answer without a reasoning trace; None = not sent."""
    max_tokens: Count | None = None
    """Longest reply in tokens; None = room for the answer asked for: 16 for a verdict on a pair (one word), 16 + 8 per answer for an order of k answers (label mode ranking: "[3] > [1] > [2]" is about 4 tokens an answer)."""
    temperature: NonNegative = 0.0
    """Sampling temperature of the judge."""
    cache: Text | None = None
    """JSONL file of the judge's verdicts, appended as they arrive, so an interrupted run resumes without asking twice; None = <output>.judge-cache.jsonl."""


@section
class SampleJudgeSection(JudgeSection):
    """A judge of sampled answers: a reward source that scores each one, or an LLM that compares two (openai:URL#MODEL)."""

    source: OptionalRewardSources = None
    """A reward-model directory, file.py:function, module:function, URL or a list of {source, weight, name} that scores each answer; or openai:URL#MODEL, an LLM over an OpenAI-compatible API that compares two; None = none."""
    llm: LLMJudgeSection = _defaults(LLMJudgeSection)
    """How the LLM judge is asked (source openai:URL#MODEL only)."""


@section
class PolicyReward(RewardSection):
    """The reward of ppo and grpo, with the penalty for a response that never stops."""

    missing_eos_penalty: NonNegative | None = None
    """Penalty (≥ 0) for a response that hits max_new_tokens without the stop token; None = none."""
    missing_eos_mode: MissingEosPenalty = MissingEosPenalty.REPLACE
    """How the penalty applies: replace (score := −penalty) or subtract (score −= penalty)."""


@section
class KLSection:
    """The KL penalty against the frozen reference policy."""

    coef: NonNegative = 0.05
    """β, the weight of the penalty (the initial value when adaptive); 0 turns it off (no reference model)."""
    estimator: KLEstimator = KLEstimator.K1
    """Per-token estimator: k1 = log π − log π_ref, k2 = ½(log r)², k3 = (r − 1) − log r with r = π_ref/π."""
    add_to: KLPlacement = KLPlacement.REWARD
    """Where the penalty goes: into the per-token rewards (−β·KL with the estimator), or added to the loss (+β·k3, whatever the estimator: k3 is the one whose value is non-negative per token)."""
    control: KLControl = KLControl.FIXED
    """fixed β, or adaptive: β ← β·(1 + clip(KL/target − 1, ±0.2)·batch/horizon) after each iteration."""
    target: Positive = 6.0
    """Target KL (nats per sequence) of the adaptive controller."""
    horizon: Count = 10000
    """Horizon (in sequences) of the adaptive controller."""
    reference_ema: Annotated[float, Field(gt=0, lt=1)] | None = None
    """Move the reference towards the policy after each iteration: θ_ref ← d·θ_ref + (1 − d)·θ with d = reference_ema (0.9: the reference lags about ten iterations). The penalty then limits how fast the policy moves rather than how far it may go from the SFT model (Xu et al. 2024). None = the frozen SFT model (default: docs/ppo_study.md measures both). Needs a reference copy: not with model.lora or kl.coef 0."""


@section
class OptimSection:
    """AdamW and its learning-rate schedule."""

    learning_rate: Positive = 1e-5
    """Peak learning rate."""
    scheduler: Literal["constant", "linear", "cosine"] = "linear"
    """Schedule after warm-up: constant, linear decay to 0, or cosine decay to 0."""
    warmup_steps: NonNegativeInt = 0
    """Optimizer steps of linear warm-up from 0 to learning_rate."""
    weight_decay: NonNegative = 0.0
    """Decoupled weight decay."""
    max_grad_norm: Positive | None = 1.0
    """Clip the global gradient norm to this value; None = no clipping (the norm is still logged)."""


@section
class BatchSection:
    """How many examples make an optimizer step, and how many go through one forward/backward pass."""

    size: Count = 32
    """Examples per optimizer step, over all ranks."""
    micro_size: Count | None = None
    """Sequences per forward/backward pass (gradient accumulation when smaller than the batch); must divide it. None = the whole batch in one pass."""


@section
class RankingBatch(BatchSection):
    """The batch of rm and dpo: prompts per optimizer step, each with all its labelled answers, and answers per pass."""

    size: Count = 32
    """Prompts per optimizer step, over all ranks, each with every pair labelled on it (a ranking of k answers: its k(k−1)/2 pairs; data with one pair per prompt: pairs per step); the loss averages each prompt's pairs, then the prompts (InstructGPT)."""
    micro_size: Count | None = None
    """Answers per forward/backward pass (gradient accumulation): prompts are packed whole while they fit, and a prompt with more answers is split over passes with the gradient of one (each answer then takes one more forward without gradient). None = the step in one pass."""


@section
class PolicyBatch(BatchSection):
    """The rollout batch of ppo and grpo, and how it is cut for the updates."""

    size: Count = 64
    """Prompts per iteration, over all ranks (grpo samples each group_size times)."""
    micro_size: Count | None = None
    """Sequences per forward/backward pass (gradient accumulation); must divide the minibatch (the iteration's sequences / num_minibatches). None = the whole minibatch in one pass."""
    micro_tokens: Count | None = None
    """Token budget of a forward/backward pass: each minibatch's sequences, longest first, are cut into micro-batches of at most this many tokens when padded to their own longest sequence (with micro_size, both limits hold). Bounds activation memory by tokens rather than sequences and cuts padding between sequences of unequal length. None = no budget."""


@section
class DoctorSection:
    """Live alarms: the training doctor's rules read every logged step (README "Training doctor")."""

    alarms: bool = True
    """Say each finding once when it starts and when it clears (console, and output_dir/doctor.jsonl), and show what holds under the progress bar."""
    stop_on: Literal["never", "warning", "critical"] = "never"
    """Stop the run at the step where a finding at least this severe starts: a checkpoint is saved and final/ holds the policy of that step (resume with --doctor.stop_on never to go on)."""


@section
class RunSection:
    """Seeding, logging, checkpoints, resuming and how torchrun ranks share the work."""

    seed: NonNegativeInt = 0
    """Seed for every random number generator (data order, dropout, sampling)."""
    eval_every: NonNegativeInt = 100
    """Evaluate every this many optimizer steps (iterations for ppo/grpo), before training and at the end; 0 = only then."""
    save_every: NonNegativeInt = 500
    """Write a resumable checkpoint every this many optimizer steps (iterations for ppo/grpo); 0 = only the final model."""
    log_every: Count = 1
    """Log metrics every this many steps."""
    report_to: tuple[Literal["jsonl", "tensorboard", "wandb", "trackio"], ...] = ("jsonl",)
    """Metric sinks; jsonl writes output_dir/metrics.jsonl."""
    name: Text | None = None
    """Run name for tensorboard / wandb / trackio; None = the name of output_dir."""
    resume: bool = False
    """Continue the run in output_dir from its newest checkpoint that loads. The config must match the run's config.yaml except the fields listed in rlhf.runlog.rundir.SAFE_ON_RESUME (steps, epochs, logging, checkpoints, micro-batching, compile, parallelism, memory budget, output_dir itself: a moved run resumes where it now is; a changed steps/epochs re-times the learning-rate schedule from the resume point); any other difference is refused, listing each field. Without a checkpoint the run starts afresh (refused if it finished with a final/)."""
    overwrite: bool = False
    """Replace the run already in output_dir: its config.yaml, metrics.jsonl, samples/, checkpoints/, final/ and tensorboard/ are deleted once the new run has loaded its models (other files there are left alone). Without resume or overwrite, a non-empty run directory is refused."""
    progress: bool = True
    """Show a progress bar on the console."""
    memory_budget_gib: Positive | None = None
    """Memory each rank may use (GiB) in the memory plan every trainer checks before it loads a weight (`rlhf plan`); None = what the device has: 90 % of a GPU's free memory, or of the machine's MemAvailable shared by the ranks on it."""
    ignore_memory_plan: bool = False
    """Start even when the memory plan predicts a peak over the budget (the refusal's plan is then only printed)."""
    parallelism: Literal["auto", "none", "ddp", "fsdp"] = "auto"
    """How the ranks of a torchrun launch share the work (batch sizes stay global): ddp = every rank holds the models and trains on its share of each batch, gradients are averaged; fsdp = FSDP2, parameters, gradients and optimizer state sharded per decoder layer; auto = ddp under torchrun, one process otherwise; none = refuse torchrun."""


# Rules that span fields, checked once on the final config. Each raises ConfigError naming the fields.


def _check_divides(name: str, value: int | None, total: int, total_text: str) -> None:
    """`value` (field `name`; None = unset) must divide `total` (described by `total_text`)."""
    if value is not None and total % value != 0:
        divisors = [str(d) for d in range(1, total + 1) if total % d == 0]
        shown = ", ".join(divisors[:12]) + (", …" if len(divisors) > 12 else "")
        raise ConfigError(f"{name}={value} does not divide {total_text}; choose a divisor of {total} ({shown})")


def _check_sources(name: str, scorer: Any, pairwise: bool = False) -> None:
    """A reward list has unique names; gdpo needs a list; an LLM judge only where pairs are compared."""
    if scorer.source is None:
        return
    single = isinstance(scorer.source, str)
    for source in [scorer.source] if single else [spec.source for spec in scorer.source]:
        try:
            is_llm = llm_judge(source) is not None
        except ConfigError as error:
            raise ConfigError(f"{name}.source: {error}") from None
        if is_llm and not (pairwise and single):
            fix = (
                "give it alone, not in a list"
                if pairwise
                else "here each answer needs a score of its own: use it with `rlhf sample --mode preferences` or "
                "`rlhf label --judge.source`"
            )
            raise ConfigError(f"{name}.source={source!r} is an LLM judge, which compares two answers; {fix}")
    if single and scorer.aggregation == "gdpo":
        raise ConfigError(
            f"{name}.aggregation='gdpo' combines several rewards but {name}.source is a single source; give "
            f"{name}.source as a list of {{source, weight, name}} or use aggregation='sum'"
        )
    if not single and not scorer.source:
        raise ConfigError(f"{name}.source is an empty list; give at least one {{source, weight, name}}")
    names = [] if single else [spec.name for spec in scorer.source]
    for i, spec_name in enumerate(names):
        if spec_name in names[:i]:
            raise ConfigError(
                f"{name}.source[{i}].name={spec_name!r} is already used by {name}.source[{names.index(spec_name)}]; "
                "give each reward a distinct `name`"
            )
