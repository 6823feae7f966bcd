"""How well the listwise LLM judge (k answers in one request, `rlhf label --mode ranking`) agrees with the pairwise
one (`--mode pairs`) on the same candidates, and how much position bias each shows, with and without both orders.

    python benchmarks/judge_agreement.py --stub --out /tmp/judge_bench             # a simulated judge, here
    python benchmarks/judge_agreement.py --url http://127.0.0.1:8000/v1 --model M --out /tmp/judge_bench

Both modes run through `rlhf label` (the library's own `run`) on one candidates file: ``--candidates FILE``, or
``--items`` rows of ``--k`` generated answers. One request cache is shared by the runs, so the one-order runs cost
nothing: their requests are the first order of the both-orders runs.

``--stub`` starts a simulated judge on 127.0.0.1 (a real HTTP server): every generated answer has a known score
(uniform in [0, 1]); the judge sees score + Gaussian noise (``--noise``, the same draw for the same request) +
a position bonus (``--bias``) and answers with the best (a pair: A or B) or the order (k answers). ``--bias-shape``
``first``: the bonus goes to the answer shown first only; ``linear``: it falls linearly from the first position to
nothing at the last (for a pair both are the same).

Reported per mode (pairs / ranking) × orders (one / both), over the implied pairs of every item (a ranking is its
k(k−1)/2 pairs):
- ``first_wins``: of the single-order decisions (each order's verdict or ranking, ties left out), the share where the
  answer shown earlier won; 50 % = no position bias;
- ``a_wins``: of the final labels' decided pairs, the share where the answer earlier in the file (shown first in
  the first order) won; the file's order is random, so 50 % = no position bias left in the labels;
- ``ties``, ``skips``: shares of the implied pairs;
- ``accuracy`` (the simulated judge only): of the decided pairs, the share that the true scores order the same way;
- agreement of ranking with pairs (same orders): of the implied pairs both decided, the share decided alike; the
  pairs one mode decided and the other tied, both tied, and skipped, counted apart.
Writes ``results.json`` and ``results.md`` under ``--out``; ``--results NAME`` copies them to
benchmarks/results/NAME.{json,md}."""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import random
import re
import shutil
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
MODES = [("pairs", True), ("pairs", False), ("ranking", True), ("ranking", False)]


def generate(path: Path, items: int, k: int, seed: int) -> dict[str, float]:
    """A candidates file of ``items`` rows of ``k`` answers; returns each answer's true score."""
    rng = random.Random(seed)
    words = ["the", "a", "cat", "dog", "sees", "runs", "small", "old", "blue", "red", "tree", "house", "over", "under"]
    scores: dict[str, float] = {}
    with path.open("w") as out:
        for n in range(items):
            answers = [f"Answer {n}.{i}: " + " ".join(rng.choices(words, k=rng.randint(3, 12))) for i in range(k)]
            scores |= {a: rng.random() for a in answers}
            out.write(json.dumps({"prompt": f"Question {n}: what does the {rng.choice(words)} do?", "completions": answers}) + "\n")  # fmt: skip
    return scores


class SimulatedJudge:
    """A judge with a known score per answer, noise and a position bonus; see the module docstring."""

    def __init__(self, scores: dict[str, float], noise: float, bias: float, shape: str):
        self.scores, self.noise, self.bias, self.shape = scores, noise, bias, shape

    def reply(self, user: str) -> str:
        rng = random.Random(hashlib.sha256(user.encode()).digest())  # temperature 0: the same request, the same draw
        if "[Answer 1]\n" in user:
            body = user[user.index("[Answer 1]\n") : user.rindex("\n\n")]
            shown = re.split(r"\n\n\[Answer \d+\]\n", body.removeprefix("[Answer 1]\n"))
        else:
            shown = list(re.search(r"\[Answer A\]\n(.*?)\n\n\[Answer B\]\n(.*?)\n\n", user, re.S).groups())
        k = len(shown)
        seen = [self.scores[a] + rng.gauss(0, self.noise) + self.bonus(p, k) for p, a in enumerate(shown)]
        order = sorted(range(k), key=lambda p: -seen[p])
        if "[Answer 1]\n" in user:
            return " > ".join(f"[{p + 1}]" for p in order)
        return "AB"[order[0]]

    def bonus(self, position: int, k: int) -> float:
        if self.shape == "first":
            return self.bias if position == 0 else 0.0
        return self.bias * (k - 1 - position) / (k - 1)


def serve(judge: SimulatedJudge) -> tuple[ThreadingHTTPServer, str]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_POST(self) -> None:  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            content = judge.reply(body["messages"][-1]["content"])
            data = json.dumps({"choices": [{"index": 0, "message": {"role": "assistant", "content": content}}]})
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data.encode())

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/v1"


