"""The default rollout engine: batched, KV-cached sampling with any ``transformers`` causal LM.

Notation: B sequences, C prompt columns (left-padded), T generated columns (≤ max_new_tokens), V vocab.

Why our own loop instead of ``model.generate``: we need exactly the distribution the trainer scores
(temperature, top-k, top-p and nothing else — no repetition penalty or min-length processors that make
the KL negative, checklist Part 3 §7), a ``torch.Generator`` whose state we checkpoint for exact
resume, and an early exit as soon as every row has stopped.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from rlhf.data.collate import position_ids_from_mask
from rlhf.models.policy import accepts_logits_to_keep


@dataclass(frozen=True)
class SamplingParams:
    """How tokens are drawn. ``top_k=0`` and ``top_p=1.0`` mean off (pure sampling, checklist item 3)."""

    max_new_tokens: int
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = off), got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")


def filter_logits(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """(B, V) -> (B, V) with tokens outside the top-k / nucleus set to −inf.

    Nucleus: keep the smallest set of most-probable tokens whose mass reaches ``top_p`` (the token that
    crosses the threshold is kept, so at least one token always survives).
    """
    if top_k > 0 and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        cumulative = sorted_logits.softmax(-1).cumsum(-1)
        # drop a token when the mass *before* it already reaches top_p
        drop_sorted = (cumulative - sorted_logits.softmax(-1)) >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


@torch.inference_mode()
def sample(
    model: nn.Module,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    params: SamplingParams,
    stop_token_ids: list[int],
    pad_token_id: int,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Sample responses for a left-padded batch of prompts.

    prompt_ids, prompt_mask: (B, C), left-padded. Returns responses (B, T) long with T ≤ max_new_tokens:
    each row keeps its first stop token and is ``pad_token_id`` after it (checklist item 4); a row that
    never stops runs to max_new_tokens. The loop ends early once every row has stopped.
    """
    B = prompt_ids.shape[0]
    device = prompt_ids.device
    stops = torch.tensor(stop_token_ids, device=device)
    attention_mask = prompt_mask.long()
    positions = position_ids_from_mask(attention_mask)
    inputs = prompt_ids.masked_fill(attention_mask == 0, 0)
    extra = {"logits_to_keep": 1} if accepts_logits_to_keep(model) else {}
    past = None
    finished = torch.zeros(B, dtype=torch.bool, device=device)
    columns: list[torch.Tensor] = []
    for _ in range(params.max_new_tokens):
        out = model(
            input_ids=inputs,
            attention_mask=attention_mask,
            position_ids=positions,
            past_key_values=past,
            use_cache=True,
            **extra,
        )
        past = out.past_key_values
        logits = out.logits[:, -1].float() / params.temperature
        # PAD marks "no token" everywhere downstream; a sampled PAD would silently end the response.
        # A pad token added to the tokenizer after training may lie beyond the vocabulary: nothing to mask.
        if pad_token_id < logits.shape[-1]:
            logits[:, pad_token_id] = float("-inf")
        probs = filter_logits(logits, params.top_k, params.top_p).softmax(-1)
        token = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
        token = token.masked_fill(finished, pad_token_id)
        columns.append(token)
        finished |= torch.isin(token, stops)
        if bool(finished.all()):
            break
        # next step feeds only the new token; its position is one past the row's last real position
        inputs = token.masked_fill(finished, 0).unsqueeze(-1)
        positions = positions[:, -1:] + 1
        attention_mask = torch.cat([attention_mask, torch.ones_like(token).unsqueeze(-1)], dim=-1)
    return torch.stack(columns, dim=-1)
