"""Plumbing the RL trainers share: stop tokens, generating a batch, scoring it, held-out samples, the run dir.

Math never lives here (it is in ``rlhf.core``); this is I/O and bookkeeping around the models.
Notation: B sequences, C prompt columns, T response columns, K reward sources.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from rlhf.config import ConfigError, config_to_dict, config_to_yaml
from rlhf.core.group import gdpo_advantages, sum_rewards
from rlhf.data import held_out, left_pad, load_prompts
from rlhf.data.stream import PromptBatch, PromptStream
from rlhf.optim import build_optimizer
from rlhf.rollout.engine import SamplingParams, sample
from rlhf.runlog.metrics import MetricsLogger
from rlhf.runlog.seeding import rng_state, set_rng_state

MAX_HELD_OUT = 32
"""Held-out prompts answered at every eval step: the first ones of ``eval_data``, or a slice of ``train_data``."""


def device_for_run() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def stop_token_ids(tokenizer: Any, stop_token: str) -> list[int]:
    """Token ids that end a response: EOS always, plus ``stop_token`` when it names another single token.

    Raises `ConfigError` for a text the tokenizer does not encode as exactly one token: a response is cut at
    one sampled token, so a multi-token text could never be matched.
    """
    eos = tokenizer.eos_token_id
    if eos is None:
        raise ConfigError("the policy's tokenizer has no eos token; responses need a stop token")
    if stop_token == "eos":
        return [int(eos)]
    ids = tokenizer.encode(stop_token, add_special_tokens=False)
    if len(ids) != 1:
        pieces = tokenizer.convert_ids_to_tokens(ids)
        raise ConfigError(
            f"stop_token={stop_token!r} is {len(ids)} tokens for the policy's tokenizer "
            f"({', '.join(f'{i}={p!r}' for i, p in zip(ids, pieces, strict=True)) or 'none'}); it must be exactly "
            f"one token: 'eos' (the tokenizer's {tokenizer.eos_token!r}) or a text that is one token, such as "
            f"{_one_token_example(tokenizer)}"
        )
    return sorted({int(eos), int(ids[0])})


def _one_token_example(tokenizer: Any) -> str:
    """A few stop texts that are single tokens for this tokenizer, for the error message."""
    found = [repr(t) for t in ("\n", ".", "\n\n", "</s>", "<|im_end|>")
             if len(tokenizer.encode(t, add_special_tokens=False)) == 1]  # fmt: skip
    return " or ".join(found[:3]) or "a special token of the tokenizer"


def reward_spec(reward: Any) -> Any:
    """The config's ``reward`` (a string or a tuple of RewardSpec dataclasses) as load_reward_set takes it."""
    if isinstance(reward, str):
        return reward
    return [dataclasses.asdict(spec) for spec in reward]


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


def generate(
    model: nn.Module,
    tokenizer: Any,
    batch: PromptBatch,
    params: SamplingParams,
    stops: list[int],
    generator: torch.Generator,
    device: torch.device,
    repeat: int = 1,
) -> Generated:
    """Sample ``repeat`` responses per prompt (consecutive rows), decode them, and build ``query ⊕ response``."""
    pad = tokenizer.pad_token_id
    prompt_ids = [ids for ids in batch.input_ids for _ in range(repeat)]
    query, query_mask = left_pad(prompt_ids, pad)
    query, query_mask = query.to(device), query_mask.to(device)
    responses = sample(model, query, query_mask, params, stops, pad, generator)
    response_mask = (responses != pad).long()
    has_stop = torch.isin(responses, torch.tensor(stops, device=device)).any(-1)
    completions = tokenizer.batch_decode(responses.tolist(), skip_special_tokens=True)
    return Generated(
        query_responses=torch.cat([query, responses], dim=1),
        attention_mask=torch.cat([query_mask, response_mask], dim=1),
        responses=responses,
        completions=completions,
        has_stop=has_stop,
        pad_token_id=pad,
    )


@dataclasses.dataclass(frozen=True)
class Scores:
    """Rewards of a batch. ``per_source``: (B, K) with NaN = unscored; ``combined``: (B,) NaN = unscored."""

    per_source: torch.Tensor
    combined: torch.Tensor
    names: list[str]
    seconds: float


