"""Asynchronous RL against the synchronous loop: ``sampling.max_staleness`` k = 1 against k = 0, for ``rlhf grpo`` and
``rlhf ppo``, at SmolLM2-135M's shape on the CPU, in three scenarios.

    python benchmarks/async_overlap.py                    # every scenario, 5 steps per run, 2 repeats
    python benchmarks/async_overlap.py --tiny             # a ~1M-parameter smoke run of the same code
    python benchmarks/async_overlap.py --only latency --algorithms grpo --repeats 3

Scenarios (``--only compute,latency,long_tail``):

- ``compute``: a cheap reward computed in the process that samples. k = 0 uses every core (``--threads``); k = 1 the
  trainer ``threads - 1`` and the sampling worker 1 (``sampling.worker_threads``). The synchronous loop also runs
  with ``threads - 1`` threads: its phases bound what the overlap can win here.
- ``latency``: the reward served over HTTP by a local ``ThreadingHTTPServer`` (a thread of this process) that
  sleeps ``--latency`` seconds before it answers (default: the sampling time of a k = 0 step of the same
  algorithm, from the compute scenario or a short calibration run). Goal: GRPO at k = 1 at least 1.3× the steps/s
  of k = 0.
- ``long_tail``: multi-turn episodes (``rollout.environment``, :class:`LongTail`) of which one in eight takes
  8 model turns and the rest 2.

Each (scenario, algorithm, k) run is ``python -m rlhf <algo> --config …`` in its own process (its sampling worker
too), the runs of a scenario alternating k = 0 / k = 1 within each repeat and reversing the order from one repeat to
the next, so a drift of the machine's speed lands on both. Per run: the median of each ``time/*`` column of
``metrics.jsonl`` after the warm-up steps (2; 1 when a run has 2 or 3 steps). Writes
benchmarks/results/async_overlap.{json,md} (``--tiny``: benchmarks/.work/async_overlap/tiny/; ``--out`` elsewhere).
Notes: benchmarks/README.md, "Asynchronous RL: overlap".

This file is also the runs' reward functions (:func:`local_reward`, :func:`http_reward`) and environment
(:class:`LongTail`): the trainers load it by path, so everything at its top level is the standard library.
"""

from __future__ import annotations

import argparse
import datetime
import http.server
import json
import math
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SCRIPT = Path(__file__).resolve()
RESULTS = HERE / "results"
WORK = HERE / ".work" / "async_overlap"
FORMAT = 1

SCENARIOS = ("compute", "latency", "long_tail")
SCENARIO_NAMES = {
    "compute": "compute-bound",
    "latency": "latency-bound (HTTP reward)",
    "long_tail": "long tail",
    "calibration": "calibration (the latency)",
}
ALGORITHMS = ("grpo", "ppo")

SMOLLM2_135M = {"hidden_size": 576, "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
                "intermediate_size": 1536, "vocab_size": 49152, "tie_word_embeddings": True, "rope_theta": 100000.0,
                "max_position_embeddings": 8192}  # fmt: skip
"""SmolLM2-135M's config (random weights here: 134.5M parameters)."""
TINY = {"hidden_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
        "intermediate_size": 384, "vocab_size": 2048, "tie_word_embeddings": True, "rope_theta": 100000.0,
        "max_position_embeddings": 2048}  # fmt: skip
"""The ``--tiny`` shape: 1.05M parameters."""

PROMPTS, GROUP = 8, 8
"""GRPO: 8 prompts × 8 completions a step; PPO: 64 prompts (the same 64 sequences a step)."""
NUM_PROMPTS = PROMPTS * GROUP
SHORT_TURNS, LONG_TURNS, LONG_EVERY = 2, 8, 8
"""Long tail: one row in LONG_EVERY asks for LONG_TURNS model turns, the others for SHORT_TURNS."""
EOS_SHIFT = 3.0
"""Added to dimension 0 of every embedding row of the long-tail policy, so the final hidden state has a steady
positive component there; the EOS row gets more (:func:`bias_eos`) and EOS becomes a steady per-token probability."""
BUSY = 0.1
"""Share of the CPU other processes used just before a run above which the results say so."""
URL_ENV = "RLHF_BENCH_REWARD_URL"
"""Where :func:`http_reward` posts (set per run by the benchmark: the server's address and the latency)."""


# -------------------------------------------------------------------------------------------------------------------
# What the runs load by path: reward functions and the long-tail environment (standard library only)
# -------------------------------------------------------------------------------------------------------------------


def cheap_score(ids: list[int]) -> float:
    """A reward that costs nothing: the share of even token ids (random models sample ids above the small tokenizer's
    vocabulary, whose text is empty, so the ids are what varies)."""
    ids = [int(i) for i in ids]
    return sum(1 for i in ids if i % 2 == 0) / max(1, len(ids))


def local_reward(completions, completion_ids=None, **kwargs) -> list[float]:
    """The compute-bound scenario's reward, computed where the batch is sampled."""
    return [cheap_score(ids) for ids in completion_ids]


def http_reward(completions, completion_ids=None, **kwargs) -> list[float]:
    """The latency-bound scenario's reward: the batch's ids POSTed to the benchmark's server (``$RLHF_BENCH_REWARD_URL``,
    which carries the latency), its scores back."""
    url = os.environ[URL_ENV]
    latency = float(urllib.parse.parse_qs(urllib.parse.urlsplit(url).query).get("latency", ["0"])[0])
    body = json.dumps({"completion_ids": [[int(i) for i in ids] for ids in completion_ids]}).encode()
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(request, timeout=latency + 120) as response:
        return [float(x) for x in json.loads(response.read())["scores"]]


