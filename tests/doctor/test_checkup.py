"""`rlhf doctor RUN_DIR`: the verdict on finished, crashed, running and empty runs, on a directory of runs, and a
clear refusal of what is not a run; exit codes 0 healthy / 1 warnings / 2 critical."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from rlhf.cli import main
from rlhf.doctor.rules import RULES

FIXTURES = Path(__file__).resolve().parent / "fixtures"


def doctor(capsys, *args: str) -> tuple[int, str, str]:
    code = main(["doctor", *map(str, args)])
    out, err = capsys.readouterr()
    return code, out, err


def copy_run(name: str, tmp_path: Path) -> Path:
    return Path(shutil.copytree(FIXTURES / name, tmp_path / name))


def test_a_healthy_run_is_healthy(capsys):
    code, out, _ = doctor(capsys, FIXTURES / "seed0_ppo")
    assert code == 0
    assert f"healthy: none of the {len(RULES)} rules fired" in out
    assert "(rlhf ppo, 60 rows, steps 1–60)" in out


def test_reward_hacking_is_named_with_steps_evidence_and_fix(capsys):
    code, out, _ = doctor(capsys, FIXTURES / "seed0_ppo_no_kl")
    assert code == 1  # warnings, nothing critical
    assert "[warning] over_optimisation: reward hacking" in out
    assert "reward/gold/mean fell from" in out  # the evidence, with its numbers
    assert "raise kl.coef" in out  # the fix names the config field


def test_json_verdict_for_tools(capsys):
    code, out, _ = doctor(capsys, FIXTURES / "seed0_ppo_no_kl", "--json")
    verdict = json.loads(out)
    assert code == verdict["exit_code"] == 1 and verdict["status"] == "warning"
    (run,) = verdict["runs"]
    assert run["command"] == "ppo" and run["rows"] == 60 and (run["first_step"], run["last_step"]) == (1, 60)
    found = {f["rule"]: f for f in run["findings"]}
    assert found["over_optimisation"]["severity"] == "warning"
    assert found["over_optimisation"]["steps"][-1][1] == 60  # episodes as [first, last] step
    assert set(found["over_optimisation"]) >= {"evidence", "first_evidence", "diagnosis", "fix", "metrics"}


def test_a_critical_finding_exits_2(tmp_path, capsys):
    run = copy_run("seed0_ppo", tmp_path)
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    rows[-1]["policy/loss"] = float("nan")  # what the trainer writes for a NaN loss (json allows NaN)
    (run / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    code, out, _ = doctor(capsys, run)
    assert code == 2
    assert "[critical] non_finite" in out and "policy/loss = nan at step 60" in out


def test_a_crashed_run_with_a_torn_last_line(tmp_path, capsys):
    run = copy_run("seed0_ppo_no_kl", tmp_path)
    text = (run / "metrics.jsonl").read_text()
    (run / "metrics.jsonl").write_text(text[: len(text) - 200])  # the process died in the middle of row 60
    code, out, _ = doctor(capsys, run)
    assert "metrics.jsonl:60: the last line is incomplete" in out
    assert "(rlhf ppo, 59 rows, steps 1–59)" in out
    assert code == 1 and "over_optimisation" in out  # the rows before the tear are diagnosed as usual


def test_a_running_run_whose_last_row_lacks_only_its_newline(tmp_path, capsys):
    run = copy_run("seed0_ppo", tmp_path)
    text = (run / "metrics.jsonl").read_text()
    (run / "metrics.jsonl").write_text(text.rstrip("\n"))  # caught between the row and its newline
    code, out, _ = doctor(capsys, run)
    assert code == 0 and "60 rows" in out and "note:" not in out


def test_unreadable_lines_are_skipped_with_a_note(tmp_path, capsys):
    run = copy_run("seed0_ppo", tmp_path)
    lines = (run / "metrics.jsonl").read_text().splitlines()
    lines[4] = "garbage {"
    lines[9] = json.dumps({"no_step": 1})
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    code, out, _ = doctor(capsys, run)
    assert code == 0 and "58 rows" in out
    assert "metrics.jsonl:5: not a metrics row, skipped: 'garbage {'" in out
    assert "metrics.jsonl:10: not a metrics row" in out


def test_an_empty_run_has_nothing_to_diagnose(tmp_path, capsys):
    run = copy_run("seed0_ppo", tmp_path)
    (run / "metrics.jsonl").write_text("")  # started, died before its first step
    code, out, _ = doctor(capsys, run)
    assert code == 0 and "no step logged yet: nothing to diagnose" in out
    code, out, _ = doctor(capsys, run, "--json")
    assert json.loads(out)["status"] == "no_data" and code == 0


def test_a_directory_of_runs_is_diagnosed_run_by_run(tmp_path, capsys):
    for name in ("seed0_sft", "seed0_rm", "seed0_dpo", "seed0_ppo", "seed0_ppo_no_kl"):
        copy_run(name, tmp_path)
    (tmp_path / "not_a_run").mkdir()  # other directories (e.g. the demo's data) are passed over
    code, out, _ = doctor(capsys, tmp_path)
    assert code == 1  # the worst run's code
    assert out.count("(rlhf ") == 5 and "(rlhf sft, " in out and "(rlhf dpo, " in out
    assert out.rstrip().endswith("5 runs: 1 warning, 4 healthy")


@pytest.mark.parametrize("what", ["empty directory", "file", "missing"])
def test_what_is_not_a_run_is_refused_clearly(what, tmp_path, capsys):
    path = tmp_path / "x"
    if what == "empty directory":
        path.mkdir()
    elif what == "file":
        path.write_text("{}")
    code, out, err = doctor(capsys, path)
    assert code == 2 and out == ""  # nothing on stdout: a tool reading --json sees no verdict
    assert err.startswith("error: rlhf doctor: ")
    expected = "is not a run directory (no metrics.jsonl and no config.yaml)" if what == "empty directory" \
        else "is not a directory"  # fmt: skip
    assert expected in err


def test_a_run_whose_config_is_unreadable_is_still_diagnosed(tmp_path, capsys):
    run = copy_run("seed0_ppo_no_kl", tmp_path)
    (run / "config.yaml").write_text("# rlhf ppo: resolved config\nkl: [unclosed\n")
    code, out, _ = doctor(capsys, run)
    assert "note: config.yaml is not readable YAML" in out
    # without the config the gold monitor is unknown (it is a weight-0 source there): no over-optimisation call
    assert "over_optimisation" not in out and code == 1


def test_an_rm_ensemble_is_diagnosed_member_by_member(tmp_path, capsys):
    """`rlhf rm --rm.ensemble` writes config.yaml at the top and each member's run in members/member_<m>/: the
    doctor reads the members, given the ensemble's directory or a directory holding it (a demo's rm/)."""
    ensemble = tmp_path / "rm"
    for m in range(2):
        member = copy_run("seed0_rm", ensemble / "members")
        member.rename(ensemble / "members" / f"member_{m}")
    shutil.copy(FIXTURES / "seed0_rm" / "config.yaml", ensemble / "config.yaml")
    copy_run("seed0_ppo", tmp_path)
    for where, runs in ((ensemble, 2), (tmp_path, 3)):
        code, out, _ = doctor(capsys, where)
        assert code == 0 and out.count("(rlhf ") == runs
        assert (
            f"{ensemble / 'members' / 'member_0'} (rlhf rm, " in out and f"{ensemble / 'members' / 'member_1'}" in out
        )
