"""`rlhf eval`: a model's completions on held-out prompts scored by a reward; optionally its win rate against a
baseline under a judge. The pass (the numbered steps of `run`), the result keys, the rows and the conventions:
docs/sample_and_eval.md.
"""

from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import dataclass
from typing import Any

import torch

from rlhf import answering
from rlhf.config import ConfigError, EvalConfig
from rlhf.core.masked import masked_sum
from rlhf.core.sequences import response_masks
from rlhf.data import load_prompts
from rlhf.data.tokenization import TokenizedPrompt
from rlhf.inputs import check_inputs
from rlhf.models.loading import load_causal_lm, load_tokenizer
from rlhf.models.policy import score_response_tokens
from rlhf.models.precision import bf16_enabled
from rlhf.rollout import scoring
from rlhf.rollout.rewards import RewardSet
from rlhf.runlog import distributed, rundir
from rlhf.runlog.progress import BatchProgress
from rlhf.runlog.seeding import seed_everything


@dataclass(frozen=True)
class Answers:
    """One model's answer to every prompt, in prompt order, with the reward's scores of them."""

    completions: list[str]
    scores: scoring.Scores
    metrics: dict[str, float]  # reward/…, response/…, kl/…, best_of/…
    seconds: float  # generating and scoring
    kl: torch.Tensor | None = None  # (N,) each answer's Σ_t log π − log π_ref, with a reference


def run(config: EvalConfig) -> dict[str, Any]:
    """Evaluate ``config.model.name`` (and its win rate against ``config.baseline``); returns the results. One
    function: its steps read top to bottom, and split up each part would need most of the others' state."""
    check_inputs(config)  # every model path, reward source and stop_token, before anything loads
    start = time.perf_counter()
    rundir.check_outputs(config, {"output": config.output, "samples_output": config.samples_output})
    seed_everything(config.seed)
    d = distributed.Dist(device=distributed.device_for_run())  # one process: reward models load whole
    device = d.device
    # 1. prompts (through the policy's tokenizer) and the reward
    tokenizer = load_tokenizer(config.model.name, config.chat_template_kwargs)
    prompts = _prompts(config, tokenizer)
    bf16 = bf16_enabled(config.model.bf16, device)
    rewards = scoring.load_rewards(config.reward, tokenizer, d, bf16)
    selector = _or_reward(config.best_of, rewards, tokenizer, d, bf16) if config.best_of.n > 1 else None
    reference = reference_model(config, tokenizer, device)
    # 2. the policy answers every prompt (the best of n with a selector); the reward scores the answers
    policy = answer(config, config.model.name, tokenizer, prompts, rewards, device, "policy", selector, reference)
    results: dict[str, Any] = {
        "policy": config.model.name,
        "eval_data": config.eval_data,
        "num_prompts": len(prompts),
        "seed": config.seed,
        **policy.metrics,
    }
    rows = [
        {"prompt": answering.prompt_value(p), "completion": c, **_reward_fields(policy.scores, i)}
        for i, (p, c) in enumerate(zip(prompts, policy.completions, strict=True))
    ]
    if policy.kl is not None:
        for row, kl in zip(rows, policy.kl.tolist(), strict=True):
            row["kl"] = kl
    times = {"time/policy_s": policy.seconds}
    if config.baseline is not None:
        # 3. the baseline answers the same prompts from the same seed
        baseline_tokenizer = load_tokenizer(config.baseline)
        baseline_prompts = _prompts(config, baseline_tokenizer)
        baseline = answer(config, config.baseline, baseline_tokenizer, baseline_prompts, rewards, device, "baseline")
        # 4. the judge compares the two answers to each prompt
        t0 = time.perf_counter()
        judge = _or_reward(config.judge, rewards, tokenizer, d, bf16)
        a, b = judge_pairs(judge, prompts, policy.completions, baseline.completions, config)
        results["baseline"] = config.baseline
        results |= {f"baseline/{key}": value for key, value in baseline.metrics.items()} | win_rate(a, b)
        for i, row in enumerate(rows):
            row["baseline_completion"] = baseline.completions[i]
            row |= {f"baseline_{key}": value for key, value in _reward_fields(baseline.scores, i).items()}
            row["judge_policy"], row["judge_baseline"] = a[i].item(), b[i].item()
            row["outcome"] = _outcome(a[i].item(), b[i].item())
        times |= {"time/baseline_s": baseline.seconds, "time/judge_s": time.perf_counter() - t0}
    # 5. results
    results |= times | {"time/total_s": time.perf_counter() - start}
    results = answering.json_safe(results)
    text = json.dumps(results, indent=2)
    if config.output is None:
        print(text)
    else:
        _write(config.output, text + "\n", config.overwrite)
        print(f"eval: {_summary_line(results)} → {config.output}", file=sys.stderr)
    if config.samples_output is not None:
        lines = [json.dumps(answering.json_safe(row), ensure_ascii=False) + "\n" for row in rows]
        _write(config.samples_output, "".join(lines), config.overwrite)
    return results


