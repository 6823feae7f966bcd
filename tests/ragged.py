"""Ragged responses for trainer tests: most end with a stop token, some run to ``max_new_tokens``.

A random-init model almost never samples EOS (≈1/400 per token), so without this every response would fill
``max_new_tokens`` and padding, the score position and per-token normalisation would go untested. Used by the
``ragged`` fixture (tests/conftest.py) and by the multi-process runs of tests/distributed/worker.py.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch


def ragged(generate: Callable[..., Any]) -> Callable[..., Any]:
    """``rlhf.rollout.generation.generate`` with row i that has not stopped cut after 1 + (2i mod T) tokens with a
    stop token, except every 4th row. Depends only on the row index: the same on every rank."""

    def generate_ragged(model, tokenizer, batch, params, stops, generator, device, repeat=1, **kwargs):
        g = generate(model, tokenizer, batch, params, stops, generator, device, repeat, **kwargs)
        if kwargs.get("episodes") is not None:  # multi-turn episodes end as their turns do: left as they are
            return g
        responses = g.responses.clone()
        B, T = responses.shape
        for i in range(B):
            if not g.has_stop[i] and i % 4 != 3:
                n = 1 + (2 * i) % T
                responses[i, n - 1] = stops[0]
                responses[i, n:] = g.pad_token_id
        C = g.query_responses.shape[1] - T
        return dataclasses.replace(
            g,
            query_responses=torch.cat([g.query_responses[:, :C], responses], dim=1),
            attention_mask=torch.cat([g.attention_mask[:, :C], (responses != g.pad_token_id).long()], dim=1),
            responses=responses,
            completions=tokenizer.batch_decode(responses.tolist(), skip_special_tokens=True),
            has_stop=torch.isin(responses, torch.tensor(stops, device=responses.device)).any(-1),
            sampler_logprobs=None,  # the forced stop tokens were not sampled
        )

    return generate_ragged
