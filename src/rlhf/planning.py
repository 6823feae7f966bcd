"""The memory plan of a training run: each rank's predicted peak by phase and part, before any weight loads.

`plan` reads the models' config.json files (a hub id resolves its config only), builds each model empty on the
``meta`` device to count its parameters, and adds up `rlhf.core.memory`'s parts for the run's command, batch,
micro-batching, dtypes, LoRA, gradient checkpointing and parallelism. `check` is what every trainer runs at start:
the plan against the device's free memory (or ``run.memory_budget_gib``), refusing with the plan and the cheapest
change that fits. `rlhf plan --config FILE` prints the same. The derivation and its validation: docs/memory.md.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from rlhf.config import ConfigError, LoRAConfig
from rlhf.core import memory
from rlhf.core.memory import GiB, Transformer
from rlhf.models.precision import frozen_dtype

USABLE = 0.9
"""Share of the free memory a run may plan to use: the rest is headroom for what the plan leaves out (the
allocator's slack, other processes growing)."""

WORKSPACE = 128 * 2**20
"""On CPU, what a process's libraries take at their first use beyond the imports: oneDNN's kernels and caches,
OpenMP's and autograd's threads, glibc's arenas — a fixed allowance (measured by benchmarks/memory_plan.py; under
torchrun the process group is already in the process's memory when the plan is made)."""


REUSED = frozenset(
    {"gathered policy (fsdp)", "gathered frozen model (fsdp)", "gathered layer (fsdp)", "full policy on rank 0 (fsdp)"}
)
"""FSDP's gathers: each phase allocates whole-model (or whole-layer) buffers again in the blocks the last one
freed, so on CPU they do not add up (`Plan.reused`)."""


AFTER_UPDATE = frozenset({"save"})
"""Phases that run after a step's last optimizer step: on CPU the trainer has just given the freed heap back
(`rlhf.trainers.update.release_freed_heap`), so they start from the resident parts alone."""


@dataclass(frozen=True)
class Plan:
    """Predicted bytes per rank: ``resident`` parts (held all run: the libraries, weights, optimizer state) and
    what each phase adds (``phases[phase][part]``, phases in the order a step runs them).

    ``retains``: on CPU the allocator keeps most of what a phase frees (glibc returns little of a fragmented
    heap to the system), so a phase's total is the resident parts plus what it and every earlier phase add — up
    to the update, after whose optimizer steps the trainer trims the heap (:data:`AFTER_UPDATE`); on a GPU the
    caching allocator reuses freed blocks, so a phase's total is the resident parts plus its own.
    ``reused``: parts whose blocks later phases allocate again whole (FSDP's gathers of full weights): counted
    once, the largest, rather than added up."""

    command: str
    world_size: int
    parallelism: str
    positions: int
    resident: dict[str, int]
    phases: dict[str, dict[str, int]]
    retains: bool = True
    reused: frozenset[str] = frozenset()
    notes: tuple[str, ...] = ()

    def total(self, phase: str) -> int:
        names = list(self.phases)
        fresh = not self.retains or phase in AFTER_UPDATE
        counted = [self.phases[p] for p in ([phase] if fresh else names[: names.index(phase) + 1])]
        added = [size for parts in counted for part, size in parts.items() if part not in self.reused]
        reused = [size for parts in counted for part, size in parts.items() if part in self.reused]
        return sum(self.resident.values()) + sum(added) + max(reused, default=0)

    @property
    def peak(self) -> int:
        return max(self.total(phase) for phase in self.phases)

    @property
    def peak_phase(self) -> str:
        return max(self.phases, key=self.total)


@dataclass(frozen=True)
class Fix:
    """A change to the config (``flags``, as typed on the command line) and the plan it gives."""

    flags: tuple[str, ...]
    plan: Plan


def model_sizes(name: str, reward: bool = False) -> Transformer:
    """A model's sizes from its config.json: the model built on the ``meta`` device (no memory, no weights) to
    count its parameters exactly, whatever the architecture. Remembered while the file is unchanged (the cheapest
    fix plans many variants of one run)."""
    return _model_sizes(name, reward, _version(name))


def _version(name: str) -> float | None:
    """When a local model's config.json last changed (None for a hub id): a directory rewritten in place (a demo
    run again) is read again."""
    path = Path(name).expanduser() / "config.json"
    return path.stat().st_mtime if path.is_file() else None


@functools.cache
def _model_sizes(name: str, reward: bool, version: float | None) -> Transformer:
    model = _meta_model(name, reward)
    config = model.config
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    hidden, heads = int(text.hidden_size), int(text.num_attention_heads)
    inner = getattr(text, "intermediate_size", None) or getattr(text, "n_inner", None) or 4 * hidden
    module_names = [module_name for module_name, _ in model.named_modules()]
    return Transformer(
        layers=int(text.num_hidden_layers),
        hidden=hidden,
        intermediate=int(inner),
        heads=heads,
        kv_heads=int(getattr(text, "num_key_value_heads", None) or heads),
        head_dim=int(getattr(text, "head_dim", None) or hidden // heads),
        vocab=int(text.vocab_size),
        params=sum(p.numel() for p in model.parameters()),
        matmul_params=sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear)),
        gated=any(n.endswith("gate_proj") for n in module_names),
    )