def score(
    rewards: Any,
    prompts: list[str],
    completions: list[str],
    columns: dict[str, list],
    aggregation: str,
    group_size: int = 1,
    token_ids: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> Scores:
    """Score with every source, then combine: weighted sum, or GDPO within groups of ``group_size`` rows.

    For PPO (one sample per prompt) GDPO's "group" is the whole batch: each reward is normalised over the
    batch before the weighted sum, so rewards on different scales weigh as their weights say.
    ``token_ids``: the policy's (query ⊕ response, mask), scored as they are by reward models that share the
    policy's tokenizer (see ``RewardSet.score``).
    """
    start = time.perf_counter()
    result = rewards.score(prompts, completions, columns, token_ids)
    per_source = result.scores.float()
    B, K = per_source.shape
    weights = rewards.weights.to(per_source)
    if aggregation == "gdpo" and K > 1:
        groups = per_source.view(-1, group_size if group_size > 1 else B, K)
        combined = gdpo_advantages(groups, weights).reshape(B)
        combined = torch.where(per_source.isnan().all(-1), torch.nan, combined)
    else:
        combined = sum_rewards(per_source.view(1, B, K), weights).reshape(B)
    return Scores(per_source, combined, list(result.names), time.perf_counter() - start)


def reward_metrics(scores: Scores, prefix: str = "reward") -> dict[str, float]:
    """``reward/mean``, ``reward/std`` over scored samples and ``reward/<name>/mean`` and ``/std`` per source."""
    valid = ~scores.combined.isnan()
    combined = scores.combined[valid]
    out = {
        f"{prefix}/mean": combined.mean().item() if len(combined) else math.nan,
        f"{prefix}/std": combined.std(unbiased=False).item() if len(combined) else math.nan,
    }
    if (~valid).any():
        out[f"{prefix}/unscored"] = int((~valid).sum())
    if len(scores.names) > 1:
        for k, name in enumerate(scores.names):
            column = scores.per_source[:, k]
            column = column[~column.isnan()]
            out[f"{prefix}/{name}/mean"] = column.mean().item() if len(column) else math.nan
            out[f"{prefix}/{name}/std"] = column.std(unbiased=False).item() if len(column) else math.nan
    return out


def write_samples(
    output_dir: Path, step: int, prompts: list[str], completions: list[str], scores: Scores
) -> Path:
    """``samples/step_NNNNNN.jsonl``: one line per held-out prompt with its completion and rewards."""
    path = output_dir / "samples" / f"step_{step:06d}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for i, (prompt, completion) in enumerate(zip(prompts, completions, strict=True)):
            row: dict[str, Any] = {"step": step, "prompt": prompt, "completion": completion}
            value = scores.combined[i].item()
            row["reward"] = None if math.isnan(value) else value
            if len(scores.names) > 1:
                row["rewards"] = {
                    name: (None if math.isnan(v) else v)
                    for name, v in zip(scores.names, scores.per_source[i].tolist(), strict=True)
                }
            f.write(json.dumps(row) + "\n")
    return path


def write_run_config(output_dir: Path, config: Any) -> None:
    output_dir.mkdir(parents=True, exist_ok=True)
    (output_dir / "config.yaml").write_text(config_to_yaml(config))


def open_run(output_dir: Path, config: Any, checkpoint: Path | None, start: int) -> MetricsLogger:
    """Say whether the run resumes, write ``config.yaml`` and open ``metrics.jsonl``.

    Resuming from ``checkpoint`` (at step ``start``) keeps the metric rows before ``start + 1``; otherwise
    the file starts empty. Shared by every trainer so resumes read the same everywhere.
    """
    if checkpoint is not None:
        print(f"resuming from {checkpoint} (step {start})", file=sys.stderr)
    elif config.resume:
        print(
            f"resume: no checkpoint under {output_dir / 'checkpoints'}; starting from step 0", file=sys.stderr
        )
    write_run_config(output_dir, config)
    resume_step = start + 1 if checkpoint is not None else None
    return MetricsLogger(
        output_dir, config.report_to, resume_step=resume_step, run_config=config_to_dict(config)
    )


def rl_prompts(config: Any, tokenizer: Any) -> tuple[list, list]:
    """Training prompts, and held-out ones: ``eval_data``, else a small deterministic slice of ``train_data``."""
    prompts = load_prompts(config.train_data, tokenizer, config.max_prompt_length)
    if config.eval_data:
        return prompts, load_prompts(config.eval_data, tokenizer, config.max_prompt_length)[:MAX_HELD_OUT]
    n = min(MAX_HELD_OUT, len(prompts) // 10)
    if n == 0:
        return prompts, []
    return held_out(prompts, n, seed=config.seed)


@dataclasses.dataclass
class TrainState:
    """The resumable part of an RL run besides the models: optimizer, schedule, prompt stream and the RNGs
    (``sampling`` draws the responses, ``shuffle`` the minibatch order of later epochs)."""

    optimizer: torch.optim.Optimizer
    scheduler: Any
    stream: PromptStream
    generators: dict[str, torch.Generator]

    @classmethod
    def create(
        cls, config: Any, params: list[nn.Parameter], total_updates: int, prompts: list, device: torch.device
    ) -> TrainState:
        optimizer, scheduler = build_optimizer(
            params, config.learning_rate, config.weight_decay, total_updates, config.lr_scheduler,
            config.warmup_steps,
        )  # fmt: skip
        generators = {"sampling": torch.Generator(device).manual_seed(config.seed), "shuffle": torch.Generator()}
        generators["shuffle"].manual_seed(config.seed + 1)
        return cls(optimizer, scheduler, PromptStream(prompts, config.batch_size, seed=config.seed), generators)

    def state_dict(self) -> dict[str, Any]:
        """The checkpoint entries ``optimizer``, ``scheduler``, ``stream`` and ``rng``."""
        return {
            "optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
            "stream": self.stream.state_dict(), "rng": rng_state(self.generators),
        }  # fmt: skip

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.stream.load_state_dict(state["stream"])
        set_rng_state(state["rng"], self.generators)


def repeat_each(values: list[Any], k: int) -> list[Any]:
    """[a, b] → [a, a, b, b] for k = 2: per-prompt values aligned with k consecutive completions."""
    return [value for value in values for _ in range(k)]


def concat_scores(parts: list[Scores]) -> Scores:
    """The Scores of several batches as one (rows in order, times summed)."""
    return Scores(
        torch.cat([s.per_source for s in parts]),
        torch.cat([s.combined for s in parts]),
        parts[0].names,
        sum(s.seconds for s in parts),
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


def chunks(rows: torch.Tensor, size: int) -> list[torch.Tensor]:
    """Consecutive pieces of ``rows`` of ``size`` (the last may be shorter)."""
    return list(rows.split(size))


@dataclasses.dataclass(frozen=True)
class MicroBatch:
    """The rows of one forward/backward pass and the only columns of ``query ⊕ response`` they need.

    rows: (b,) row indices. first_column: the first of the C query columns where one of the rows has a
    real token (left padding before it is cut). response_length: T' ≤ T response columns kept — the
    longest response + 1, for the value read one past the stop token (right padding after it is cut).
    """

    rows: torch.Tensor
    first_column: int
    response_length: int

    def columns(self, C: int) -> slice:
        """The kept columns of a (B, C+T) ``query ⊕ response`` tensor."""
        return slice(self.first_column, C + self.response_length)


def plan_micro_batches(
    rows: torch.Tensor, attention_mask: torch.Tensor, T: int, max_rows: int, max_tokens: int | None
) -> list[MicroBatch]:
    """Split the ``rows`` of one minibatch into micro-batches with their padding cut.

    ``attention_mask``: (B, C+T) of the whole batch, query left-padded, response right-padded. A micro-batch
    holds at most ``max_rows`` rows and, with ``max_tokens``, at most that many tokens once padded to its
    own longest row (rows × kept columns). With a token budget the rows are first sorted longest first, so
    rows of similar length share a micro-batch and pad little; a row longer than the budget alone gets a
    micro-batch of its own. Without one, the rows keep their order in consecutive chunks of ``max_rows``.
    Every row lands in exactly one micro-batch; the plan depends only on the lengths, so the rollout's
    no-grad pass and the first epoch, planned alike, run exactly the same forwards.
    """
    C = attention_mask.shape[1] - T
    query = attention_mask[rows, :C].sum(-1).tolist()
    needed = (attention_mask[rows, C:].sum(-1) + 1).clamp(max=T).tolist()  # response columns a row needs
    order = list(range(len(query)))
    if max_tokens is not None:
        order.sort(key=lambda i: -(query[i] + needed[i]))
    plans: list[list[int]] = []
    widest_query = widest_response = 0
    for i in order:
        grown = max(widest_query, query[i]) + max(widest_response, needed[i])
        group = plans[-1] if plans else []
        full = len(group) >= max_rows or (max_tokens is not None and (len(group) + 1) * grown > max_tokens)
        if not group or full:
            plans.append([i])
            widest_query, widest_response = query[i], needed[i]
        else:
            group.append(i)
            widest_query, widest_response = max(widest_query, query[i]), max(widest_response, needed[i])
    return [
        MicroBatch(
            rows=rows[torch.tensor(group)],
            first_column=C - max(query[i] for i in group),
            response_length=max(needed[i] for i in group),
        )
        for group in plans
    ]


def micro_batches(config: Any, minibatch: torch.Tensor, mask: torch.Tensor, T: int) -> list[MicroBatch]:
    """The micro-batches of one minibatch of rollout rows under ``config.micro_batch_size`` and
    ``config.micro_batch_tokens``, padding cut (:func:`plan_micro_batches`)."""
    size, budget = config.effective_micro_batch_size, config.micro_batch_tokens
    return plan_micro_batches(minibatch, mask, T, size, budget)


def evaluate_and_log(
    config: Any, policy: nn.Module, tokenizer: Any, rewards: Any, prompts: list, stops: list[int],
    device: torch.device, out: Path, step: int, metrics: dict[str, Any], logger: MetricsLogger,
) -> None:  # fmt: skip
    """End of an RL step: answer the held-out prompts when due (every ``eval_every`` steps and at the last),
    adding ``eval/reward/*`` to this step's ``metrics``, then log the row when due (every ``log_every``)."""
    evaluating = bool(prompts) and (
        (config.eval_every > 0 and step % config.eval_every == 0) or step == config.steps
    )
    if evaluating:
        start = time.perf_counter()
        metrics.update(evaluate(config, policy, tokenizer, rewards, prompts, stops, device, out, step))
        metrics["time/eval_s"] = time.perf_counter() - start
    if evaluating or step % config.log_every == 0 or step == config.steps:
        logger.log(metrics)


@torch.no_grad()
def evaluate(
    config: Any, policy: nn.Module, tokenizer: Any, rewards: Any, prompts: list, stops: list[int],
    device: torch.device, out: Path, step: int,
) -> dict[str, float]:  # fmt: skip
    """Answer the held-out prompts (same sampler, a fixed seed so steps are comparable), write them to
    ``samples/step_NNNNNN.jsonl`` and return ``eval/reward/*``."""
    sampling = SamplingParams(config.max_new_tokens, config.temperature, config.top_k, config.top_p)
    generator = torch.Generator(device).manual_seed(config.seed + 2)
    size = config.effective_micro_batch_size
    texts, completions, parts = [], [], []
    for start in range(0, len(prompts), size):
        batch = PromptBatch.of(prompts, range(start, min(len(prompts), start + size)))
        generated = generate(policy, tokenizer, batch, sampling, stops, generator, device)
        parts.append(
            score(rewards, batch.texts, generated.completions, batch.columns, config.reward_aggregation,
                  token_ids=generated.token_ids)  # fmt: skip
        )
        texts += batch.texts
        completions += generated.completions
    scores = concat_scores(parts)
    write_samples(out, step, texts, completions, scores)
    return reward_metrics(scores, prefix="eval/reward")
