"""benchmarks/async_overlap.py: its pure helpers (summaries of metrics.jsonl rows, repeats, speed-ups, the overlap
bound, the table), its run order, and what the runs load from it (the rewards, the reward server, the environment).

Nothing is trained and no model is built; the reward server is a local socket answering at once.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "async_overlap.py"
_spec = importlib.util.spec_from_file_location("benchmarks_async_overlap", _PATH)
bench = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = bench  # its dataclass looks its module up there
_spec.loader.exec_module(bench)


def row(step: int, step_s: float, rollout: float, score: float, logprobs: float, train: float, **extra) -> dict:
    return {"step": step, "time/step_s": step_s, "time/rollout_s": rollout, "time/score_s": score,
            "time/logprobs_s": logprobs, "time/train_s": train, **extra}  # fmt: skip


def summary(step_s: float, k: int = 0, rollout: float = 0.0, score: float = 0.0, logprobs: float = 0.0,
            train: float = 0.0, other: float = 0.0, idle: float | None = None) -> dict:  # fmt: skip
    return {"k": k, "step_s": step_s, "rollout_s": rollout, "score_s": score, "logprobs_s": logprobs,
            "train_s": train, "other_s": other, "producer_idle_s": idle}  # fmt: skip


def test_warmup_steps():
    assert [bench.warmup_steps(n) for n in (1, 2, 3, 4, 5, 12)] == [0, 1, 1, 2, 2, 2]


def test_summarize_synchronous_rows_by_hand():
    # step 0 (held-out answers only) is not a training row; steps 1-2 are the warm-up; rows out of order are sorted
    rows = [
        {"step": 0, "time/eval_s": 3.0},
        row(5, 10.0, 4.0, 1.0, 0.0, 4.5, **{"response/length_mean": 128.0}),
        row(1, 50.0, 20.0, 1.0, 0.0, 20.0),
        row(2, 40.0, 20.0, 1.0, 0.0, 18.0),
        row(3, 12.0, 5.0, 1.0, 0.0, 5.0, **{"response/length_mean": 128.0}),
        row(4, 11.0, 4.0, 1.0, 0.0, 5.0, **{"response/length_mean": 127.0}),
    ]
    s = bench.summarize(rows, k=0, warmup=2)
    assert s["timed_steps"] == [3, 4, 5] and s["steps"] == 5
    assert (s["step_s"], s["rollout_s"], s["score_s"], s["train_s"]) == (11.0, 4.0, 1.0, 5.0)
    # the rest of each step at k = 0 counts the reward: 12-5-1-5 = 1, 11-4-1-5 = 1, 10-4-1-4.5 = 0.5 -> median 1
    assert s["other_s"] == 1.0
    assert s["producer_idle_s"] is None and s["staleness"] is None  # k = 0 logs neither
    assert s["length_mean"] == 128.0
    with pytest.raises(ValueError, match="no training rows"):
        bench.summarize([{"step": 0, "time/eval_s": 1.0}], k=0, warmup=2)


def test_summarize_async_rows_leave_the_workers_reward_out_of_the_step():
    # at k = 1 rollout_s is the trainer's wait; score_s (3 s) was spent in the worker, outside the trainer's step
    rows = [row(1, 30.0, 20.0, 3.0, 2.0, 8.0, **{"time/producer_idle_s": 0.0, "async/staleness": 0}),
            row(2, 11.0, 0.5, 3.0, 2.0, 8.0, **{"time/producer_idle_s": 1.5, "async/staleness": 1})]  # fmt: skip
    s = bench.summarize(rows, k=1, warmup=1)
    assert s["timed_steps"] == [2]
    assert s["other_s"] == pytest.approx(11.0 - 0.5 - 2.0 - 8.0)
    assert (s["producer_idle_s"], s["staleness"], s["score_s"]) == (1.5, 1, 3.0)
    # too few rows for the warm-up: every row counts
    assert bench.summarize(rows[:1], k=1, warmup=2)["timed_steps"] == [1]


def test_combine_repeats_median_range_and_failures():
    repeats = [summary(4.6, train=1.0), None, summary(4.3, train=2.0), summary(4.44, train=3.0)]
    c = bench.combine(repeats)
    assert (c["s_per_step"], c["s_min"], c["s_max"]) == (4.44, 4.3, 4.6)
    assert c["train_s"] == 3.0  # the other numbers: the median repeat's
    assert c["repeats_s"] == [4.6, None, 4.3, 4.44] and c["repeats_done"] == 3
    assert bench.median_index([0.5, 0.3, 0.4, 0.6]) == 2  # even count: the faster middle one
    assert bench.combine([None, None]) is None


def test_speedup_is_the_ratio_of_medians_with_paired_range():
    # k=0: 10, 12 s/step; k=1: 8, 6 s/step -> medians 11 and 7 -> 11/7; pairs 10/8 = 1.25, 12/6 = 2
    sync = [summary(10.0), summary(12.0)]
    overlapped = [summary(8.0, k=1), summary(6.0, k=1)]
    up = bench.speedup(sync, overlapped)
    assert up["ratio"] == pytest.approx(11 / 7)
    assert (up["min"], up["max"]) == (pytest.approx(1.25), pytest.approx(2.0))
    # a repeat that failed on one side leaves the pairs, not the other side's median
    up = bench.speedup(sync, [None, summary(6.0, k=1)])
    assert up["ratio"] == pytest.approx(11 / 6) and (up["min"], up["max"]) == (2.0, 2.0)
    assert bench.speedup(sync, [None, None]) is None


def test_overlap_bound_by_hand():
    # 2 threads: 30 s sampling + 1 s reward + 60 s train + 1 s other = 92 s a synchronous step
    # 1 thread: sampling side 50 + 1 = 51 s, learning side 100 + 2 = 102 s -> at best 92 / 102
    sync = summary(92.0, rollout=30.0, score=1.0, train=60.0, other=1.0)
    one = summary(153.0, rollout=50.0, score=1.0, train=100.0, other=2.0)
    assert bench.sampling_side(one) == 51.0 and bench.learning_side(one) == 102.0
    b = bench.overlap_bound(sync, one)
    assert b == {"bound": pytest.approx(92 / 102), "worker_s": 51.0, "trainer_s": 102.0}
    # a reward server's 60 s on the sampling side: the worker's side (111 s) is now the longer
    assert bench.overlap_bound(sync, one, extra_latency=60.0)["bound"] == pytest.approx(92 / 111)


def test_number_formats():
    assert [bench.fmt_s(x) for x in (123.4, 12.34, 1.234, 0.1234)] == ["123", "12.3", "1.23", "0.123"]
    assert bench.fmt_range(0.444, 0.431, 0.4601) == "0.444 (0.431–0.461)"  # the range rounded outwards
    assert bench.fmt_range(12.0, 11.96, 12.04) == "12.0 (11.9–12.1)"
    assert bench.fmt_range(1.5, 1.5, 1.5, "×") == "1.50×"  # one repeat: no range
    assert bench.fmt_range(1.42, 1.3849, 1.4701, "×") == "1.42× (1.38–1.48×)"


def test_where_the_step_goes():
    sync = summary(10.0, rollout=3.0, score=1.0, logprobs=0.0, train=5.5, other=0.5)
    assert bench.where_it_goes(sync) == "sample 30% · reward 10% · logprobs 0% · train 55% · other 5%"
    overlapped = summary(8.0, k=1, rollout=0.4, score=2.5, logprobs=2.0, train=5.4, other=0.2, idle=0.05)
    assert bench.where_it_goes(overlapped) == (
        "wait 5% · logprobs 25% · train 68% · other 2%; worker: reward 2.50 s, idle 0.050 s"
    )


def test_runs_and_their_order_alternate_between_repeats():
    runs = bench.scenario_runs("compute", ["grpo", "ppo"], threads=2)
    assert [r.key for r in runs] == ["compute/grpo/k0", "compute/grpo/k1", "compute/grpo/k0/t1",
                                     "compute/ppo/k0", "compute/ppo/k1", "compute/ppo/k0/t1"]  # fmt: skip
    assert [r.key for r in bench.scenario_runs("latency", ["grpo"], threads=2)] == [
        "latency/grpo/k0",
        "latency/grpo/k1",
    ]
    assert [r.key for r in bench.scenario_runs("compute", ["grpo"], threads=1)] == [
        "compute/grpo/k0",
        "compute/grpo/k1",
    ]
    pair = bench.scenario_runs("latency", ["grpo"], threads=2)
    orders = [[r.k for r in bench.repeat_order(pair, repeat)] for repeat in range(4)]
    assert orders == [[0, 1], [1, 0], [0, 1], [1, 0]]  # each k first as often as last
    assert bench.run_label(runs[1], 2) == "k=1, trainer 1 + worker 1 thread"
    assert (bench.run_label(runs[0], 2), bench.run_label(runs[2], 2)) == ("k=0, 2 threads", "k=0, 1 thread")


def _results(latency_k1: list[float | None]) -> dict:
    def run(scenario, algo, k, seconds, threads=None, **phases):
        repeats = [{"summary": None, "error": "exit code 1: boom"} if s is None else {"summary": summary(s, k=k, **phases)}
                   for s in seconds]  # fmt: skip
        key = f"{scenario}/{algo}/k{k}" + (f"/t{threads}" if threads else "")
        return key, {"scenario": scenario, "algo": algo, "k": k, "threads": threads, "repeats": repeats}

    compute = dict([run("compute", "grpo", 0, [92.0, 94.0], rollout=30.0, score=1.0, train=60.0, other=1.0),
                    run("compute", "grpo", 1, [100.0, 104.0], rollout=1.0, logprobs=30.0, train=68.0, other=1.0),
                    run("compute", "grpo", 0, [153.0, 155.0], threads=1, rollout=50.0, score=1.0, train=100.0,
                        other=2.0)])  # fmt: skip
    latency = dict([run("latency", "grpo", 0, [120.0, 124.0], rollout=30.0, score=31.0, train=60.0, other=1.0),
                    run("latency", "grpo", 1, latency_k1, rollout=1.0, logprobs=30.0, train=68.0, other=1.0)])  # fmt: skip
    return {"threads": 2, "tiny": False, "steps": 5, "repeats": 2, "warmup": 2, "latency_s": {"grpo": 30.0},
            "machine": {"cpu": "AMD EPYC", "cores": 2, "torch": "2.13.0+cpu", "date": "2026-11-28 12:00 UTC"},
            "settings": {"shape_name": "SmolLM2-135M's shape", "params": 134_515_008, "ppo_epochs": 4,
                         "max_new_tokens": 128},
            "scenarios": {"compute": {"status": "ran", "runs": compute},
                          "latency": {"status": "ran", "runs": latency}}}  # fmt: skip


def test_table_speedups_bounds_and_goal():
    results = _results([80.0, 90.0])
    rows = {r["key"]: r for r in bench.table_rows(results)}
    assert rows["compute/grpo/k0"]["speedup"] is None  # the base
    assert rows["compute/grpo/k1"]["speedup"]["ratio"] == pytest.approx(93 / 102)
    assert rows["compute/grpo/k0/t1"]["speedup"]["ratio"] == pytest.approx(93 / 154)  # thread scaling
    assert rows["latency/grpo/k1"]["speedup"]["ratio"] == pytest.approx(122 / 85)
    # the compute bound: 93 / max(51, 102); the latency bound: 122 / max(51 + 30, 102)
    assert bench.bounds(results) == {"grpo": {"compute": pytest.approx(93 / 102), "latency": pytest.approx(122 / 102)}}
    assert bench.goal_line(list(rows.values())).endswith("**met**, 1.44×.")
    table = bench.markdown_table(list(rows.values()))
    assert (
        "| compute-bound | grpo | k=1, trainer 1 + worker 1 thread | 102 (100–104) | 0.912× (0.903–0.920×) |" in table
    )
    assert "| compute-bound | grpo | k=0, 2 threads | 93.0 (92.0–94.0) | 1 (base) |" in table
    page = bench.render(results)
    assert "the most k=1 can win here is 0.91× (compute-bound), 1.20× (latency-bound)" in page
    assert "reward latency grpo 30.0 s" in page


def test_a_failed_run_is_a_row_and_the_goal_says_so():
    results = _results([None, 130.0])
    rows = {r["key"]: r for r in bench.table_rows(results)}
    assert rows["latency/grpo/k1"]["summary"]["repeats_done"] == 1
    assert "130 [1 of 2 repeats]" in bench.markdown_table(list(rows.values()))
    assert "**not met**, 0.94×" in bench.goal_line(list(rows.values()))
    results = _results([None, None])
    rows = list(bench.table_rows(results))
    assert "failed: exit code 1: boom" in bench.markdown_table(rows)
    assert "not measured (exit code 1: boom)" in bench.goal_line(rows)


def test_rewards_the_server_and_the_environment(monkeypatch):
    ids = [[2, 4, 5, 7], [1], []]
    assert [bench.cheap_score(x) for x in ids] == [0.5, 0.0, 0.0]
    assert bench.local_reward(["", "", ""], completion_ids=ids) == [0.5, 0.0, 0.0]
    server = bench.RewardServer()
    try:
        monkeypatch.setitem(os.environ, bench.URL_ENV, server.url(0.0))
        assert bench.http_reward(["", "", ""], completion_ids=ids) == [0.5, 0.0, 0.0]
        assert server.served() == 1 and server.requests[0]["rows"] == 3
    finally:
        server.close()
    env = bench.LongTail()
    assert env.reset({"prompt": "hello", "turns": 3}) == [{"role": "user", "content": "hello"}]
    assert env.step({"role": "assistant", "content": "ab"}) == ([{"role": "user", "content": "go on"}], None, False)
    assert env.step({"role": "assistant", "content": "cde"})[2] is False
    assert env.step({"role": "assistant", "content": ""}) == ([], None, True)  # the third turn ends it
    assert env.get_reward() == pytest.approx(0.05)


def test_rlhf_accepts_every_runs_config(tmp_path):
    """The configs of every scenario, algorithm and k load (nothing is opened: the paths do not exist)."""
    from rlhf.config import config_from_dict

    missing = str(tmp_path / "missing")
    assets = {"policy": missing, "policy_eos": missing, "prompts": missing, "eval": missing,
              "long_tail": {"grpo": missing, "ppo": missing}}  # fmt: skip
    settings = {"steps": 5, "max_new_tokens": 128, "micro_size": 16, "ppo_epochs": 4}
    for scenario in ("compute", "latency", "long_tail"):
        for algo in ("grpo", "ppo"):
            for k in (0, 1):
                config_from_dict(
                    algo, bench.run_config(bench.Run(scenario, algo, k), assets, tmp_path / "out", settings)
                )
    grpo = bench.run_config(bench.Run("compute", "grpo", 1), assets, tmp_path / "out", settings)
    assert (grpo["batch"]["size"], grpo["grpo"]["group_size"], grpo["sampling"]["is_correction"]) == (8, 8, "token")
    ppo = bench.run_config(bench.Run("long_tail", "ppo", 0), assets, tmp_path / "out", settings)
    assert ppo["batch"]["size"] == 64 and "max_staleness" not in ppo["sampling"]  # k = 0: the synchronous default
    assert ppo["rollout"]["max_turns"] == 8 and ppo["reward"]["source"] == "environment"