class LongTail:
    """A multi-turn environment with a long tail: the row's ``turns`` column says how many model turns its episodes
    take (one row in eight: 8, the others 2). Each turn the model's answer is met with "go on" until the last;
    the reward is what the model said, in characters / 100."""

    def reset(self, row: dict) -> list[dict]:
        self.turn, self.needed, self.said = 0, int(row["turns"]), 0
        return [{"role": "user", "content": row["prompt"]}]

    def step(self, message: dict) -> tuple[list[dict], float | None, bool]:
        self.turn += 1
        self.said += len(message.get("content") or "")
        if self.turn >= self.needed:
            return [], None, True
        return [{"role": "user", "content": "go on"}], None, False

    def get_reward(self) -> float:
        return self.said / 100


class RewardServer:
    """The latency-bound scenario's reward server: a ``ThreadingHTTPServer`` on 127.0.0.1 in a daemon thread of this
    process. ``POST /score?latency=S`` with ``{"completion_ids": [[...], ...]}`` sleeps S seconds, then answers
    ``{"scores": [...]}`` (:func:`cheap_score`); every request is counted in ``requests``."""

    def __init__(self) -> None:
        server = self
        self.requests: list[dict] = []
        self.lock = threading.Lock()

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                query = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)
                latency = float(query.get("latency", ["0"])[0])
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                time.sleep(latency)
                scores = [cheap_score(ids) for ids in body["completion_ids"]]
                payload = json.dumps({"scores": scores}).encode()
                with server.lock:  # counted before the answer leaves: a caller that has it sees it counted
                    server.requests.append({"latency_s": latency, "rows": len(scores), "at": time.time()})
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True, name="reward-server")
        self.thread.start()

    def url(self, latency: float) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/score?latency={latency:.4f}"

    def served(self) -> int:
        with self.lock:
            return len(self.requests)

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


# -------------------------------------------------------------------------------------------------------------------
# Pure helpers: per-run summaries, repeats, ratios, the bound, the table (tests/test_async_benchmark.py)
# -------------------------------------------------------------------------------------------------------------------

TIME_COLUMNS = {"step_s": "time/step_s", "rollout_s": "time/rollout_s", "score_s": "time/score_s",
                "logprobs_s": "time/logprobs_s", "train_s": "time/train_s",
                "producer_idle_s": "time/producer_idle_s"}  # fmt: skip
"""A summary's keys and the ``metrics.jsonl`` columns they are the medians of."""
EXTRA_COLUMNS = {"length_mean": "response/length_mean", "eos_rate": "response/eos_rate",
                 "turns_mean": "episode/turns_mean", "staleness": "async/staleness"}  # fmt: skip
"""Medians kept beside the times: response length, EOS rate, turns per episode, staleness (where logged)."""


def warmup_steps(steps: int) -> int:
    """Steps left out of a run's medians: 2 (the first pays for start-up, and at k > 0 always waits for the worker's
    first batch), 1 in a run of 2 or 3 steps, none in a run of one."""
    return 2 if steps >= 4 else 1 if steps >= 2 else 0


def train_rows(rows: list[dict]) -> list[dict]:
    """The training rows of a ``metrics.jsonl`` (those with ``time/step_s``), in step order."""
    return sorted((row for row in rows if "time/step_s" in row), key=lambda row: row["step"])


def summarize(rows: list[dict], k: int, warmup: int) -> dict[str, Any]:
    """One run's numbers: the median of each ``time/*`` column (and :data:`EXTRA_COLUMNS`) over the training rows
    after ``warmup`` (every row when there are no more), and ``other_s``, the median of the step's rest: at k = 0
    ``step - rollout - score - logprobs - train`` (rollout_s is sampling without scoring, score_s the reward); at
    k > 0 ``step - rollout - logprobs - train`` (rollout_s is the trainer's wait for the batch, which the worker
    sampled and scored: its score_s is not part of the trainer's step)."""
    steps = train_rows(rows)
    if not steps:
        raise ValueError("no training rows (time/step_s) in metrics.jsonl")
    timed = steps[warmup:] if len(steps) > warmup else steps

    def median(column: str) -> float | None:
        values = [row[column] for row in timed if row.get(column) is not None]
        return float(statistics.median(values)) if values else None

    out: dict[str, Any] = {"k": k, "steps": len(steps), "timed_steps": [row["step"] for row in timed]}
    out |= {key: median(column) for key, column in TIME_COLUMNS.items()}
    out |= {key: median(column) for key, column in EXTRA_COLUMNS.items()}
    for key in ("rollout_s", "score_s", "logprobs_s", "train_s"):
        out[key] = out[key] or 0.0
    rest = []
    for row in timed:
        inside = sum(row.get(TIME_COLUMNS[key], 0.0) for key in ("rollout_s", "logprobs_s", "train_s"))
        inside += row.get("time/score_s", 0.0) if k == 0 else 0.0
        rest.append(row["time/step_s"] - inside)
    out["other_s"] = float(statistics.median(rest))
    return out


