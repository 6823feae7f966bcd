"""One rank of the multi-process sharding tests: ``torchrun --nproc_per_node N sharding_worker.py TASK ...``.

Each task measures and writes its numbers as JSON (rank 0, to the last argument); the test asserts on them,
so a failure shows the numbers. Tasks:

* ``load BIG_DIR GPT2_DIR SMALL_DIR REWARD_DIR OUT``: peak loading memory (first, so the process's memory has
  not yet been through a larger peak), loaded weights = ``load_causal_lm``'s, ``gathered`` sampling, a frozen
  reward model (sharded by hand, and loaded sharded as a reward source), a critic loaded sharded;
* ``train BIG_DIR SMALL_DIR OUT``: two AdamW steps sharded vs one process on the whole batch, shard sizes,
  one LoRA step, the mixed-precision policy;
* ``save SMALL_DIR CKPT OUT`` / ``load-checkpoint SMALL_DIR CKPT OUT``: DCP checkpoints across world sizes.

The worker leaves with ``os._exit(0)`` after destroying the process group: see test_sharding.py on why.
"""

from __future__ import annotations

import copy
import functools
import gc
import json
import os
import resource
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import DTensor

from rlhf.models.loading import load_causal_lm, load_tokenizer
from rlhf.models.sharding import fsdp_modules, full_state_dict, gathered, load_sharded, shard
from rlhf.rollout.engine import SamplingParams, sample
from rlhf.runlog import sharded_checkpoint

LR = 1e-3
EPS = 1e-3
"""AdamW's eps. Large enough that its update lr·m̂/(√v̂ + eps) is a smooth function of the gradient (Lipschitz
in it with a constant of order lr/eps = 1): the sharded and one-process runs round their gradients
differently, and with the default eps = 1e-8 a gradient that is zero but for rounding would be blown up to
a full ±lr step in either direction. See `test_fsdp_training_matches_one_process` for the tolerance."""


def adamw(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=LR, eps=EPS)


# ---------------------------------------------------------------------------------------------------------
# shared helpers (the test process imports these too)
# ---------------------------------------------------------------------------------------------------------


