"""The memory plan a trainer's own start-up check makes (`rlhf.planning.check`), recorded for the benchmark children
that compare it with the peak they measure."""

from __future__ import annotations

from typing import Any


def record_plans() -> list[Any]:
    """Make every later `rlhf.planning.check` append its plan to the returned list (the trainers call it through the
    module, so the wrapper is what they run)."""
    from rlhf import planning

    plans: list[Any] = []
    check = planning.check

    def recorded(*args: Any, **kwargs: Any) -> Any:
        plans.append(check(*args, **kwargs))
        return plans[-1]

    planning.check = recorded
    return plans