def answer(
    config: EvalConfig,
    model: str,
    tokenizer: Any,
    prompts: list[TokenizedPrompt],
    rewards: RewardSet,
    device: torch.device,
    description: str,
    selector: RewardSet | None = None,
    reference: Any = None,
) -> Answers:
    """``model``'s completion of every prompt (batch by batch), scored by ``rewards``: one sample each, or with
    ``selector`` the best of ``config.best_of.n``; with ``reference`` (a causal LM) each answer's KL from it."""
    start = time.perf_counter()
    sampler = answering.Sampler(model, tokenizer, config, device)
    n = config.best_of.n if selector is not None else 1
    completions: list[str] = []
    responses = []  # per batch: `response_stats` of the kept answers
    scores_all: list[scoring.Scores] = []
    kls: list[torch.Tensor] = []
    picked: list[tuple[torch.Tensor, torch.Tensor]] = []  # per batch: (kept answers', all samples') selector scores
    with BatchProgress(len(prompts), description, config.progress) as bar:
        for batch in answering.prompt_batches(prompts, config.batch_size):
            generated = sampler(batch, repeat=n)
            if selector is not None:
                generated, selected = best_of(selector, config, batch, generated, n)
                picked.append(selected)
            if reference is not None:
                kls.append(answer_kl(sampler.model, reference, generated, config.sampling.temperature))
            scores = answering.score_groups(
                rewards, batch, generated.completions, config.reward.aggregation, 1, generated
            )
            scores_all.append(scores)
            completions += generated.completions
            responses.append(answering.response_stats(generated))
            bar.advance(len(batch), f"reward {torch.cat([s.raw for s in scores_all]).nanmean():.3g}")
    sampler.close()  # the baseline's engine comes next
    scores = scoring.concat_scores(scores_all) if scores_all else _no_scores(rewards)
    metrics = reward_metrics(scores) | answering.response_metrics(responses)
    kl = torch.cat(kls) if kls else None
    if kl is not None:
        metrics |= {"kl/mean": kl.mean().item(), "kl/std": kl.std().item() if len(kl) > 1 else math.nan}
    if selector is not None:
        metrics |= best_of_metrics(n, picked)
    return Answers(completions, scores, metrics, time.perf_counter() - start, kl)


def _or_reward(section: Any, rewards: RewardSet, tokenizer: Any, d: distributed.Dist, bf16: bool) -> RewardSet:
    """The reward set of a judge's or best-of-N selector's ``source``, or ``rewards`` when it has none."""
    return rewards if section.source is None else scoring.load_rewards(section, tokenizer, d, bf16)


def best_of(
    selector: RewardSet, config: EvalConfig, batch: Any, generated: Any, n: int
) -> tuple[Any, tuple[torch.Tensor, torch.Tensor]]:
    """The selector's best of each prompt's ``n`` consecutive samples (unscored ones lose; ties and all
    unscored: the earliest), and (the kept answers' selector scores (B,), all samples' (B·n,))."""
    aggregation = config.best_of.aggregation if config.best_of.source is not None else config.reward.aggregation
    scores = answering.score_groups(
        selector, batch, generated.completions, aggregation, n, generated, token_ids=generated.token_ids
    )
    combined = scores.combined.view(-1, n)
    best = combined.nan_to_num(nan=-math.inf).argmax(-1)  # argmax returns the first of equal maxima
    rows = torch.arange(len(combined)) * n + best
    return generated.select(rows), (combined.gather(1, best[:, None]).squeeze(1), scores.combined)


def best_of_metrics(n: int, picked: list[tuple[torch.Tensor, torch.Tensor]]) -> dict[str, float]:
    """``best_of/*`` and the KL of best-of-n sampling from the sampled model, ``log n − (n−1)/n``."""
    kept = torch.cat([k for k, _ in picked]) if picked else torch.empty(0)
    every = torch.cat([a for _, a in picked]) if picked else torch.empty(0)
    return {
        "best_of/n": n,
        "best_of/selector_mean": kept.nanmean().item(),
        "best_of/selector_sample_mean": every.nanmean().item(),
        "kl/best_of_n_bound": math.log(n) - (n - 1) / n,
    }


def reference_model(config: EvalConfig, tokenizer: Any, device: torch.device) -> Any:
    """The causal LM of ``reference`` (dropout off), or None; its tokenizer must be the policy's (KL is
    measured token by token)."""
    if config.reference is None:
        return None
    if load_tokenizer(config.reference).get_vocab() != tokenizer.get_vocab():
        raise ConfigError(
            f"eval: reference {config.reference} has another vocabulary than the policy {config.model.name}; "
            "the KL is measured token by token and needs the same tokenizer"
        )
    return load_causal_lm(config.reference, answering.inference_dtype(config, device), device)