def batch(vocab: int, rows: int = 4, length: int = 24, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Random ids (B, L) and a right-padding mask of unequal lengths: ranks hold unequal token counts, so
    only a token mean over the *global* batch matches the one-process loss."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (rows, length), generator=generator)
    lengths = torch.tensor([length, length - 5, length - 11, length - 2][:rows])
    mask = (torch.arange(length)[None] < lengths[:, None]).long()
    return ids, mask


def token_sum_loss(model: nn.Module, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Summed next-token cross-entropy over the real tokens (the caller divides by the global count)."""
    logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1].float()
    targets = ids[:, 1:].masked_fill(mask[:, 1:] == 0, -100)
    return nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="sum")


def train_steps(
    model: nn.Module, optimizer: torch.optim.Optimizer, ids, mask, steps: int, world: int, rank: int
) -> float:
    """``steps`` AdamW steps on this rank's rows of the global batch, minimising the global token mean.

    FSDP's reduce-scatter *averages* the ranks' gradients (divides their sum by ``world``). Each rank's
    loss is its token sum over the global token count, so the sum of the ranks' gradients is the gradient of
    the global mean; multiplying by ``world`` undoes the average. With world = 1 this is the plain loss.
    Returns the largest |gradient| of the first step (of this rank's shard when sharded).
    """
    rows = ids.shape[0] // world
    local = slice(rank * rows, (rank + 1) * rows)
    tokens = int(mask[:, 1:].sum())
    largest = []
    for _ in range(steps):
        loss = token_sum_loss(model, ids[local], mask[local]) / tokens * world
        loss.backward()
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        largest.append(max(float(_local(g).abs().max()) for g in grads))
        optimizer.step()
        optimizer.zero_grad()
    return largest[0]


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def max_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys(), sorted(set(a) ^ set(b))[:5]
    return max((float((a[k].float() - b[k].float()).abs().max()) for k in a), default=0.0)


# ---------------------------------------------------------------------------------------------------------
# tasks
# ---------------------------------------------------------------------------------------------------------


def rss_bytes() -> int:
    """Resident set size now (Linux ``/proc/self/statm``)."""
    return int(Path("/proc/self/statm").read_text().split()[1]) * resource.getpagesize()


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def task_load(mesh: DeviceMesh, big: str, gpt2: str, small: str, reward: str) -> dict:
    """Peak memory while loading, the loaded weights, then ``gathered`` sampling."""
    # Why RSS is a sound measure here: every byte a CPU tensor holds is in this process's resident memory
    # once written (and `to_empty` + the broadcast write every shard), so the high-water mark of RSS minus
    # RSS just before loading bounds from above what loading allocated — tensors, allocator slack, the
    # checkpoint's pages, everything. The bound is only sound if the high-water mark was not already above
    # the current RSS before loading (an earlier, larger peak would hide the growth): checked as
    # `headroom`, and why this task runs first. Imports and the tokenizer are done before the baseline so
    # they are not counted as loading.
    tokenizer = load_tokenizer(big)
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):  # imports the modeling code before the baseline
        AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(big))
    gc.collect()
    before, headroom = rss_bytes(), peak_rss_bytes() - rss_bytes()
    model = load_sharded(lambda device: load_causal_lm(big, device=device, tokenizer=tokenizer), mesh)
    grown = peak_rss_bytes() - before
    full_bytes = sum(p.numel() * p.element_size() for p in model.parameters())  # DTensor: global shape
    results = {"load_peak_over_full": grown / full_bytes, "load_headroom_over_full": headroom / full_bytes}
    results["load_difference"] = {big: compare_loaded(model, big, tokenizer)}
    del model
    gpt2_tokenizer = load_tokenizer(gpt2)
    model = load_sharded(lambda device: load_causal_lm(gpt2, device=device, tokenizer=gpt2_tokenizer), mesh)
    results["load_difference"][gpt2] = compare_loaded(model, gpt2, gpt2_tokenizer)
    results["gpt2_rows"] = int(model.get_input_embeddings().weight.shape[0])
    results |= task_gather(mesh, small)
    return results | task_reward_model(mesh, small, reward)


def compare_loaded(model: nn.Module, path: str, tokenizer) -> float | None:
    """Largest difference between the sharded model's full weights and ``load_causal_lm``'s, buffers included;
    the dropout settings must agree too."""
    state = full_state_dict(model)
    buffers = dict(model.named_buffers())  # FSDP leaves buffers whole on every rank
    if dist.get_rank() != 0:
        return None
    reference = load_causal_lm(path, tokenizer=tokenizer)
    expected_buffers = dict(reference.named_buffers())
    dropouts = [m.p for m in model.modules() if isinstance(m, nn.Dropout)]
    assert all(p == 0.0 for p in dropouts), dropouts
    assert reference.config.pad_token_id == model.config.pad_token_id == tokenizer.pad_token_id
    return max(max_difference(state, reference.state_dict()), max_difference(buffers, expected_buffers))


def count_all_gathers(run) -> tuple[int, int]:
    """How many all-gathers ``run()`` issues, counted twice from the profiler's record of the real calls:
    FSDP's ``FSDP::all_gather`` range (named ``FSDP::all_gather (<module>)`` once FSDP knows the module
    names) and gloo's own ``gloo:all_gather`` collective under it. Returns both counts."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        run()
    names = [event.name for event in profile.events()]
    fsdp = sum(1 for n in names if n == "FSDP::all_gather" or n.startswith("FSDP::all_gather ("))
    return fsdp, names.count("gloo:all_gather")


def task_gather(mesh: DeviceMesh, small: str) -> dict:
    """``sample`` inside ``gathered``: the tokens of an unsharded copy, and one all-gather per FSDP module
    however many tokens are drawn."""
    tokenizer = load_tokenizer(small)
    reference = load_causal_lm(small, tokenizer=tokenizer)
    model = load_sharded(lambda device: load_causal_lm(small, device=device, tokenizer=tokenizer), mesh)
    ids, mask = batch(len(tokenizer), rows=3, length=6, seed=1)
    ids = ids.masked_fill(mask == 0, tokenizer.pad_token_id).flip(-1)  # left-padded prompts
    mask = mask.flip(-1)

    def run(m: nn.Module, tokens: int, fast: bool) -> torch.Tensor:
        params = SamplingParams(max_new_tokens=tokens)
        generator = torch.Generator().manual_seed(7)
        return sample(m, ids, mask, params, [], tokenizer.pad_token_id, generator, engine="lean" if fast else "hf")[0]

    results: dict = {"gathered_equal": {}, "all_gathers": {}, "plain_inside": {}, "sharded_after": {}}
    for fast in (True, False):
        for tokens in (4, 16):
            out: dict[str, torch.Tensor] = {}

            def sharded(out=out, tokens=tokens, fast=fast) -> None:
                with gathered(model) as m:
                    # what the packed decoder reads: plain full tensors, not DTensor shards
                    out["plain_inside"] = not any(isinstance(p, DTensor) for p in m.parameters())
                    out["tokens"] = run(m, tokens, fast)
                out["sharded_after"] = all(isinstance(p, DTensor) for p in model.parameters())

            key = f"fast={fast},tokens={tokens}"
            results["all_gathers"][key] = count_all_gathers(sharded)
            results["gathered_equal"][key] = bool(torch.equal(out["tokens"], run(reference, tokens, fast)))
            results["plain_inside"][key] = out["plain_inside"]
            results["sharded_after"][key] = out["sharded_after"]
            assert out["tokens"].shape[1] == tokens  # no stop token: every step ran
    # without `gathered`, FSDP's hooks gather every layer on every forward: the count grows with the tokens
    for tokens in (4, 16):
        results["all_gathers"][f"ungathered,tokens={tokens}"] = count_all_gathers(lambda t=tokens: run(model, t, False))
    results["fsdp_modules"] = len(fsdp_modules(model))
    return results


def task_reward_model(mesh: DeviceMesh, small: str, reward: str) -> dict:
    """A frozen sequence-classification reward model shards and scores as its unsharded copy does; loaded
    as a reward source (each rank holds its shards only) it scores unequal numbers of rows per rank inside
    ``gathered``; a critic built from it loads sharded with the same weights."""
    from rlhf.models.critic import load_critic
    from rlhf.models.tiny import tiny_reward_model, toy_corpus
    from rlhf.rollout.rewards import RewardModelReward

    tokenizer = load_tokenizer(small)
    model = tiny_reward_model("llama", tokenizer).requires_grad_(False)
    reference = copy.deepcopy(model)
    shard(model, mesh)
    ids, mask = batch(len(tokenizer))
    with torch.no_grad():
        scores = model(input_ids=ids, attention_mask=mask).logits
        expected = reference(input_ids=ids, attention_mask=mask).logits
    results = {"reward_difference": float((scores - expected).abs().max()), "reward_shape": list(scores.shape)}

    source = RewardModelReward.load(reward, batch_size=2, loader=functools.partial(load_sharded, mesh=mesh))
    plain = RewardModelReward.load(reward, batch_size=2)
    parameters = list(source.model.parameters())
    results["source_sharded"] = all(isinstance(p, DTensor) for p in parameters)
    local = sum(_local(p).numel() for p in parameters)
    results["source_local_fraction"] = local / sum(p.numel() for p in parameters)
    lines = toy_corpus(14, seed=dist.get_rank())[: 10 if dist.get_rank() == 0 else 4]  # 5 and 2 micro-batches
    with gathered(source.model):
        sharded_scores = source.score(lines[::2], lines[1::2])
    plain_scores = plain.score(lines[::2], lines[1::2])
    results["source_score_difference"] = max(abs(a - b) for a, b in zip(sharded_scores, plain_scores, strict=True))

    critic = load_sharded(lambda device: load_critic(reward, from_reward_model=True, device=device), mesh)
    state = full_state_dict(critic)
    if dist.get_rank() == 0:
        expected = load_critic(reward, from_reward_model=True).state_dict()
        results["critic_difference"] = max_difference(state, expected)
    return results


def local_bytes(model: nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """Bytes this rank holds of the parameters and their optimizer state (a DTensor's local shard only)."""
    tensors = list(model.parameters())
    tensors += [v for state in optimizer.state.values() for v in state.values() if torch.is_tensor(v)]
    return sum(_local(t).numel() * _local(t).element_size() for t in tensors)


def task_train(mesh: DeviceMesh, big: str, small: str) -> dict:
    """Two AdamW steps: 2 ranks × half the batch vs one process on the whole batch; then a LoRA step."""
    rank, world = dist.get_rank(), dist.get_world_size()
    tokenizer = load_tokenizer(big)
    model = load_causal_lm(big, tokenizer=tokenizer)  # every rank: the same weights
    reference = copy.deepcopy(model) if rank == 0 else None
    ids, mask = batch(len(tokenizer))
    shard(model, mesh)
    optimizer = adamw(model)
    train_steps(model, optimizer, ids, mask, 2, world, rank)
    results = {"shard_bytes": local_bytes(model, optimizer)}
    state = full_state_dict(model)
    if reference is not None:
        ref_optimizer = adamw(reference)
        results["max_gradient"] = train_steps(reference, ref_optimizer, ids, mask, 2, 1, 0)
        results["one_process_bytes"] = local_bytes(reference, ref_optimizer)
        results["train_difference"] = max_difference(state, reference.state_dict())
        results["train_moved"] = max_difference(state, load_causal_lm(big, tokenizer=tokenizer).state_dict())
    del model, optimizer, reference
    return results | task_lora(mesh, small) | task_mixed_precision(mesh, small)


def task_mixed_precision(mesh: DeviceMesh, small: str) -> dict:
    """``shard(mixed_precision=True)`` (meant for CUDA, but the policy is device-agnostic): the forward runs
    in bfloat16, the sharded weights and the reduced gradients stay float32."""
    tokenizer = load_tokenizer(small)
    model = load_causal_lm(small, tokenizer=tokenizer)
    reference = copy.deepcopy(model)
    shard(model, mesh, mixed_precision=True)
    ids, mask = batch(len(tokenizer))
    logits = model(input_ids=ids, attention_mask=mask).logits
    logits.float().sum().backward()
    with torch.no_grad():
        expected = reference(input_ids=ids, attention_mask=mask).logits
    return {
        "mp_logits_dtype": str(logits.dtype),
        "mp_param_dtypes": sorted({str(p.dtype) for p in model.parameters()}),
        "mp_grad_dtypes": sorted({str(p.grad.dtype) for p in model.parameters()}),
        "mp_relative_difference": float((logits.float() - expected).abs().max() / expected.abs().max()),
    }


def task_lora(mesh: DeviceMesh, small: str) -> dict:
    """A peft LoRA model (only adapters trainable) shards, trains a step, and equals one process's step."""
    from rlhf.config import LoRAConfig
    from rlhf.models.loading import apply_lora

    rank, world = dist.get_rank(), dist.get_world_size()
    tokenizer = load_tokenizer(small)
    torch.manual_seed(0)  # the adapters' random init, the same on every rank
    model = apply_lora(load_causal_lm(small, tokenizer=tokenizer), LoRAConfig(r=4, alpha=8))
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():  # peft starts B at zero: make the adapters matter in the first forward
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.02, generator=generator)
    reference = copy.deepcopy(model) if rank == 0 else None
    ids, mask = batch(len(tokenizer))
    shard(model, mesh)
    optimizer = adamw(model)
    train_steps(model, optimizer, ids, mask, 1, world, rank)
    state = full_state_dict(model)
    if reference is None:
        return {}
    before = {k: v.clone() for k, v in reference.state_dict().items()}
    ref_optimizer = adamw(reference)
    max_gradient = train_steps(reference, ref_optimizer, ids, mask, 1, 1, 0)
    return {
        "lora_difference": max_difference(state, reference.state_dict()),
        "lora_moved": max_difference(state, before),
        "lora_max_gradient": max_gradient,
        "lora_trainable": sum(1 for p in reference.parameters() if p.requires_grad),
        "lora_frozen_moved": max(
            float((state[n] - before[n]).abs().max()) for n, p in reference.named_parameters() if not p.requires_grad
        ),
    }


def checkpoint_state(models: dict[str, nn.Module], optimizer: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    """Full (unsharded) model and optimizer state as one flat dict on CPU, for comparing across world sizes."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    model_state, optimizer_state = get_state_dict(nn.ModuleDict(models), optimizer, options=options)
    flat = {f"model.{k}": v for k, v in model_state.items()}
    for name, per_param in optimizer_state.get("state", {}).items():  # empty but on rank 0
        flat |= {f"optimizer.{name}.{k}": torch.as_tensor(v) for k, v in per_param.items()}
    return flat


def checkpoint_models(small: str, mesh: DeviceMesh | None, seed: int) -> tuple[dict, torch.optim.Optimizer]:
    """A policy and a frozen reference of ``small`` (sharded over ``mesh`` unless None), with an AdamW
    optimizer on the policy; ``seed`` perturbs the weights so a load visibly replaces them."""
    tokenizer = load_tokenizer(small)
    models = {
        "policy": load_causal_lm(small, tokenizer=tokenizer),
        "reference": load_causal_lm(small, tokenizer=tokenizer),
    }
    models["reference"].requires_grad_(False)
    with torch.no_grad():
        generator = torch.Generator().manual_seed(seed)
        for p in models["policy"].parameters():
            p.add_(torch.randn(p.shape, generator=generator) * 0.01)
    if mesh is not None:
        for model in models.values():
            shard(model, mesh)
    return models, adamw(models["policy"])


def task_save(mesh: DeviceMesh | None, small: str, directory: str) -> dict:
    """One training step, then a save; returns the full state that was saved."""
    models, optimizer = checkpoint_models(small, mesh, seed=1)
    ids, mask = batch(models["policy"].config.vocab_size)
    train_steps(models["policy"], optimizer, ids, mask, 1, *_world_rank(mesh))
    extra = {"step": 1, "rng": torch.get_rng_state(), "kl_coef": 0.05}
    sharded_checkpoint.save_sharded(directory, models, optimizer, extra)
    return checkpoint_state(models, optimizer)


def task_load_checkpoint(mesh: DeviceMesh | None, small: str, directory: str) -> tuple[dict, dict]:
    """Fresh (differently perturbed) models loaded from ``directory``: their full state and ``extra``."""
    models, optimizer = checkpoint_models(small, mesh, seed=2)
    ids, mask = batch(models["policy"].config.vocab_size, seed=3)
    train_steps(models["policy"], optimizer, ids, mask, 1, *_world_rank(mesh))  # state to overwrite
    extra = sharded_checkpoint.load_sharded(directory, models, optimizer)
    return checkpoint_state(models, optimizer), extra


def _world_rank(mesh: DeviceMesh | None) -> tuple[int, int]:
    return (dist.get_world_size(), dist.get_rank()) if mesh is not None else (1, 0)


def main() -> None:
    task, *args = sys.argv[1:]
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    try:
        if task == "load":
            results = task_load(mesh, *args[:4])
        elif task == "train":
            results = task_train(mesh, *args[:2])
        elif task == "save":
            saved = task_save(mesh, *args[:2])
            loaded, extra = task_load_checkpoint(mesh, *args[:2])  # the same world size
            results = {"step": extra["step"]}
            if dist.get_rank() == 0:  # the full states are gathered on rank 0 only
                results["same_world_difference"] = max_difference(saved, loaded)
                torch.save(saved, Path(args[1]).with_suffix(".saved.pt"))
        elif task == "load-checkpoint":
            loaded, extra = task_load_checkpoint(mesh, *args[:2])
            results = {"step": extra["step"]}
            if dist.get_rank() == 0:
                saved = torch.load(Path(args[1]).with_suffix(".saved.pt"))
                results["other_world_difference"] = max_difference(saved, loaded)
        else:
            raise ValueError(f"unknown task {task!r}")
        results["rank"] = dist.get_rank()
        Path(f"{args[-1]}.rank{dist.get_rank()}.json").write_text(json.dumps(results))
        dist.barrier()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # Leave without the interpreter's teardown: the process group is destroyed, every rank passed the
    # barrier, the results are written. `destroy_process_group` does not end gloo's worker threads once
    # DTensors were used (DTensor's caches keep the DeviceMesh, and with it the process group, alive), so
    # those threads would still be running while Python finalises, which aborted about one run in ten with
    # "terminate called without an active exception" (SIGABRT); see tests/distributed/test_sharding.py.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