def label(candidates: Path, out: Path, url: str, model: str, mode: str, both: bool, flags: list[str]) -> float:
    """One `rlhf label` run (the library's `run`); its seconds."""
    from rlhf.config import load_config
    from rlhf.labelling import run

    argv = ["--pairs", str(candidates), "--out", str(out), "--mode", mode, "--judge.source", f"openai:{url}#{model}",
            "--judge.llm.cache", str(out.parent / "cache.jsonl"), *flags]  # fmt: skip
    if not both:
        argv.append("--judge.llm.no_both_orders")
    start = time.perf_counter()
    run(load_config("label", None, argv))
    return time.perf_counter() - start


def decisions(candidates: Path, labels: Path, mode: str) -> tuple[dict, list[tuple[int, int, bool]]]:
    """(item, i, j) → ``i``, ``j``, ``tie`` or ``skip`` for every implied pair (i < j) of the labels; and the
    single-order decisions as (earlier shown, later shown, earlier won)."""
    from rlhf.data.labels import candidates_id, pair_id

    rows = [json.loads(line) for line in candidates.read_text().splitlines()]
    index = {}
    for n, row in enumerate(rows):
        answers = row["completions"]
        index[candidates_id(row["prompt"], answers)] = (n, answers)
        for i, j in itertools.combinations(range(len(answers)), 2):
            index[pair_id(row["prompt"], answers[i], answers[j])] = (n, (i, j))
    found: dict[tuple[int, int, int], str] = {}
    single: list[tuple[int, int, bool]] = []
    for row in map(json.loads, labels.read_text().splitlines()):
        if row["kind"] == "session":
            continue
        if mode == "pairs":
            n, (i, j) = index[row["pair"]]
            text = lambda answer: answer if isinstance(answer, str) else answer[0]["content"]  # noqa: E731
            won = None if row["kind"] != "preference" else i if text(row["chosen"]) == rows[n]["completions"][i] else j
            found[(n, i, j)] = row["kind"] if won is None else str(won)
            for order, verdict in row["judge"].items():  # ab: a (= i) shown first; ba: b first
                if verdict in ("a", "b"):
                    single.append((i, j, (verdict == "a") == (order == "ab")))
            continue
        n, answers = index[row["item"]]
        k = len(answers)
        rank = {}
        if row["kind"] == "ranking":
            for place, tier in enumerate(row["ranking"]):
                rank |= dict.fromkeys(tier if isinstance(tier, list) else [tier], place)
        for i, j in itertools.combinations(range(k), 2):
            if row["kind"] != "ranking":
                found[(n, i, j)] = row["kind"]
            else:
                found[(n, i, j)] = "tie" if rank[i] == rank[j] else str(i if rank[i] < rank[j] else j)
        for order in row["judge"]:
            if order["ranking"] is not None:
                place, shown = {a: p for p, a in enumerate(order["ranking"])}, order["shown"]
                single += [(x, y, place[x] < place[y]) for x, y in itertools.combinations(shown, 2)]
    return found, single


def summarize(found: dict, single: list, scores: dict[str, float] | None, candidates: Path) -> dict[str, Any]:
    rows = [json.loads(line)["completions"] for line in candidates.read_text().splitlines()]
    decided = {key: v for key, v in found.items() if v not in ("tie", "skip")}
    n = len(found)
    out: dict[str, Any] = {
        "implied_pairs": n,
        "first_wins": _share([won for _, _, won in single]),
        "single_decisions": len(single),
        "a_wins": _share([int(v) == i for (_, i, _), v in decided.items()]),
        "ties": sum(v == "tie" for v in found.values()) / n,
        "skips": sum(v == "skip" for v in found.values()) / n,
        "accuracy": None,
    }
    if scores is not None:
        truth = lambda m, i, j: i if scores[rows[m][i]] > scores[rows[m][j]] else j  # noqa: E731
        out["accuracy"] = _share([int(v) == truth(*key) for key, v in decided.items()])
    return out


def agreement(ranking: dict, pairs: dict) -> dict[str, Any]:
    both = [(ranking[key], pairs[key]) for key in ranking if key in pairs]
    decided = [(r, p) for r, p in both if "skip" not in (r, p) and "tie" not in (r, p)]
    return {
        "implied_pairs": len(both),
        "both_decided": len(decided),
        "agree": _share([r == p for r, p in decided]),
        "one_tied": sum(("tie" in (r, p)) and r != p and "skip" not in (r, p) for r, p in both),
        "both_tied": sum(r == p == "tie" for r, p in both),
        "skipped": sum("skip" in (r, p) for r, p in both),
    }