def median_index(values: list[float]) -> int:
    """Index of the median value: the middle one of an odd count, the lower (faster) middle one of an even count."""
    if not values:
        raise ValueError("no values")
    order = sorted(range(len(values)), key=lambda i: (values[i], i))
    return order[(len(values) - 1) // 2]


def combine(repeats: list[dict | None]) -> dict[str, Any] | None:
    """One run over its repeats (``None``: a repeat that failed; ``None`` back if all did): the median repeat's summary
    (:func:`median_index` of s/step) with ``s_per_step`` the median over repeats, ``s_min``/``s_max`` their range,
    ``repeats_s`` every repeat's s/step (``None`` where it failed) and ``repeats_done``."""
    done = [(i, s) for i, s in enumerate(repeats) if s is not None]
    if not done:
        return None
    seconds = [s["step_s"] for _, s in done]
    _, representative = done[median_index(seconds)]
    return {
        **representative,
        "s_per_step": float(statistics.median(seconds)),
        "s_min": min(seconds),
        "s_max": max(seconds),
        "repeats_s": [None if s is None else s["step_s"] for s in repeats],
        "repeats_done": len(done),
    }


def speedup(base: list[dict | None], other: list[dict | None]) -> dict[str, Any] | None:
    """Steps/s of ``other`` over ``base`` (repeats, as :func:`combine` takes them): ``ratio`` = the median s/step of
    base ÷ other's (> 1: other is faster), and ``min``/``max`` of the per-repeat ratios, repeat i against repeat i
    (run back to back); ``None`` when either side has no finished repeat."""
    a, b = combine(base), combine(other)
    if a is None or b is None:
        return None
    pairs = [x["step_s"] / y["step_s"] for x, y in zip(base, other, strict=False) if x is not None and y is not None]
    ratio = a["s_per_step"] / b["s_per_step"]
    return {"ratio": ratio, "min": min(pairs, default=ratio), "max": max(pairs, default=ratio)}


def sampling_side(summary: dict) -> float:
    """Seconds a synchronous step spends drawing its batch: sampling and the reward (k = 0's rollout + score)."""
    return summary["rollout_s"] + summary["score_s"]


def learning_side(summary: dict) -> float:
    """Seconds a synchronous step spends learning: the no-grad pass, the update and the rest of the step."""
    return summary["logprobs_s"] + summary["train_s"] + summary["other_s"]


def overlap_bound(sync: dict, one_thread: dict, extra_latency: float = 0.0) -> dict[str, float]:
    """The most k = 1 can win: the synchronous step (``sync``, every thread) over the longer of the two sides a k = 1
    step overlaps, each on its share of the cores, taken from the synchronous loop with the trainer's thread count
    (``one_thread``): the worker's sampling + reward (+ ``extra_latency``, a reward server's wait that the 1-thread
    run did not have) and the trainer's learning. A bound from k = 0's phases: at k > 0 GRPO also runs the no-grad
    pass for π_prox that k = 0 skips, so its real ceiling is lower."""
    worker = sampling_side(one_thread) + extra_latency
    trainer = learning_side(one_thread)
    step = sync.get("s_per_step", sync["step_s"])  # combined repeats: their median
    return {"bound": step / max(worker, trainer), "worker_s": worker, "trainer_s": trainer}


def _digits(value: float) -> int:
    """Decimals that show ``value`` to about 3 significant digits (at most 3 decimals)."""
    if value >= 100:
        return 0
    if value >= 10:
        return 1
    if value >= 1:
        return 2
    return 3


def fmt_s(value: float) -> str:
    return f"{value:.{_digits(value)}f}"


def fmt_range(median: float, low: float, high: float, suffix: str = "") -> str:
    """``median (low–high)`` at the median's precision, the range rounded outwards; just the median when the range is
    one value at that precision."""
    digits = _digits(median)
    if high - low <= 1e-9 * max(1.0, abs(median)):  # one value (one repeat)
        return f"{median:.{digits}f}{suffix}"
    scale = 10**digits
    lo, hi = math.floor(low * scale + 1e-9) / scale, math.ceil(high * scale - 1e-9) / scale
    text = f"{median:.{digits}f}{suffix}"
    if f"{lo:.{digits}f}" == f"{hi:.{digits}f}":
        return text
    return f"{text} ({lo:.{digits}f}–{hi:.{digits}f}{suffix})"


def where_it_goes(summary: dict) -> str:
    """The step's split as text: at k = 0 sampling, reward, no-grad pass, update and the rest as shares of the step; at
    k > 0 the trainer's wait for the batch, its no-grad pass, update and rest, then the worker's reward seconds and its
    wait for the weights."""
    step = summary["step_s"]

    def share(seconds: float) -> str:
        return f"{100 * seconds / step:.0f}%"

    if summary["k"] == 0:
        parts = [("sample", summary["rollout_s"]), ("reward", summary["score_s"])]
    else:
        parts = [("wait", summary["rollout_s"])]
    parts += [("logprobs", summary["logprobs_s"]), ("train", summary["train_s"]), ("other", summary["other_s"])]
    text = " · ".join(f"{name} {share(seconds)}" for name, seconds in parts)
    if summary["k"] > 0:
        idle = summary.get("producer_idle_s") or 0.0
        text += f"; worker: reward {fmt_s(summary['score_s'])} s, idle {fmt_s(idle)} s"
    return text


@dataclass(frozen=True)
class Run:
    """One run of a scenario: an algorithm at staleness ``k``; ``threads`` None = every core (``--threads``)."""

    scenario: str
    algo: str
    k: int
    threads: int | None = None

    @property
    def key(self) -> str:
        return f"{self.scenario}/{self.algo}/k{self.k}" + (f"/t{self.threads}" if self.threads else "")


def scenario_runs(scenario: str, algorithms: list[str], threads: int) -> list[Run]:
    """A scenario's runs per algorithm, in the order of an even repeat: k = 0 on every core, k = 1, and for the
    compute-bound scenario the synchronous loop on ``threads - 1`` threads (the trainer's share at k = 1)."""
    runs = []
    for algo in algorithms:
        runs += [Run(scenario, algo, 0), Run(scenario, algo, 1)]
        if scenario == "compute" and threads > 1:
            runs.append(Run(scenario, algo, 0, threads - 1))
    return runs


def repeat_order(runs: list[Run], repeat: int) -> list[Run]:
    """The runs of repeat ``repeat``: as given in even repeats, reversed in odd ones (A B C, C B A, …), so every run
    sits as often before as after the others and a drift of the machine's speed lands on k = 0 and k = 1 alike."""
    return list(runs) if repeat % 2 == 0 else list(reversed(runs))


def run_label(run: Run, threads: int) -> str:
    if run.k == 0:
        n = run.threads or threads
        return f"k=0, {n} thread{'s' if n > 1 else ''}"
    return f"k={run.k}, trainer {max(1, threads - 1)} + worker 1 thread"


def table_rows(results: dict) -> list[dict[str, Any]]:
    """Per (scenario, algorithm, run): the combined summary, the speed-up and the text columns of the table.

    Speed-up: k = 1 against k = 0 on every core (steps/s ratio, per-repeat range); the synchronous loop on fewer
    threads against it as well (thread scaling: below 1)."""
    threads = results["threads"]
    out = []
    for scenario in results["scenarios"]:
        entry = results["scenarios"][scenario]
        runs = entry.get("runs", {})
        for key, run in runs.items():
            summaries = [r.get("summary") for r in run["repeats"]]
            combined = combine(summaries)
            base_key = f"{run['scenario']}/{run['algo']}/k0"
            row = {"scenario": scenario, "algo": run["algo"], "key": key, "k": run["k"],
                   "label": run_label(Run(run["scenario"], run["algo"], run["k"], run["threads"]), threads),
                   "summary": combined, "speedup": None, "error": None}  # fmt: skip
            if combined is None:
                row["error"] = next((r["error"] for r in run["repeats"] if r.get("error")), "no repeat finished")
            elif key != base_key and base_key in runs:
                base = [r.get("summary") for r in runs[base_key]["repeats"]]
                row["speedup"] = speedup(base, summaries)
            out.append(row)
    return out


def bounds(results: dict) -> dict[str, dict[str, float]]:
    """Per algorithm: the compute-bound ceiling of k = 1 (:func:`overlap_bound` from the compute scenario's k = 0
    runs on every core and on ``threads - 1``), and the latency-bound one (the latency scenario's k = 0 step over the
    longer of the fewer-thread run's sampling side + the server's latency and its learning side), where they ran."""
    out: dict[str, dict[str, float]] = {}
    compute = results["scenarios"].get("compute", {}).get("runs", {})
    latency = results["scenarios"].get("latency", {}).get("runs", {})
    for algo in ALGORITHMS:
        sync = compute.get(f"compute/{algo}/k0")
        fewer = next((run for key, run in compute.items() if key.startswith(f"compute/{algo}/k0/t")), None)
        if sync is None or fewer is None:
            continue
        a, b = (combine([r.get("summary") for r in run["repeats"]]) for run in (sync, fewer))
        if a is None or b is None:
            continue
        out[algo] = {"compute": overlap_bound(a, b)["bound"]}
        slow = latency.get(f"latency/{algo}/k0")
        c = slow and combine([r.get("summary") for r in slow["repeats"]])
        seconds = results.get("latency_s", {}).get(algo)
        if c and seconds is not None:
            out[algo]["latency"] = overlap_bound(c, b, extra_latency=seconds)["bound"]
    return out


GOAL = 1.3
"""The latency-bound goal: GRPO at k = 1 at least this many times the synchronous loop's steps/s."""


def goal_line(rows: list[dict]) -> str | None:
    """Whether the latency-bound GRPO k = 1 run reached :data:`GOAL` × the synchronous steps/s; None if it did not run."""
    row = next((r for r in rows if r["key"] == "latency/grpo/k1"), None)
    if row is None:
        return None
    if row["speedup"] is None:
        return f"Goal (latency-bound GRPO k=1 ≥ {GOAL}× the synchronous steps/s): not measured ({row['error']})."
    ratio = row["speedup"]["ratio"]
    verdict = "met" if ratio >= GOAL else "not met"
    return f"Goal (latency-bound GRPO k=1 ≥ {GOAL}× the synchronous steps/s): **{verdict}**, {ratio:.2f}×."


def markdown_table(rows: list[dict]) -> str:
    lines = ["| scenario | algorithm | run | s/step median (range) | speed-up | where the step goes |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    for row in rows:
        s = row["summary"]
        name = SCENARIO_NAMES.get(row["scenario"], row["scenario"])
        if s is None:
            lines.append(f"| {name} | {row['algo']} | {row['label']} | failed: {row['error']} | — | — |")
            continue
        seconds = fmt_range(s["s_per_step"], s["s_min"], s["s_max"])
        if s["repeats_done"] < len(s["repeats_s"]):
            seconds += f" [{s['repeats_done']} of {len(s['repeats_s'])} repeats]"
        up = row["speedup"]
        ratio = "1 (base)" if row["k"] == 0 and row["speedup"] is None else "—"
        if up is not None:
            ratio = fmt_range(up["ratio"], up["min"], up["max"], "×")
        lines.append(f"| {name} | {row['algo']} | {row['label']} | {seconds} | {ratio} | {where_it_goes(s)} |")
    return "\n".join(lines)


def render(results: dict) -> str:
    """The markdown page: caption, table, the bounds, the goal, the legend."""
    m, s = results["machine"], results["settings"]
    busy = max((r.get("cpu_busy_before", 0.0) for entry in results["scenarios"].values()
                for run in entry.get("runs", {}).values() for r in run["repeats"]), default=0.0)  # fmt: skip
    warning = (
        f" **Other processes used up to {100 * busy:.0f}% of the CPU just before a run: not a measurement.**"
        if busy > BUSY
        else ""
    )
    tiny = "**--tiny smoke run: timings that mean nothing.** " if results["tiny"] else ""
    latency = ", ".join(f"{algo} {fmt_s(v)} s" for algo, v in results.get("latency_s", {}).items())
    caption = (
        f"{tiny}{m['cpu']}, {m['cores']} cores, torch {m['torch']}; {s['shape_name']} ({s['params'] / 1e6:.1f}M "
        f"parameters, random weights, float32); GRPO {PROMPTS} prompts × {GROUP}, PPO {NUM_PROMPTS} prompts "
        f"({s['ppo_epochs']} epochs); {s['max_new_tokens']} new tokens; {results['steps']} steps per run, medians "
        f"after {results['warmup']} warm-up; {results['repeats']} repeat(s), the median over repeats with their range"
        f"{'; reward latency ' + latency if latency else ''}; {m['date']}. `python benchmarks/async_overlap.py"
        f"{' --tiny' if results['tiny'] else ''}`; notes in benchmarks/README.md.{warning}"
    )
    rows = table_rows(results)
    parts = [caption, "", markdown_table(rows), ""]
    for algo, bound in bounds(results).items():
        text = f"{algo}: the most k=1 can win here is {bound['compute']:.2f}× (compute-bound)"
        if "latency" in bound:
            text += f", {bound['latency']:.2f}× (latency-bound)"
        parts.append(
            f"- {text}: the synchronous step on {results['threads']} threads over the longer of the sampling side "
            f"and the learning side of the synchronous loop on {max(1, results['threads'] - 1)} (k=0's phases)."
        )
    goal = goal_line(rows)
    if goal:
        parts.append(f"- {goal}")
    return "\n".join(parts).rstrip() + "\n" + LEGEND


LEGEND = """
Columns: **s/step** per repeat the median `time/step_s` of the steps after warm-up, then the median over repeats
with their min–max; **speed-up** the k=0 run on every core's median s/step ÷ this run's (its steps/s over the
synchronous loop's; the fewer-thread k=0 row is the loop's thread scaling), in brackets the min–max of the per-repeat
ratios (repeat i against repeat i); **where the step goes** the median seconds of each phase of the median repeat
as shares of its step: at k=0 `sample` (`time/rollout_s`: sampling without the reward), `reward` (`time/score_s`),
`logprobs` (`time/logprobs_s`, the no-grad pass), `train` (`time/train_s`), `other` (the rest of the step); at
k=1 `wait` (`time/rollout_s`: the trainer's wait for the worker's batch), then the worker's reward seconds and its
wait for the weights (`time/producer_idle_s`), which are not part of the trainer's step.
"""


# -------------------------------------------------------------------------------------------------------------------
# Assets: a tokenizer, the policies (random weights at the shape) and the prompts, built once per recipe
# -------------------------------------------------------------------------------------------------------------------


def log(message: str) -> None:
    print(f"[async_overlap] {message}", file=sys.stderr, flush=True)


def eos_target(max_new_tokens: int) -> float:
    """The long-tail policy's per-token EOS probability: turns of about max_new_tokens / 8 tokens (so a turn rarely
    reaches max_new_tokens, which would end its episode), at most 0.4."""
    return min(0.4, 8 / max_new_tokens)


def bias_eos(model: Any, eos: int, target: float, shift: float = EOS_SHIFT) -> dict[str, float]:
    """Make ``model`` (tied embeddings, random weights) end a turn with probability ``target`` per token: dimension 0
    of every embedding row gets ``shift`` (every logit gains the same h₀·shift: no change), the EOS row ``delta``
    more (EOS's logit gains h₀·delta), ``delta`` solved on the logits of random token ids (bisection). Returns delta
    and the EOS probability measured afterwards."""
    import torch

    weight = model.get_input_embeddings().weight
    captured = {}
    hook = model.model.norm.register_forward_hook(lambda module, args, out: captured.update(h=out))
    ids = torch.randint(0, weight.shape[0], (4, 48), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        weight[:, 0] += shift
        logits = model(ids).logits.float()
        h0 = captured["h"][..., 0].float()
        others = torch.cat([logits[..., :eos], logits[..., eos + 1 :]], dim=-1).logsumexp(-1)

        def probability(delta: float) -> float:
            return torch.sigmoid(logits[..., eos] + delta * h0 - others).mean().item()

        low, high = 0.0, 1.0
        while probability(high) < target and high < 1e4:
            high *= 2
        for _ in range(60):
            middle = (low + high) / 2
            low, high = (middle, high) if probability(middle) < target else (low, middle)
        delta = (low + high) / 2
        weight[eos, 0] += delta
        measured = torch.softmax(model(ids).logits.float(), -1)[..., eos].mean().item()
    hook.remove()
    return {"shift": shift, "delta": delta, "target": target, "measured": measured}


def build_assets(work: Path, tiny: bool, max_new_tokens: int) -> dict:
    """``work/assets.json``: the policy directories (plain; EOS-biased for the long tail), the prompts files and the
    parameter count; rebuilt only when the recipe changed. The tokenizer is rlhf's tiny byte-level BPE
    (``rlhf.models.tiny.train_tokenizer``, 398 tokens, with its chat template: EOS ends a turn); the models' vocabulary
    stays the shape's (49152), as a real checkpoint's may be larger than its tokenizer."""
    shape = TINY if tiny else SMOLLM2_135M
    recipe = {"format": 2, "shape": shape, "eos_target": eos_target(max_new_tokens), "seed": 0,
              "prompts": NUM_PROMPTS, "turns": [SHORT_TURNS, LONG_TURNS, LONG_EVERY]}  # fmt: skip
    path = work / "assets.json"
    if path.exists():
        old = json.loads(path.read_text())
        if old.get("recipe") == recipe and all(Path(old[key]).is_dir() for key in ("policy", "policy_eos")):
            return old
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from rlhf.models.tiny import toy_corpus, train_tokenizer

    log(f"building the {'tiny' if tiny else 'SmolLM2-135M'}-shaped policies into {work}")
    work.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tokenizer(toy_corpus(2000), vocab_size=512)
    ids = {"pad_token_id": tokenizer.pad_token_id, "bos_token_id": tokenizer.bos_token_id,
           "eos_token_id": tokenizer.eos_token_id}  # fmt: skip
    config = LlamaConfig(**shape, **ids)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = LlamaForCausalLM(config).eval()
    params = sum(p.numel() for p in model.parameters())
    for name in ("policy", "policy_eos"):
        if name == "policy_eos":
            eos = bias_eos(model, tokenizer.eos_token_id, recipe["eos_target"])
            log(f"long-tail policy: EOS per token {eos['measured']:.3f} (target {eos['target']:.3f})")
        model.save_pretrained(work / name)
        tokenizer.save_pretrained(work / name)
    lines = list(dict.fromkeys(toy_corpus(400, seed=1)))[:NUM_PROMPTS]
    if len(lines) < NUM_PROMPTS:
        raise RuntimeError(f"only {len(lines)} distinct toy prompts; {NUM_PROMPTS} needed")
    (work / "prompts.jsonl").write_text("".join(json.dumps({"prompt": line}) + "\n" for line in lines))
    # one held-out prompt (data.eval), answered before the first step and after the last, outside the timed steps:
    # without data.eval rlhf would hold out a tenth of the training rows
    (work / "eval.jsonl").write_text(json.dumps({"prompt": lines[0], "turns": SHORT_TURNS}) + "\n")
    long_tail = {}
    for algo, rows in (("grpo", PROMPTS), ("ppo", NUM_PROMPTS)):
        # exactly one batch of rows: every step's batch is the whole file, one row in LONG_EVERY long
        file = work / f"long_tail_{algo}.jsonl"
        turns = [LONG_TURNS if i % LONG_EVERY == LONG_EVERY - 1 else SHORT_TURNS for i in range(rows)]
        file.write_text("".join(json.dumps({"prompt": lines[i], "turns": t}) + "\n" for i, t in enumerate(turns)))
        long_tail[algo] = str(file)
    manifest = {"recipe": recipe, "policy": str(work / "policy"), "policy_eos": str(work / "policy_eos"),
                "prompts": str(work / "prompts.jsonl"), "eval": str(work / "eval.jsonl"), "long_tail": long_tail,
                "params": params, "tokenizer_size": len(tokenizer), "eos_bias": eos}  # fmt: skip
    path.write_text(json.dumps(manifest, indent=1))
    return manifest


# -------------------------------------------------------------------------------------------------------------------
# Runs
# -------------------------------------------------------------------------------------------------------------------


def run_config(run: Run, assets: dict, out_dir: Path, settings: dict) -> dict:
    """The run's config (rlhf's sections): the scenario's reward, the plain policy (EOS-biased for the long tail),
    GRPO 8 prompts × 8 or PPO 64 prompts, k = 0 as the synchronous default (no importance weights) or k = 1 with
    token-level importance weights (required) and a 1-thread worker."""
    long_tail = run.scenario == "long_tail"
    reward = {"compute": f"{SCRIPT}:local_reward", "calibration": f"{SCRIPT}:local_reward",
              "latency": f"{SCRIPT}:http_reward", "long_tail": "environment"}  # fmt: skip
    sampling: dict[str, Any] = {"max_new_tokens": settings["max_new_tokens"], "temperature": 1.0}
    if run.k > 0:
        sampling |= {"max_staleness": run.k, "is_correction": "token", "worker_threads": 1}
    if run.algo == "grpo":
        algorithm = {"steps": settings["steps"], "group_size": GROUP}
        size = PROMPTS
    else:
        algorithm = {"steps": settings["steps"], "epochs": settings["ppo_epochs"]}
        size = NUM_PROMPTS
    config = {
        "output_dir": str(out_dir),
        "model": {"name": assets["policy_eos" if long_tail else "policy"]},
        "data": {"train": assets["long_tail"][run.algo] if long_tail else assets["prompts"], "eval": assets["eval"]},
        "reward": {"source": reward[run.scenario]},
        "sampling": sampling,
        "batch": {"size": size, "micro_size": settings["micro_size"]},
        "run": {"seed": 0, "eval_every": 0, "save_every": 0, "progress": False, "overwrite": True,
                "report_to": ["jsonl"]},
        run.algo: algorithm,
    }  # fmt: skip
    if long_tail:
        # room for the long episodes (8 turns of about max_new_tokens / 8 tokens and the replies) without planning
        # memory for rollout.max_episode_tokens' default (2 × 8 × max_new_tokens); micro-batches by tokens, as rows
        # of very different lengths want
        tokens = LONG_TURNS * (settings["max_new_tokens"] // 2 + 16)
        config["rollout"] = {"environment": f"{SCRIPT}:LongTail", "max_turns": LONG_TURNS, "max_episode_tokens": tokens}
        if settings["micro_size"]:
            config["batch"]["micro_tokens"] = settings["micro_size"] * (settings["max_new_tokens"] + 32)
    return config


def cpu_busy(seconds: float) -> float:
    """Share of all cores' time spent busy over the next ``seconds`` (/proc/stat), while this process waits."""

    def sample() -> tuple[int, int]:
        ticks = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
        return ticks[3] + ticks[4], sum(ticks)

    try:
        idle0, total0 = sample()
        time.sleep(seconds)
        idle1, total1 = sample()
    except OSError:
        return 0.0
    return 1 - (idle1 - idle0) / max(1, total1 - total0)


def execute(run: Run, config: dict, folder: Path, threads: int, timeout: float, env: dict) -> dict:
    """``python -m rlhf <algo> --config`` in ``folder`` (its own session, so a timeout ends its sampling worker too);
    the run's metrics rows, exit code and seconds, or an error with the log's tail."""
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    config_path = folder / "config.yaml"
    config_path.write_text(json.dumps(config, indent=1))  # JSON is YAML
    env = {**os.environ, **env, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
           "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "WANDB_MODE": "disabled"}  # fmt: skip
    if not rlhf_importable():
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE.parent / "src"), env.get("PYTHONPATH")]))
    command = [sys.executable, "-m", "rlhf", run.algo, "--config", str(config_path)]
    result = run_in_session(command, env, folder / "log.txt", timeout)
    metrics = folder / "out" / "metrics.jsonl"
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()] if metrics.exists() else []
    return result | {"rows": rows}


