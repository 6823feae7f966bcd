"""A sampled batch of responses: generating it from a policy (``rollout.engine``) and assembling ``query ⊕ response``
with the masks and decoded texts every later phase reads.

Notation: B sequences, C prompt columns, T response columns."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, Protocol

import torch
from torch import nn

from rlhf.data import left_pad
from rlhf.data.stream import PromptBatch
from rlhf.models.precision import rollout_region
from rlhf.models.sharding import sampling as sampling_weights
from rlhf.rollout.decoder import reusing_packed
from rlhf.rollout.engine import RowGenerators, Samples, SamplingParams, TokenRows, row_seed, row_seeds, sample
from rlhf.rollout.episodes import Episode, EpisodeRunner
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
    sampler_logprobs: torch.Tensor | None = None
    """(B, T) float32: each response token's log-prob under the distribution the engine drew it from (0 at padding);
    None when unknown (responses not sampled as they stand)."""
    env_mask: torch.Tensor | None = None
    """(B, T) bool, multi-turn: True on the tokens the model did not sample (environment and tool turns, the template's
    markup between turns), which carry no loss, advantage or KL; None: every response token is the model's."""
    episodes: list[Episode] | None = None
    """Multi-turn: each row's episode (transcript, environment rewards, counts); None for single responses."""

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

    @property
    def model_tokens(self) -> torch.Tensor:
        """(B, T) bool: the tokens the model sampled (not padding, not an environment's)."""
        sampled = self.responses != self.pad_token_id
        return sampled if self.env_mask is None else sampled & ~self.env_mask

    def select(self, rows: torch.Tensor) -> Generated:
        """The batch of rows ``rows`` (1-D indices), in that order."""
        taken = {key: t[rows.to(t.device)] for key, t in vars(self).items() if isinstance(t, torch.Tensor)}
        index = rows.tolist()
        episodes = None if self.episodes is None else [self.episodes[i] for i in index]
        return dataclasses.replace(self, completions=[self.completions[i] for i in index], episodes=episodes, **taken)


@dataclasses.dataclass(frozen=True)
class LocalEngine:
    """One of rlhf's own engines sampling the policy module itself: ``name`` one of `rlhf.rollout.engine.LOCAL_ENGINES`;
    ``cuda_graphs``: on a CUDA device, the lean decoder's steps replay a captured graph (``sampling.cuda_graphs``)."""

    name: str = "auto"
    cuda_graphs: bool = False


AUTO = LocalEngine()
"""The default engine: the lean decoder where it covers the model, else the model's own forward; eager."""


class Engine(Protocol):
    """A sampler outside the policy module (vLLM: `rlhf.rollout.vllm_engine`, `rlhf.rollout.vllm_server`): it holds
    its own copy of the weights, refreshed by :meth:`sync`."""

    version: int
    shared: bool
    """True: one engine that every rank samples from (a server), whose weights rank 0 alone pushes."""

    def sync(self, policy: nn.Module) -> None: ...

    def close(self) -> None: ...

    def sample(
        self, prompts: TokenRows, params: SamplingParams, stops: Sequence[int], pad_token_id: int, seeds: Sequence[int]
    ) -> Samples: ...


