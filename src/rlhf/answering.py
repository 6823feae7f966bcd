"""Answering prompts outside training, shared by ``rlhf sample`` and ``rlhf eval``: a model that answers
batches of prompts with the rollout engine, the batches, and the numbers and JSON values both report."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any

import torch

from rlhf.config import EvalConfig, SampleConfig
from rlhf.data.stream import PromptBatch
from rlhf.data.tokenization import TokenizedPrompt, stop_token_ids
from rlhf.models.loading import load_causal_lm
from rlhf.rollout import generation
from rlhf.rollout.decoder import keep_packed
from rlhf.rollout.engine import SamplingParams


def prompt_value(prompt: TokenizedPrompt) -> str | list[dict[str, Any]]:
    """The prompt as the prompts file gave it: its text, or its message list for a chat prompt."""
    return prompt.messages if prompt.messages is not None else prompt.text


class Sampler:
    """One model answering prompt batches with the rollout engine: left-padded prompts, a torch.Generator
    seeded once with ``config.seed`` (the same prompts in the same batches give the same completions),
    responses cut at the stop token. ``seconds`` accumulates the time spent generating."""

    def __init__(self, model: str, tokenizer: Any, config: SampleConfig | EvalConfig, device: torch.device):
        self.model = load_causal_lm(model, config.model.dtype, device)  # dropout off
        keep_packed(self.model)  # frozen: its weights are packed for the lean decoder once, not per batch
        self.tokenizer = tokenizer
        self.device = device
        self.stops = stop_token_ids(tokenizer, config.sampling.stop)
        self.params = SamplingParams.of(config.sampling)
        self.generator = torch.Generator(device).manual_seed(config.seed)
        self.seconds = 0.0

    def __call__(self, batch: PromptBatch, repeat: int = 1) -> generation.Generated:
        """``repeat`` completions per prompt of ``batch``, in consecutive rows."""
        start = time.perf_counter()
        generated = generation.generate(
            self.model, self.tokenizer, batch, self.params, self.stops, self.generator, self.device, repeat
        )
        self.seconds += time.perf_counter() - start
        return generated


def prompt_batches(prompts: Sequence[TokenizedPrompt], batch_size: int) -> list[PromptBatch]:
    """The prompts in file order, ``batch_size`` at a time (the last batch may be smaller)."""
    return [
        PromptBatch.of(prompts, range(start, min(len(prompts), start + batch_size)))
        for start in range(0, len(prompts), batch_size)
    ]


def response_lengths(generated: generation.Generated) -> torch.Tensor:
    """(B,) tokens of each response, the stop token included, on the CPU."""
    return (generated.responses != generated.pad_token_id).sum(-1).cpu()


def response_metrics(lengths: Sequence[torch.Tensor], stopped: Sequence[torch.Tensor]) -> dict[str, float]:
    """``response/length_mean`` (tokens) and ``response/eos_rate`` (share that ended with the stop token) over
    the per-batch `response_lengths` and ``has_stop`` tensors."""
    if not lengths:
        return {"response/length_mean": math.nan, "response/eos_rate": math.nan}
    return {
        "response/length_mean": torch.cat(lengths).float().mean().item(),
        "response/eos_rate": torch.cat(stopped).float().mean().item(),
    }


def nan_to_none(values: Sequence[float]) -> list[float | None]:
    """Scores as JSON values: NaN (unscored) → None."""
    return [None if math.isnan(v) else v for v in values]


def json_safe(data: Any) -> Any:
    """``data`` with every non-finite float replaced by None (JSON has no NaN)."""
    if isinstance(data, dict):
        return {key: json_safe(value) for key, value in data.items()}
    if isinstance(data, list | tuple):
        return [json_safe(value) for value in data]
    if isinstance(data, float) and not math.isfinite(data):
        return None
    return data
