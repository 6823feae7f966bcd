"""A sampled batch of responses: generating it from a policy (``rollout.engine``) and assembling
``query ⊕ response`` with the masks and decoded texts every later phase reads.

Notation: B sequences, C prompt columns, T response columns.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import nn

from rlhf.data import left_pad
from rlhf.data.stream import PromptBatch
from rlhf.models.sharding import sampling as sampling_weights
from rlhf.rollout.decoder import reusing_packed
from rlhf.rollout.engine import RowGenerators, SamplingParams, sample
from rlhf.runlog.distributed import SINGLE, Dist


@dataclasses.dataclass(frozen=True)
class Generated:
    """A sampled batch. ``query_responses``/``attention_mask``: (B, C+T); ``responses``: (B, T), PAD after stop."""

    query_responses: torch.Tensor
    attention_mask: torch.Tensor
    responses: torch.Tensor
    completions: list[str]
    has_stop: torch.Tensor  # (B,) bool: the response ended with a stop token (not cut at max_new_tokens)
    pad_token_id: int

    @property
    def token_ids(self) -> tuple[torch.Tensor, torch.Tensor]:
        """What a reward model sharing the policy's tokenizer scores: (query ⊕ response, mask)."""
        return self.query_responses, self.attention_mask

    @property
    def completion_ids(self) -> list[list[int]]:
        """Each response's token ids without padding, the stop token included (TRL's ``completion_ids``: up to
        and including the first EOS)."""
        lengths = (self.responses != self.pad_token_id).sum(-1).tolist()
        return [row[:n] for row, n in zip(self.responses.tolist(), lengths, strict=True)]

    def select(self, rows: torch.Tensor) -> Generated:
        """The batch of rows ``rows`` (1-D indices), in that order."""
        taken = {key: t[rows.to(t.device)] for key, t in vars(self).items() if isinstance(t, torch.Tensor)}
        return dataclasses.replace(self, completions=[self.completions[i] for i in rows.tolist()], **taken)


def generate(
    model: nn.Module,
    tokenizer: Any,
    batch: PromptBatch,
    params: SamplingParams,
    stops: list[int],
    generator: torch.Generator,
    device: torch.device,
    repeat: int = 1,
    d: Dist = SINGLE,
    max_rows: int | None = None,
) -> Generated:
    """Sample ``repeat`` responses per prompt (consecutive rows), decode them, and build ``query ⊕ response``.

    Under ``torchrun`` each rank samples its shard of the rows (whole prompts) and the token ids are gathered, so
    every rank returns the whole batch; each row draws from its own stream (``RowGenerators``), so the responses
    do not depend on the number of ranks. ``max_rows``: sample at most that many rows at a time (memory).
    """
    pad = tokenizer.pad_token_id
    all_prompts = repeat_each(batch.input_ids, repeat)
    rows = d.shard(len(all_prompts), unit=repeat)
    noise = RowGenerators.spawn(generator, rows)
    prompt_ids = [all_prompts[row] for row in rows]
    responses: list[list[int]] = []
    step = max_rows or max(1, len(rows))
    # sharded weights are gathered once for the whole rollout, and packed once for all its chunks
    with sampling_weights(model, d), reusing_packed(model):
        for start in range(0, len(rows), step):
            chunk = slice(start, start + step)
            query, query_mask = left_pad(prompt_ids[chunk], pad)
            sampled = sample(model, query.to(device), query_mask.to(device), params, stops, pad, noise[chunk])
            lengths = (sampled != pad).sum(-1).tolist()
            responses += [ids[:length] for ids, length in zip(sampled.tolist(), lengths, strict=True)]
    responses = d.gather_rows(responses, len(all_prompts), unit=repeat)
    return assemble(all_prompts, responses, tokenizer, stops, device)


def assemble(
    prompt_ids: list[list[int]], responses: list[list[int]], tokenizer: Any, stops: list[int], device: torch.device
) -> Generated:
    """A `Generated` batch from unpadded prompt and response ids: prompts left-padded, responses right-padded
    to the longest one (at least one column)."""
    pad = tokenizer.pad_token_id
    query, query_mask = left_pad(prompt_ids, pad)
    T = max(1, max(map(len, responses), default=1))
    response = torch.full((len(responses), T), pad, dtype=torch.long)
    for i, ids in enumerate(responses):
        response[i, : len(ids)] = torch.tensor(ids, dtype=torch.long)
    query, query_mask, response = query.to(device), query_mask.to(device), response.to(device)
    response_mask = (response != pad).long()
    has_stop = torch.isin(response, torch.tensor(stops, device=device)).any(-1)
    return Generated(
        query_responses=torch.cat([query, response], dim=1),
        attention_mask=torch.cat([query_mask, response_mask], dim=1),
        responses=response,
        completions=tokenizer.batch_decode(response.tolist(), skip_special_tokens=True),
        has_stop=has_stop,
        pad_token_id=pad,
    )


def response_metrics(generated: Generated) -> dict[str, float]:
    """``response/length_mean``, ``length_max``, ``eos_rate`` and ``tokens`` of a sampled batch."""
    lengths = (generated.responses != generated.pad_token_id).sum(-1).float()
    return {
        "response/length_mean": lengths.mean().item(),
        "response/length_max": lengths.max().item(),
        "response/eos_rate": generated.has_stop.float().mean().item(),
        "response/tokens": lengths.sum().item(),
    }


def repeat_each(values: list[Any], k: int) -> list[Any]:
    """[a, b] → [a, a, b, b] for k = 2: per-prompt values aligned with k consecutive completions."""
    return [value for value in values for _ in range(k)]
