"""`rlhf <command> ...` as a user runs it (``python -m rlhf`` or ``torchrun -m rlhf``), with two test hooks.

Usage: ``[torchrun ...] worker.py RECORD.pt <command> --config ... [--<field> ...]``

- responses are made ragged (tests/ragged.py), so padding and the score position are exercised;
- every optimizer step's gradients (after they were synchronised over ranks, before clipping) are recorded
  by rank 0 and saved to RECORD.pt as a list of {parameter name: gradient}.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the ragged module

import torch  # noqa: E402

from ragged import ragged  # noqa: E402
from rlhf import cli  # noqa: E402
from rlhf.rollout import generation
from rlhf.trainers import update  # noqa: E402


def main(argv: list[str]) -> int:
    record, args = Path(argv[0]), argv[1:]
    steps: list[dict[str, torch.Tensor]] = []
    optimizer_step = update.optimizer_step

    def recording(trainable, *rest, **kwargs):
        names = [name for name, p in trainable.module.named_parameters() if p.requires_grad]
        grads = [p.grad for p in trainable.parameters()]
        # sharded (FSDP2) gradients are gathered whole: a collective every rank takes part in
        grads = [g.full_tensor() if hasattr(g, "full_tensor") else g for g in grads]
        steps.append({n: g.detach().cpu().clone() for n, g in zip(names, grads, strict=True) if g is not None})
        return optimizer_step(trainable, *rest, **kwargs)

    update.optimizer_step = recording
    generation.generate = ragged(generation.generate)
    code = cli.main([*args, "--debug"] if "--debug" not in args else args)
    if int(os.environ.get("RANK", 0)) == 0:
        torch.save(steps, record)
    return code


if __name__ == "__main__":
    cli.exit_process(main(sys.argv[1:]))
