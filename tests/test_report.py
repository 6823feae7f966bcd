"""`rlhf report RUN_DIR`: the plot math against hand-computed numbers, and real ppo/grpo runs turned into
self-contained pages (every image embedded, every text escaped, refusals as clean errors)."""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path

import pytest

from configs import nested
from rlhf import cli, report
from rlhf.config import config_from_dict
from rlhf.models.tiny import toy_corpus
from rlhf.report import charts, pages, runs

REWARDS = Path(__file__).resolve().parent / "trainers" / "ppo_rewards.py"
HOSTILE = "what is <script>alert(1)</script> & co"


# ---------------------------------------------------------------------------------------------------------------
# Pure pieces
# ---------------------------------------------------------------------------------------------------------------


def test_rolling_mean_is_centred_and_shrinks_at_the_ends():
    assert charts.rolling_mean([1.0, 2.0, 6.0, 3.0, 8.0], 3) == [1.5, 3.0, 11 / 3, 17 / 3, 5.5]
    assert charts.rolling_mean([4.0, 5.0], 1) == [4.0, 5.0]


def test_smoothing_window_is_odd_and_grows_with_the_run():
    assert [charts.smoothing_window(n) for n in (1, 14, 15, 30, 45, 100)] == [1, 1, 1, 3, 3, 7]


def test_reward_gain_is_in_units_of_the_first_std():
    # means 2, 3, 1.5 with first-step std 0.5: gains 0, (3−2)/0.5 = 2, (1.5−2)/0.5 = −1
    assert charts.reward_gain([2.0, 3.0, 1.5], 0.5) == [0.0, 2.0, -1.0]
    # a constant first batch (std 0) or a missing std falls back to the reward's own units
    assert charts.reward_gain([2.0, 3.0], 0.0) == [0.0, 1.0]
    assert charts.reward_gain([2.0, 3.0], float("nan")) == [0.0, 1.0]


def test_binned_means_group_points_by_x():
    xs = [5.0, 1.0, 3.0, 2.0, 4.0]
    ys = [50.0, 10.0, 30.0, 20.0, 40.0]
    # sorted by x: (1,10) (2,20) (3,30) (4,40) (5,50); 2 bins of 3 and 2 points
    assert charts.binned_means(xs, ys, 2) == ([2.0, 4.5], [20.0, 45.0])
    assert charts.binned_means(xs[:1], ys[:1], 3) == ([5.0], [50.0])  # fewer points than bins


def test_first_last_averages_the_ends():
    assert charts.first_last([1.0, 2.0, 3.0, 4.0, 5.0, 6.0], k=2) == (1.5, 5.5)
    assert charts.first_last([7.0], k=5) == (7.0, 7.0)
    assert charts.first_last([1.0, 3.0, 5.0], k=5) == (1.0, 5.0)  # never overlapping halves


def test_fmt_and_esc():
    assert pages.fmt(0.123456) == "0.123" and pages.fmt(12) == "12" and pages.fmt(None) == "—"
    assert pages.fmt(float("nan")) == "—"
    assert pages.fmt_seconds(167.4) == "167 s" and pages.fmt_seconds(2.23) == "2.2 s"
    assert pages.esc("<a & b>") == "&lt;a &amp; b&gt;"


# ---------------------------------------------------------------------------------------------------------------
# Real runs
# ---------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def prompts_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("report_prompts") / "prompts.jsonl"
    rows = [{"prompt": " ".join(line.split()[:3])} for line in toy_corpus(24, seed=3)]
    rows.insert(0, {"prompt": HOSTILE})  # must reach the page escaped
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def _run(command: str, policy: Path, prompts: Path, out: Path, **overrides: object) -> Path:
    from rlhf.trainers.rl import grpo, ppo

    values = {
        "model.name": str(policy),
        "reward.source": [
            {"source": f"{REWARDS}:length_chars", "name": "length"},
            {"source": f"{REWARDS}:digit_count", "name": "digits", "weight": 0.0},
        ],
        "data.train": str(prompts), "data.eval": str(prompts), "output_dir": str(out),
        f"{command}.steps": 4, "batch.size": 4, "sampling.max_new_tokens": 6, "sampling.temperature": 1.0, "optim.learning_rate": 1e-3,
        "kl.coef": 0.1, "run.eval_every": 2, "run.save_every": 0, "run.progress": False,
    }  # fmt: skip
    config = config_from_dict(command, nested(values | overrides))
    (ppo if command == "ppo" else grpo).run(config)
    return out


def _images(page: str) -> list[bytes]:
    return [base64.b64decode(b64) for b64 in re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)]


