"""Write the README's table of the training doctor's rules from `rlhf.doctor.rules.RULES` itself.

    python tools/doctor_rules.py          # rewrite the block between <!-- doctor-rules:start/end --> in README.md

One row per rule: name, severity, the metrics it reads, when it fires, how many quiet rows clear it, and the fix
to try. tests/doctor/test_rules.py fails when the table is out of date.
"""

from __future__ import annotations

from pathlib import Path

from rlhf.doctor.rules import RULES

README = Path(__file__).resolve().parents[1] / "README.md"
START, END = "<!-- doctor-rules:start -->", "<!-- doctor-rules:end -->"


def table() -> str:
    lines = ["| rule | severity | reads | fires when | clears after | fix to try |", "|---|---|---|---|---|---|"]
    for rule in RULES:
        reads = ", ".join(f"`{metric}`" for metric in rule.metrics)
        clears = "the next quiet row" if rule.hold == 1 else f"{rule.hold} quiet rows"
        cells = [f"`{rule.name}`", rule.severity, reads, rule.threshold.replace("|", "\\|"), clears, rule.fix]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    text = README.read_text()
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    README.write_text(f"{head}{START}\n{table()}\n{END}{tail}")
    print(f"wrote the doctor's rules table in {README}")


if __name__ == "__main__":
    main()
