"""`rlhf sample`: k completions per prompt, written as candidates, pairs to label, preferences or best-of-N.

One pass: (1) load the policy, its tokenizer and the prompts → (2) per batch of prompts, sample k completions
each with the rollout engine (``generation.generate``; seeded, stopping at the stop token) → (3) score them with
the judge, if any (``scoring.score``; the prompts' extra columns are passed to it) → (4) turn each prompt's k
completions into rows of the chosen ``mode`` and append them to ``output`` → (5) a summary to stderr (and to
``<output>.summary.json`` with ``summary: true``).

Output rows, one JSON object per line (``mode``):

=============  ==========================================================================================
candidates     ``{"prompt", "completions": [k str]}`` — one row per prompt; with a judge also
               ``"rewards": [k float | null]`` (null = the judge could not score it)
pairs          ``{"prompt", "a", "b"}`` — for human labelling; ``pairing: adjacent`` pairs samples (1, 2),
               (3, 4), … (each completion in one pair), ``all`` every pair
preferences    ``{"prompt", "chosen", "rejected", "chosen_reward", "rejected_reward"}`` — the judge's
               highest- and lowest-scored completion; a preferences file for ``rlhf rm``; with an LLM judge
               (``judge.source: openai:URL#MODEL``) each pair of ``pairing`` compared in both orders, written as
               labels-file rows (`rlhf.data.labels`: preference, tie or skip; ``source`` the judge), as
               ``rlhf label`` writes them
best_of_n      ``{"prompt", "response", "reward"}`` — the judge's highest-scored completion; an SFT file
               for ``rlhf sft`` (rejection-sampling fine-tuning)
=============  ==========================================================================================

``"prompt"`` is the prompt as the prompts file gave it. Chat prompts (``{"messages"}``) keep the chat form
where the next command needs it: preferences get ``"chosen"``/``"rejected"`` as ``[{"role": "assistant",
"content": …}]`` with ``"prompt"`` the message list, best_of_n rows are ``{"messages": prompt + [assistant],
"reward"}``; candidates and pairs keep completions as plain strings. The prompt's extra columns are copied
into its rows (a column named like one of the row's own keys is left out).

Preferences and best_of_n rank only the completions the judge scored and that are not empty (an empty
answer is not a valid preference or SFT example). A prompt is skipped, and counted in the summary, when
fewer than two such completions remain (best_of_n: none) — ``skipped.unscored`` — or, for preferences,
when its best and worst completions score the same or are the same text (``skipped.tie``: there is no
preference to learn). Pairs leave out identical a/b (``skipped.identical``, counted per pair).
Ties between several best (or worst) completions go to the earliest sample.

The judge is called like every reward source of ``ppo``/``grpo``: reward functions get TRL's arguments (chat
prompts and completions in the conversational form, ``completion_ids``, a fresh ``trainer_state`` — step 0 of
0 — and ``log_metric``, whose means land in the summary as ``judge/<source>/<name>``; ``log_extra`` columns
are not written). The summary's ``judge/mean`` is the weighted sum of the raw rewards; the rows' rewards and
the ranking use the judge's combination (with ``gdpo``: normalised within the k completions of a prompt).

Reproducible: the same seed, model, prompts, batch_size and sampling settings write the same file, and
every mode draws exactly the same completions (so best_of_n can be checked against candidates).
One process: ``torchrun`` is not used here.
"""

from __future__ import annotations

import functools
import itertools
import json
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from rlhf.answering import (
    Sampler,
    json_safe,
    nan_to_none,
    prompt_batches,
    prompt_value,
    response_lengths,
    response_metrics,
)
from rlhf.config import SampleConfig, llm_judge
from rlhf.data import load_prompts
from rlhf.data.labels import pair_id
from rlhf.data.tokenization import TokenizedPrompt
from rlhf.labelling.judge import LLMJudge, cache_path_for
from rlhf.labelling.pairs import Pair
from rlhf.models.loading import load_tokenizer
from rlhf.rollout import generation, scoring
from rlhf.rollout.rewards import load_reward_set
from rlhf.runlog import distributed, rundir
from rlhf.runlog.progress import BatchProgress
from rlhf.runlog.seeding import seed_everything

Row = dict[str, Any]