def model_config(name: str) -> Any:
    """``name``'s config.json (a hub id downloads this file only), remembered while the file is unchanged."""
    return _model_config(name, _version(name))


@functools.cache
def _model_config(name: str, version: float | None) -> Any:
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(name)


def _meta_model(name: str, reward: bool) -> nn.Module:
    """The model ``name``'s config.json describes, built on the ``meta`` device: shapes without memory."""
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    config = copy.deepcopy(model_config(name))
    if reward:
        config.num_labels = 1  # a reward model's one score
    auto = AutoModelForSequenceClassification if reward else AutoModelForCausalLM
    with torch.device("meta"):
        return auto.from_config(config)


def lora_params(name: str, lora: LoRAConfig, reward: bool = False) -> int:
    """LoRA's trainable parameters: the adapters `rlhf.models.loading.apply_lora` puts on the model, built on the
    ``meta`` device (its targets are peft's per architecture unless ``target_modules`` names them)."""
    from rlhf.models.loading import apply_lora

    with torch.device("meta"):
        model = apply_lora(_meta_model(name, reward), lora, task_type="SEQ_CLS" if reward else "CAUSAL_LM")
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def reward_models(config: Any) -> list[str]:
    """The reward-model sources of ``reward.source`` (a directory or a hub id: not a function, URL or LLM judge)."""
    from rlhf.inputs import is_reward_model, reward_sources

    return [source for _, source in reward_sources("reward.source", config.reward.source) if is_reward_model(source)]


def parallelism(config: Any, world_size: int) -> str:
    """``run.parallelism`` resolved for ``world_size`` ranks: auto is ddp under several ranks, none for one."""
    chosen = config.run.parallelism
    if world_size == 1:
        return "none"
    return "ddp" if chosen == "auto" else chosen


def plan(config: Any, *, world_size: int = 1, positions: int, runtime: int = 0, retains: bool = True) -> Plan:
    """The plan of ``config`` on ``world_size`` ranks, rows at most ``positions`` tokens long (prompt and
    response for ppo/grpo); ``runtime`` bytes the process holds before any model (libraries: this process's RSS
    on CPU, 0 on a GPU); ``retains``: `Plan.retains` (CPU). ``model.bf16`` unset is mixed precision on a GPU (one
    that does not retain) and float32 on a CPU, as the trainers resolve it (`rlhf.models.precision`)."""
    bf16 = config.model.bf16 if config.model.bf16 is not None else not retains
    layout = _Layout(config, world_size, positions, bf16, gpu=not retains)
    workspace = WORKSPACE if retains else 0
    resident = {
        "runtime": runtime,
        **({"workspace (CPU libraries)": workspace} if workspace else {}),
        **layout.resident(),
    }
    phases = layout.phases()
    return Plan(
        command=config.COMMAND,
        world_size=world_size,
        parallelism=layout.parallelism,
        positions=layout.positions,
        resident=resident,
        phases=phases,
        retains=retains,
        reused=REUSED,
        notes=tuple(dict.fromkeys(layout.notes)),
    )


