"""One step of the GPU acceptance benchmark in its own process: ``python child_gpu.py SPEC RESULT``.

``spec["side"]``: ``build`` writes the random-init policy and reward model (:func:`build_models`, on the GPU when
there is one: seconds instead of a CPU minute); ``ours`` runs child_ours.py (our trainer through the public API)
and ``trl`` child_trl.py (TRL's trainer), after which the CUDA allocator's peaks, read in this process after the
run, are added to RESULT (``cuda``: None on a CPU).
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

if importlib.util.find_spec("rlhf") is None:  # a checkout run with PYTHONPATH=src, which run.run_child drops
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))


def build_models(spec: dict) -> dict:
    """Qwen2 policy (tied embeddings) and reward model (one output) of ``spec``'s shapes with random weights,
    saved in bfloat16 beside the tokenizer of benchmarks/run.py (whose prompts are exactly 10 tokens); the models'
    vocabulary (``spec["vocab_size"]``) may be larger than the tokenizer's, as real checkpoints' is."""
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, Qwen2Config

    from rlhf.models.tiny import save_tiny, toy_corpus, train_tokenizer

    tokenizer = train_tokenizer(toy_corpus(2000), vocab_size=512)  # run.build_assets's
    ids = {f"{t}_token_id": getattr(tokenizer, f"{t}_token_id") for t in ("pad", "bos", "eos")}
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    out, builds = {}, {"policy": AutoModelForCausalLM, "reward": AutoModelForSequenceClassification}
    for seed, (name, build) in enumerate(builds.items()):
        labels = {"num_labels": 1} if name == "reward" else {}
        config = Qwen2Config(vocab_size=spec["vocab_size"], tie_word_embeddings=name == "policy", **spec[name],
                             **ids, **labels)  # fmt: skip
        try:
            model = initialised(build, config, seed, device)
        except Exception as error:  # noqa: BLE001 - the GPU session has one shot: the CPU is slower but builds too
            print(f"building on {device} failed ({error}); building on the CPU", file=sys.stderr)
            model = initialised(build, config, seed, torch.device("cpu"))
        save_tiny(model, tokenizer, Path(spec["dir"]) / name)
        out[f"{name}_params"] = sum(p.numel() for p in model.parameters())
        del model
    return out


def initialised(build, config, seed: int, device):
    """``build.from_config(config)`` with its weights drawn on ``device`` from ``seed``, in bfloat16."""
    import torch

    torch.manual_seed(seed)
    with device:
        return build.from_config(config).to(torch.bfloat16)


def cuda_memory() -> dict | None:
    """This process's CUDA peaks (MB) and the GPU's name; None without a GPU."""
    import torch

    if not torch.cuda.is_available():
        return None
    return {
        "gpu": torch.cuda.get_device_name(),
        "max_allocated_mb": torch.cuda.max_memory_allocated() / 2**20,
        "max_reserved_mb": torch.cuda.max_memory_reserved() / 2**20,
    }


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text())
    result_path = Path(sys.argv[2])
    if spec["side"] == "build":
        result_path.write_text(json.dumps(build_models(spec)))
        return
    child = __import__("child_ours" if spec["side"] == "ours" else "child_trl")
    child.main()  # reads SPEC and writes RESULT from sys.argv, as when run on its own
    result = json.loads(result_path.read_text()) | {"cuda": cuda_memory()}
    result_path.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