@pytest.fixture(scope="module")
def ppo_run(tiny_llama_dir: Path, prompts_file: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _run("ppo", tiny_llama_dir, prompts_file, tmp_path_factory.mktemp("ppo_run"), **{"ppo.num_minibatches": 2})


def test_ppo_report_is_self_contained_and_complete(ppo_run: Path):
    assert cli.main(["report", str(ppo_run)]) == 0
    page = (ppo_run / "report.html").read_text()
    images = _images(page)
    assert images and all(png.startswith(b"\x89PNG\r\n\x1a\n") for png in images)
    assert not re.search(r'(src|href)="(https?:)?//', page)  # nothing fetched from the network
    # (no response-length chart: a random model never stops early, every length is max_new_tokens — a flat line)
    for title in ("Reward (training batch)", "Held-out reward", "KL to the reference", "Entropy", "Clip fraction",
                  "Value loss", "Reward source 'length'", "Reward source 'digits'", "Reward against KL"):  # fmt: skip
        assert f'alt="{pages.esc(title)}"' in page, title
    assert "Held-out samples (step 0 and step 4)" in page  # before training and after it
    assert "monitor (weight 0)" in page  # the weight-0 source is labelled as never optimised
    assert "<script>" not in page and pages.esc(HOSTILE) in page
    assert pages.esc((ppo_run / "config.yaml").read_text()) in page
    last = [json.loads(line) for line in (ppo_run / "samples" / "step_000004.jsonl").read_text().splitlines()]
    for row in last[:12]:
        assert pages.esc(row["completion"]) in page


def test_output_flag_writes_elsewhere(ppo_run: Path, tmp_path: Path):
    target = tmp_path / "nested" / "page.html"
    assert cli.main(["report", str(ppo_run), "--output", str(target), "--max_samples", "2"]) == 0
    page = target.read_text()
    assert page.count("<tr>") == 1 + 2  # the samples table: header + 2 prompts


def test_grpo_report_uses_its_own_metrics(tiny_llama_dir: Path, prompts_file: Path, tmp_path: Path):
    out = _run("grpo", tiny_llama_dir, prompts_file, tmp_path / "grpo", **{"batch.size": 2, "grpo.group_size": 4})
    page = report.build(out)
    assert "rlhf grpo report" in page
    assert 'alt="KL to the reference"' in page and 'alt="Reward against KL"' in page
    assert "Value loss" not in page  # no critic, no chart
    assert 'alt="KL coefficient β"' not in page  # a fixed β is a flat line: not drawn
    assert len(_images(page)) >= 8


def test_run_loading_reads_weights_and_series(ppo_run: Path):
    run = runs.load_run(ppo_run)
    assert run.command == "ppo" and run.reward_weights() == {"length": 1.0, "digits": 0.0}
    steps, values = run.series("eval/reward/mean")
    assert steps == [0, 2, 4] and len(values) == 3  # step 0: the held-out answers before training
    assert sorted(run.samples) == [0, 2, 4]


def test_refuses_what_it_cannot_read(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    assert cli.main(["report", str(tmp_path / "missing")]) == 2
    assert "not a directory" in capsys.readouterr().err
    assert cli.main(["report", str(tmp_path)]) == 2
    assert "metrics.jsonl does not exist" in capsys.readouterr().err
    sft = tmp_path / "sft"
    sft.mkdir()
    (sft / "config.yaml").write_text("# rlhf sft: resolved config (defaults < --config file < command line)\n")
    (sft / "metrics.jsonl").write_text('{"step": 1, "train/loss": 1.0}\n')
    assert cli.main(["report", str(sft)]) == 2
    assert "reads ppo and grpo runs" in capsys.readouterr().err


def test_a_run_still_writing_gets_a_report(ppo_run: Path, tmp_path: Path):
    """A run killed (or still running) mid-line: the cut-off last metrics line is left out, the rest is drawn."""
    import shutil

    run = tmp_path / "partial"
    shutil.copytree(ppo_run, run, ignore=shutil.ignore_patterns("report.html"))
    lines = (run / "metrics.jsonl").read_text().splitlines()
    (run / "metrics.jsonl").write_text("\n".join(lines[:-1]) + "\n" + lines[-1][: len(lines[-1]) // 2])
    assert len(runs.load_run(run).rows) == len(lines) - 1
    assert "Training curves" in report.build(run)
    broken = lines[:1] + ["{not json"] + lines[1:]
    (run / "metrics.jsonl").write_text("\n".join(broken) + "\n")
    with pytest.raises(ValueError, match=r"metrics.jsonl:2: not a JSON line"):
        runs.load_run(run)
    assert cli.main(["report", str(run)]) == 2  # a clean error line, no traceback


# ---------------------------------------------------------------------------------------------------------------
# Health: the training doctor's findings in the report
# ---------------------------------------------------------------------------------------------------------------

DOCTOR_FIXTURES = Path(__file__).resolve().parent / "doctor" / "fixtures"


def test_the_health_section_names_reward_hacking_and_shades_its_steps(monkeypatch):
    run = runs.load_run(DOCTOR_FIXTURES / "seed0_ppo_no_kl")
    spans: list[tuple[float, float, str]] = []
    original = charts._mark_findings

    def recording(ax, drawn, multiple):
        before = len(ax.patches)
        marked = original(ax, drawn, multiple)
        spans.extend((p.get_x(), p.get_x() + p.get_width(), str(p.get_label())) for p in ax.patches[before:])
        return marked

    monkeypatch.setattr(charts, "_mark_findings", recording)
    page = pages.run_report(run, max_samples=2)
    health = page.split("<h2>Health</h2>")[1].split("<h2>")[0]
    assert "<code>over_optimisation</code>" in health and "<td>29–60</td>" in health
    assert "reward/gold/mean fell from 1.56 (step 13)" in health and "raise kl.coef" in health
    assert "2 warnings" in page  # the headline card
    # the reward curves (training batch, held-out, and the rm and gold sources) are shaded over steps 29-60
    assert spans.count((28.5, 60.5, "doctor: over_optimisation")) == 4


def test_a_healthy_run_says_so():
    page = pages.run_report(runs.load_run(DOCTOR_FIXTURES / "seed0_ppo"), max_samples=2)
    assert "<p>Healthy: none of the rules fired (ppo).</p>" in page
    assert "<b>healthy</b>" in page or ">healthy<" in page


def test_a_rule_metric_pattern_matches_each_monitor():
    assert charts._matches("reward/<monitor>/mean", "reward/gold/mean")
    assert not charts._matches("reward/<monitor>/mean", "reward/mean")
    assert not charts._matches("reward/<monitor>/mean", "eval/reward/gold/mean")
    assert charts._matches("kl/mean", "kl/mean") and not charts._matches("kl/mean", "kl/coef")