def open_engine(
    sampling: Any, model: str, *, dtype: str, seed: int, response_tokens: int | None = None
) -> LocalEngine | Engine:
    """The engine a config's ``sampling`` section names: one of ours, or a vLLM engine over ``model`` (a hub
    id or directory: its architecture and tokenizer; the weights follow the policy through ``sync``), for prompts
    followed by at most ``response_tokens`` (None: ``sampling.max_new_tokens``; a multi-turn episode's budget)."""
    if sampling.engine != "vllm":
        return LocalEngine(sampling.engine, sampling.cuda_graphs)
    vllm = sampling.vllm
    if vllm.url is not None:
        from rlhf.rollout.vllm_server import VLLMServer

        return VLLMServer(vllm.url, timeout=vllm.timeout)
    from rlhf.rollout.vllm_engine import VLLMEngine

    return VLLMEngine(
        model,
        dtype=dtype,
        memory_fraction=vllm.memory_fraction,
        max_model_len=sampling.max_prompt_length + (response_tokens or sampling.max_new_tokens),
        seed=seed,
        sleep=vllm.sleep,
    )


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
    engine: LocalEngine | Engine = AUTO,
    episodes: EpisodeRunner | None = None,
) -> Generated:
    """Sample ``repeat`` responses per prompt (consecutive rows), decode them, and build ``query ⊕ response``. Under
    ``torchrun`` each rank samples its shard of the rows (whole prompts) and the token ids are gathered, so every rank
    returns the whole batch; each row draws from its own stream (seeded by `row_seeds`), so the responses do not depend
    on the number of ranks. ``engine``: one of our own (`LocalEngine`) sampling ``model`` at most ``max_rows`` rows at a
    time (memory), or an `Engine`. ``episodes``: multi-turn episodes instead (`rlhf.rollout.episodes`), ``repeat`` per
    prompt (a group opens alike), each rank running its shard's episodes, environments and tools, every model turn one
    call of the same sampler (row ``i``'s turn ``k`` seeded by ``row_seed(seed_i, k)``: the same episodes on any number
    of ranks)."""
    pad = tokenizer.pad_token_id

    def sampler(prompt_ids: list[list[int]], seeds: list[int]) -> list[tuple[list[int], list[float]]]:
        """A response to each prompt and its log-probs, row i drawn with ``seeds[i]``."""
        if not isinstance(engine, LocalEngine):
            return list(zip(*engine.sample(prompt_ids, params, stops, pad, seeds), strict=True))
        noise = RowGenerators.of(seeds)
        out = []
        step = max_rows or max(1, len(prompt_ids))
        # sharded weights are gathered once for the whole rollout, packed once for all its chunks, and under mixed
        # precision cast to bfloat16 once (rollout_region), not at every token
        with sampling_weights(model, d), reusing_packed(model), rollout_region(model):
            for start in range(0, len(prompt_ids), step):
                chunk = slice(start, start + step)
                query, query_mask = left_pad(prompt_ids[chunk], pad)
                ids, logprobs = sample(
                    model,
                    query.to(device),
                    query_mask.to(device),
                    params,
                    stops,
                    pad,
                    noise[chunk],
                    engine=engine.name,
                    cuda_graphs=engine.cuda_graphs and device.type == "cuda",  # elsewhere the eager loop is faster
                )
                lengths = (ids != pad).sum(-1).tolist()
                for row, row_logprobs, n in zip(ids.tolist(), logprobs.tolist(), lengths, strict=True):
                    out.append((row[:n], row_logprobs[:n]))
        return out

    all_rows = repeat_each(batch.input_ids if episodes is None else episode_rows(batch), repeat)
    rows = d.shard(len(all_rows), unit=repeat)
    seeds = row_seeds(generator, rows)
    if episodes is None:
        sampled = sampler([all_rows[row] for row in rows], seeds)
        responses, logprobs = zip(*d.gather_rows(sampled, len(all_rows), unit=repeat), strict=True)
        return assemble(all_rows, list(responses), tokenizer, stops, device, logprobs=list(logprobs))

    def sample_turn(active: list[int], prompts: list[list[int]], turn: int) -> list[tuple[list[int], list[float]]]:
        return sampler(prompts, [seeds[i] if turn == 0 else row_seed(seeds[i], turn) for i in active])

    played = episodes.run([all_rows[row] for row in rows], sample_turn, group_size=repeat)
    return assemble_episodes(d.gather_rows(played, len(all_rows), unit=repeat), tokenizer, device)


def episode_rows(batch: PromptBatch) -> list[dict[str, Any]]:
    """What an environment's ``reset`` gets for each prompt: its columns and ``prompt`` (the chat messages, or the
    prompt text)."""
    return [
        {**{key: values[i] for key, values in batch.columns.items()}, "prompt": text if messages is None else messages}
        for i, (text, messages) in enumerate(zip(batch.texts, batch.messages, strict=True))
    ]


