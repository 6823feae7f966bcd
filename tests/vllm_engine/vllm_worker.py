"""Run inside the vLLM virtualenv by test_vllm_engine.py: a tiny Llama sampled by `VLLMEngine` and by rlhf's own
engine, the trainer's log-probs of vLLM's samples before an update, after it (stale) and after `sync`.
Prints one JSON object of measurements."""

import json
import sys

import peft
import torch

from rlhf.config import ConfigError
from rlhf.core.logprobs import selective_log_softmax
from rlhf.data import left_pad
from rlhf.models.tiny import save_tiny, tiny_causal_lm, toy_corpus, train_tokenizer
from rlhf.rollout.engine import SamplingParams, sample
from rlhf.rollout.vllm_engine import VLLMEngine


def trainer_gap(policy, prompts, ids, logprobs, pad) -> float:
    """max |log π(y_t) − vLLM's log-prob| over every sampled token: the trainer's forward at temperature 1, over the
    vocabulary the engines draw from (the pad token excluded)."""
    worst = 0.0
    for prompt, row, theirs in zip(prompts, ids, logprobs, strict=True):
        seq = torch.tensor([prompt + row])
        with torch.no_grad():
            logits = policy(seq).logits.float()
            logits[..., pad] = float("-inf")
            ours = selective_log_softmax(logits[:, len(prompt) - 1 : -1], seq[:, len(prompt) :], temperature=1.0)[0]
        worst = max(worst, (ours - torch.tensor(theirs)).abs().max().item())
    return worst


def main(out_dir: str) -> None:
    tokenizer = train_tokenizer(toy_corpus(500), vocab_size=256)
    # head_dim 64: vLLM's CPU attention refuses 16 (the default tiny model's)
    policy = tiny_causal_lm("llama", tokenizer, hidden_size=128, num_heads=2, seed=0).eval()
    save_tiny(policy, tokenizer, out_dir)
    engine = VLLMEngine(out_dir, dtype="float32", memory_fraction=0.2, max_model_len=128, seed=0)
    prompts = [tokenizer(text).input_ids for text in ("the cat sees", "a small dog", "what is 3 + 4 ?", "the old")]
    pad, eos = tokenizer.pad_token_id, tokenizer.eos_token_id
    greedy = SamplingParams(max_new_tokens=10, top_k=1)
    theirs, _ = engine.sample(prompts, greedy, [], pad, seeds=[0] * len(prompts))
    ids, mask = left_pad(prompts, pad)
    ours = sample(policy, ids, mask, greedy, [], pad)[0].tolist()
    params = SamplingParams(max_new_tokens=16, temperature=1.0)
    seeds = [11, 12, 13, 14]
    sampled, logprobs = engine.sample(prompts, params, [eos], pad, seeds)
    again, _ = engine.sample(prompts, params, [eos], pad, seeds)
    stop = sampled[0][2]  # a token row 0 draws third: with it as the stop token, row 0 ends there
    stopped, _ = engine.sample(prompts, params, [stop], pad, seeds)
    before = trainer_gap(policy, prompts, sampled, logprobs, pad)
    with torch.no_grad():  # an "update": every weight moves
        generator = torch.Generator().manual_seed(1)
        for parameter in policy.parameters():
            parameter.add_(0.05 * torch.randn(parameter.shape, generator=generator))
    stale_ids, stale_logprobs = engine.sample(prompts, params, [eos], pad, seeds)
    stale = trainer_gap(policy, prompts, stale_ids, stale_logprobs, pad)
    engine.sync(policy)
    synced_ids, synced_logprobs = engine.sample(prompts, params, [eos], pad, seeds)
    synced = trainer_gap(policy, prompts, synced_ids, synced_logprobs, pad)
    # a LoRA policy (adapters that change the outputs): vLLM gets the base weights with the adapters added
    lora = peft.get_peft_model(
        policy, peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    )
    engine.sync(lora.eval())
    lora_ids, lora_logprobs = engine.sample(prompts, params, [eos], pad, seeds)
    gap_lora = trainer_gap(lora, prompts, lora_ids, lora_logprobs, pad)
    result = {
        "greedy_vllm": theirs,
        "greedy_rlhf": ours,
        "sampled": sampled,
        "sampled_again": again,
        "stop": stop,
        "stopped": stopped,
        "pad": pad,
        "max_new_tokens": params.max_new_tokens,
        "gap_before": before,
        "gap_stale": stale,
        "gap_synced": synced,
        "gap_lora": gap_lora,
        "version": engine.version,
    }
    engine.close()
    result |= sleep_mode(out_dir, lora.merge_and_unload(), prompts, params, eos, pad, seeds)
    try:  # vLLM refusing to start (here a dtype it has no kernels for) is the user's to fix, said as such
        VLLMEngine(out_dir, dtype="int8", memory_fraction=0.2, max_model_len=128)
    except ConfigError as error:
        result["start_refused"] = str(error)
    print(json.dumps(result))


def sleep_mode(out_dir, policy, prompts, params, eos, pad, seeds) -> dict:
    """Where vLLM has a sleep mode (CUDA, ROCm, XPU): the trainer's log-probs of what a sleeping engine samples once
    synced. Elsewhere (the CPU build): the refusal."""
    from vllm.platforms import current_platform

    if not current_platform.is_sleep_mode_available():
        try:
            VLLMEngine(out_dir, dtype="float32", memory_fraction=0.2, max_model_len=128, sleep=True)
        except ConfigError as error:
            return {"sleep_refused": str(error)}
        return {"sleep_refused": None}
    engine = VLLMEngine(out_dir, dtype="float32", memory_fraction=0.2, max_model_len=128, sleep=True)
    engine.sample(prompts, params, [eos], pad, seeds)  # asleep afterwards
    asleep = engine.llm.llm_engine.is_sleeping()
    engine.sync(policy)  # woken, then the policy's weights loaded
    ids, logprobs = engine.sample(prompts, params, [eos], pad, seeds)
    return {"slept": asleep, "gap_after_sleep": trainer_gap(policy, prompts, ids, logprobs, pad)}


if __name__ == "__main__":
    main(sys.argv[1])
