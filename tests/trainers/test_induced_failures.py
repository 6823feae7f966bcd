"""The training doctor on real runs of the tiny model with a failure induced on purpose: each is named by the
right rule, live (``doctor.jsonl``, the console) exactly as ``rlhf doctor`` names it afterwards, and a gentle
run of the same setup is left alone. ``doctor.stop_on`` ends a run at the finding, and it resumes from there.

The policy is the tiny Llama after a short SFT on two-word answers, so it starts out ending its answers (EOS)
after about four tokens, as a real SFT policy does; a random-weight model would never stop and could show
neither length hacking nor a vanishing EOS. Each failure was checked on seeds 0-2 (the finding fired on every
one), the length failure on seeds 0-4 under both the default (AVX-512) and AVX2 kernels; the tests run seed 0.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import test_grpo
import test_ppo
import test_sft
import yaml

from rlhf import cli
from rlhf.doctor.rules import History
from rlhf.doctor.watch import diagnose
from rlhf.models.tiny import toy_corpus
from rlhf.runlog.health import EVENTS_FILE
from rlhf.trainers import sft
from rlhf.trainers.rl import grpo, ppo
from runs import metric_rows, train_rows

LENGTH = test_ppo.reward("length_chars")  # pays 0.1 per character: longer is always better
GENTLE = {"ppo.steps": 25, "sampling.max_new_tokens": 16, "reward.source": LENGTH, "optim.learning_rate": 1e-4}
"""The gentle run: its learning rate is the one the failures are measured against."""
LENGTH_AND_GOLD = [
    {"source": LENGTH, "name": "length", "weight": 1.0},
    {"source": test_ppo.reward("concise_gold"), "name": "gold", "weight": 0.0},  # a monitor: logged, never optimised
]  # fmt: skip

FAILURES = {
    # name: (overrides on GENTLE, the findings expected among those named)
    "learning rate 100× too high": ({"optim.learning_rate": 1e-2}, {"approx_kl_high"}),
    "temperature tiny": ({"sampling.temperature": 0.05}, {"entropy_collapse"}),
    # 16 answers a step: with 8, eos_rate moves in steps of ⅛ and the unleashed policy swings back and forth
    # across ½ (seed 0 ended at 0.5 on AVX-512 kernels); with 16 it stays under ¼ from step ~12 on every one
    # of seeds 0-4 × both kernel families
    "reward pays for length": (
        {"optim.learning_rate": 1e-3, "kl.coef": 0.0, "batch.size": 16, "ppo.steps": 30}, {"eos_vanishing"}
    ),
    "no KL penalty against a proxy": (
        {"optim.learning_rate": 1e-3, "kl.coef": 0.0, "reward.source": LENGTH_AND_GOLD, "ppo.steps": 30},
        {"over_optimisation"},
    ),
}  # fmt: skip


@pytest.fixture(scope="module")
def sft_policy(tiny_llama_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the tiny Llama after SFT on two-word answers, a prompts file)."""
    tmp = tmp_path_factory.mktemp("induced")
    data = tmp / "sft.jsonl"
    rows = [(line.split()[:4], line.split()[4:6]) for line in toy_corpus(400, seed=5)]
    data.write_text("".join(json.dumps({"prompt": " ".join(p), "response": " " + " ".join(r)}) + "\n" for p, r in rows))
    final = sft.run(test_sft.make_config(tiny_llama_dir, data, tmp / "sft", **{"sft.epochs": 2}))
    prompts = tmp / "prompts.jsonl"
    prompts.write_text(
        "".join(json.dumps({"prompt": " ".join(line.split()[:4])}) + "\n" for line in toy_corpus(60, seed=7))
    )
    return final, prompts


def run_ppo(sft_policy, out: Path, **overrides) -> dict[str, list[tuple[int, int]]]:
    """Train; the doctor's findings on the run, as ``rlhf doctor`` reads it (rule → episodes)."""
    policy, prompts = sft_policy
    ppo.run(test_ppo.make_config(policy, prompts, out, **(GENTLE | overrides)))
    config = yaml.safe_load((out / "config.yaml").read_text())
    return {f.rule.name: f.episodes for f in diagnose(History(metric_rows(out), config))}


def live_starts(out: Path) -> dict[str, list[int]]:
    """Rule → the steps where the live alarms said it started (doctor.jsonl)."""
    starts: dict[str, list[int]] = {}
    for event in map(json.loads, (out / EVENTS_FILE).read_text().splitlines()):
        if event["event"] == "start":
            starts.setdefault(event["rule"], []).append(event["step"])
    return starts


