"""The weights `VLLMEngine.sync` hands to vLLM (no vLLM needed here: tests/vllm_engine runs the engine itself)."""

from __future__ import annotations

import copy

import peft
import torch

from rlhf.models.tiny import tiny_causal_lm, toy_corpus, train_tokenizer
from rlhf.rollout.vllm_engine import plain_weights


def test_a_lora_policy_hands_over_its_merged_weights_under_the_base_models_names():
    tokenizer = train_tokenizer(toy_corpus(200), vocab_size=128)
    base = tiny_causal_lm("llama", tokenizer, seed=0).eval()
    plain = copy.deepcopy(base)
    # init_lora_weights=False: random B, so the adapters change the outputs
    config = peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    policy = peft.get_peft_model(base, config).eval()
    before = {name: p.detach().clone() for name, p in policy.named_parameters()}
    weights = dict(plain_weights(policy))
    assert set(weights) == set(plain.state_dict())
    plain.load_state_dict(weights)
    ids = torch.tensor([[3, 17, 42, 9, 64, 5]])
    with torch.no_grad():
        # W + B·A computed once against the adapters applied on the fly: float32 rounding of a 64-wide sum, ~1e-7
        assert torch.allclose(plain(ids).logits, policy(ids).logits, atol=1e-5, rtol=0)
    assert all(torch.equal(p, before[name]) for name, p in policy.named_parameters())  # the policy is untouched


def test_a_plain_policy_hands_over_its_state_dict():
    tokenizer = train_tokenizer(toy_corpus(200), vocab_size=128)
    policy = tiny_causal_lm("llama", tokenizer, seed=0)
    weights = plain_weights(policy)
    state = policy.state_dict()
    assert [name for name, _ in weights] == list(state)
    assert all(torch.equal(tensor, state[name]) for name, tensor in weights)