def run(config: SampleConfig) -> dict[str, Any]:
    """Sample ``config.num_samples`` completions per prompt and write ``config.output``; returns the summary.

    Its phases (load, per batch: sample, judge, write rows; summary) read top to bottom as the command's
    steps; the rows of each mode are built by the functions of `ROWS`.
    """
    from rlhf.inputs import check_inputs

    check_inputs(config)  # every model path, reward source and stop_token, before anything loads
    start = time.perf_counter()
    out = Path(config.output)
    summary_path = Path(f"{out}.summary.json")
    rundir.check_outputs(config, {"output": out, "summary": summary_path if config.summary else None})
    seed_everything(config.seed)
    device = distributed.device_for_run()
    # 1. policy, prompts, judge
    tokenizer = load_tokenizer(config.model.name)
    prompts = load_prompts(config.prompts, tokenizer, config.sampling.max_prompt_length)
    judge, comparer = None, None
    make_rows = ROWS[config.mode]
    if llm_judge(config.judge.source) is not None:  # an LLM compares pairs (mode preferences)
        comparer = LLMJudge(config.judge.source, config.judge.llm, cache_path_for(config.judge.llm, out))
        make_rows = functools.partial(judged_pair_rows, comparer)
    elif config.judge.source is not None:
        spec = scoring.reward_spec(config.judge.source)
        judge = load_reward_set(spec, policy_tokenizer=tokenizer, device=str(device))
    sampler = Sampler(config.model.name, tokenizer, config, device)
    k = config.num_samples

    rows_written, skipped = 0, Counter()
    lengths: list[torch.Tensor] = []  # per batch: response lengths (B·k,) and whether each stopped (B·k,)
    stopped: list[torch.Tensor] = []
    scores_all: list[scoring.Scores] = []
    batches = prompt_batches(prompts, config.batch_size)
    with (
        rundir.atomic_open(out, replace=config.overwrite) as f,
        BatchProgress(len(prompts), "sample", config.progress) as bar,
    ):
        for batch in batches:
            # 2. k completions per prompt (consecutive rows)
            generated = sampler(batch, repeat=k)
            lengths.append(response_lengths(generated))
            stopped.append(generated.has_stop.cpu())
            # 3. the judge's scores, each prompt's columns repeated for its k completions
            rewards: list[float | None] | None = None
            if judge is not None:
                scores = scoring.score(
                    judge,
                    generation.repeat_each(batch.texts, k),
                    generated.completions,
                    {name: generation.repeat_each(values, k) for name, values in batch.columns.items()},
                    config.judge.aggregation,
                    group_size=k,
                    context=scoring.reward_context(batch, generated, k, scoring.make_trainer_state()),
                )
                scores_all.append(scores)
                rewards = nan_to_none(scores.combined.tolist())
            # 4. rows of this mode, prompt by prompt
            for i, index in enumerate(batch.indices):
                group = slice(i * k, (i + 1) * k)
                made, skips = make_rows(
                    prompts[index], generated.completions[group], None if rewards is None else rewards[group], config
                )
                skipped.update(skips)
                for row in made:
                    f.write(json.dumps(with_columns(row, prompts[index].columns), ensure_ascii=False) + "\n")
                rows_written += len(made)
            bar.advance(len(batch), f"{rows_written} rows")

    # 5. summary
    summary: dict[str, Any] = {
        "mode": config.mode,
        "output": str(out),
        "prompts": len(prompts),
        "samples": len(prompts) * k,
        "rows": rows_written,
    }
    if comparer is not None:
        comparer.close()
        summary["labels"] = {kind: skipped[kind] for kind in ("preference", "tie", "skip")}
        summary["skipped"] = {"identical": skipped["identical"]}
        summary["judge/requests"] = comparer.asked
        summary["judge/cached"] = comparer.cached_at_start
    elif config.mode in ("preferences", "best_of_n"):
        summary["skipped"] = {"tie": skipped["tie"], "unscored": skipped["unscored"]}
    elif config.mode == "pairs":
        summary["skipped"] = {"identical": skipped["identical"]}
    if scores_all:
        summary.update(scoring.reward_metrics(scoring.concat_scores(scores_all), prefix="judge"))
    summary.update(response_metrics(lengths, stopped))
    summary["time/generate_s"] = sampler.seconds
    summary["time/judge_s"] = sum((s.seconds for s in scores_all), 0.0) + (comparer.seconds if comparer else 0.0)
    summary["time/total_s"] = time.perf_counter() - start
    summary = json_safe(summary)
    if config.summary:
        with rundir.atomic_open(summary_path, replace=config.overwrite) as f:
            f.write(json.dumps(summary, indent=2) + "\n")
    print(summary_line(summary), file=sys.stderr)
    return summary


# ---------------------------------------------------------------------------------------------------------------
# Rows per mode: (prompt, its k completions, their judge scores or None, config) → (rows, {skip reason: count}).
# ---------------------------------------------------------------------------------------------------------------