def test_a_gentle_run_is_healthy(sft_policy, tmp_path):
    assert run_ppo(sft_policy, tmp_path / "run") == {}
    assert (tmp_path / "run" / EVENTS_FILE).read_text() == ""


@pytest.mark.parametrize("failure", list(FAILURES))
def test_each_induced_failure_is_named_live_and_afterwards(failure, sft_policy, tmp_path, capsys):
    overrides, expected = FAILURES[failure]
    out = tmp_path / "run"
    found = run_ppo(sft_policy, out, **overrides)
    assert expected <= found.keys(), found
    # live and afterwards agree: each finding started where its episodes start
    assert live_starts(out) == {rule: [first for first, _ in episodes] for rule, episodes in found.items()}
    err = capsys.readouterr().err
    for rule in expected:
        assert f"] {rule}: " in err  # said on the console when it started
    code = cli.main(["doctor", str(out)])
    assert code == (2 if any(f.rule.severity == "critical" for f in diagnose(History(metric_rows(out)))) else 1)


def test_the_length_failure_is_what_its_metrics_show(sft_policy, tmp_path):
    """The induced failure is real, not an artefact of the rule: the answers did grow and stop ending."""
    run_ppo(sft_policy, tmp_path / "length", **FAILURES["reward pays for length"][0])
    rows = train_rows(tmp_path / "length")
    assert rows[0]["response/eos_rate"] == 1.0 and rows[-1]["response/eos_rate"] < 0.5
    assert rows[-1]["response/length_mean"] > 2 * rows[0]["response/length_mean"]


def test_stop_on_ends_the_run_at_the_finding_and_it_resumes(sft_policy, tmp_path, capsys):
    overrides = FAILURES["no KL penalty against a proxy"][0] | {"run.save_every": 0, "doctor.stop_on": "warning"}
    out = tmp_path / "run"
    found = run_ppo(sft_policy, out, **overrides)
    first = min(episodes[0][0] for episodes in found.values())  # the first warning (nothing critical here)
    rows = metric_rows(out)
    assert rows[-1]["step"] == first < 30
    assert (out / "checkpoints" / f"step_{first:06d}").is_dir() and (out / "final").is_dir()
    assert f"doctor: stopping at step {first} (doctor.stop_on: warning)" in capsys.readouterr().err
    # go on without the stop: the resumed run continues from that step to the end
    policy, prompts = sft_policy
    resumed = GENTLE | overrides | {"doctor.stop_on": "never", "run.resume": True}
    ppo.run(test_ppo.make_config(policy, prompts, out, **resumed))
    assert [row["step"] for row in metric_rows(out)] == list(range(31))  # step 0: held-out answers before training


def test_grpo_with_a_reward_that_never_varies_has_no_signal(sft_policy, tmp_path):
    policy, prompts = sft_policy
    out = tmp_path / "run"
    overrides = {"grpo.steps": 8, "reward.source": test_grpo.reward("constant_one"), "run.save_every": 0}
    grpo.run(test_grpo.make_config(policy, prompts, out, **overrides))
    found = {f.rule.name: f.episodes for f in diagnose(History(metric_rows(out)))}
    assert found == {"no_group_signal": [(5, 8)]}  # every group's rewards equal from step 1: fires at 5 steps
    assert live_starts(out) == {"no_group_signal": [5]}


def test_sft_overfitting_a_handful_of_examples(tiny_llama_dir, tmp_path, capsys):
    """SFT (no live alarms: `rlhf doctor` reads it afterwards) for 40 epochs on 16 examples at a constant learning
    rate: the training loss falls towards 0 while the held-out loss turns back up — eval_loss_rising."""
    lines = toy_corpus(48, seed=11)
    for name, part in (("train", lines[:16]), ("eval", lines[16:])):
        (tmp_path / f"{name}.jsonl").write_text("".join(
            json.dumps({"prompt": " ".join(line.split()[:3]), "response": " " + " ".join(line.split()[3:])}) + "\n"
            for line in part))  # fmt: skip
    out = tmp_path / "sft"
    overrides = {"sft.epochs": 40, "data.eval": str(tmp_path / "eval.jsonl"), "run.eval_every": 5,
                 "optim.scheduler": "constant"}  # fmt: skip
    sft.run(test_sft.make_config(tiny_llama_dir, tmp_path / "train.jsonl", out, **overrides))
    evals = [row["eval/loss"] for row in metric_rows(out) if "eval/loss" in row]
    assert evals[-1] > min(evals) + 0.1  # the overfitting is real: the held-out loss rose from its lowest
    assert cli.main(["doctor", str(out)]) == 1
    assert (
        "[warning] eval_loss_rising: the held-out loss rises while the training loss falls" in capsys.readouterr().out
    )
