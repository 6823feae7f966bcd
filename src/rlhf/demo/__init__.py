"""``rlhf demo``: the whole RLHF pipeline on a built-in advice task, offline, on a CPU (see `pipeline`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rlhf.config import DemoConfig


def run(config: DemoConfig) -> dict[str, Any]:
    """Run the demo into ``config.output_dir``; returns the summary written to summary.json."""
    from rlhf.demo import pipeline  # torch and transformers load here, not on `import rlhf.demo`

    return pipeline.run(config)


__all__ = ["run"]
