"""Rollouts against the GPU's memory-bandwidth floor: the lean decoder eager and captured (``sampling.cuda_graphs``),
the model's own forward (``engine: hf``), at a 1.7B Llama shape in bfloat16.

    python benchmarks/gpu_rollout.py          # on one CUDA GPU (H100 / H200): about 2 minutes
    python benchmarks/gpu_rollout.py --tiny   # the same code on a tiny shape (on the CPU: seconds)

Random weights of SmolLM2-1.7B's shape (24 layers, hidden 2048, vocabulary 49152), held in bfloat16 as the
trainers' frozen copies and pure-bf16 runs hold them; 64 rows (8 prompts × 8, GRPO's groups: each prompt prefilled
once) × 128 new tokens at temperature 1, no stop token (every rollout runs its full length). Each engine: one
rollout to warm up, then ``--repeats`` timed ones (``torch.cuda.synchronize`` around each). The floor of a decode
step is reading every weight it multiplies once (the layers' and the head's, not the embedding table: a lookup)
at the bandwidth this card reaches in a device-to-device copy, measured here. Also: the captured loop's samples
and log-probs against the eager loop's (the same seeds), and the stop checks every k tokens. Writes
benchmarks/results/gpu_rollout.{json,md} (``--tiny``: benchmarks/.work/gpu_rollout/). Notes: benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import time
from pathlib import Path

if importlib.util.find_spec("rlhf") is None:  # a checkout run without installing
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch
from transformers import AutoModelForCausalLM, LlamaConfig

from rlhf.rollout.engine import RowGenerators, SamplingParams, sample

HERE = Path(__file__).resolve().parent
SMOLLM2_1_7B = {"hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 24, "num_attention_heads": 32,
                "num_key_value_heads": 32, "vocab_size": 49152, "tie_word_embeddings": True}  # fmt: skip
TINY = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": 1024, "tie_word_embeddings": True}  # fmt: skip
ENGINES = {  # label: (engine, cuda_graphs, stop_every)
    "lean, captured, check every 16": ("lean", True, 16),
    "lean, captured, check every 64": ("lean", True, 64),
    "lean, eager, check every 16": ("lean", False, 16),
    "lean, eager, check every token": ("lean", False, 1),
    "hf (the model's forward)": ("hf", False, None),
}


def build(shape: dict, device: torch.device) -> torch.nn.Module:
    torch.manual_seed(0)
    config = LlamaConfig(**shape, max_position_embeddings=4096, pad_token_id=0)
    with device:
        return AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).eval()


def bandwidth(device: torch.device) -> float:
    """Bytes a second of a device-to-device copy of 1 GiB (read + write), the best of 5; None on a CPU."""
    if device.type != "cuda":
        return None
    src = torch.empty(2**30, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(5):
        torch.cuda.synchronize()
        start = time.perf_counter()
        dst.copy_(src)
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return 2 * src.numel() / best


def weight_bytes(model: torch.nn.Module) -> int:
    """What one decode step reads: every linear layer's weight (the tied head included), not the embedding lookup."""
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    return sum(m.weight.numel() * m.weight.element_size() for m in linears)