def run_in_session(
    command: list[str], env: dict[str, str], logfile: Path, timeout: float, preexec: Any = None
) -> dict[str, Any]:
    """``command`` in its own session (run over ``timeout``, or this script stopped, it is killed with its sampling
    worker), its output into ``logfile`` after the command line: ``exit_code`` (None: timed out) and ``wall_s``,
    with ``error`` (the log's last lines) when it failed. ``preexec``: run in the child before the command."""
    start = time.perf_counter()
    with logfile.open("w") as out:
        out.write("$ " + " ".join(command) + "\n")
        out.flush()
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True,
                                   preexec_fn=preexec)  # fmt: skip
        try:
            code = process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)  # the trainer and its sampling worker
            process.wait()
            code = None
        except BaseException:  # this script stopped (Ctrl-C, SIGTERM): its run, in a session of its own, goes too
            os.killpg(process.pid, signal.SIGKILL)
            raise
    result: dict[str, Any] = {"exit_code": code, "wall_s": time.perf_counter() - start}
    if code != 0:
        tail = " ".join(logfile.read_text(errors="replace").strip().splitlines()[-6:])
        what = f"timed out after {timeout:.0f} s" if code is None else f"exit code {code}"
        result["error"] = f"{what}: {tail[-900:]} (log: {logfile})"
    return result


