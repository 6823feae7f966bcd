"""Launching rlhf the way users do — ``python``, ``torchrun``, two ``torchrun`` "nodes" — and comparing runs.

The tolerances are explained in test_equivalence.py's docstring.
"""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from configs import nested

WORKER = Path(__file__).resolve().parent / "worker.py"
TIMEOUT_S = 300  # a hung collective fails the test instead of the suite


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def environment(gpus: bool = False) -> dict[str, str]:
    """The runs' environment: one thread per process, this checkout's src, and no GPU unless asked (the CPU
    tests run on CPU on any machine; tests/distributed/test_gpu.py asks for them)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    if not gpus:
        env["CUDA_VISIBLE_DEVICES"] = ""
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parents[2] / "src"), env.get("PYTHONPATH", "")])
    return env


def torchrun(nproc: int = 2) -> list[str]:
    """One node of ``nproc`` ranks; rendezvous on a free local port."""
    return [f"--nproc_per_node={nproc}", "--master_addr=127.0.0.1", f"--master_port={free_port()}"]


def two_nodes(nproc_per_node: int = 1) -> list[list[str]]:
    """The arguments of two ``torchrun`` launchers that meet as two nodes through a c10d rendezvous."""
    endpoint = f"127.0.0.1:{free_port()}"
    common = [f"--nproc_per_node={nproc_per_node}", "--nnodes=2", "--rdzv-backend=c10d",
              f"--rdzv-endpoint={endpoint}", "--rdzv-id=rlhf-test"]  # fmt: skip
    return [common + [f"--node-rank={rank}"] for rank in range(2)]


def command_line(args: list[str], launcher: list[str] | None) -> list[str]:
    """``python worker.py ARGS``, or under ``torchrun LAUNCHER``."""
    if launcher is None:
        return [sys.executable, str(WORKER), *args]
    return [sys.executable, "-m", "torch.distributed.run", *launcher, str(WORKER), *args]


def launch(args: list[str], launchers: list[list[str] | None], gpus: bool = False) -> list[subprocess.CompletedProcess]:
    """Start one process per launcher (several: the nodes of one run), wait for all; each must succeed."""
    processes = [
        subprocess.Popen(
            command_line(args, launcher),
            env=environment(gpus),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for launcher in launchers
    ]
    results = []
    for process in processes:
        try:
            stdout, stderr = process.communicate(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            for p in processes:
                p.kill()
            raise
        results.append(subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr))
    for result in results:
        assert result.returncode == 0, result.stderr[-4000:]
    return results


def run(
    command: str, config: dict, out: Path, *launchers: list[str] | None, flags: tuple[str, ...] = (),
    gpus: bool = False, members: int = 0,
) -> tuple[list[dict], list[dict[str, torch.Tensor]]]:  # fmt: skip
    """(metric rows, per-step gradients) of one run in ``out/run``: one process without launchers, else one
    ``torchrun`` per launcher (:func:`torchrun`, :func:`two_nodes`). ``flags``: more command-line fields.
    ``members``: a reward-model ensemble's, whose rows are its members' in turn."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "in.yaml").write_text(yaml.safe_dump(nested(config)))
    record = out / f"grads{len(list(out.glob('grads*.pt')))}.pt"
    args = [str(record), command, "--config", str(out / "in.yaml"), "--output_dir", str(out / "run"), *flags]
    launch(args, list(launchers) or [None], gpus)
    runs = [out / "run" / "members" / f"member_{m}" for m in range(members)] or [out / "run"]
    rows = [json.loads(line) for run in runs for line in (run / "metrics.jsonl").read_text().splitlines()]
    return rows, torch.load(record)


FIRST_STEP_RTOL = 1e-4
"""The first optimizer step's gradients (the same weights on both sides): each element is a sum of ≲ 10³ fp32
per-token terms, each perturbed by a few ulp (≲ 10⁻⁷ relative) by the other grouping and kernel blocking."""
LATER_STEPS_RTOL = 1e-3
"""Later steps: the weights themselves now differ. Adam divides by √v, so an element whose gradient is ≈ 0 moves
by up to the learning rate on a rounding difference, and every later gradient is taken at slightly different
weights. Still 10³× below what a wrong reduction does (a missing rank, a local instead of a global statistic, a
gradient averaged twice: differences of the gradient's own size)."""


def assert_same_gradients(a: list[dict], b: list[dict]) -> None:
    """Every optimizer step's gradients, each tensor compared relative to its largest element (+ 1e-7)."""
    assert len(a) == len(b) > 0
    for step, (ga, gb) in enumerate(zip(a, b, strict=True)):
        assert ga.keys() == gb.keys()
        rtol = FIRST_STEP_RTOL if step == 0 else LATER_STEPS_RTOL
        for name in ga:
            scale = ga[name].abs().max().item()
            torch.testing.assert_close(gb[name], ga[name], rtol=0, atol=rtol * scale + 1e-7,
                                       msg=lambda m, n=name, s=step: f"step {s} {n}: {m}")  # fmt: skip


def assert_same_weights(a: Path, b: Path, bound: float, files: tuple[str, ...] = ("model.safetensors",)) -> None:
    for file in files:
        wa, wb = load_file(a / file), load_file(b / file)
        assert wa.keys() == wb.keys()
        for name in wa:
            torch.testing.assert_close(wb[name], wa[name], rtol=0, atol=bound, msg=lambda m, n=name: f"{n}: {m}")


NOT_COMPARED = ("time/", "throughput/")  # wall-clock
ROUNDING = "rollout/logprob_diff_"
"""Metrics that measure float32 rounding themselves (the sampler's log-probs against the trainer's: ~1e-5 apart).
The decoder's rounding depends on how many rows a decode step has (oneDNN blocks the product by it), which a rank's
shard changes, so these agree across layouts to the rounding's own size: 1e-5 (100 ulps of a log-prob of ~6, as
tests/rollout's engine tests bound it), not to 1e-6."""


def assert_same_metrics(a: list[dict], b: list[dict]) -> None:
    assert [r.get("step") for r in a] == [r.get("step") for r in b]
    for ra, rb in zip(a, b, strict=True):
        assert ra.keys() == rb.keys()
        for key, value in ra.items():
            if key.startswith(NOT_COMPARED) or not isinstance(value, float) or math.isnan(value):
                continue
            bound = 1e-5 if key.startswith(ROUNDING) else 1e-6
            assert rb[key] == pytest.approx(value, rel=1e-4, abs=bound), (ra["step"], key)