def candidate_rows(
    prompt: TokenizedPrompt, completions: list[str], rewards: list[float | None] | None, config: SampleConfig
) -> tuple[list[Row], dict[str, int]]:
    """One row with all k completions (and their scores when there is a judge)."""
    row: Row = {"prompt": prompt_value(prompt), "completions": completions}
    if rewards is not None:
        row["rewards"] = rewards
    return [row], {}


def pair_rows(
    prompt: TokenizedPrompt, completions: list[str], rewards: list[float | None] | None, config: SampleConfig
) -> tuple[list[Row], dict[str, int]]:
    """``{"prompt", "a", "b"}`` per pair of samples: adjacent (1, 2), (3, 4), … or all of them."""
    k = len(completions)
    if config.pairing == "all":
        pairs: Sequence[tuple[int, int]] = list(itertools.combinations(range(k), 2))
    else:
        pairs = [(i, i + 1) for i in range(0, k - 1, 2)]
    distinct = [(i, j) for i, j in pairs if completions[i] != completions[j]]  # nothing to choose between
    rows = [{"prompt": prompt_value(prompt), "a": completions[i], "b": completions[j]} for i, j in distinct]
    return rows, {"identical": len(pairs) - len(distinct)}


def preference_rows(
    prompt: TokenizedPrompt, completions: list[str], rewards: list[float | None] | None, config: SampleConfig
) -> tuple[list[Row], dict[str, int]]:
    """The highest-scored completion as chosen, the lowest as rejected; none when they tie."""
    ranked = ranked_candidates(completions, rewards)
    if len(ranked) < 2:
        return [], {"unscored": 1}
    (best_score, best), (worst_score, worst) = ranked[0], min(ranked)  # min: the earliest of the worst
    chosen, rejected = completions[best], completions[worst]
    # equal texts can only score differently under a judge that is not deterministic (e.g. remote sampling)
    if best_score == worst_score or chosen == rejected:
        return [], {"tie": 1}
    if prompt.messages is not None:
        row: Row = {"prompt": prompt.messages, "chosen": assistant(chosen), "rejected": assistant(rejected)}
    else:
        row = {"prompt": prompt.text, "chosen": chosen, "rejected": rejected}
    row |= {"chosen_reward": best_score, "rejected_reward": worst_score}
    return [row], {}


def best_of_n_rows(
    prompt: TokenizedPrompt, completions: list[str], rewards: list[float | None] | None, config: SampleConfig
) -> tuple[list[Row], dict[str, int]]:
    """The highest-scored completion as an SFT demonstration, with its score."""
    ranked = ranked_candidates(completions, rewards)
    if not ranked:
        return [], {"unscored": 1}
    score, best = ranked[0]
    if prompt.messages is not None:
        return [{"messages": [*prompt.messages, *assistant(completions[best])], "reward": score}], {}
    return [{"prompt": prompt.text, "response": completions[best], "reward": score}], {}


def judged_pair_rows(
    comparer: LLMJudge, prompt: TokenizedPrompt, completions: list[str], rewards: None, config: SampleConfig
) -> tuple[list[Row], dict[str, int]]:
    """Preferences by an LLM judge: each pair of `pair_rows` compared (in both orders), as labels-file rows —
    a preference, a tie (the orders disagreed, or the judge said tie) or a skip (no verdict)."""
    rows, skips = pair_rows(prompt, completions, None, config)
    value = prompt_value(prompt)
    judged = comparer.judge([Pair(pair_id(value, r["a"], r["b"]), value, r["a"], r["b"], "") for r in rows])
    return judged, skips | dict(Counter(row["kind"] for row in judged))


ROWS: dict[str, Callable[..., tuple[list[Row], dict[str, int]]]] = {
    "candidates": candidate_rows,
    "pairs": pair_rows,
    "preferences": preference_rows,
    "best_of_n": best_of_n_rows,
}
"""``mode`` → its row function."""


def ranked_candidates(completions: list[str], rewards: list[float | None] | None) -> list[tuple[float, int]]:
    """(score, sample index) of the scored, non-empty completions, best first; equal scores keep sample order."""
    assert rewards is not None, "this mode needs a judge (checked by SampleConfig)"
    scored = [(r, i) for i, (c, r) in enumerate(zip(completions, rewards, strict=True)) if r is not None and c]
    return sorted(scored, key=lambda pair: (-pair[0], pair[1]))


def assistant(text: str) -> list[dict[str, str]]:
    return [{"role": "assistant", "content": text}]


def with_columns(row: Row, columns: dict[str, Any]) -> Row:
    """The row followed by the prompt's extra columns; the row's own keys win over a column of the same name."""
    return row | {name: value for name, value in columns.items() if name not in row}


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