def rlhf_importable() -> bool:
    import importlib.util

    return importlib.util.find_spec("rlhf") is not None


def machine_info(threads: int) -> dict:
    import torch
    import transformers

    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())  # fmt: skip
    return {"cpu": cpu, "cores": os.cpu_count(), "threads": threads, "torch": torch.__version__,
            "transformers": transformers.__version__, "python": platform.python_version(),
            "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")}  # fmt: skip


def write(results: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "async_overlap.json").write_text(json.dumps(results, indent=1) + "\n")
    (out / "async_overlap.md").write_text("# Asynchronous RL: k = 1 against k = 0\n\n" + render(results))


def latency_from(results: dict, algo: str) -> float | None:
    """The sampling time of a synchronous step of ``algo`` (the median ``time/rollout_s`` of the compute scenario's k = 0
    run on every core, or of the calibration run), None if neither ran."""
    for scenario in ("compute", "calibration"):
        run = results["scenarios"].get(scenario, {}).get("runs", {}).get(f"{scenario}/{algo}/k0")
        combined = run and combine([r.get("summary") for r in run["repeats"]])
        if combined:
            return combined["rollout_s"]
    return None


def run_scenario(scenario: str, args: argparse.Namespace, assets: dict, results: dict, server: RewardServer | None,
                 work: Path) -> None:  # fmt: skip
    """Every run of ``scenario`` × ``--repeats``, in :func:`repeat_order`; the results written after each run."""
    entry: dict[str, Any] = {"status": "ran", "runs": {}}
    results["scenarios"][scenario] = entry
    runs = scenario_runs("compute" if scenario == "calibration" else scenario, args.algorithms, args.threads)
    if scenario == "calibration":  # one k = 0 run per algorithm, for the reward server's latency
        runs = [Run("calibration", r.algo, 0) for r in runs if r.k == 0 and r.threads is None]
    repeats = 1 if scenario == "calibration" else args.repeats
    for run in runs:
        entry["runs"][run.key] = {"scenario": run.scenario, "algo": run.algo, "k": run.k, "threads": run.threads,
                                  "repeats": []}  # fmt: skip
    for repeat in range(repeats):
        for run in repeat_order(runs, repeat):
            threads = run.threads or args.threads
            folder = work / "runs" / f"{run.key.replace('/', '-')}-r{repeat}"
            settings = args.settings
            if scenario == "calibration":  # enough steps for one after the warm-up
                settings = settings | {"steps": min(settings["steps"], results["warmup"] + 1)}
            config = run_config(run, assets, folder / "out", settings)
            env: dict[str, str] = {}
            latency = None
            if scenario == "latency":
                latency = results["latency_s"][run.algo]
                env[URL_ENV] = server.url(latency)
            busy = cpu_busy(0.2 if args.tiny else 1.0)
            log(f"{run.key} ({threads} threads, repeat {repeat + 1}/{repeats}, busy {100 * busy:.0f}%)")
            served = server.served() if server else 0
            raw = execute(run, config, folder, threads, args.timeout, env)
            record: dict[str, Any] = {"repeat": repeat, "cpu_busy_before": busy, "threads": threads,
                                      "config": config, **raw}  # fmt: skip
            if latency is not None:
                record |= {"latency_s": latency, "requests_served": server.served() - served}
            if "error" not in raw:
                try:
                    record["summary"] = summarize(raw["rows"], run.k, results["warmup"])
                except ValueError as error:
                    record["error"] = f"{error} (log: {folder / 'log.txt'})"
            if "summary" in record:
                s = record["summary"]
                log(f"  {fmt_s(s['step_s'])} s/step: {where_it_goes(s)} (run {raw['wall_s']:.0f} s)")
            else:
                log(f"  failed: {record['error']}")
            entry["runs"][run.key]["repeats"].append(record)
            write(results, args.out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiny", action="store_true", help="a ~1M-parameter model, 2 steps, 8 new tokens, 1 repeat")
    parser.add_argument("--only", help=f"comma-separated scenarios out of {','.join(SCENARIOS)}")
    parser.add_argument("--algorithms", default="grpo,ppo", help="comma-separated: grpo, ppo")
    parser.add_argument("--steps", type=int, help="steps per run (default 5; --tiny 2)")
    parser.add_argument("--repeats", type=int, help="rounds of every run (default 2; --tiny 1)")
    parser.add_argument("--max-new-tokens", type=int, help="tokens per completion (default 128; --tiny 8)")
    parser.add_argument("--ppo-epochs", type=int, default=4, help="PPO epochs per batch (rlhf's default 4)")
    parser.add_argument("--micro-size", type=int, help="batch.micro_size (default 16; --tiny: the whole batch)")
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="torch threads of a k=0 run (all cores)")
    parser.add_argument(
        "--latency", default="auto", help="seconds the reward server waits; auto = a k=0 step's sampling time"
    )
    parser.add_argument("--timeout", type=float, help="seconds a run may take (default 7200; --tiny 300)")
    parser.add_argument("--out", type=Path, help="where the results go (default benchmarks/results; --tiny: .work)")
    args = parser.parse_args(argv)
    scenarios = args.only.replace("-", "_").split(",") if args.only else list(SCENARIOS)
    unknown = [s for s in scenarios if s not in SCENARIOS]
    args.algorithms = args.algorithms.split(",")
    unknown += [a for a in args.algorithms if a not in ALGORITHMS]
    if unknown:
        parser.error(f"unknown {', '.join(unknown)}; scenarios: {', '.join(SCENARIOS)}; algorithms: grpo, ppo")
    args.steps = args.steps or (2 if args.tiny else 5)
    args.repeats = args.repeats or (1 if args.tiny else 2)
    args.timeout = args.timeout or (300 if args.tiny else 7200)
    max_new_tokens = args.max_new_tokens or (8 if args.tiny else 128)
    micro = args.micro_size if args.micro_size is not None else (None if args.tiny else 16)
    if args.steps < 1 or args.repeats < 1 or args.threads < 1:
        parser.error("--steps, --repeats and --threads must be at least 1")
    work = WORK / ("tiny" if args.tiny else "full")
    args.out = args.out or (work if args.tiny else RESULTS)
    args.settings = {"steps": args.steps, "max_new_tokens": max_new_tokens, "micro_size": micro,
                     "ppo_epochs": args.ppo_epochs}  # fmt: skip

    assets = build_assets(work, args.tiny, max_new_tokens)
    results: dict[str, Any] = {
        "format": FORMAT, "tiny": args.tiny, "machine": machine_info(args.threads), "threads": args.threads,
        "steps": args.steps, "repeats": args.repeats, "warmup": warmup_steps(args.steps),
        "settings": args.settings | {"shape_name": "tiny Llama" if args.tiny else "SmolLM2-135M's shape",
                                     "shape": TINY if args.tiny else SMOLLM2_135M, "params": assets["params"],
                                     "tokenizer": f"rlhf.models.tiny.train_tokenizer ({assets['tokenizer_size']} "
                                                  "tokens; the model's vocabulary stays the shape's)",
                                     "grpo": {"prompts": PROMPTS, "group_size": GROUP},
                                     "ppo": {"prompts": NUM_PROMPTS, "epochs": args.ppo_epochs},
                                     "long_tail": {"short_turns": SHORT_TURNS, "long_turns": LONG_TURNS,
                                                   "long_every": LONG_EVERY, "eos_bias": assets["eos_bias"]}},
        "scenarios": {}, "latency_s": {},
    }  # fmt: skip
    start = time.perf_counter()
    server = RewardServer() if "latency" in scenarios else None
    try:
        for scenario in scenarios:
            if scenario == "latency":
                if args.latency == "auto" and any(latency_from(results, a) is None for a in args.algorithms):
                    run_scenario("calibration", args, assets, results, server, work)
                for algo in args.algorithms:
                    seconds = float(args.latency) if args.latency != "auto" else latency_from(results, algo)
                    if seconds is None:
                        log(f"no k=0 sampling time measured for {algo}; latency 1 s")
                    results["latency_s"][algo] = seconds if seconds is not None else 1.0
                log(f"reward latency: {results['latency_s']}")
            run_scenario(scenario, args, assets, results, server, work)
    finally:
        if server:
            server.close()
    results["wall_s"] = time.perf_counter() - start
    write(results, args.out)
    print(render(results))
    log(f"{results['wall_s']:.0f} s in all; results in {args.out}")
    failed = [row["key"] for row in table_rows(results) if row["summary"] is None]
    if failed:
        log(f"failed runs: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
