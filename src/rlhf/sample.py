"""`rlhf sample`: k completions per prompt, written as candidates, pairs to label, preferences or best-of-N.
The pass (the numbered steps of `run`), the rows of each mode, what is skipped and how the judge is called:
docs/sample_and_eval.md. Reproducible: every mode draws the same completions.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import math
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rlhf import answering
from rlhf.config import SampleConfig, llm_judge
from rlhf.data import load_prompts
from rlhf.data.labels import pair_id
from rlhf.data.stream import PromptBatch
from rlhf.data.tokenization import TokenizedPrompt
from rlhf.inputs import check_inputs
from rlhf.labelling.judge import LLMJudge, cache_path_for
from rlhf.labelling.pairs import Pair
from rlhf.models.loading import load_tokenizer
from rlhf.models.precision import bf16_enabled
from rlhf.rollout import scoring
from rlhf.runlog import distributed, rundir
from rlhf.runlog.progress import BatchProgress
from rlhf.runlog.seeding import seed_everything

Row = dict[str, Any]
Rewards = list[float | None] | None
Rows = tuple[list[Row], dict[str, int]]


def run(config: SampleConfig) -> dict[str, Any]:
    """Sample ``config.num_samples`` completions per prompt and write ``config.output`` (rows by the functions
    of `ROWS`); returns the summary."""
    check_inputs(config)  # every model path, reward source and stop_token, before anything loads
    start = time.perf_counter()
    out = Path(config.output)
    summary_path = Path(f"{out}.summary.json")
    rundir.check_outputs(config, {"output": out, "summary": summary_path if config.summary else None})
    seed_everything(config.seed)
    # 1. policy, prompts, judge
    job = Pass.open(config, distributed.device_for_run())
    with (
        rundir.atomic_open(out, replace=config.overwrite) as f,
        BatchProgress(len(job.prompts), "sample", config.progress) as bar,
    ):
        for batch in answering.prompt_batches(job.prompts, config.batch_size):
            f.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in job.batch_rows(batch))
            bar.advance(len(batch), f"{job.rows} rows")
    if job.comparer is not None:
        job.comparer.close()
    # 5. summary
    summary = answering.json_safe(job.summary() | {"time/total_s": time.perf_counter() - start})
    if config.summary:
        with rundir.atomic_open(summary_path, replace=config.overwrite) as f:
            f.write(json.dumps(summary, indent=2) + "\n")
    print(summary_line(summary), file=sys.stderr)
    return summary


@dataclasses.dataclass
class Pass:
    """One pass of `run`: the policy's sampler, the prompts, the judge that scores completions (a reward source)
    or the LLM judge that compares pairs (``comparer``, mode preferences), the mode's row function; and what the
    pass wrote and measured: rows written, rows skipped by reason (and an LLM judge's labels by kind), each
    batch's `answering.response_stats` and the judge's scores."""

    config: SampleConfig
    sampler: answering.Sampler
    prompts: list[TokenizedPrompt]
    judge: scoring.RewardSet | None
    comparer: LLMJudge | None
    make_rows: Callable[..., Rows]
    rows: int = 0
    skipped: Counter = dataclasses.field(default_factory=Counter)
    responses: list = dataclasses.field(default_factory=list)
    scores: list[scoring.Scores] = dataclasses.field(default_factory=list)

    @classmethod
    def open(cls, config: SampleConfig, device: Any) -> Pass:
        """The policy's tokenizer, prompts and sampler, and the judge ``config.judge`` names."""
        tokenizer = load_tokenizer(config.model.name, config.chat_template_kwargs)
        prompts = load_prompts(config.prompts, tokenizer, config.sampling.max_prompt_length)
        judge, comparer, make_rows = None, None, ROWS[config.mode]
        if llm_judge(config.judge.source) is not None:
            comparer = LLMJudge(
                config.judge.source, config.judge.llm, cache_path_for(config.judge.llm, Path(config.output))
            )
            make_rows = functools.partial(judged_pair_rows, comparer)
        elif config.judge.source is not None:
            bf16 = bf16_enabled(config.model.bf16, device)
            judge = scoring.load_rewards(config.judge, tokenizer, distributed.Dist(device=device), bf16)  # loaded whole
        sampler = answering.Sampler(config.model.name, tokenizer, config, device)
        return cls(config, sampler, prompts, judge=judge, comparer=comparer, make_rows=make_rows)

    def batch_rows(self, batch: PromptBatch) -> list[Row]:
        """Steps 2-4 for one batch of prompts: k completions per prompt (consecutive rows), the judge's scores (each
        prompt's k completions one group), and the rows of the mode, prompt by prompt, each followed by its
        prompt's columns (the row's keys win)."""
        config, k = self.config, self.config.num_samples
        generated = self.sampler(batch, repeat=k)
        self.responses.append(answering.response_stats(generated))
        rewards: Rewards = None
        if self.judge is not None:
            aggregation = config.judge.aggregation
            scores = answering.score_groups(self.judge, batch, generated.completions, aggregation, k, generated)
            self.scores.append(scores)
            rewards = [None if math.isnan(r) else r for r in scores.combined.tolist()]  # NaN: unscored
        rows = []
        for i, index in enumerate(batch.indices):
            group, prompt = slice(i * k, (i + 1) * k), self.prompts[index]
            made, skips = self.make_rows(
                prompt, generated.completions[group], None if rewards is None else rewards[group], config
            )
            self.skipped.update(skips)
            rows += [row | {name: v for name, v in prompt.columns.items() if name not in row} for row in made]
        self.rows += len(rows)
        return rows

    def summary(self) -> dict[str, Any]:
        """The pass's summary: what was written and skipped (by mode), the judge's scores, the responses' stats
        and the time each part took."""
        config, comparer, skipped, prompts = self.config, self.comparer, self.skipped, len(self.prompts)
        summary: dict[str, Any] = {
            "mode": config.mode,
            "output": str(Path(config.output)),
            "prompts": prompts,
            "samples": prompts * config.num_samples,
            "rows": self.rows,
        }
        if comparer is not None:
            summary["labels"] = {kind: skipped[kind] for kind in ("preference", "tie", "skip")}
            summary["skipped"] = {"identical": skipped["identical"]}
            summary["judge/requests"] = comparer.asked
            summary["judge/cached"] = comparer.cached_at_start
        elif config.mode in ("preferences", "best_of_n"):
            summary["skipped"] = {"tie": skipped["tie"], "unscored": skipped["unscored"]}
        elif config.mode == "pairs":
            summary["skipped"] = {"identical": skipped["identical"]}
        if self.scores:
            summary.update(scoring.reward_metrics(scoring.concat_scores(self.scores), prefix="judge"))
        summary.update(answering.response_metrics(self.responses))
        summary["time/generate_s"] = self.sampler.seconds
        judge_s = sum((s.seconds for s in self.scores), 0.0) + (comparer.seconds if comparer else 0.0)
        return summary | {"time/judge_s": judge_s}


# Rows per mode: (prompt, its k completions, their judge scores or None, config) → (rows, {skip reason: count}).


def candidate_rows(prompt: TokenizedPrompt, completions: list[str], rewards: Rewards, config: SampleConfig) -> Rows:
    """One row with all k completions (and their scores when there is a judge)."""
    row: Row = {"prompt": answering.prompt_value(prompt), "completions": completions}
    if rewards is not None:
        row["rewards"] = rewards
    return [row], {}


def pair_rows(prompt: TokenizedPrompt, completions: list[str], rewards: Rewards, config: SampleConfig) -> Rows:
    """``{"prompt", "a", "b"}`` per pair of samples: adjacent (1, 2), (3, 4), … or all of them."""
    k = len(completions)
    if config.pairing == "all":
        pairs: Sequence[tuple[int, int]] = list(itertools.combinations(range(k), 2))
    else:
        pairs = [(i, i + 1) for i in range(0, k - 1, 2)]
    distinct = [(i, j) for i, j in pairs if completions[i] != completions[j]]  # nothing to choose between
    rows = [{"prompt": answering.prompt_value(prompt), "a": completions[i], "b": completions[j]} for i, j in distinct]
    return rows, {"identical": len(pairs) - len(distinct)}


def preference_rows(prompt: TokenizedPrompt, completions: list[str], rewards: Rewards, config: SampleConfig) -> Rows:
    """The highest-scored completion as chosen, the lowest as rejected; none when they tie."""
    ranked = ranked_candidates(completions, rewards)
    if len(ranked) < 2:
        return [], {"unscored": 1}
    (best_score, best), (worst_score, worst) = ranked[0], min(ranked)  # min: the earliest of the worst
    chosen, rejected = completions[best], completions[worst]
    # equal texts can only score differently under a judge that is not deterministic (e.g. remote sampling)
    if best_score == worst_score or chosen == rejected:
        return [], {"tie": 1}
    row = dict(prompt=answering.prompt_value(prompt), chosen=reply(prompt, chosen), rejected=reply(prompt, rejected))
    return [row | {"chosen_reward": best_score, "rejected_reward": worst_score}], {}


def best_of_n_rows(prompt: TokenizedPrompt, completions: list[str], rewards: Rewards, config: SampleConfig) -> Rows:
    """The highest-scored completion as an SFT demonstration, with its score."""
    ranked = ranked_candidates(completions, rewards)
    if not ranked:
        return [], {"unscored": 1}
    score, best = ranked[0]
    if prompt.messages is not None:
        return [{"messages": [*prompt.messages, *reply(prompt, completions[best])], "reward": score}], {}
    return [{"prompt": prompt.text, "response": completions[best], "reward": score}], {}


def judged_pair_rows(
    comparer: LLMJudge, prompt: TokenizedPrompt, completions: list[str], rewards: None, config: SampleConfig
) -> Rows:
    """Preferences by an LLM judge: each pair of `pair_rows` compared (in both orders), as labels-file rows —
    a preference, a tie (the orders disagreed, or the judge said tie) or a skip (no verdict)."""
    rows, skips = pair_rows(prompt, completions, None, config)
    value = answering.prompt_value(prompt)
    judged = comparer.judge([Pair(pair_id(value, r["a"], r["b"]), value, r["a"], r["b"], "") for r in rows])
    return judged, skips | dict(Counter(row["kind"] for row in judged))


ROWS: dict[str, Callable[..., Rows]] = {
    "candidates": candidate_rows,
    "pairs": pair_rows,
    "preferences": preference_rows,
    "best_of_n": best_of_n_rows,
}


def ranked_candidates(completions: list[str], rewards: Rewards) -> list[tuple[float, int]]:
    """(score, sample index) of the scored, non-empty completions, best first; equal scores keep sample order."""
    assert rewards is not None, "this mode needs a judge (checked by SampleConfig)"
    scored = [(r, i) for i, (c, r) in enumerate(zip(completions, rewards, strict=True)) if r is not None and c]
    return sorted(scored, key=lambda pair: (-pair[0], pair[1]))


def reply(prompt: TokenizedPrompt, text: str) -> Any:
    """A completion as an answer to ``prompt``: the text, or for a chat prompt an assistant message list."""
    return text if prompt.messages is None else [{"role": "assistant", "content": text}]


def summary_line(summary: dict[str, Any]) -> str:
    """One line for stderr: what was written, what was skipped, the judge's mean and the time taken."""
    parts = [
        f"sample: wrote {summary['rows']} {summary['mode']} rows to {summary['output']} "
        f"({summary['prompts']} prompts × {summary['samples'] // max(summary['prompts'], 1)} samples)"
    ]
    skipped = {reason: n for reason, n in summary.get("skipped", {}).items() if n}
    if skipped:
        parts.append("skipped " + ", ".join(f"{n} {reason}" for reason, n in skipped.items()))
    if "labels" in summary:
        parts.append(", ".join(f"{n} {kind}s" for kind, n in summary["labels"].items()) + " by the LLM judge")
    if summary.get("judge/mean") is not None:
        parts.append(f"judge mean {summary['judge/mean']:.4g} ± {summary['judge/std']:.3g}")
    parts.append(f"{summary['time/total_s']:.1f} s")
    return "; ".join(parts)
