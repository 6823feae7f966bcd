"""The memory model: what one rank of a run holds, part by part and phase by phase (`plan`), from the models'
sizes (`rlhf.planning.sizes`) and `rlhf.core.memory`'s parts; the plan as a table (`render`). The derivation and
its validation: docs/memory.md."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from rlhf.config import DPOConfig, PolicyGradientConfig, PPOConfig, RMConfig, SFTConfig, TrainingConfig
from rlhf.core import memory
from rlhf.core.memory import Transformer
from rlhf.models.critic import critic_layout
from rlhf.models.precision import frozen_dtype
from rlhf.planning.sizes import lora_params, model_config, model_sizes, reads_policy_tokens, reward_models
from rlhf.runlog.distributed import strategy

WORKSPACE = 128 * 2**20
"""On CPU, what a process's libraries take at their first use beyond the imports: oneDNN's kernels and caches,
OpenMP's and autograd's threads, glibc's arenas — a fixed allowance (measured by benchmarks/memory_plan.py; under
torchrun the process group is already in the process's memory when the plan is made)."""


REUSED = frozenset(
    {"gathered policy (fsdp)", "gathered frozen model (fsdp)", "gathered layer (fsdp)", "full policy on rank 0 (fsdp)"}
)
"""FSDP's gathers: each phase allocates whole-model (or whole-layer) buffers again in the blocks the last one
freed, so on CPU they do not add up (`Plan.reused`)."""


WorkerPlace = Literal["cpu", "trainer's GPU", "another GPU"]
"""Where the sampling worker (``sampling.max_staleness`` > 0) holds its models (`rlhf.planning.device.worker_place`):
the CPU, the trainer's own GPU (two processes share it), or a GPU the trainer does not use."""


AFTER_UPDATE = frozenset({"save"})
"""Phases that run after a step's last optimizer step: on CPU the trainer has just given the freed heap back
(`rlhf.trainers.update.release_freed_heap`), so they start from the resident parts alone."""


@dataclass(frozen=True)
class Plan:
    """Predicted bytes per rank: ``resident`` parts (held all run: the libraries, weights, optimizer state) and
    what each phase adds (``phases[phase][part]``, phases in the order a step runs them).

    ``retains``: a CPU's plan, whose allocator keeps what a phase frees: a phase's total adds every earlier
    phase's parts, up to the heap's trim after the update (:data:`AFTER_UPDATE`); a GPU's reuses them (why:
    docs/memory.md, "Phases"). ``reused``: parts whose blocks later phases allocate again whole (FSDP's gathers of
    full weights): counted once, the largest. The sampling worker's parts (`_Layout.worker`, docs/async.md):
    ``worker`` in the CPU's memory, ``worker_gpu`` on its GPU (``worker_place``), in the trainer's memory
    (`beside`) or not (`apart`)."""

    command: str
    world_size: int
    parallelism: str
    positions: int
    resident: dict[str, int]
    phases: dict[str, dict[str, int]]
    retains: bool = True
    reused: frozenset[str] = frozenset()
    notes: tuple[str, ...] = ()
    worker: dict[str, int] = field(default_factory=dict)
    worker_gpu: dict[str, int] = field(default_factory=dict)
    worker_place: WorkerPlace = "cpu"

    @property
    def beside(self) -> dict[str, int]:
        """The worker's parts in the trainer's memory: on CPU those in the CPU's, on the trainer's GPU those on it."""
        return {**(self.worker if self.retains else {}), **(self.worker_gpu if self._shares else {})}

    @property
    def apart(self) -> dict[str, dict[str, int]]:
        """The worker's other parts, by memory (``cpu`` beside a GPU trainer, ``gpu`` on another GPU than the
        trainer's): in no phase's total, each checked against its own memory (`rlhf.planning.device.worker_fits`)."""
        apart = {"cpu": {} if self.retains else self.worker, "gpu": {} if self._shares else self.worker_gpu}
        return {pool: parts for pool, parts in apart.items() if parts}

    @property
    def _shares(self) -> bool:
        return self.worker_place == "trainer's GPU"

    def total(self, phase: str) -> int:
        names = list(self.phases)
        fresh = not self.retains or phase in AFTER_UPDATE
        counted = [self.phases[p] for p in ([phase] if fresh else names[: names.index(phase) + 1])]
        added = [size for parts in counted for part, size in parts.items() if part not in self.reused]
        reused = [size for parts in counted for part, size in parts.items() if part in self.reused]
        # the worker holds its parts all run, whatever phase the trainer is in
        return sum(self.resident.values()) + sum(self.beside.values()) + sum(added) + max(reused, default=0)

    @property
    def peak(self) -> int:
        return max(self.total(phase) for phase in self.phases)

    @property
    def peak_phase(self) -> str:
        return max(self.phases, key=self.total)


