"""Answering prompts outside training, shared by ``rlhf sample`` and ``rlhf eval``: a model that answers
batches of prompts with the rollout engine, the batches, their scoring, and the numbers and JSON values both
report."""

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
from rlhf.models.precision import bf16_enabled, frozen_dtype
from rlhf.rollout import generation, scoring
from rlhf.rollout.decoder import keep_packed
from rlhf.rollout.engine import SamplingParams
from rlhf.rollout.rewards import RewardSet


def prompt_value(prompt: TokenizedPrompt) -> str | list[dict[str, Any]]:
    """The prompt as the prompts file gave it: its text, or its message list for a chat prompt."""
    return prompt.messages if prompt.messages is not None else prompt.text


class Sampler:
    """One model answering prompt batches with the engine of ``config.sampling``: left-padded prompts, a
    torch.Generator seeded once with ``config.seed`` (the same prompts in the same batches give the same
    completions), responses cut at the stop token. ``seconds`` accumulates the time spent generating."""

    def __init__(self, model: str, tokenizer: Any, config: SampleConfig | EvalConfig, device: torch.device):
        dtype = inference_dtype(config, device)
        self.model = load_causal_lm(model, dtype, device)  # dropout off
        keep_packed(self.model)  # frozen: its weights are packed for the lean decoder once, not per batch
        self.tokenizer = tokenizer
        self.device = device
        self.stops = stop_token_ids(tokenizer, config.sampling.stop)
        self.params = SamplingParams.of(config.sampling)
        self.generator = torch.Generator().manual_seed(config.seed)  # row seeds only: the same on any device
        self.engine = generation.open_engine(config.sampling, model, dtype=dtype, seed=config.seed)
        if not isinstance(self.engine, generation.LocalEngine):
            self.engine.sync(self.model)  # a server may hold other weights; vLLM's dtype may round them otherwise
        self.seconds = 0.0

    def __call__(self, batch: PromptBatch, repeat: int = 1) -> generation.Generated:
        """``repeat`` completions per prompt of ``batch``, in consecutive rows."""
        start = time.perf_counter()
        generated = generation.generate(
            self.model,
            self.tokenizer,
            batch,
            self.params,
            self.stops,
            self.generator,
            self.device,
            repeat,
            engine=self.engine,
        )
        self.seconds += time.perf_counter() - start
        return generated

    def close(self) -> None:
        """Release the engine (a colocated vLLM's memory) once the model has answered everything."""
        if not isinstance(self.engine, generation.LocalEngine):
            self.engine.close()


def prompt_batches(prompts: Sequence[TokenizedPrompt], batch_size: int) -> list[PromptBatch]:
    return [
        PromptBatch.of(prompts, range(start, min(len(prompts), start + batch_size)))
        for start in range(0, len(prompts), batch_size)
    ]


def inference_dtype(config: SampleConfig | EvalConfig, device: torch.device) -> str:
    """The dtype of a model that only answers (``rlhf sample``, ``rlhf eval``): bfloat16 under mixed precision
    (``model.bf16``; nothing trains, so nothing needs float32 master weights), else ``model.dtype``."""
    return frozen_dtype(config.model.dtype, bf16_enabled(config.model.bf16, device))


def score_groups(
    rewards: RewardSet,
    batch: PromptBatch,
    completions: list[str],
    aggregation: str,
    repeat: int = 1,
    generated: generation.Generated | None = None,
    token_ids: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> scoring.Scores:
    """``rewards``' scores of ``completions``, ``repeat`` consecutive ones per prompt of ``batch`` scored as one
    group (GDPO normalises within it), each with its prompt's columns; reward functions get the completion
    ids of ``generated`` (if any) and a fresh ``trainer_state`` (step 0 of 0)."""
    return scoring.score(
        rewards,
        generation.repeat_each(batch.texts, repeat),
        completions,
        {name: generation.repeat_each(values, repeat) for name, values in batch.columns.items()},
        aggregation,
        group_size=repeat,
        token_ids=token_ids,
        context=scoring.reward_context(batch, generated, repeat, scoring.make_trainer_state()),
    )


def response_stats(generated: generation.Generated) -> tuple[torch.Tensor, torch.Tensor]:
    """(B,) tokens of each response, the stop token included, and (B,) whether it ended with the stop token;
    on the CPU."""
    return (generated.responses != generated.pad_token_id).sum(-1).cpu(), generated.has_stop.cpu()


def response_metrics(stats: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> dict[str, float]:
    """``response/length_mean`` (tokens) and ``response/eos_rate`` (share that ended with the stop token) over
    the per-batch `response_stats`."""
    if not stats:
        return {"response/length_mean": math.nan, "response/eos_rate": math.nan}
    lengths, stopped = zip(*stats, strict=True)
    return {
        "response/length_mean": torch.cat(lengths).float().mean().item(),
        "response/eos_rate": torch.cat(stopped).float().mean().item(),
    }


def json_safe(data: Any) -> Any:
    """``data`` with every non-finite float replaced by None (JSON has no NaN)."""
    if isinstance(data, dict):
        return {key: json_safe(value) for key, value in data.items()}
    if isinstance(data, list | tuple):
        return [json_safe(value) for value in data]
    if isinstance(data, float) and not math.isfinite(data):
        return None
    return data
