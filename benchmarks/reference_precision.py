"""How far a bfloat16 reference's log-probs are from the float32 reference's, and what its forward costs.

    python benchmarks/reference_precision.py            # the benchmark's 3M, 25M and 110M policies (built if missing)
    python benchmarks/reference_precision.py --sizes 3m

For each size: 16 toy prompts, 32 tokens sampled from the float32 policy, then the reference log-probs of those
tokens from the float32 copy and from a ``model.reference_dtype: bfloat16`` copy (``frozen_copy``), as the
trainers compute them. Prints the per-token absolute error (mean, p99, max), the error of the per-sequence
KL sum it feeds, and the seconds of one reference forward in each dtype. Writes results/reference_precision.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import run as bench
import torch

from rlhf.data import left_pad
from rlhf.models.loading import frozen_copy, load_causal_lm, load_tokenizer
from rlhf.models.policy import score_response_tokens
from rlhf.rollout.engine import RowGenerators, SamplingParams, row_seeds, sample


def forward_seconds(model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor, T: int, repeats: int = 3) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        score_response_tokens(model, ids, mask, T, 1.0)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


@torch.no_grad()
def measure(size: str, assets: dict) -> dict:
    path = assets["models"][size]["policy"]
    tokenizer = load_tokenizer(path)
    policy = load_causal_lm(path)
    prompts = [json.loads(line)["prompt"] for line in Path(assets["prompts"]).read_text().splitlines()[:16]]
    query, query_mask = left_pad(
        [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts], tokenizer.pad_token_id
    )
    noise = RowGenerators.of(row_seeds(torch.Generator().manual_seed(0), range(len(prompts))))
    responses, _ = sample(policy, query, query_mask, SamplingParams(32, 1.0), [], tokenizer.pad_token_id, noise)
    ids = torch.cat([query, responses], 1)
    mask = torch.cat([query_mask, torch.ones_like(responses)], 1)
    T = responses.shape[1]
    exact_model, half_model = frozen_copy(policy), frozen_copy(policy, "bfloat16")
    exact = score_response_tokens(exact_model, ids, mask, T, 1.0).logprobs
    approx = score_response_tokens(half_model, ids, mask, T, 1.0).logprobs.float()
    error = (approx - exact).abs().flatten()
    sequence_error = (approx - exact).sum(-1).abs()
    return {
        "size": size,
        "tokens": int(error.numel()),
        "logprob_abs_error_mean": error.mean().item(),
        "logprob_abs_error_p99": error.quantile(0.99).item(),
        "logprob_abs_error_max": error.max().item(),
        "sequence_logprob_sum_abs_error_mean": sequence_error.mean().item(),
        "float32_forward_s": forward_seconds(exact_model, ids, mask, T),
        "bfloat16_forward_s": forward_seconds(half_model, ids, mask, T),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--sizes", default=",".join(bench.SIZES), help=f"comma-separated, out of {','.join(bench.SIZES)}"
    )
    args = parser.parse_args()
    sizes = args.sizes.split(",")
    assets = bench.build_assets(set(sizes))
    results = [measure(size, assets) for size in sizes]
    for r in results:
        print(f"{r['size']}: |Δ log p| per token mean {r['logprob_abs_error_mean']:.4f}, p99 {r['logprob_abs_error_p99']:.4f}, "
              f"max {r['logprob_abs_error_max']:.4f} nats; per-sequence sum {r['sequence_logprob_sum_abs_error_mean']:.3f}; "
              f"forward {r['float32_forward_s']:.3f} s float32, {r['bfloat16_forward_s']:.3f} s bfloat16")  # fmt: skip
    bench.RESULTS.mkdir(parents=True, exist_ok=True)
    (bench.RESULTS / "reference_precision.json").write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