def _share(flags: list[bool]) -> float | None:
    return sum(flags) / len(flags) if flags else None


def table(result: dict[str, Any]) -> str:
    pct = lambda x: "–" if x is None else f"{100 * x:.1f} %"  # noqa: E731
    lines = [
        "| mode | orders | requests | seconds | first shown wins (single orders) | earlier-in-file wins (labels) "
        "| ties | skips | accuracy vs true scores |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for run in result["runs"]:
        lines.append(
            f"| {run['mode']} | {'both' if run['both_orders'] else 'one'} | {run['requests']} | {run['seconds']:.1f} "
            f"| {pct(run['first_wins'])} (n={run['single_decisions']}) | {pct(run['a_wins'])} | {pct(run['ties'])} "
            f"| {pct(run['skips'])} | {pct(run['accuracy'])} |"
        )
    lines += ["", "| orders | implied pairs | both decided | agree | one tied | both tied | skipped |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    for orders, a in result["agreement"].items():
        lines.append(
            f"| {orders} | {a['implied_pairs']} | {a['both_decided']} | {pct(a['agree'])} | {a['one_tied']} "
            f"| {a['both_tied']} | {a['skipped']} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="an OpenAI-compatible base URL (…/v1)")
    parser.add_argument("--model", default="judge")
    parser.add_argument("--stub", action="store_true", help="start the simulated judge here")
    parser.add_argument("--candidates", type=Path, help="a candidates file; default: generated")
    parser.add_argument("--items", type=int, default=100)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--noise", type=float, default=0.1)
    parser.add_argument("--bias", type=float, default=0.2)
    parser.add_argument("--bias-shape", choices=("first", "linear"), default="first")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--results", help="also write benchmarks/results/NAME.{json,md}")
    parser.add_argument("--flag", action="append", default=[], help="one more `rlhf label` argument (repeatable)")
    args = parser.parse_args(argv)
    if args.stub == (args.url is not None):
        parser.error("give --url or --stub")
    sys.path.insert(0, str(ROOT / "src"))
    args.out.mkdir(parents=True, exist_ok=True)
    candidates, scores = args.candidates, None
    if candidates is None:
        candidates = args.out / "candidates.jsonl"
        scores = generate(candidates, args.items, args.k, args.seed)
    server, url = (None, args.url)
    if args.stub:
        server, url = serve(SimulatedJudge(scores or {}, args.noise, args.bias, args.bias_shape))
    runs, found = [], {}
    try:
        for mode, both in MODES:
            labels = args.out / f"{mode}-{'both' if both else 'one'}.jsonl"
            labels.unlink(missing_ok=True)
            cache = args.out / "cache.jsonl"
            before = sum(1 for _ in cache.open()) if cache.exists() else 0
            seconds = label(candidates, labels, url, args.model, mode, both, ["--judge.llm.backoff", "0.5", *args.flag])
            sent = sum(1 for _ in cache.open()) - before
            rows = [json.loads(line) for line in labels.read_text().splitlines()[1:]]
            requests = sum(len(row["judge"]) for row in rows)  # what the run needed, asked now or cached
            found[(mode, both)], single = decisions(candidates, labels, mode)
            runs.append({"mode": mode, "both_orders": both, "requests": requests, "sent": sent, "seconds": seconds,
                         **summarize(found[(mode, both)], single, scores, candidates)})  # fmt: skip
    finally:
        if server is not None:
            server.shutdown()
    result = {
        "command": "python benchmarks/judge_agreement.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "judge": "simulated" if args.stub else f"{args.model} at {args.url}",
        "settings": {"items": args.items, "k": args.k, "seed": args.seed}
        | ({"noise": args.noise, "bias": args.bias, "bias_shape": args.bias_shape} if args.stub else {}),
        "runs": runs,
        "agreement": {
            "both orders": agreement(found[("ranking", True)], found[("pairs", True)]),
            "one order": agreement(found[("ranking", False)], found[("pairs", False)]),
        },
    }
    markdown = (
        f"`{result['command']}` — judge: {result['judge']}, {json.dumps(result['settings'])}\n\n{table(result)}\n"
    )
    (args.out / "results.json").write_text(json.dumps(result, indent=2) + "\n")
    (args.out / "results.md").write_text(markdown)
    if args.results:
        for ext in ("json", "md"):
            shutil.copy(args.out / f"results.{ext}", ROOT / "benchmarks" / "results" / f"{args.results}.{ext}")
    print(markdown)
    return result


if __name__ == "__main__":
    main()
