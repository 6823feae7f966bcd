"""benchmarks/measure.py: the FLOP formula against hand-computed numbers, the summaries and the results table.

Pure functions only: nothing is installed, no model is built, no peer runs.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "measure.py"
_spec = importlib.util.spec_from_file_location("benchmarks_measure", _PATH)
measure = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(measure)


def test_step_flops_ppo_separate_critic_by_hand():
    # N_policy = 1000, N_reward = N_critic = 500, B = 2, C = 3, T = 4 (L = 7), 2 epochs, with a reference:
    # generate: 2·1000 · 2·(3 + 4 − 1)                    =  24 000
    # score:    2·(1000 old + 1000 ref + 500 value + 500 reward) · 2·7 =  84 000
    # train:    6 · 2 epochs · (1000 + 500) · 2·7          = 252 000
    flops = measure.step_flops(
        policy_params=1000, reward_params=500, critic_params=500,
        sequences=2, prompt_len=3, response_len=4, epochs=2, reference=True,
    )  # fmt: skip
    assert flops == {"generate": 24_000, "score": 84_000, "train": 252_000, "total": 360_000}


def test_step_flops_without_critic_or_reference_by_hand():
    # GRPO with β = 0 (or PPO's shared value head, whose h+1 weights are not counted), 1 pass:
    # generate 24 000 as above; score 2·(1000 old + 500 reward)·14 = 42 000; train 6·1·1000·14 = 84 000
    flops = measure.step_flops(
        policy_params=1000, reward_params=500, sequences=2, prompt_len=3, response_len=4, epochs=1,
        reference=False,
    )  # fmt: skip
    assert flops == {"generate": 24_000, "score": 42_000, "train": 84_000, "total": 150_000}
    # on-policy GRPO skips the old-log-prob pass: score is the reward model alone, 2·500·14 = 14 000
    flops = measure.step_flops(
        policy_params=1000, reward_params=500, sequences=2, prompt_len=3, response_len=4, epochs=1,
        reference=False, old_logprobs=False,
    )  # fmt: skip
    assert flops["score"] == 14_000 and flops["total"] == 122_000


def test_median_skips_warmup_steps():
    assert measure.median_after_warmup([9.0, 8.0, 1.0, 3.0, 2.0]) == 2.0
    assert measure.median_after_warmup([9.0, 8.0]) == 8.5  # too few steps: keep them all
    with pytest.raises(ValueError):
        measure.median_after_warmup([])


def _step(step_s: float, tokens: float) -> dict:
    # a quarter of the step in each phase
    return {"step_s": step_s, "sequences": 16, "gen_tokens": tokens, "gen_columns": 32} | {
        f"{phase}_s": step_s / 4 for phase in measure.PHASES
    }


def test_summarize_rates_and_split():
    steps = [_step(10.0, 100), _step(10.0, 100), _step(2.0, 512), _step(2.0, 512)]
    s = measure.summarize(steps)
    assert s["s_per_step"] == 2.0
    assert s["episodes_per_s"] == 8.0  # 16 sequences / 2 s
    assert s["gen_tokens_per_s"] == 256.0  # 512 tokens / 2 s
    assert s["mean_gen_len"] == 32.0
    assert s["split"] == {phase: 0.25 for phase in measure.PHASES}
    assert s["gen_columns"] == 32
    assert s["warmup_s"] == 20.0  # the two warm-up steps together
    peer = measure.summarize([{"step_s": 4.0, "sequences": 16, "gen_tokens": 512}] * 3)
    assert "split" not in peer


def test_phase_peaks_median_over_timed_steps():
    steps = [_step(10.0, 100), _step(10.0, 100), _step(2.0, 512), _step(2.0, 512), _step(2.0, 512)]
    peaks = [{"rollout": 900.0, "train": 990.0}, {"rollout": 900.0, "train": 990.0},  # warm-up: left out
             {"rollout": 500.0, "other": 505.0, "logprobs": 510.0, "train": 560.0},
             {"rollout": 520.0, "logprobs": 530.0, "train": 580.0},  # no "other" in this step
             {"rollout": 510.0, "other": 515.0, "logprobs": 520.0, "train": 570.0}]  # fmt: skip
    s = measure.summarize(steps, phase_peaks=peaks)
    assert s["phase_peak_mb"] == {"rollout": 510.0, "other": 510.0, "logprobs": 520.0, "train": 570.0}
    assert list(s["phase_peak_mb"]) == ["rollout", "other", "logprobs", "train"]  # first-seen order
    assert "phase_peak_mb" not in measure.summarize(steps, phase_peaks=None)


def test_median_over_repeats_and_spread_by_hand():
    # three repeats of one run: 0.46, 0.43, 0.444 s/step -> median 0.444 (the third), spread 0.43–0.46
    assert measure.spread([0.46, 0.43, 0.444]) == {"median": 0.444, "min": 0.43, "max": 0.46}
    assert measure.median_index([0.46, 0.43, 0.444]) == 2
    assert measure.median_index([0.5, 0.3, 0.4, 0.6]) == 2  # even count: the faster middle one (0.4)
    repeats = [
        {"s_per_step": 0.46, "peak_rss_mb": 510.0, "episodes_per_s": 1.0},
        None,  # a repeat that failed is skipped
        {"s_per_step": 0.43, "peak_rss_mb": 530.0, "episodes_per_s": 2.0},
        {"s_per_step": 0.444, "peak_rss_mb": 500.0, "episodes_per_s": 3.0},
    ]
    s = measure.combine_repeats(repeats)
    assert (s["s_per_step"], s["s_per_step_min"], s["s_per_step_max"]) == (0.444, 0.43, 0.46)
    assert (s["peak_rss_mb"], s["peak_rss_mb_min"], s["peak_rss_mb_max"]) == (510.0, 500.0, 530.0)
    assert s["median_repeat"] == 3 and s["episodes_per_s"] == 3.0  # the other numbers: the median repeat's
    assert s["repeats"] == 3 and s["repeats_s_per_step"] == [0.46, None, 0.43, 0.444]
    assert measure.combine_repeats([None, None]) is None


def test_ratio_of_medians_and_paired_range_by_hand():
    # ours 0.5, 0.4, 0.45 s/step; TRL 0.6, 0.6, 0.72: medians 0.45 and 0.6 -> 0.6 / 0.45 = 1.333…
    # paired per repeat: 0.6/0.5 = 1.2, 0.6/0.4 = 1.5, 0.72/0.45 = 1.6 -> range 1.2–1.6
    ours = [{"s_per_step": x, "peak_rss_mb": m} for x, m in ((0.5, 400.0), (0.4, 500.0), (0.45, 450.0))]
    peer = [{"s_per_step": x, "peak_rss_mb": m} for x, m in ((0.6, 1000.0), (0.6, 800.0), (0.72, 900.0))]
    r = measure.ratios(ours, peer)
    assert r["speed"] == pytest.approx(0.6 / 0.45)
    assert r["speed_per_repeat"] == pytest.approx([1.2, 1.5, 1.6])
    assert (r["speed_min"], r["speed_max"]) == (pytest.approx(1.2), pytest.approx(1.6))
    assert r["rss"] == pytest.approx(450 / 900)  # medians 450 and 900
    assert (r["rss_min"], r["rss_max"]) == (pytest.approx(0.4), pytest.approx(0.625))  # 400/1000, 500/800
    # a repeat that failed on one side drops out of the pairs (not of that side's median)
    r = measure.ratios([ours[0], None, ours[2]], peer)
    assert r["speed_per_repeat"] == pytest.approx([1.2, 1.6])
    assert r["speed"] == pytest.approx(0.6 / 0.475)


def test_markdown_table_rows():
    ours = {"summary": {"s_per_step": 0.444, "s_per_step_min": 0.431, "s_per_step_max": 0.4601, "repeats": 3,
                        "warmup_s": 31.25, "episodes_per_s": 8.0, "gen_tokens_per_s": 256.0,
                        "mean_gen_len": 32.0, "peak_rss_mb": 500.0, "floor_fraction": 0.125,
                        "split": {"generate": 0.5, "reward": 0.05, "score": 0.15, "train": 0.3},
                        "phase_peak_mb": {"rollout": 512.4, "logprobs": 530.0, "train": 575.2}},
            "vs_peer": {"speed": 1.42, "speed_min": 1.3849, "speed_max": 1.4701, "speed_per_repeat": [1.4] * 3,
                        "rss": 0.5},
            "label": "rlhf ppo"}  # fmt: skip
    peer = {"summary": {"s_per_step": 4.0, "s_per_step_min": 4.0, "s_per_step_max": 4.0, "repeats": 3,
                        "episodes_per_s": 4.0, "gen_tokens_per_s": 128.0, "mean_gen_len": 32.0,
                        "peak_rss_mb": 1000.0}, "label": "TRL PPOTrainer"}  # fmt: skip
    quick = {"summary": {"s_per_step": 0.05, "s_per_step_min": 0.05, "s_per_step_max": 0.05, "repeats": 1,
                         "repeats_s_per_step": [None, 0.05],  # one of two repeats failed
                         "episodes_per_s": 4.0, "gen_tokens_per_s": 128.0, "mean_gen_len": 32.0,
                         "peak_rss_mb": 1000.0},
             "vs_peer": {"speed": 2.0, "speed_min": 2.0, "speed_max": 2.0, "speed_per_repeat": [2.0], "rss": 0.5},
             "label": "rlhf grpo"}  # fmt: skip
    failed = {"label": "TRL GRPOTrainer", "error": "exit code 1: ImportError | no module"}
    table = measure.markdown_table([{"name": "ppo32", "runs": [ours, peer]}, {"name": "grpo", "runs": [quick, failed]}])
    lines = table.strip().splitlines()
    assert len(lines) == 6
    assert {line.count("|") for line in lines} == {14}  # 13 columns everywhere, the failed row too
    # the spread is rounded outwards: 0.431 -> 0.43, 0.4601 -> 0.47; 1.3849 -> 1.38, 1.4701 -> 1.48
    assert lines[2] == (
        "| ppo32 | rlhf ppo | 0.444 (0.43–0.47) | 31.2 | 8.0 | 256 | 32.0 | 500 | 1.42× (1.38–1.48) | 0.50× "
        "| 50 / 5 / 15 / 30 | 12.5% | rollout 512 / logprobs 530 / train 575 |"
    )
    # no spread when every repeat gave the same number, or with one repeat
    assert lines[3] == "| ppo32 | TRL PPOTrainer | 4.000 | — | 4.0 | 128 | 32.0 | 1000 | — | — | — | — | — |"
    assert (
        lines[4]
        == "| grpo | rlhf grpo | 0.050 [1 of 2 repeats] | — | 4.0 | 128 | 32.0 | 1000 | 2.00× | 0.50× | — | — | — |"
    )
    assert lines[5].startswith("| grpo | TRL GRPOTrainer | failed: exit code 1: ImportError / no module |")


def test_old_results_format_is_refused():
    with pytest.raises(ValueError, match="re-run the benchmark"):
        measure.check_results({"repeats": 2, "cases": []})
    measure.check_results({"format": measure.RESULTS_FORMAT, "cases": []})


def test_replace_between_markers():
    text = "intro\n<!-- benchmarks:start -->\nold table\n<!-- benchmarks:end -->\noutro\n"
    assert measure.replace_between_markers(text, "new table\n") == (
        "intro\n<!-- benchmarks:start -->\nnew table\n<!-- benchmarks:end -->\noutro\n"
    )
    assert measure.replace_between_markers("no markers here\n", "table") is None
    assert measure.replace_between_markers("<!-- benchmarks:end --> <!-- benchmarks:start -->", "t") is None


def test_reusable_models_keeps_the_sizes_whose_recipe_still_matches():
    recipe = {"prompt_tokens": 10, "num_prompts": 64}
    sizes = {"3m": {"hidden_size": 256}, "25m": {"hidden_size": 512}, "110m": {"hidden_size": 768}}
    manifest = {"recipe": recipe, "models": {
        "3m": {"recipe": {"hidden_size": 256}, "policy": "p3"},
        "25m": {"recipe": {"hidden_size": 384}, "policy": "p25"},  # its dimensions changed: rebuilt
        "9m": {"recipe": {"hidden_size": 320}, "policy": "p9"},  # a size no longer listed: dropped
    }}  # fmt: skip
    assert measure.reusable_models(manifest, recipe, sizes) == {"3m": {"recipe": {"hidden_size": 256}, "policy": "p3"}}
    # other prompts: nothing is reused
    assert measure.reusable_models(manifest, {**recipe, "prompt_tokens": 12}, sizes) == {}
    assert measure.reusable_models({}, recipe, sizes) == {}
    # a manifest from before per-size recipes: each entry takes its size's dimensions from the old recipe
    old = {"recipe": {"sizes": {"3m": {"hidden_size": 256}, "25m": {"hidden_size": 512}}, **recipe},
           "models": {"3m": {"policy": "p3"}, "25m": {"policy": "p25"}}}  # fmt: skip
    assert measure.reusable_models(old, recipe, sizes) == {
        "3m": {"recipe": {"hidden_size": 256}, "policy": "p3"},
        "25m": {"recipe": {"hidden_size": 512}, "policy": "p25"},
    }


def _run_module(monkeypatch):
    """benchmarks/run.py as a module (it imports measure from its own folder; nothing heavy at import)."""
    monkeypatch.syspath_prepend(str(_PATH.parent))
    spec = importlib.util.spec_from_file_location("benchmarks_run", _PATH.parent / "run.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "benchmarks_run", module)  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_110m_cases_run_their_own_step_count(monkeypatch):
    run = _run_module(monkeypatch)
    assert run.SIZES["110m"] == {"hidden_size": 768, "num_layers": 12, "num_heads": 12}
    ppo, grpo = run.CASES["ppo32-110m"], run.CASES["grpo-110m"]
    assert (ppo.size, ppo.steps, ppo.settings, ppo.max_new_tokens) == ("110m", 6, run.PPO, 32)
    assert [r.critic for r in ppo.runs] == ["shared", "shared", "separate", None] and ppo.runs[-1].side == "trl-ppo"
    assert [r.checkpointing for r in ppo.runs] == [False, True, False, False]
    assert (grpo.size, grpo.steps, grpo.settings) == ("110m", 6, run.GRPO)
    assert [(r.side, r.checkpointing) for r in grpo.runs] == [("ours", False), ("ours", True), ("trl-grpo", False)]
    args = argparse.Namespace(steps=12, quick=False)
    assert run.case_steps(ppo, args) == 6 and run.case_steps(run.CASES["ppo32"], args) == 12
    quick = argparse.Namespace(steps=4, quick=True)
    assert run.case_steps(ppo, quick) == 4 and run.case_steps(run.CASES["ppo32"], quick) == 4


def test_floor_rate_includes_the_training_products_by_hand(monkeypatch):
    run = _run_module(monkeypatch)
    assets = {"models": {"3m": {"hidden_size": 256}, "110m": {"hidden_size": 768}}, "prompt_len": 10}
    # ppo32: 16 sequences × (10 prompt + 32 response) = 672 tokens; grpo-110m: 4 prompts × 4 answers, the same
    # 672 tokens; ppo128: 16 × 138 = 2208. The MLP is 4× the hidden size: (m, h, 4h) and (m, 4h, h).
    assert run.training_products(["ppo32", "grpo", "ppo128"], assets) == [
        (672, 256, 1024), (672, 1024, 256), (2208, 256, 1024), (2208, 1024, 256)]  # fmt: skip
    assert run.training_products(["grpo-110m"], assets) == [(672, 768, 3072), (672, 3072, 768)]


def _fake_raw(ours: bool, step_s: float) -> dict:
    steps = [{"step_s": step_s, "sequences": 16, "gen_tokens": 512} for _ in range(4)]
    if not ours:
        return {"steps": steps, "peak_rss_mb": 1000.0}
    steps = [s | {"generate_s": step_s / 2, "reward_s": 0.0, "score_s": 0.0, "train_s": step_s / 2, "gen_columns": 32}
             for s in steps]  # fmt: skip
    peaks = [{"rollout": 500.0 + step_s, "logprobs": 510.0, "train": 560.0}] * 4
    return {"steps": steps, "peak_rss_mb": 600.0, "rss_start_mb": 400.0, "phase_peaks": peaks, "planned_peak_mb": 610.0}


def test_run_case_interleaves_repeats_and_renders_from_results(monkeypatch, tmp_path):
    run = _run_module(monkeypatch)
    calls: list[str] = []
    times = {"ours": iter([0.5, 0.4, 0.45]), "trl-grpo": iter([0.6, 0.6, 0.72])}

    def fake_child(python, script, spec, folder, threads, timeout):
        side = "ours" if script == "child_ours.py" else "trl-grpo"
        calls.append(side)
        return _fake_raw(side == "ours", next(times[side]))

    monkeypatch.setattr(run, "run_child", fake_child)
    monkeypatch.setattr(run, "cpu_busy", lambda: 0.0)
    monkeypatch.setattr(run, "WORK", tmp_path / "work")
    monkeypatch.setattr(run, "RESULTS", tmp_path / "results")
    case = run.Case("grpo", "3m", 32, (run.Run("rlhf grpo", "ours"), run.Run("TRL GRPOTrainer", "trl-grpo")),
                    run.GRPO)  # fmt: skip
    model = {"policy": "p", "reward": "r", "policy_params": 1000, "reward_params": 900,
             "policy_matmul_params": 900, "reward_matmul_params": 800, "vocab_size": 100, "num_layers": 2,
             "hidden_size": 16, "num_heads": 2, "num_kv_heads": 2, "head_dim": 8}  # fmt: skip
    assets = {"models": {"3m": model}, "prompts": "prompts.jsonl", "prompt_len": 10}
    args = argparse.Namespace(steps=4, quick=False, repeats=3, threads=1, timeout=60)
    entry = run.run_case("grpo", case, assets, {"trl-grpo": ("python", {})}, args, gflops=1.0)
    assert calls == ["ours", "trl-grpo"] * 3  # interleaved
    ours, peer = entry["runs"]
    assert [r["raw"]["steps"][0]["step_s"] for r in ours["repeats"]] == [0.5, 0.4, 0.45]  # every repeat kept
    assert ours["summary"]["s_per_step"] == 0.45 and ours["summary"]["median_repeat"] == 2
    assert ours["summary"]["phase_peak_mb"] == {"rollout": 500.45, "logprobs": 510.0, "train": 560.0}
    assert ours["summary"]["rss_start_mb"] == 400.0 and ours["summary"]["planned_peak_mb"] == 610.0
    assert "planned_peak_mb" not in peer["summary"]
    assert ours["vs_peer"]["speed"] == pytest.approx(0.6 / 0.45)
    assert (ours["vs_peer"]["speed_min"], ours["vs_peer"]["speed_max"]) == (pytest.approx(1.2), pytest.approx(1.6))

    results = {"format": measure.RESULTS_FORMAT, "quick": False, "steps": 4, "repeats": 3,
               "machine": {"cpu": "CPU", "cores": 2, "threads": 1, "peak_fp32_gflops": 1.0, "torch": "2",
                           "date": "today"},
               "peers": {"trl-1.16.0": {"trl": "1.16.0", "transformers": "5"}},
               "cases": [entry | {"steps": 6}]}  # fmt: skip
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "results.json").write_text(json.dumps(results))
    readme = tmp_path / "README.md"
    readme.write_text("intro\n<!-- benchmarks:start -->\nold\n<!-- benchmarks:end -->\n")
    monkeypatch.setattr(sys, "argv", ["run.py", "--from-results", "--update-readme", str(readme)])
    assert run.main() == 0
    text = readme.read_text()
    assert "median of 3 repeats run in turn, spread min–max" in text and "4 steps per run (6 in grpo)," in text
    assert "| grpo | rlhf grpo | 0.450 (0.40–0.50) |" in text and "| 1.33× (1.20–1.60) |" in text
    assert "rollout 500 / logprobs 510 / train 560 |" in text and "old" not in text
    # the old format is refused with a clear message
    (tmp_path / "results" / "results.json").write_text(json.dumps({"repeats": 2, "cases": []}))
    with pytest.raises(SystemExit) as exit_info:
        run.main()
    assert exit_info.value.code == 2


def test_merge_replaces_the_rerun_cases_and_keeps_the_rest(monkeypatch):
    run = _run_module(monkeypatch)
    machine = {"cpu": "CPU", "cores": 2, "threads": 2, "peak_fp32_gflops": 1.0, "torch": "2", "date": "day 1"}

    def results(date: str, names: list[str], repeats: int = 3) -> dict:
        return {"format": measure.RESULTS_FORMAT, "quick": False, "steps": 6, "repeats": repeats,
                "machine": machine | {"date": date}, "peers": {"trl-1.16.0": {"trl": "1.16.0", "transformers": "5"}},
                "cases": [{"name": n, "steps": 6, "runs": [], "tag": date} for n in names]}  # fmt: skip

    old = results("day 1", ["ppo32", "grpo", "grpo-110m"])
    new = results("day 2", ["grpo-110m", "ppo32-25m"])
    for case in new["cases"]:
        case["date"] = "day 2"
    both = run.merged(old, new)
    assert [(c["name"], c["tag"]) for c in both["cases"]] == [
        ("ppo32", "day 1"),
        ("grpo", "day 1"),
        ("ppo32-25m", "day 2"),
        ("grpo-110m", "day 2"),
    ]  # CASES order; the re-run grpo-110m replaced, ppo32-25m added
    assert "day 1 (ppo32, grpo); day 2 (ppo32-25m, grpo-110m)." in run.caption(both)
    with pytest.raises(ValueError, match="other repeats"):
        run.merged(old, results("day 2", ["grpo"], repeats=1))


def test_gpu_acceptance_reports_a_failed_child_in_its_row(monkeypatch, tmp_path):
    """benchmarks/gpu_acceptance.py with faked children: our runs' phases, memory against the plan, changed_frac and
    the share of weights moved; TRL's time-out is a row of the table, not a crash (the GPU session has one shot)."""
    import torch
    from safetensors.torch import save_file

    run = _run_module(monkeypatch)
    monkeypatch.setitem(sys.modules, "run", run)  # gpu_acceptance imports run.py and measure.py by those names
    monkeypatch.setitem(sys.modules, "measure", measure)
    spec = importlib.util.spec_from_file_location("benchmarks_gpu_acceptance", _PATH.parent / "gpu_acceptance.py")
    gpu = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "benchmarks_gpu_acceptance", gpu)
    spec.loader.exec_module(gpu)
    start = tmp_path / "policy"
    start.mkdir()
    save_file({"w": torch.tensor([1.0, 2.0, 3.0, 4.0]).bfloat16()}, start / "model.safetensors")
    models = {"policy": str(start), "reward": "reward", "policy_params": 1_543_714_304, "reward_params": 494_032_768}
    monkeypatch.setattr(gpu, "build_models", lambda mode, work, timeout: models)
    monkeypatch.setattr(gpu, "has_trl", lambda: True)
    monkeypatch.setattr(run, "build_assets", lambda sizes: {"prompts": "prompts.jsonl"})
    monkeypatch.setattr(run, "WORK", tmp_path / "work")
    specs: list[dict] = []

    def fake_child(python, script, spec, folder, threads, timeout):
        specs.append(spec)
        if spec["side"] == "trl":
            return {"error": "timed out after 120 s (log: log.txt)"}
        out = Path(spec["config"]["output_dir"])
        (out / "final").mkdir(parents=True)
        save_file({"w": torch.tensor([1.0, 2.0, 3.5, 4.0])}, out / "final" / "model.safetensors")  # 1 of 4 moved
        phases = {"time/rollout_s": 1.0, "time/score_s": 0.1, "time/logprobs_s": 0.2, "time/train_s": 0.7}
        rows = [
            {"step": i + 1, "time/step_s": 2.0, **phases, "update/changed_frac": f}
            for i, f in enumerate([1, 0.97, 0.99])
        ]
        (out / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
        cuda = {"gpu": "NVIDIA H100", "max_allocated_mb": 50_000.0, "max_reserved_mb": 52_000.0}
        steps = [{"step_s": 2.0, "sequences": 64, "gen_tokens": 8192}] * 3
        return {"steps": steps, "peak_rss_mb": 3000.0, "planned_peak_mb": 45_000.0, "cuda": cuda}

    monkeypatch.setattr(run, "run_child", fake_child)
    monkeypatch.setattr(sys, "argv", ["gpu_acceptance.py", "--tiny"])
    assert gpu.main() == 1  # a run failed
    grpo, graphs, ppo, trl = specs
    assert (ppo["config"]["batch"]["micro_size"], grpo["config"]["model"]["bf16"]) == (4, True)
    assert graphs["config"]["sampling"]["cuda_graphs"] and "cuda_graphs" not in grpo["config"]["sampling"]
    assert graphs["config"]["output_dir"] != grpo["config"]["output_dir"]
    ours = grpo["config"]
    assert (trl["batch_size"], trl["group_size"], trl["max_new_tokens"], trl["steps"], trl["bf16"]) == (
        ours["batch"]["size"], ours["grpo"]["group_size"], ours["sampling"]["max_new_tokens"], ours["grpo"]["steps"], True)  # fmt: skip
    text = (tmp_path / "work" / "gpu_acceptance" / "tiny" / "gpu_acceptance.md").read_text()
    assert "NVIDIA H100, torch" in text and "policy of 1.54B parameters, reward model 494.0M" in text
    # 64 sequences and 8192 tokens in 2 s; planned 45 000 / measured 50 000 MB; changed_frac 0.97-1
    assert (
        "| rlhf grpo | 2.00 | – | 32.0 | 4,096 | 1.00 / 0.10 / 0.20 / 0.70 | 50,000 (52,000) | 45,000 | 0.90 "
        "| 0.970–1.000 | 25.0% |"
    ) in text
    assert "| TRL GRPOTrainer | **failed**: timed out after 120 s (log: log.txt) | – |" in text
    saved = json.loads((tmp_path / "work" / "gpu_acceptance" / "tiny" / "gpu_acceptance.json").read_text())
    assert saved["runs"][2]["summary"]["weights_changed"] == {"frac": 0.25, "dtype": "torch.float32"}


def test_gpu_rollout_runs_its_tiny_shape_and_writes_the_table(monkeypatch, tmp_path):
    """benchmarks/gpu_rollout.py --tiny: every engine row (the captured loop runs as is on a CPU), the floor left
    blank without a GPU, and the captured loop's agreement with the eager one."""
    spec = importlib.util.spec_from_file_location("benchmarks_gpu_rollout", _PATH.parent / "gpu_rollout.py")
    rollout = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(rollout)
    monkeypatch.setattr(rollout, "HERE", tmp_path)
    monkeypatch.setattr(sys, "argv", ["gpu_rollout.py", "--tiny", "--repeats", "1"])
    assert rollout.main() == 0
    saved = json.loads((tmp_path / ".work" / "gpu_rollout" / "gpu_rollout.json").read_text())
    assert list(saved["engines"]) == list(rollout.ENGINES) and saved["floor_ms"] is None
    assert saved["agreement"]["rows"] == 16 and saved["agreement"]["first_difference_min"] >= 0
    table = (tmp_path / ".work" / "gpu_rollout" / "gpu_rollout.md").read_text()
    assert "| lean, captured, check every 16 |" in table and "| hf (the model's forward) |" in table
