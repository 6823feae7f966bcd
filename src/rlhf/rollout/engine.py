"""The default rollout engine: batched, KV-cached sampling with any ``transformers`` causal LM.

Notation: B sequences, C prompt columns (left-padded), T generated columns (≤ max_new_tokens), V vocab.

Why our own loop instead of ``model.generate``: we need exactly the distribution the trainer scores (temperature, top-k,
top-p and nothing else — no repetition penalty or min-length processors that make the KL negative, checklist Part 3 §7),
a ``torch.Generator`` whose state we checkpoint for exact resume, and an early exit as soon as every row has stopped."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from rlhf.config import ConfigError
from rlhf.data.collate import position_ids_from_mask
from rlhf.models.policy import accepts_logits_to_keep, cache_keyword, unwrap
from rlhf.rollout.decoder import LlamaDecoder, build_decoder

TokenRows = Sequence[Sequence[int]]
"""Rows of token ids (prompts, for an engine)."""
Samples = tuple[list[list[int]], list[list[float]]]
"""An engine's answer: each row's sampled token ids and their log-probs under the distribution it drew from."""


@dataclass(frozen=True)
class SamplingParams:
    """How tokens are drawn. ``top_k=0`` and ``top_p=1.0`` mean off (pure sampling, checklist item 3)."""

    max_new_tokens: int
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0

    @classmethod
    def of(cls, sampling: Any) -> SamplingParams:
        """The draw settings of a config's ``sampling`` section (it also holds the prompt length and stop)."""
        return cls(sampling.max_new_tokens, sampling.temperature, sampling.top_k, sampling.top_p)

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
    """(B, V) -> (B, V) with tokens outside the top-k / nucleus set to −inf. Nucleus: the smallest set of most-probable
    tokens whose mass reaches ``top_p`` (the token that crosses the threshold is kept: at least one always survives)."""
    if top_k > 0 and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = sorted_logits.softmax(-1)
        drop_sorted = (probs.cumsum(-1) - probs) >= top_p  # the mass *before* the token already reaches top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


@dataclass
class RowGenerators:
    """One random stream per row (:meth:`of` :func:`row_seeds`), seeded by
    ``(seed, the row's index in the global batch)``. A row's draws then depend on nothing but its index, not on the
    other rows or how the batch is split (so N ranks sample exactly what one process samples: docs/scaling.md). The
    streams are CPU generators whatever the rollout's device: a row draws the same numbers on any machine, and a rollout
    draws all of them at once (:meth:`uniforms`, one call per row), none inside the decode loop."""

    generators: list[torch.Generator]

    def __getitem__(self, rows: slice) -> RowGenerators:
        """The streams of some of the rows (the same generator objects: drawing advances them here too)."""
        return RowGenerators(self.generators[rows])

    def uniforms(self, steps: int) -> torch.Tensor:
        """(B, steps) float64 uniform [0, 1) numbers on the CPU, row b from the b-th stream."""
        out = torch.empty(len(self.generators), steps, dtype=torch.float64)
        for row, generator in zip(out, self.generators, strict=True):
            row.uniform_(generator=generator)
        return out

    @classmethod
    def of(cls, seeds: Sequence[int]) -> RowGenerators:
        """One stream per seed of :func:`row_seeds`."""
        return cls([torch.Generator().manual_seed(seed) for seed in seeds])


def row_seeds(generator: torch.Generator, rows: Sequence[int]) -> list[int]:
    """The seeds of ``rows``' streams for one rollout, from one draw of ``generator`` (every rank draws it alike): our
    engines' `RowGenerators`, vLLM's per-request seeds."""
    seed = int(torch.randint(0, 2**62, (1,), generator=generator, device=generator.device))
    return [row_seed(seed, row) for row in rows]