def plan(
    config: TrainingConfig,
    *,
    world_size: int = 1,
    positions: int,
    runtime: int = 0,
    retains: bool = True,
    worker_place: WorkerPlace = "cpu",
    answers: int = 2,
) -> Plan:
    """The plan of ``config`` on ``world_size`` ranks, rows at most ``positions`` tokens long (prompt and
    response for ppo/grpo); ``answers``: rm and dpo, the most answers of one prompt (`rlhf.planning.lengths.most_answers`;
    a pass holds the rank's share of ``batch.size`` prompts with that many each, unless ``batch.micro_size`` caps
    it); ``runtime``: this process's RSS before any model (libraries, the data), counted on a
    CPU only (a GPU's plan counts the device's memory) and as the sampling worker's own (it loads the same);
    ``retains``: `Plan.retains` (CPU); ``worker_place``: the sampling worker's models' device."""
    layout = _Layout(config, world_size, positions, gpu=not retains, answers=answers)
    worker, worker_gpu = layout.worker(runtime, gpu=worker_place != "cpu")
    workspace = {"workspace (CPU libraries)": WORKSPACE} if retains else {}
    return Plan(
        command=config.COMMAND,
        world_size=world_size,
        parallelism=layout.parallelism,
        positions=layout.positions,
        resident={"runtime": runtime if retains else 0, **workspace, **layout.resident()},
        phases=layout.phases(),
        retains=retains,
        reused=REUSED,
        notes=tuple(dict.fromkeys(layout.notes)),
        worker=worker,
        worker_gpu=worker_gpu,
        worker_place=worker_place,
    )