def assemble(
    prompt_ids: list[list[int]],
    responses: list[list[int]],
    tokenizer: Any,
    stops: list[int],
    device: torch.device,
    logprobs: list[list[float]],
    has_stop: torch.Tensor | None = None,
    completions: list[str] | None = None,
) -> Generated:
    """A `Generated` batch from unpadded prompt and response ids and the sampler's log-probs of them:
    prompts left-padded, responses right-padded to the longest one (at least one column). ``has_stop``: (B,) bool,
    whether each response ended as it should (None: it holds one of ``stops``); ``completions``: the responses' texts
    (None: decoded without special tokens)."""
    pad = tokenizer.pad_token_id
    query, query_mask = left_pad(prompt_ids, pad)
    T = max(1, max(map(len, responses), default=1))
    response = torch.full((len(responses), T), pad, dtype=torch.long)
    sampler = torch.zeros(len(responses), T)
    for i, ids in enumerate(responses):
        response[i, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        sampler[i, : len(ids)] = torch.tensor(logprobs[i], dtype=torch.float32)
    query, query_mask, response = query.to(device), query_mask.to(device), response.to(device)
    response_mask = (response != pad).long()
    if has_stop is None:
        has_stop = torch.isin(response, torch.tensor(stops, device=device)).any(-1)
    if completions is None:
        completions = tokenizer.batch_decode(response.tolist(), skip_special_tokens=True)
    return Generated(
        query_responses=torch.cat([query, response], dim=1),
        attention_mask=torch.cat([query_mask, response_mask], dim=1),
        responses=response,
        completions=completions,
        has_stop=has_stop,
        pad_token_id=pad,
        sampler_logprobs=sampler.to(device),
    )


def assemble_episodes(episodes: list[Episode], tokenizer: Any, device: torch.device) -> Generated:
    """A `Generated` batch of episodes: the opening as the query, everything after it as the response, with the
    env mask; ``completions``: the response's text as the model saw it (special tokens kept), for samples and logs."""
    generated = assemble(
        [e.prompt_ids for e in episodes],
        [e.ids for e in episodes],
        tokenizer,
        [],
        device,
        logprobs=[e.logprobs for e in episodes],
        has_stop=torch.tensor([e.stopped for e in episodes], device=device),
        completions=[tokenizer.decode(e.ids) for e in episodes],
    )
    env_mask = torch.zeros_like(generated.responses, dtype=torch.bool)
    for i, episode in enumerate(episodes):
        env_mask[i, : len(episode.env_mask)] = torch.tensor(episode.env_mask, dtype=torch.bool)
    return dataclasses.replace(generated, env_mask=env_mask.to(device), episodes=episodes)


def response_metrics(generated: Generated) -> dict[str, float]:
    """The ``response/*`` metrics of a sampled batch (the model's own tokens) and, for episodes, ``episode/*``: what
    each means is the README's "Metrics" table."""
    lengths = generated.model_tokens.sum(-1).float()
    metrics = {
        "response/length_mean": lengths.mean().item(),
        "response/length_max": lengths.max().item(),
        "response/eos_rate": generated.has_stop.float().mean().item(),
        "response/tokens": lengths.sum().item(),
    }
    if episodes := generated.episodes:
        n = len(episodes)
        metrics |= {
            "episode/turns_mean": sum(e.model_turns for e in episodes) / n,
            "episode/tool_calls_mean": sum(e.tool_calls for e in episodes) / n,
            "episode/tool_errors": sum(e.tool_errors for e in episodes) / n,
            "episode/truncated": sum(e.truncated for e in episodes) / n,
            "episode/length_mean": sum(len(e.ids) for e in episodes) / n,
        }
    return metrics


def repeat_each(values: list[Any], k: int) -> list[Any]:
    """[a, b] → [a, a, b, b] for k = 2: per-prompt values aligned with k consecutive completions."""
    return [value for value in values for _ in range(k)]
