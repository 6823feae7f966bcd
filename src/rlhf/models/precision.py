"""bfloat16 mixed precision (``model.bf16``): what HF Trainer's and TRL's ``bf16=True`` do, and verl's and OpenRLHF's
defaults — the trained weights and AdamW's state stay in ``model.dtype`` (float32: the master weights), every forward
computes in bfloat16 under ``torch.autocast``, and the frozen models (the reference copy, the reward models) are held in
bfloat16. Why not pure bfloat16: a bfloat16 weight near 0.02 has a spacing of 1.2e-4, so an AdamW step of 1e-6 rounds
away entirely (docs/precision.md measures it; ``update/changed_frac`` shows it in a run).

How: :func:`compute_in_bf16` hooks a model so that each call of it runs under autocast (and nothing else does: the
backward runs outside, and the cast weights are cached only while one forward, or one rollout inside
:func:`rollout_region`, lasts — never across an optimizer step, which would leave them stale)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn

from rlhf.models.policy import unwrap

COMPUTE_DTYPE = "_rlhf_compute_dtype"
"""The attribute :func:`compute_in_bf16` sets on a model: the dtype its forwards compute in."""


def bf16_enabled(bf16: bool | None, device: torch.device) -> bool:
    """``model.bf16`` resolved on ``device``: None is on for a CUDA device that computes in bfloat16 (Ampere and
    later), off elsewhere (a CPU without bfloat16 units runs it several times slower, and float32 keeps CPU runs
    comparable with earlier ones)."""
    if bf16 is not None:
        return bf16
    return device.type == "cuda" and torch.cuda.is_bf16_supported()


def frozen_dtype(dtype: str, bf16: bool) -> str:
    """The dtype of a frozen model (the reference copy, a reward model) in a run whose trained weights are
    ``dtype``: bfloat16 under mixed precision (it never takes a step, so nothing rounds away; autocast would cast
    its weights to bfloat16 for every product anyway), else ``dtype``."""
    return "bfloat16" if bf16 else dtype


def compute_in_bf16(model: nn.Module, device: torch.device) -> nn.Module:
    """Make every call of ``model`` compute under ``torch.autocast(device.type, torch.bfloat16)``; its parameters
    keep their dtype. A forward pre-hook enters the region and a forward hook that runs even when the forward
    raises leaves it, so the gradients' backward runs outside it (PyTorch's recommendation) and nested calls
    (generate calling forward) share the outer region. Returns ``model``."""
    regions: list[torch.autocast] = []

    def enter(module: nn.Module, args: tuple) -> None:
        region = torch.autocast(device.type, dtype=torch.bfloat16)
        region.__enter__()
        regions.append(region)

    def leave(module: nn.Module, args: tuple, output: object) -> None:
        regions.pop().__exit__(None, None, None)

    model.register_forward_pre_hook(enter)
    model.register_forward_hook(leave, always_call=True)
    for module in {model, unwrap(model)}:  # the lean decoder reads the transformers model inside a peft wrapper
        setattr(module, COMPUTE_DTYPE, torch.bfloat16)
    return model


def compute_dtype(model: nn.Module) -> torch.dtype | None:
    """The dtype ``model``'s forwards compute in when :func:`compute_in_bf16` hooked it (or the peft wrapper around
    it: both carry the mark), else None: its parameters' dtype."""
    return getattr(model, COMPUTE_DTYPE, None)


@contextlib.contextmanager
def rollout_region(model: nn.Module) -> Iterator[None]:
    """One autocast region around a whole rollout of a hooked ``model`` (nothing for another): every decode step's
    forward nests inside it, so each trained weight is cast to bfloat16 once per rollout rather than once per
    token (autocast caches the casts of leaf tensors until its outermost region ends). The weights do not change
    inside a rollout, so the cache is never stale."""
    dtype = compute_dtype(model)
    device = None if dtype is None else next(model.parameters()).device
    with contextlib.nullcontext() if device is None else torch.autocast(device.type, dtype=dtype):
        yield