def answer_kl(policy: Any, reference: Any, generated: Any, temperature: float) -> torch.Tensor:
    """(B,) each answer's Σ_t log π(y_t) − log π_ref(y_t) over its response tokens (stop token included), both
    at the sampling temperature: a sample of the per-answer KL(π ‖ π_ref) whose mean estimates it (k1)."""
    T = generated.responses.shape[1]
    mask = ~response_masks(generated.responses, generated.pad_token_id).padding_mask
    ids, attention = generated.query_responses, generated.attention_mask
    with torch.no_grad():
        logp = score_response_tokens(policy, ids, attention, T, temperature).logprobs
        ref = score_response_tokens(reference, ids, attention, T, temperature).logprobs
    return masked_sum(logp.float() - ref.float(), mask.to(logp.device), dim=-1).cpu()


def reward_metrics(scores: scoring.Scores, prefix: str = "reward") -> dict[str, float]:
    """``scoring.reward_metrics`` plus ``<prefix>/<name>/mean`` for a single source too (eval always reports it)."""
    metrics = scoring.reward_metrics(scores, prefix)
    for k, name in enumerate(scores.names):
        column = scores.per_source[:, k]
        column = column[~column.isnan()]
        metrics.setdefault(f"{prefix}/{name}/mean", column.mean().item() if len(column) else math.nan)
    return metrics


def judge_pairs(
    judge: RewardSet, prompts: list[TokenizedPrompt], a: list[str], b: list[str], config: EvalConfig
) -> tuple[torch.Tensor, torch.Tensor]:
    """The judge's combined scores (N,), (N,) of answers ``a`` and ``b``; NaN = unscored. Rows are interleaved
    a₀ b₀ a₁ b₁ … and scored as groups of two (GDPO normalises within the pair), ``batch_size`` prompts at a time."""
    combined = []
    aggregation = (config.judge if config.judge.source is not None else config.reward).aggregation
    for batch in answering.prompt_batches(prompts, config.batch_size):
        answers = [x for i in batch.indices for x in (a[i], b[i])]
        # no completion ids: the two answers may come from models with different tokenizers
        combined.append(answering.score_groups(judge, batch, answers, aggregation, 2).combined)
    pairs = torch.cat(combined).view(-1, 2) if combined else torch.empty(0, 2)
    return pairs[:, 0], pairs[:, 1]


def win_rate(a: torch.Tensor, b: torch.Tensor) -> dict[str, float]:
    """Win rate of A over B from paired scores (N,), (N,): (wins + ties / 2) / compared; NaN rows not compared."""
    compared = ~(a.isnan() | b.isnan())
    wins, losses = int((a > b)[compared].sum()), int((a < b)[compared].sum())
    ties = int((a == b)[compared].sum())
    n = wins + losses + ties
    return {
        "win_rate": (wins + 0.5 * ties) / n if n else math.nan,
        "wins": wins,
        "losses": losses,
        "ties": ties,
        "compared": n,
        "unscored": int((~compared).sum()),
    }


def _outcome(a: float, b: float) -> str | None:
    if math.isnan(a) or math.isnan(b):
        return None
    return "win" if a > b else "loss" if a < b else "tie"


def _reward_fields(scores: scoring.Scores, i: int) -> dict[str, Any]:
    """``reward`` (the weighted sum of the raw rewards), with several sources ``rewards`` by name, and the
    ``log_extra`` columns as ``extra``, of row ``i``."""
    fields: dict[str, Any] = {"reward": scores.raw[i].item()}
    if len(scores.names) > 1:
        fields["rewards"] = dict(zip(scores.names, scores.per_source[i].tolist(), strict=True))
    if scores.extra:
        fields["extra"] = {key: values[i] for key, values in scores.extra.items()}
    return fields


def _no_scores(rewards: RewardSet) -> scoring.Scores:
    return scoring.Scores(torch.empty(0, len(rewards)), torch.empty(0), list(rewards.names), 0.0, torch.empty(0))


def _prompts(config: EvalConfig, tokenizer: Any) -> list[TokenizedPrompt]:
    return load_prompts(config.eval_data, tokenizer, config.sampling.max_prompt_length)[: config.max_prompts]


def _write(path: str, text: str, overwrite: bool) -> None:
    """Temp file + rename; without ``overwrite`` a file another process wrote meanwhile is not replaced."""
    with rundir.atomic_open(path, replace=overwrite) as f:
        f.write(text)


def _summary_line(results: dict[str, Any]) -> str:
    def number(key: str) -> str:
        value = results.get(key)
        return "n/a" if value is None else f"{value:.4g}"

    line = f"{results['num_prompts']} prompts, reward {number('reward/mean')} ± {number('reward/std')}"
    if "win_rate" in results:
        line += (
            f", win rate {number('win_rate')} against the baseline "
            f"({results['wins']} wins, {results['losses']} losses, {results['ties']} ties)"
        )
    return line
