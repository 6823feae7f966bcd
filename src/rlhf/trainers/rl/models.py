"""What an RL run trains and samples with (`Models`: policy, reference, value function, engine) and how the
trained ones are written to ``final/``."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from rlhf import planning
from rlhf.config import PolicyGradientConfig
from rlhf.models.loading import compile_models, load_trainable_state, trainable_state
from rlhf.models.policy import ActorCritic, Reference, ScoredTokens, ValueHead
from rlhf.models.precision import bf16_enabled, frozen_dtype
from rlhf.models.sharding import load_policy, unsharded
from rlhf.models.sharding import sampling as sampling_weights
from rlhf.rollout import generation
from rlhf.runlog import rundir
from rlhf.runlog.distributed import SINGLE, Dist
from rlhf.trainers import update


@dataclasses.dataclass(frozen=True)
class ValueFunction:
    """PPO's value function: a ``head`` on the policy's trunk, or a separate ``critic``; ``load()`` builds a fresh
    one (on the CPU), the shell of the unsharded copy for ``final/``."""

    head: ValueHead | None = None
    critic: nn.Module | None = None
    load: Callable[..., nn.Module] | None = None


class Models:
    """What an RL run trains and scores against: the policy, its reference (`rlhf.planning.has_reference`: frozen,
    or moving with ``kl.reference_ema``), PPO's value function (``value(policy)``), `Trainable`, policy and value
    function as the ranks train them, and the ``engine`` that samples (one of ours by name, or vLLM holding its own
    copy of the policy's weights). The checkpoint holds what changes: the policy's trained weights, the value
    function and a moving reference."""

    def __init__(
        self,
        config: PolicyGradientConfig,
        d: Dist,
        value: Callable[[nn.Module], ValueFunction] | None = None,
        *,
        sampler: bool = False,
    ):
        """``sampler``: the policy and its engine only, for a sampling worker (no reference, no value function)."""
        model = config.model
        self.model, self.d = model, d
        # vLLM holds its copy of the policy in bfloat16 under mixed precision (it never trains), else in model.dtype
        dtype = frozen_dtype(model.dtype, bf16_enabled(model.bf16, d.device))
        if config.sampling.worker_drives_vllm and not sampler:  # its pushes label the server's weights
            self.engine = generation.AUTO
        else:
            self.engine = generation.open_engine(
                config.sampling, model.name, dtype=dtype, seed=config.run.seed, response_tokens=config.response_tokens
            )
        reference = planning.has_reference(config) and not sampler
        self.policy, copy = load_policy(model, d, reference)
        self.reference = Reference(self.policy, copy, config.kl.reference_ema) if reference else None
        self.value = value(self.policy) if value is not None and not sampler else ValueFunction()
        if model.compile:
            compile_models([self.policy, copy, self.value.critic], d.device)
        self.trainable = update.Trainable(ActorCritic(self.policy, self.value.head, self.value.critic), d)

    def old_scores(
        self, ids: torch.Tensor, mask: torch.Tensor, T: int, temperature: float, entropy: bool = False
    ) -> ScoredTokens:
        """The rollout's forward without gradients, on the plain module (no collective); a training forward is
        ``trainable.forward`` (through the gradient-synchronising wrapper under torchrun)."""
        return self.trainable.module(ids, mask, T, temperature, entropy=entropy)

    def sync_engine(self) -> None:
        """Give an engine with its own weights (vLLM) the policy's current ones; ours sample the policy itself. A
        server all ranks share gets them from rank 0, and the others expect what rank 0 pushed."""
        engine = self.engine
        if isinstance(engine, generation.LocalEngine):
            return
        with sampling_weights(self.policy, self.d) as policy:  # sharded: every rank gathers the full weights
            if not engine.shared or self.d.is_main:
                engine.sync(policy)
        if engine.shared and self.d.distributed:  # a collective: no rank samples before the push is done
            engine.client, engine.version = self.d.broadcast((engine.client, engine.version))

    def value_module(self) -> nn.Module | None:
        return self.value.head if self.value.head is not None else self.value.critic

    def modules(self) -> dict[str, nn.Module]:
        """The modules that change in training, by name (checkpoints)."""
        modules = {"policy": self.policy}
        if self.value_module() is not None:
            modules["value"] = self.value_module()
        if self.reference is not None and self.reference.moves:
            modules["reference"] = self.reference.copy
        return modules

    def state_dict(self) -> dict[str, Any]:
        # the policy's trained tensors only (LoRA: the adapters); the others whole
        return {name: trainable_state(m) if name == "policy" else m.state_dict() for name, m in self.modules().items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for name, module in self.modules().items():
            if name == "policy":
                load_trainable_state(module, state[name], "policy weights")
            else:
                module.load_state_dict(state[name])


def write_final(models: Models, tokenizer: Any, final: Path, d: Dist) -> None:
    """``final/``: a plain ``save_pretrained`` policy (LoRA merged in) + tokenizer, and PPO's value function beside it
    (``value_head.safetensors``, or the separate critic under ``critic/``). Every rank calls it (sharded weights
    are gathered by all); rank 0 alone writes, through a staging directory (a crash keeps the previous final/)."""
    from safetensors.torch import save_file

    # plain modules: themselves, or when sharded, full copies on rank 0 (None elsewhere)
    policy = unsharded(models.policy, lambda: load_policy(models.model, SINGLE, reference=False)[0], d)
    value = models.value_module()
    value = unsharded(value, models.value.load, d) if value is not None else None
    if policy is None or not d.is_main:
        return
    policy = policy.merge_and_unload() if hasattr(policy, "merge_and_unload") else policy
    with rundir.staged(final) as staging:
        out = staging / "final"
        policy.save_pretrained(out)
        tokenizer.save_pretrained(out)
        if isinstance(value, ValueHead):
            save_file({k: v.contiguous() for k, v in value.state_dict().items()}, out / "value_head.safetensors")
        elif value is not None:
            value.trunk.save_pretrained(out / "critic")
            save_file(dict(value.head.state_dict()), out / "critic" / "value_head.safetensors")