def prompts(rows: int, group: int, length: int, vocab: int, device: torch.device) -> tuple[torch.Tensor, ...]:
    """``rows // group`` distinct prompts of ``length`` tokens (the first one left-padded by 5), each ``group`` times."""
    g = torch.Generator().manual_seed(1)
    distinct = torch.randint(1, vocab, (rows // group, length), generator=g)
    mask = torch.ones_like(distinct)
    distinct[0, :5], mask[0, :5] = 0, 0
    return distinct.repeat_interleave(group, 0).to(device), mask.repeat_interleave(group, 0).to(device)


def timed(model, ids, mask, params, engine: tuple, repeats: int) -> dict:
    name, graphs, every = engine
    seconds, out = [], None
    for i in range(repeats + 1):
        if ids.is_cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        out = sample(model, ids, mask, params, [], 0, RowGenerators.of(range(len(ids))), engine=name,
                     stop_every=every, cuda_graphs=graphs)  # fmt: skip
        if ids.is_cuda:
            torch.cuda.synchronize()
        if i > 0:  # the first warms caches (and cuBLAS)
            seconds.append(time.perf_counter() - start)
    return {"s": statistics.median(seconds), "all_s": seconds, "tokens": out[0], "logprobs": out[1]}


def agreement(ours: dict, eager: dict) -> dict:
    """Where the captured loop's samples first leave the eager loop's (the same seeds: they part only where the
    logits' rounding differs enough to move a draw across a boundary), and the log-prob gap before that."""
    a, b = ours["tokens"], eager["tokens"]
    differ = (a != b).int()
    first = torch.where(differ.any(-1), differ.argmax(-1), torch.full_like(differ[:, 0], a.shape[1]))
    before = torch.arange(a.shape[1], device=a.device)[None, :] < first[:, None]
    gap = (ours["logprobs"] - eager["logprobs"]).abs().masked_fill(~before, 0)
    return {"rows_equal": int((first == a.shape[1]).sum()), "rows": len(a), "first_difference_min": int(first.min()),
            "logprob_gap_max": float(gap.max())}  # fmt: skip


def render(results: dict) -> str:
    floor = results["floor_ms"]
    lines = [f"{results['gpu']}; {results['shape']}; {results['rows']} rows × {results['new_tokens']} new tokens; "
             f"weights read per token {results['weight_gb']:.2f} GB at {results['bandwidth_gbs'] or 0:.0f} GB/s "
             f"(floor {floor or 0:.2f} ms a token)", "",
             "| engine | rollout s | ms a token | × floor | tokens/s |", "|---|---|---|---|---|"]  # fmt: skip
    for label, row in results["engines"].items():
        times = floor and f"{row['ms_per_token'] / floor:.1f}"
        lines.append(
            f"| {label} | {row['s']:.3f} | {row['ms_per_token']:.2f} | {times or '—'} | {row['tokens_s']:.0f} |"
        )
    lines += ["", f"captured against eager (same seeds): {json.dumps(results['agreement'])}"]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiny", action="store_true", help="a tiny shape (the CPU test of this script)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cpu" and not args.tiny:
        parser.error("no CUDA GPU here; --tiny runs the same code on a tiny shape on the CPU")
    shape = TINY if args.tiny else SMOLLM2_1_7B
    rows, new_tokens = (16, 16) if args.tiny else (64, 128)
    model = build(shape, device)
    ids, mask = prompts(rows, 8, 32, shape["vocab_size"], device)
    params = SamplingParams(max_new_tokens=new_tokens, temperature=1.0)
    speed, read = bandwidth(device), weight_bytes(model)
    floor_ms = speed and 1e3 * read / speed
    results = {"format": 1, "gpu": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
               "torch": torch.__version__, "shape": "tiny" if args.tiny else "SmolLM2-1.7B (random weights, bf16)",
               "rows": rows, "new_tokens": new_tokens, "weight_gb": read / 1e9,
               "bandwidth_gbs": speed and speed / 1e9, "floor_ms": floor_ms, "engines": {}}  # fmt: skip
    runs = {}
    for label, engine in ENGINES.items():
        print(f"{label} ...", file=sys.stderr, flush=True)
        runs[label] = timed(model, ids, mask, params, engine, args.repeats)
        s = runs[label]["s"]
        results["engines"][label] = {"s": s, "all_s": runs[label]["all_s"], "ms_per_token": 1e3 * s / new_tokens,
                                     "tokens_s": rows * new_tokens / s}  # fmt: skip
    results["agreement"] = agreement(runs["lean, captured, check every 16"], runs["lean, eager, check every 16"])
    out = HERE / ("results" if not args.tiny else ".work/gpu_rollout")
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_rollout.json").write_text(json.dumps(results, indent=1))
    (out / "gpu_rollout.md").write_text(render(results) + "\n")
    print(render(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