def micro_rows_now(config: TrainingConfig, world_size: int, answers: int = 2) -> int:
    """Rows of one forward/backward per rank as ``config`` stands (its micro_size, or the rank's whole minibatch).
    rm and dpo count answers: batch.size prompts of at most ``answers`` each (`plan`), micro_size answers."""
    rows = max(1, config.minibatch_size // world_size)  # minibatch_size is batch.size for sft, rm and dpo
    if isinstance(config, RMConfig | DPOConfig):
        rows *= answers
    return min(rows, config.batch.micro_size or rows)


def has_reference(config: TrainingConfig) -> bool:
    """Whether the run has a KL anchor, the reference policy: ppo always, grpo only with ``kl.coef > 0`` (with 0
    not even a frozen copy in memory)."""
    return isinstance(config, PPOConfig) or (isinstance(config, PolicyGradientConfig) and config.kl.coef > 0)


def reference_copy(config: TrainingConfig) -> bool:
    """Whether the run holds a copy of the policy as its reference (not with LoRA: the base model is)."""
    return has_reference(config) and not config.model.lora


class _Layout:
    """What one rank of ``config`` holds, part by part (a class only to share the run's sizes between phases)."""

    def __init__(self, config: TrainingConfig, world_size: int, positions: int, gpu: bool, answers: int = 2):
        self.config, self.world, self.gpu, self.answers = config, world_size, gpu, answers
        # model.bf16 as the trainers resolve it (`rlhf.models.precision.bf16_enabled`): unset is mixed precision on
        # a GPU (the plan takes one that computes in bfloat16) and float32 on a CPU
        self.bf16 = config.model.bf16 if config.model.bf16 is not None else gpu
        packed = isinstance(config, SFTConfig) and config.sft.packing  # packed rows are filled to data.max_length
        self.positions = config.data.max_length if packed else positions
        self.parallelism = strategy(config.run.parallelism, world_size)
        self.sharded = self.parallelism == "fsdp"
        self.notes: list[str] = []
        self.rl = config if isinstance(config, PolicyGradientConfig) else None
        model, reward = config.model, isinstance(config, RMConfig)
        self.width = memory.DTYPE_BYTES[model.dtype]  # the trained weights' (float32 master weights when mixed)
        # mixed precision: activations, KV cache and the decoder's packed weights in bfloat16, frozen models too
        self.compute_width = memory.DTYPE_BYTES["bfloat16"] if self.bf16 else self.width
        reference_dtype = self.rl.model.reference_dtype if self.rl else None
        self.reference_width = memory.DTYPE_BYTES[reference_dtype or frozen_dtype(model.dtype, self.bf16)]
        self.reward_width = memory.DTYPE_BYTES["bfloat16"] if self.bf16 else memory.FLOAT32
        self.policy = model_sizes(model.name, reward=reward)
        self.trainable = lora_params(model.name, model.lora, reward) if model.lora else self.policy.params
        # LoRA's adapters and their moments are float32 whatever the base's dtype
        self.trainable_width = memory.FLOAT32 if model.lora else self.width
        self.micro = self._micro_rows()
        self.reward_names = reward_models(self.rl.reward) if self.rl else []
        self.reward_models = [model_sizes(name, reward=True) for name in self.reward_names]
        self.critic = self._critic()
        self.all_trainable = self.trainable + (self.critic.params if self.critic is not None else 0)
        if self.critic is None and isinstance(config, PPOConfig):
            self.all_trainable += self.policy.hidden + 1  # the shared value head

    def _micro_rows(self) -> int:
        """Rows of one forward/backward (per rank): micro_size, or what micro_tokens lets in."""
        rows = micro_rows_now(self.config, self.world, self.answers)
        budget = self.rl.batch.micro_tokens if self.rl else None
        if budget is not None:
            rows = min(rows, max(1, budget // self.positions))
        return rows

    def _critic(self) -> Transformer | None:
        """PPO's separate critic, None when shared: ``ppo.critic`` resolved as the trainer resolves it
        (`rlhf.models.critic.critic_layout`), started from the first reward model that reads the policy's tokens,
        else from the policy."""
        if not isinstance(self.config, PPOConfig):
            return None
        policy, setting = self.config.model.name, self.config.ppo.critic
        readers = (i for i, name in enumerate(self.reward_names) if reads_policy_tokens(policy, name))
        first = next(readers, None)
        layout = critic_layout(setting, first is not None)
        if setting == "auto":
            which = "a" if first is not None else "no"
            self.notes.append(f"ppo.critic auto → {layout} ({which} reward model reads the policy's tokens)")
        if layout == "shared":
            return None
        return self.reward_models[first] if first is not None else self.policy

    def share(self, total: int) -> int:
        return memory.sharded(total, self.world) if self.sharded else total

    def phases(self) -> dict[str, dict[str, int]]:
        """What each phase adds to the resident parts, in the order a step runs them."""
        phases = {"update": self.update()}
        if self.rl:
            phases = {"rollout": self.rollout(self.rl), "scoring": self.scoring(self.rl), **phases}
        return phases | ({"save": self.save()} if self.sharded else {})

    def resident(self) -> dict[str, int]:
        """Held for the whole run: every model's weights and the optimizer's moments."""
        parts = self.weights(reference=reference_copy(self.config))
        if self.critic is not None:
            parts["critic weights"] = self.share(memory.weights(self.critic.params, self.width))
        parts["optimizer state"] = self.share(memory.adamw_state(self.all_trainable, self.trainable_width))
        return parts

    def weights(self, reference: bool) -> dict[str, int]:
        """The weights of the policy (LoRA's adapters with it), of its ``reference`` copy, of each reward model."""
        policy = self.policy
        parts = {"policy weights": self.share(memory.weights(policy.params, self.width))}
        if self.config.model.lora:
            parts["policy weights"] += self.share(memory.weights(self.trainable, memory.FLOAT32))
        if reference:
            parts["reference weights"] = self.share(memory.weights(policy.params, self.reference_width))
        for i, rm in enumerate(self.reward_models):
            name = f"reward model {i + 1} weights" if i else "reward model weights"
            parts[name] = self.share(memory.weights(rm.params, self.reward_width))
        return parts

    def worker(self, runtime: int, gpu: bool) -> tuple[dict[str, int], dict[str, int]]:
        """``sampling.max_staleness`` k > 0: what the sampling worker (`rlhf.trainers.rl.producer`) holds all run, in
        the CPU's memory and on its ``gpu``: its models and rollout as a one-process run on its device holds them (its
        `Dist` is its own, ``sampling.worker_device``'s), its libraries and inputs (``runtime``, as this process's),
        and the trained weights the trainer shares with it through the CPU's memory (docs/async.md, "Memory")."""
        k = self.rl.sampling.max_staleness if self.rl else 0
        if not k:
            return {}, {}
        alone = _Layout(self.config, 1, self.positions, gpu=gpu)
        models = {**alone.weights(reference=False), **alone.rollout(self.rl, worker=True)}
        if alone.reward_models:
            models["reward model forward"] = max(alone.reward_forwards())
        # up to k + 1 versions: waiting for the batch of step s (drawn by version s-1-k, which a worker slower than
        # the trainer still holds) the trainer has published versions s-k ... s-1. The k batches in flight are left
        # out: token ids, masks and log-probs, ~28 B per row and position (64 rows of 1024: 1.8 MiB each)
        shared = {f"shared trained weights ×{k + 1}": (k + 1) * memory.weights(self.trainable, self.trainable_width)}
        cpu = {"libraries and inputs": runtime + WORKSPACE, **({} if gpu else models), **shared}

        def named(parts: dict[str, int]) -> dict[str, int]:
            return {f"sampling worker: {name}": size for name, size in parts.items()}

        return named(cpu), named(models) if gpu else {}

    def rollout(self, config: PolicyGradientConfig, *, worker: bool = False) -> dict[str, int]:
        """Sampling: the KV cache of the rank's rows, the lean decoder's packed weights, FSDP's gathered policy (of
        the sampling ``worker`` at ``sampling.max_staleness`` > 0, or of the trainer)."""
        policy = self.policy
        rows = max(1, config.num_sequences // self.world)
        parts = {"KV cache": memory.kv_cache(policy, rows, self.positions, self.compute_width)}
        engine = config.sampling.engine
        if config.sampling.worker_drives_vllm and not worker:
            engine = "auto"
        if engine == "vllm":
            if config.sampling.vllm.url is None:
                self.notes.append(
                    "sampling.engine vllm: vLLM's own memory (memory_fraction of the device) is not in the plan"
                )
            return {}
        from rlhf.rollout.decoder import SUPPORTED_MODEL_TYPES

        # on a GPU the decoder reads the policy's own weights (rollout.decoder.READS_OWN_WEIGHTS) unless it computes
        # in another dtype than they are stored in (bfloat16 over float32 master weights: a bfloat16 copy)
        copies = not self.gpu or self.compute_width != self.width
        if (
            copies
            and engine in ("auto", "lean")
            and getattr(model_config(config.model.name), "model_type", None) in SUPPORTED_MODEL_TYPES
        ):
            parts["packed weights (lean decoder)"] = memory.weights(policy.matmul_params, self.compute_width)
        if self.sharded:
            parts["gathered policy (fsdp)"] = self.gathered(memory.weights(policy.params, self.width))
        return parts

    def gathered(self, full: int) -> int:
        """FSDP: what gathering a whole sharded model of ``full`` bytes adds to a rank — the all-gather's output and
        the unsharded parameters, two full copies while gathered (as measured on gloo), less the rank's own shard."""
        return 2 * full - self.share(full)

    def scoring(self, config: PolicyGradientConfig) -> dict[str, int]:
        """The rollout's forwards without gradients (old log-probs, reference, values, rewards): the widest one."""
        policy, rows = self.policy, self.micro
        forward = max(
            [memory.inference_workspace(policy, rows, self.positions, self.compute_width), *self.reward_forwards()]
        )
        response = config.response_tokens + 1
        parts = {"forward": forward, "logits": memory.logits(rows, response, policy.vocab, copies=2)}
        if self.bf16 and not self.sharded:  # autocast keeps its bfloat16 casts of trained weights for a forward
            parts["bfloat16 copies of the trained weights (autocast)"] = memory.weights(self.trainable, 2)
        if self.sharded:  # each frozen model is gathered whole for its scoring, one at a time
            frozen = [memory.weights(rm.params, self.reward_width) for rm in self.reward_models]
            if reference_copy(config):
                frozen.append(memory.weights(policy.params, self.reference_width))
            if frozen:
                parts["gathered frozen model (fsdp)"] = max(self.gathered(full) for full in frozen)
        return parts

    def reward_forwards(self) -> list[int]:
        """Each reward model's forward over a micro-batch, without gradients."""
        return [
            memory.inference_workspace(rm, self.micro, self.positions, self.reward_width) for rm in self.reward_models
        ]

    def save(self) -> dict[str, int]:
        """FSDP: rank 0 writes final/ from the full state dict it gathers and the plain model it fills with it."""
        return {"full policy on rank 0 (fsdp)": 2 * memory.weights(self.policy.params, self.width)}

    def update(self) -> dict[str, int]:
        """One micro-batch's forward and backward: activations, the vocabulary-wide tensors, the gradients."""
        policy, rows, rl = self.policy, self.micro, self.rl
        checkpointing = self.config.model.gradient_checkpointing
        parts = {
            "gradients": self.share(memory.gradients(self.all_trainable, self.trainable_width)),
            "activations": memory.activations(
                policy, rows, self.positions, self.compute_width, checkpointing=checkpointing
            ),
        }
        if self.bf16 and not self.sharded:
            # autocast's bfloat16 copy of every weight a product reads, saved for the backward (frozen ones too:
            # the input's gradient needs them); under FSDP the gathered layer is already bfloat16
            params = policy.params + (self.critic.params if self.critic is not None else 0)
            parts["bfloat16 copies of the weights (autocast)"] = memory.weights(params, 2)
        if not isinstance(self.config, RMConfig):  # a reward model scores with one output, not the vocabulary
            scored = rl.response_tokens + 1 if rl else self.positions
            # saved for the backward and its gradient; ppo/grpo's entropy bonus keeps its softmax too
            copies = 3 if rl and rl.algorithm.entropy_coef > 0 else 2
            parts["logits"] = memory.logits(rows, scored, policy.vocab, copies=copies)
        if self.critic is not None:
            parts["critic activations"] = memory.activations(
                self.critic, rows, self.positions, self.compute_width, checkpointing=checkpointing
            )
        if self.parallelism == "ddp":  # DDP's flat buckets the gradients are all-reduced through: another copy
            parts["gradient buckets (ddp)"] = parts["gradients"]
        if self.sharded:  # FSDP gathers one layer's full weights at a time
            parts["gathered layer (fsdp)"] = memory.weights(policy.params // max(1, policy.layers), self.width)
        return parts


def render(predicted: Plan) -> str:
    """The plan as a table (MiB per rank): the resident parts, then each phase's own, one column per phase; the
    sampling worker's parts in the trainer's memory with the resident ones (`Plan.beside`), the others below the
    table, by memory (not in its peak)."""
    phases = list(predicted.phases)
    added = list(dict.fromkeys(part for phase in phases for part in predicted.phases[phase]))
    worker = {**predicted.worker, **predicted.worker_gpu}
    width = max(len(part) for part in [*predicted.resident, *worker, *added, "peak per phase"])

    def row(name: str, cells: list[int | None]) -> str:
        return f"{name:<{width}}" + "".join(f"{'' if c is None else f'{c / 2**20:.0f}':>12}" for c in cells)

    how = (
        "on CPU a phase's total keeps what earlier phases freed (the allocator holds it)"
        if predicted.retains
        else "a phase's total is the resident parts and its own"
    )
    lines = [
        f"memory plan: rlhf {predicted.command}, {predicted.world_size} rank(s), parallelism "
        f"{predicted.parallelism}, rows of up to {predicted.positions} tokens; MiB per rank ({how})",
        f"{'part':<{width}}" + "".join(f"{phase:>12}" for phase in phases),
    ]
    lines += [row(part, [size] * len(phases)) for part, size in {**predicted.resident, **predicted.beside}.items()]
    lines += [row(part, [predicted.phases[p].get(part) for p in phases]) for part in added]
    lines.append(row("peak per phase", [predicted.total(phase) for phase in phases]))
    for pool, parts in predicted.apart.items():  # one figure each, below the table
        where = "in the CPU's memory" if pool == "cpu" else "on another GPU"
        lines.append(f"sampling worker, {where} (not in the peak): {sum(parts.values()) / 2**20:.0f} MiB")
        lines += [row(part, [size]) for part, size in parts.items()]
    lines += [f"note: {note}" for note in predicted.notes]
    return "\n".join(lines)