class _Layout:
    """What one rank of ``config`` holds, part by part (a class only to share the run's sizes between phases)."""

    def __init__(self, config: Any, world_size: int, positions: int, bf16: bool, gpu: bool = False):
        self.config, self.world, self.positions, self.bf16, self.gpu = config, world_size, positions, bf16, gpu
        if config.COMMAND == "sft" and config.sft.packing:  # packed rows are filled to data.max_length
            self.positions = config.data.max_length
        self.parallelism = parallelism(config, world_size)
        self.sharded = self.parallelism == "fsdp"
        self.notes: list[str] = []
        model = config.model
        self.width = memory.DTYPE_BYTES[model.dtype]  # the trained weights' (float32 master weights when mixed)
        # mixed precision: activations, KV cache and the decoder's packed weights in bfloat16, frozen models too
        self.compute_width = memory.DTYPE_BYTES["bfloat16"] if bf16 else self.width
        frozen = frozen_dtype(model.dtype, bf16)
        self.reference_width = memory.DTYPE_BYTES[getattr(model, "reference_dtype", None) or frozen]
        self.reward_width = memory.DTYPE_BYTES["bfloat16"] if bf16 else memory.FLOAT32
        self.rl = config.COMMAND in ("ppo", "grpo")
        self.policy = model_sizes(model.name, reward=config.COMMAND == "rm")
        self.trainable = (
            lora_params(model.name, model.lora, config.COMMAND == "rm") if model.lora else self.policy.params
        )
        # LoRA's adapters and their moments are float32 whatever the base's dtype
        self.trainable_width = memory.FLOAT32 if model.lora else self.width
        self.micro = self._micro_rows()
        self.reward_models = [model_sizes(name, reward=True) for name in reward_models(config)] if self.rl else []
        self.critic = self._critic()
        self.all_trainable = self.trainable + (self.critic.params if self.critic is not None else 0)
        if self.critic is None and config.COMMAND == "ppo":
            self.all_trainable += self.policy.hidden + 1  # the shared value head

    def _micro_rows(self) -> int:
        """Rows of one forward/backward (per rank): micro_size, or what micro_tokens lets in."""
        rows = _micro_rows_now(self.config, self.world)
        if self.config.COMMAND in ("rm", "dpo"):
            rows *= 2  # chosen and rejected go through the model together
        budget = getattr(self.config.batch, "micro_tokens", None)
        if budget is not None:
            rows = min(rows, max(1, budget // self.positions))
        return rows

    def share(self, total: int) -> int:
        return memory.sharded(total, self.world) if self.sharded else total

    def phases(self) -> dict[str, dict[str, int]]:
        """What each phase adds to the resident parts, in the order a step runs them."""
        phases = {"update": self.update()}
        if self.rl:
            phases = {"rollout": self.rollout(), "scoring": self.scoring(), **phases}
        return phases | ({"save": self.save()} if self.sharded else {})

    def resident(self) -> dict[str, int]:
        """Held for the whole run: every model's weights and the optimizer's moments."""
        config, policy = self.config, self.policy
        parts = {"policy weights": self.share(memory.weights(policy.params, self.width))}
        if config.model.lora:
            parts["policy weights"] += self.share(memory.weights(self.trainable, memory.FLOAT32))
        if self.rl:
            if _reference_copy(config):
                parts["reference weights"] = self.share(memory.weights(policy.params, self.reference_width))
            for i, rm in enumerate(self.reward_models):
                name = f"reward model {i + 1} weights" if i else "reward model weights"
                parts[name] = self.share(memory.weights(rm.params, self.reward_width))
            if self.critic is not None:
                parts["critic weights"] = self.share(memory.weights(self.critic.params, self.width))
        parts["optimizer state"] = self.share(memory.adamw_state(self.all_trainable, self.trainable_width))
        return parts

    def _critic(self) -> Transformer | None:
        """PPO's separate critic (started from the first reward model, or from the policy), None when shared."""
        if self.config.COMMAND != "ppo":
            return None
        layout = self.config.ppo.critic
        if layout == "auto":
            layout = "separate" if self.reward_models else "shared"
            why = "a reward model to start it from" if self.reward_models else "no reward model"
            self.notes.append(f"ppo.critic auto → {layout} ({why})")
        if layout == "shared":
            return None
        return self.reward_models[0] if self.reward_models else self.policy

    def rollout(self) -> dict[str, int]:
        """Sampling: the KV cache of the rank's rows, the lean decoder's packed weights, FSDP's gathered policy."""
        config, policy = self.config, self.policy
        rows = max(1, config.num_sequences // self.world)
        parts = {"KV cache": memory.kv_cache(policy, rows, self.positions, self.compute_width)}
        engine = config.sampling.engine
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
            parts["gathered policy (fsdp)"] = self.gathered(policy.params, self.width)
        return parts

    def gathered(self, params: int, width: int) -> int:
        """FSDP: what gathering a whole sharded model adds to a rank — the all-gather's output and the unsharded
        parameters, two full copies while gathered (as measured on gloo), less the rank's own shard."""
        full = memory.weights(params, width)
        return 2 * full - self.share(full)

    def scoring(self) -> dict[str, int]:
        """The rollout's forwards without gradients (old log-probs, reference, values, rewards): the widest one."""
        policy, rows = self.policy, self.micro
        forwards = [memory.inference_workspace(policy, rows, self.positions, self.compute_width)]
        forwards += [
            memory.inference_workspace(rm, rows, self.positions, self.reward_width) for rm in self.reward_models
        ]
        response = self.config.response_tokens + 1
        parts = {"forward": max(forwards), "logits": memory.logits(rows, response, policy.vocab, copies=2)}
        if self.bf16 and not self.sharded:  # autocast keeps its bfloat16 casts of trained weights for a forward
            parts["bfloat16 copies of the trained weights (autocast)"] = memory.weights(self.trainable, 2)
        if self.sharded:  # each frozen model is gathered whole for its scoring, one at a time
            frozen = [memory.weights(rm.params, self.reward_width) for rm in self.reward_models]
            if _reference_copy(self.config):
                frozen.append(memory.weights(policy.params, self.reference_width))
            if frozen:
                parts["gathered frozen model (fsdp)"] = max(2 * full - self.share(full) for full in frozen)
        return parts

    def save(self) -> dict[str, int]:
        """FSDP: rank 0 writes final/ from the full state dict it gathers and the plain model it fills with it."""
        return {"full policy on rank 0 (fsdp)": 2 * memory.weights(self.policy.params, self.width)}

    def update(self) -> dict[str, int]:
        """One micro-batch's forward and backward: activations, the vocabulary-wide tensors, the gradients."""
        config, policy, rows = self.config, self.policy, self.micro
        checkpointing = config.model.gradient_checkpointing
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
        if config.COMMAND != "rm":
            scored = config.response_tokens + 1 if self.rl else self.positions
            # saved for the backward and its gradient; ppo/grpo's entropy bonus keeps its softmax too
            copies = 3 if self.rl and config.algorithm.entropy_coef > 0 else 2
            parts["logits"] = memory.logits(rows, scored, policy.vocab, copies=copies)
        if self.critic is not None:
            parts["critic activations"] = memory.activations(
                self.critic, rows, self.positions, self.compute_width, checkpointing=checkpointing
            )
        if self.parallelism == "ddp":  # DDP's flat buckets the gradients are all-reduced through: another copy
            parts["gradient buckets (ddp)"] = parts["gradients"]
        if self.sharded:  # FSDP gathers one layer's full weights at a time
            layer = memory.weights(policy.params // max(1, policy.layers), self.width)
            parts["gathered layer (fsdp)"] = layer
        return parts


def single_changes(config: Any, world_size: int) -> tuple[list[str], list[str]]:
    """(smaller micro-batch sizes, largest first; the other single changes, cheapest first: gradient
    checkpointing, a bfloat16 reference, FSDP over the ranks, LoRA) that apply to ``config``."""
    model = config.model
    current = _micro_rows_now(config, world_size)
    micro = [f"--batch.micro_size={m}" for m in reversed(_divisors(config.minibatch_size)) if m < current]
    others = [
        *([] if model.gradient_checkpointing else ["--model.gradient_checkpointing=true"]),
        *(["--model.reference_dtype=bfloat16"] if _reference_copy(config) and model.dtype == "float32" else []),
        *(["--run.parallelism=fsdp"] if world_size > 1 and config.run.parallelism != "fsdp" else []),
        *([] if model.lora else ["--model.lora.r=8"]),
    ]
    return micro, others


def _micro_rows_now(config: Any, world_size: int) -> int:
    """Rows of one forward/backward per rank as ``config`` stands (its micro_size, or the rank's whole minibatch)."""
    rows = max(1, config.minibatch_size // world_size)  # minibatch_size is batch.size for sft, rm and dpo
    return min(rows, config.batch.micro_size or rows)


def _reference_copy(config: Any) -> bool:
    """Whether the run holds a frozen copy of the policy (ppo, grpo with kl.coef > 0; not with LoRA)."""
    rl = config.COMMAND in ("ppo", "grpo")
    return rl and (config.COMMAND == "ppo" or config.kl.coef > 0) and not config.model.lora


def candidates(config: Any, world_size: int) -> Iterator[tuple[str, ...]]:
    """Changes that lower the peak, cheapest first: micro-batches down to a quarter of today's (at most 4× the
    passes), then each other single change (`single_changes`) alone and with smaller micro-batches, then smaller
    micro-batches still (each pass on a few rows wastes the hardware), then the changes together, adding one at a
    time."""
    micro, others = single_changes(config, world_size)
    few = len(micro) - sum(int(m.split("=")[1]) * 4 < _micro_rows_now(config, world_size) for m in micro)
    yield from ((m,) for m in micro[:few])
    for change in others:
        yield (change,)
        yield from ((change, m) for m in micro)
    yield from ((m,) for m in micro[few:])
    together: tuple[str, ...] = ()
    for change in others:
        # with LoRA the base is the reference (no copy, no dtype of its own)
        together = tuple(f for f in together if not (change.startswith("--model.lora") and "reference" in f))
        together += (change,)
        if len(together) > 1:
            yield together
            yield from ((*together, m) for m in micro)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def cheapest_fix(
    config: Any, budget: int, *, world_size: int, positions: int, runtime: int, retains: bool = True
) -> Fix | None:
    """The first of `candidates` whose plan fits ``budget`` bytes, or None."""
    for flags in candidates(config, world_size):
        try:
            changed = with_flags(config, flags)
        except (ConfigError, ValueError):  # pydantic's ValidationError is a ValueError: a combination refused
            continue
        fixed = plan(changed, world_size=world_size, positions=positions, runtime=runtime, retains=retains)
        if fixed.peak <= budget:
            return Fix(flags, fixed)
    return None


def with_flags(config: Any, flags: tuple[str, ...]) -> Any:
    """``config`` with ``flags`` applied (checked like any config)."""
    changed = config
    for flag in flags:
        key, value = flag.removeprefix("--").split("=", 1)
        if key == "model.lora.r":  # LoRA's defaults with that rank
            lora = LoRAConfig(r=int(value))
            changed = dataclasses.replace(changed, model=dataclasses.replace(changed.model, lora=lora))
            continue
        section, name = key.split(".")  # every other change is one field of one section
        typed = {"true": True, "false": False}.get(value, int(value) if value.isdigit() else value)
        part = dataclasses.replace(getattr(changed, section), **{name: typed})
        changed = dataclasses.replace(changed, **{section: part})
    return changed


# ------------------------------------------------------------------------------------------------------------
# The budget and the check every trainer runs
# ------------------------------------------------------------------------------------------------------------


def process_rss() -> int:
    """This process's resident memory now (bytes), from /proc; 0 where there is none."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def available(device: torch.device) -> tuple[int, str]:
    """(bytes this rank may plan to use, where the figure comes from) on ``device``: a GPU's free memory, or the
    machine's MemAvailable shared by the ranks on it (LOCAL_WORLD_SIZE), either times `USABLE`."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free * USABLE), f"{USABLE:.0%} of {device}'s free memory"
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    free = mem_available()
    share = f" / {local} ranks" if local > 1 else ""
    return process_rss() + int(free * USABLE) // local, f"this process + {USABLE:.0%} of MemAvailable{share}"


def mem_available() -> int:
    """The kernel's estimate of memory available to new work (/proc/meminfo MemAvailable), in bytes."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    raise OSError("/proc/meminfo has no MemAvailable")


def budget(config: Any, device: torch.device, gib: float | None = None) -> tuple[int, str]:
    """The budget: ``gib`` (``--device_memory_gib``), ``run.memory_budget_gib``, else what the device has free."""
    chosen = gib if gib is not None else config.run.memory_budget_gib
    if chosen is not None:
        return int(chosen * GiB), f"{chosen:g} GiB per rank"
    return available(device)


def runtime_bytes(device: torch.device) -> int:
    """What the process holds before any model: on CPU its RSS now (torch, transformers, the data); on a GPU
    nothing yet (the plan counts device memory)."""
    return 0 if device.type == "cuda" else process_rss()


def check(config: Any, d: Any, positions: int) -> Plan | None:
    """At a trainer's start (``d``: its `Dist`), before any weight loads: the plan against the budget, silent when
    it fits; when it does not, the plan on stderr and ConfigError naming the cheapest change that fits
    (``run.ignore_memory_plan``: a warning, and the run goes on). None when the plan cannot be made (a model
    whose config the plan cannot read): said, and the run goes on."""
    runtime = runtime_bytes(d.device)
    retains = d.device.type != "cuda"
    try:
        predicted = plan(config, world_size=d.world_size, positions=positions, runtime=runtime, retains=retains)
    except Exception as error:  # noqa: BLE001 - the plan advises; a model it cannot read must not stop a run
        if d.is_main:
            print(f"{config.COMMAND}: no memory plan ({type(error).__name__}: {error}); going on", file=sys.stderr)
        return None
    limit, source = budget(config, d.device)
    if predicted.peak <= limit:  # silent: `rlhf plan` shows the plan of a run that fits
        return predicted
    if d.is_main:
        print(render(predicted), file=sys.stderr)
    if config.run.ignore_memory_plan:
        if d.is_main:
            print(
                f"{config.COMMAND}: the memory plan's peak {predicted.peak / GiB:.2f} GiB per rank does NOT fit the "
                f"budget of {limit / GiB:.2f} GiB ({source}); run.ignore_memory_plan is set: going on anyway",
                file=sys.stderr,
            )
        return predicted
    fix = cheapest_fix(config, limit, world_size=d.world_size, positions=positions, runtime=runtime, retains=retains)
    raise ConfigError(f"{config.COMMAND}: {refusal(predicted, limit, source, fix)}")


def refusal(predicted: Plan, limit: int, source: str, fix: Fix | None) -> str:
    """Why a run is refused: the peak against the budget and the cheapest change that fits (the plan itself is
    printed above it)."""
    head = (
        f"the memory plan predicts a peak of {predicted.peak / GiB:.2f} GiB per rank in the {predicted.peak_phase} "
        f"phase, over the budget of {limit / GiB:.2f} GiB ({source}); no weights were loaded."
    )
    if fix is None:
        advice = "No change within reach fits (smaller micro-batches, checkpointing, a bfloat16 reference, FSDP, LoRA)."
    else:
        advice = f"The cheapest change that fits: {' '.join(fix.flags)} (peak {fix.plan.peak / GiB:.2f} GiB)."
    return (
        f"{head} {advice} To run anyway: --run.ignore_memory_plan true; to state the budget: --run.memory_budget_gib."
    )


def render(predicted: Plan) -> str:
    """The plan as a table (MiB per rank): the resident parts, then each phase's own, one column per phase."""
    phases = list(predicted.phases)
    added = list(dict.fromkeys(part for phase in phases for part in predicted.phases[phase]))
    width = max(len(part) for part in [*predicted.resident, *added, "peak per phase"])

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
    lines += [row(part, [size] * len(phases)) for part, size in predicted.resident.items()]
    lines += [row(part, [predicted.phases[p].get(part) for p in phases]) for part in added]
    lines.append(row("peak per phase", [predicted.total(phase) for phase in phases]))
    lines += [f"note: {note}" for note in predicted.notes]
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------------------
# The longest row: each trainer passes the length it tokenized; `rlhf plan` reads the data the same way
# ------------------------------------------------------------------------------------------------------------


def prompt_positions(config: Any, prompts: list) -> int:
    """ppo/grpo: the longest prompt (as the trainer cut it) plus the longest response (``sampling.max_new_tokens``,
    or a multi-turn episode's ``rollout.max_episode_tokens``)."""
    return max((len(p.input_ids) for p in prompts), default=1) + config.response_tokens


def sequence_positions(sequences: list) -> int:
    """sft: the longest example (``input_ids``); dpo: the longest prompt + response of a pair."""
    if sequences and hasattr(sequences[0], "input_ids"):
        return max(len(s.input_ids) for s in sequences)
    return max((len(p.prompt_ids) + max(len(p.chosen_ids), len(p.rejected_ids)) for p in sequences), default=1)


def data_positions(config: Any) -> int:
    """The longest row of ``config``'s data, tokenized as its trainer does (rm: as the model reads pairs, an
    encoder or a decoder, from its architecture built on the ``meta`` device)."""
    from rlhf.data import load_preferences, load_prompts, load_sft
    from rlhf.data.chat import set_template_kwargs
    from rlhf.models.loading import load_tokenizer
    from rlhf.models.reward import load_reward_model, tokenize_pairs

    files = [config.data.train, *([config.data.eval] if config.data.eval else [])]
    if config.COMMAND == "rm":
        with torch.device("meta"):
            shell = load_reward_model(config.model.name, config.model.dtype, "meta")
        set_template_kwargs(shell.tokenizer, config.data.chat_template_kwargs)
        return sequence_positions([p for file in files for p in tokenize_pairs(file, shell, config.data.max_length)])
    tokenizer = load_tokenizer(config.model.name, config.data.chat_template_kwargs)
    if config.COMMAND in ("ppo", "grpo"):  # every prompt the run may sample, held-out ones included
        limit = config.sampling.max_prompt_length
        return prompt_positions(config, [p for file in files for p in load_prompts(file, tokenizer, limit)])
    load = load_sft if config.COMMAND == "sft" else load_preferences
    return sequence_positions([row for file in files for row in load(file, tokenizer, config.data.max_length)])


# ------------------------------------------------------------------------------------------------------------
# `rlhf plan --config FILE [--world_size N] [--device_memory_gib G]`
# ------------------------------------------------------------------------------------------------------------

TRAINERS = ("sft", "rm", "dpo", "ppo", "grpo")


def command_of(sections: set[str]) -> str | None:
    """The trainer a config file is for, from its own section (``ppo:``, ``grpo:``, ``dpo:``, ``rm:``/``normalize:``,
    ``sft:``); None when it has none of them."""
    found = [c for c in TRAINERS if c in sections] + (["rm"] if "normalize" in sections else [])
    return found[0] if len(set(found)) == 1 else None


def alternatives(config: Any, world_size: int, positions: int, runtime: int, retains: bool) -> list[Fix]:
    """Each single change (`single_changes`) with its plan: what `rlhf plan` lists."""
    micro, others = single_changes(config, world_size)
    fixes = []
    for change in micro + others:
        try:
            changed = with_flags(config, (change,))
        except (ConfigError, ValueError):
            continue
        predicted = plan(changed, world_size=world_size, positions=positions, runtime=runtime, retains=retains)
        fixes.append(Fix((change,), predicted))
    return fixes


def report(config: Any, *, world_size: int = 1, device_memory_gib: float | None = None) -> tuple[str, bool]:
    """What `rlhf plan` prints for ``config`` on ``world_size`` ranks, and whether it fits the budget (the GPU or
    this machine's free memory, ``run.memory_budget_gib``, or ``device_memory_gib``)."""
    from rlhf.runlog.distributed import device_for_run  # the device a one-process run of this config would take

    device = device_for_run()
    positions, runtime, retains = data_positions(config), runtime_bytes(device), device.type != "cuda"
    predicted = plan(config, world_size=world_size, positions=positions, runtime=runtime, retains=retains)
    limit, source = budget(config, device, device_memory_gib)
    fits = predicted.peak <= limit
    lines = [
        render(predicted),
        "",
        f"peak {predicted.peak / GiB:.2f} GiB per rank ({predicted.peak_phase}); budget {limit / GiB:.2f} GiB "
        f"({source}): {'fits' if fits else 'does NOT fit'}",
        "",
        "what each change would make the peak:",
    ]
    for fix in alternatives(config, world_size, positions, runtime, retains):
        mark = "fits" if fix.plan.peak <= limit else ""
        lines.append(f"  {' '.join(fix.flags):<48} {fix.plan.peak / GiB:8.2f} GiB  {mark}")
    if not fits:
        fix = cheapest_fix(config, limit, world_size=world_size, positions=positions, runtime=runtime, retains=retains)
        lines += ["", refusal(predicted, limit, source, fix).replace("; no weights were loaded", "")]
    return "\n".join(lines), fits