def row_seed(seed: int, row: int) -> int:
    """A well-mixed 63-bit seed for ``row``: torch's CPU generator keeps only the low 32 bits of a seed, so
    nearby rows must differ there (a hash, not ``seed + row``)."""
    digest = hashlib.blake2b(f"{seed}:{row}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def rollout_uniforms(
    generator: torch.Generator | RowGenerators | None, rows: int, steps: int, device: torch.device
) -> torch.Tensor:
    """(rows, steps) float64 uniform [0, 1) numbers on ``device``: column t draws every row's token t (:func:`draw`).
    From :class:`RowGenerators` row b's are its stream's; from one ``torch.Generator`` (or torch's default one) the
    batch's are one draw on the generator's device."""
    if isinstance(generator, RowGenerators):
        if rows != len(generator.generators):
            raise ValueError(f"{rows} rows to draw for, {len(generator.generators)} row generators")
        return generator.uniforms(steps).to(device)
    where = generator.device if generator is not None else device
    return torch.rand(rows, steps, generator=generator, dtype=torch.float64, device=where).to(device)


def draw(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """(B, V) probabilities, (B,) uniform [0, 1) numbers -> (B,) token ids, one draw per row from exactly that
    distribution. Inverse transform: row b's token is the first whose cumulative probability exceeds u_b times the row's
    total. One number per row and token (the exponential race that ``torch.multinomial`` runs needs V of them), so a
    rollout draws all its numbers before the loop (:func:`rollout_uniforms`) and a decode step reads a column of them:
    nothing in the step depends on a generator's state, which is what lets it be captured as a CUDA graph. The sum runs
    in float64: its rounding (≤ V·2⁻⁵³ relative, 2e-11 at V = 150k) is all that separates the drawn distribution from
    ``probs``. A token of probability 0 adds nothing to the sum and cannot be the first to exceed it; the clamp only
    guards u·total rounding up to the total itself (probability below 2⁻⁵³ a draw)."""
    cumulative = probs.double().cumsum(-1)
    threshold = uniforms[:, None] * cumulative[:, -1:]
    return torch.searchsorted(cumulative, threshold, right=True).squeeze(-1).clamp_(max=probs.shape[-1] - 1)


def draw_column(
    logits: torch.Tensor, uniforms: torch.Tensor, finished: torch.Tensor, params: SamplingParams, pad_token_id: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """One decode step's draw: (B, V) logits, a (B,) column of uniforms, the (B,) rows already stopped -> the (B,)
    tokens (``pad_token_id`` for stopped rows) and their (B,) float32 log-probs under the distribution drawn from
    (0 for stopped rows). Static shapes, no host read: the same function runs eagerly and inside a captured step."""
    logits = logits.float() / params.temperature
    # PAD marks "no token" everywhere downstream; a sampled PAD would silently end the response.
    # A pad token added to the tokenizer after training may lie beyond the vocabulary: nothing to mask.
    if pad_token_id < logits.shape[-1]:
        logits[:, pad_token_id] = float("-inf")
    probs = filter_logits(logits, params.top_k, params.top_p).softmax(-1)
    token = draw(probs, uniforms)
    logprob = probs.gather(-1, token[:, None]).squeeze(-1).log().masked_fill(finished, 0.0)
    return token.masked_fill(finished, pad_token_id), logprob


STOP_CHECK_EVERY = {"cuda": 16}
"""Decode steps between two checks of whether every row has stopped, by device type (1 on others). The check reads a
flag on the host: on a GPU that waits for every queued kernel, so once a token it keeps the launch queue from
running ahead of the GPU; on a CPU nothing is queued, and stopping at once saves the steps. At most k − 1 steps run
after the last row stops; their columns are all padding and are cut off, so the samples do not depend on k. 16 turns
128 syncs of a 128-token rollout into 8 (not yet measured against other values on a GPU)."""

LOCAL_ENGINES = ("auto", "lean", "hf")
"""rlhf's own engines (``sampling.engine``): ``lean`` the decoder of `rlhf.rollout.decoder`, ``hf`` the model's own
forward with its KV cache, ``auto`` the lean one where it covers the model, else ``hf``."""


@torch.inference_mode()
def sample(
    model: nn.Module,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    params: SamplingParams,
    stop_token_ids: list[int],
    pad_token_id: int,
    generator: torch.Generator | RowGenerators | None = None,
    engine: str = "auto",
    stop_every: int | None = None,
    cuda_graphs: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Responses (B, T) long, T ≤ max_new_tokens, sampled for a left-padded prompt batch (ids and mask: B, C), and each
    token's log-prob (B, T) float32 under the distribution it was drawn from (after temperature, top-k and top-p, as
    vLLM's ``processed_logprobs``; 0 after the stop). Each row keeps its first stop token and is ``pad_token_id`` after
    it (checklist item 4); a row that never stops runs to max_new_tokens; the loop ends once every row has stopped.
    ``engine``: one of `LOCAL_ENGINES`. ``generator``: one stream for the batch, or :class:`RowGenerators` (one per row:
    the trainers' choice). ``stop_every``: decode steps between the host's checks for every row having stopped (default:
    :data:`STOP_CHECK_EVERY` of the device); the samples are the same for any value. ``cuda_graphs``: with the lean
    decoder, the static loop of :class:`StaticDecode`, whose step is captured as a CUDA graph and replayed on a CUDA
    device (elsewhere it runs as is: what the CPU's tests check against the eager loop)."""
    B, C = prompt_ids.shape
    device = prompt_ids.device
    every = stop_every or STOP_CHECK_EVERY.get(device.type, 1)
    uniforms = rollout_uniforms(generator, B, params.max_new_tokens, device)
    stops = torch.tensor(stop_token_ids, dtype=torch.long, device=device)
    decoder = lean_decoder(model, C + params.max_new_tokens, B, engine)
    if cuda_graphs and decoder is not None:
        rollout = StaticDecode(decoder, decoder.prefill(prompt_ids, prompt_mask), uniforms, stops, params, pad_token_id)
        responses, logprobs = rollout.run(every, capture=device.type == "cuda")
    else:  # the eager loop, one forward per token
        step = _decode_steps(model, prompt_ids, prompt_mask, decoder)
        logits = step(None)
        finished = torch.zeros(B, dtype=torch.bool, device=device)
        drawn: list[tuple[torch.Tensor, torch.Tensor]] = []  # each column's (B,) tokens and log-probs
        for t in range(1, params.max_new_tokens + 1):
            token, logprob = draw_column(logits, uniforms[:, t - 1], finished, params, pad_token_id)
            drawn.append((token, logprob))
            finished |= torch.isin(token, stops)
            if t == params.max_new_tokens or (t % every == 0 and bool(finished.all())):
                break
            # a finished row keeps feeding token 0 (its output is never read), so every row advances together
            logits = step(token.masked_fill(finished, 0))
        responses, logprobs = (torch.stack(column, dim=-1) for column in zip(*drawn, strict=True))
    if every > 1:  # the columns after every row stopped (all padding): cut, one sync for the rollout
        kept = int((responses != pad_token_id).any(0).nonzero().max()) + 1
        responses, logprobs = responses[:, :kept], logprobs[:, :kept]
    return responses, logprobs


CAPTURE_WARMUP = 3
"""Decode steps run on a side stream before a step is captured (CUDA's advice: cuBLAS and the allocator set up
their workspaces on the first calls, which a graph must not record); their writes are undone."""


class StaticDecode:
    """The lean decoder's decode loop over buffers allocated once, so that one step is the same kernels on the same
    memory every token and can be captured as a CUDA graph and replayed (:meth:`run`). A step (:meth:`step`) draws
    column t from the logits (`draw_column`, with column t of the rollout's uniforms), writes the tokens and log-probs
    into (B, T) buffers, updates the finished flags, and runs the decoder's `LlamaDecoder.static_step` for the next
    logits; the column and the cache slot are device counters. Nothing is read on the host inside a step, so the host
    only waits at the checks for every row having stopped. Eagerly on any device it computes what the eager loop
    computes (up to the attention's summation order: tested equal on CPU)."""

    def __init__(
        self,
        decoder: LlamaDecoder,
        logits: torch.Tensor,
        uniforms: torch.Tensor,
        stops: torch.Tensor,
        params: SamplingParams,
        pad_token_id: int,
    ):
        B, T = uniforms.shape
        device = uniforms.device
        self.decoder, self.uniforms, self.stops, self.params, self.pad = decoder, uniforms, stops, params, pad_token_id
        self.logits = logits.contiguous()
        self.finished = torch.zeros(B, dtype=torch.bool, device=device)
        self.responses = torch.full((B, T), pad_token_id, dtype=torch.long, device=device)
        self.logprobs = torch.zeros(B, T, dtype=torch.float32, device=device)
        self.column = torch.zeros(1, dtype=torch.long, device=device)
        self.slot = torch.full((1,), decoder.length, dtype=torch.long, device=device)

    def draw(self) -> torch.Tensor:
        """Column t's tokens (written to the buffers, the finished flags updated); the tokens fed back (0 once done)."""
        token, logprob = draw_column(
            self.logits, self.uniforms.index_select(1, self.column).squeeze(1), self.finished, self.params, self.pad
        )
        self.responses.index_copy_(1, self.column, token[:, None])
        self.logprobs.index_copy_(1, self.column, logprob[:, None])
        self.finished |= torch.isin(token, self.stops)
        return token.masked_fill(self.finished, 0)

    def step(self) -> None:
        """Draw column t and compute the logits after it."""
        self.logits.copy_(self.decoder.static_step(self.draw(), self.slot))
        self.slot += 1
        self.column += 1

    def run(self, every: int, capture: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, T) tokens and log-probs of the rollout, T ≤ max_new_tokens; with ``capture`` every step but the last
        (a draw alone) replays one CUDA graph. The host checks every ``every`` steps whether every row has stopped."""
        T = self.uniforms.shape[1]
        step = self._captured() if capture and T > 1 else self.step
        for t in range(1, T + 1):
            if t == T:
                self.draw()
                break
            step()
            if t % every == 0 and bool(self.finished.all()):
                break
        return self.responses[:, :t], self.logprobs[:, :t]

    def _captured(self) -> Callable[[], None]:
        """:meth:`step` as a CUDA graph's replay. The warm-up steps' writes to the buffers and the cache's mask are
        undone; the keys and values they wrote sit in slots that the real steps overwrite before their mask opens."""
        saved = [b.clone() for b in self._state()]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(min(CAPTURE_WARMUP, self.uniforms.shape[1] - 1)):
                self.step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):  # records the kernels on these buffers' addresses, whatever they hold now
            self.step()
        for buffer, value in zip(self._state(), saved, strict=True):
            buffer.copy_(value)
        return graph.replay

    def _state(self) -> list[torch.Tensor]:
        return [self.logits, self.finished, self.responses, self.logprobs, self.column, self.slot, self.decoder.mask]


def lean_decoder(model: nn.Module, total_length: int, rows: int, engine: str) -> LlamaDecoder | None:
    """The lean decoder of ``model`` for ``engine`` (`LOCAL_ENGINES`): None for hf, or auto on a model it does not
    cover; lean on such a model is refused."""
    if engine not in LOCAL_ENGINES:
        raise ValueError(f"engine must be one of {', '.join(LOCAL_ENGINES)}, got {engine!r}")
    decoder = build_decoder(model, total_length, rows=rows) if engine != "hf" else None
    if decoder is None and engine == "lean":
        name = type(unwrap(model)).__name__
        raise ConfigError(f"sampling.engine lean: the lean decoder does not cover {name}; use auto or hf")
    return decoder


def _decode_steps(
    model: nn.Module, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, decoder: LlamaDecoder | None
) -> Callable[[torch.Tensor | None], torch.Tensor]:
    """``step(None)`` scores the prompt, ``step(tokens)`` appends a (B,) column; each returns (B, V) logits: through
    ``decoder``, or (None) the model's own forward with its KV cache."""
    if decoder is not None:
        return lambda tokens: decoder.prefill(prompt_ids, prompt_mask) if tokens is None else decoder.step(tokens)
    mask = prompt_mask.long()
    cache = cache_keyword(model)
    inputs = {"attention_mask": mask, "position_ids": position_ids_from_mask(mask), "use_cache": True, cache: None}
    if accepts_logits_to_keep(model):
        inputs["logits_to_keep"] = 1

    def step(tokens: torch.Tensor | None) -> torch.Tensor:
        if tokens is None:
            ids = prompt_ids.masked_fill(mask == 0, 0)
        else:  # the new token sits one past the row's last real position
            ids = tokens.unsqueeze(-1)
            inputs["position_ids"] = inputs["position_ids"][:, -1:] + 1
            inputs["attention_mask"] = torch.cat([inputs["attention_mask"], torch.ones_like(ids)], dim=-1)
        out = model(input_ids=ids, **inputs)
        inputs[cache] = getattr(out, cache)
        return out.logits[:, -1]

    return step
