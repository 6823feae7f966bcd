"""The sampling loop: agrees with transformers' greedy decoding, stops and pads, respects the filters."""

from __future__ import annotations

import pytest
import torch
from torch.overrides import TorchFunctionMode
from transformers import AutoModelForCausalLM

from rlhf.config import ConfigError
from rlhf.data.collate import position_ids_from_mask
from rlhf.rollout.engine import RowGenerators, SamplingParams, filter_logits, sample


@pytest.fixture(scope="module")
def model(tiny_gpt2_dir):
    return AutoModelForCausalLM.from_pretrained(tiny_gpt2_dir).eval()


def _batch(tokenizer, texts):
    tokenizer.padding_side = "left"
    enc = tokenizer(texts, return_tensors="pt", padding=True)
    return enc.input_ids, enc.attention_mask


def test_greedy_matches_transformers_generate(model, tokenizer):
    ids, mask = _batch(tokenizer, ["one two three", "count to"])
    ours, _ = sample(model, ids, mask, SamplingParams(max_new_tokens=6, top_k=1), [], tokenizer.pad_token_id)
    theirs = model.generate(
        input_ids=ids,
        attention_mask=mask,
        max_new_tokens=6,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=tokenizer.pad_token_id,
    )[:, ids.shape[1] :]
    assert torch.equal(ours, theirs)


def test_stop_token_kept_and_rest_padded(model, tokenizer):
    ids, mask = _batch(tokenizer, ["a b c", "hello there friend"] * 4)
    gen = torch.Generator().manual_seed(0)
    params = SamplingParams(max_new_tokens=12, temperature=1.0)
    unstopped, _ = sample(model, ids, mask, params, [], tokenizer.pad_token_id, generator=gen)
    stop = int(unstopped[0, 2])  # a token we know row 0 samples third, under the same seed
    gen = torch.Generator().manual_seed(0)
    out, _ = sample(model, ids, mask, params, [stop], tokenizer.pad_token_id, generator=gen)
    assert int(out[0, 2]) == stop and bool((out[0, 3:] == tokenizer.pad_token_id).all())
    for row in out:
        hits = (row == stop).nonzero()
        if len(hits):
            first = int(hits[0])
            assert bool((row[first + 1 :] == tokenizer.pad_token_id).all())
            assert bool((row[: first + 1] != tokenizer.pad_token_id).all())
    assert not bool((out == tokenizer.pad_token_id).all(-1).any()), "no row may be empty"


def test_same_generator_state_same_samples(model, tokenizer):
    ids, mask = _batch(tokenizer, ["x y", "z"])
    params = SamplingParams(max_new_tokens=8, temperature=0.9, top_p=0.9)
    a = sample(model, ids, mask, params, [tokenizer.eos_token_id], 0, torch.Generator().manual_seed(3))
    b = sample(model, ids, mask, params, [tokenizer.eos_token_id], 0, torch.Generator().manual_seed(3))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_filter_logits_top_k_and_top_p():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    assert torch.isinf(filter_logits(logits, 2, 1.0)).tolist() == [[False, False, True, True]]
    # nucleus 0.7: 0.5 < 0.7, 0.5+0.3 ≥ 0.7 → keep the first two
    assert torch.isinf(filter_logits(logits, 0, 0.7)).tolist() == [[False, False, True, True]]
    # nucleus 0.8 exactly reached by two tokens; the third is dropped because the mass before it is 0.8
    assert torch.isinf(filter_logits(logits, 0, 0.8)).tolist() == [[False, False, True, True]]
    assert torch.isinf(filter_logits(logits, 0, 0.81)).tolist() == [[False, False, False, True]]
    assert not torch.isinf(filter_logits(logits, 0, 1.0)).any()


def test_sampling_params_validation():
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(max_new_tokens=4, temperature=0.0)
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(max_new_tokens=4, top_p=0.0)


@pytest.mark.parametrize("top_k, top_p", [(0, 1.0), (5, 1.0), (0, 0.8)])
def test_logprobs_are_those_of_the_distribution_drawn_from(model, tokenizer, top_k, top_p):
    """The engine's log-probs equal log softmax of the filtered, tempered logits of one full forward over prompt ⊕
    response (vLLM's ``processed_logprobs``), the pad token excluded as the engine excludes it."""
    ids, mask = _batch(tokenizer, ["one two three", "count to", "a"])
    params = SamplingParams(max_new_tokens=7, temperature=0.7, top_k=top_k, top_p=top_p)
    pad = tokenizer.pad_token_id
    out, logprobs = sample(model, ids, mask, params, [tokenizer.eos_token_id], pad, torch.Generator().manual_seed(1))
    full = torch.cat([ids, out], 1)
    full_mask = torch.cat([mask, (out != pad).long()], 1)
    with torch.no_grad():
        logits = model(full, attention_mask=full_mask, position_ids=position_ids_from_mask(full_mask)).logits
    logits = logits[:, ids.shape[1] - 1 : -1].float() / params.temperature
    logits[..., pad] = float("-inf")
    rows = [filter_logits(logits[:, t], top_k, top_p).log_softmax(-1) for t in range(out.shape[1])]
    expected = torch.stack(rows, 1).gather(-1, out[..., None]).squeeze(-1).masked_fill(out == pad, 0.0)
    # one forward against a KV-cached decode of the same logits: float32 rounding of ~400-way softmaxes (1e-5 ≈ 100
    # ulps of a log-prob of magnitude ~6)
    torch.testing.assert_close(logprobs, expected, rtol=0, atol=1e-5)
    assert bool((logprobs[out == pad] == 0).all())


def test_the_lean_engine_refuses_a_model_it_does_not_cover(model, tokenizer):
    ids, mask = _batch(tokenizer, ["one two"])
    with pytest.raises(ConfigError, match="lean decoder does not cover GPT2LMHeadModel; use auto or hf"):
        sample(model, ids, mask, SamplingParams(max_new_tokens=2), [], tokenizer.pad_token_id, engine="lean")


class _HostReads(TorchFunctionMode):
    """Counts what makes the host wait for a device: a tensor read as a Python bool, number or list."""

    READS = {torch.Tensor.__bool__, torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.__int__}

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.count += func in self.READS
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("every", [3, 16])
def test_checking_for_the_stop_every_k_steps_samples_the_same(model, tokenizer, every):
    """Rows stop at different steps; checking for the last stop every k steps runs up to k − 1 steps more, whose
    columns (all padding) are cut: the same ids and log-probs as checking at every step."""
    ids, mask = _batch(tokenizer, ["a b c", "hello there friend", "x", "one two"] * 2)
    params = SamplingParams(max_new_tokens=24, temperature=1.0)
    free, _ = sample(model, ids, mask, params, [], tokenizer.pad_token_id, RowGenerators.of(range(8)))
    # row i's token at step 2 + 2i is a stop: every row stops by step 16 (earlier where it samples a stop before)
    stops = sorted({int(free[i, 2 + 2 * i]) for i in range(8)})
    runs = [
        sample(model, ids, mask, params, stops, tokenizer.pad_token_id, RowGenerators.of(range(8)), stop_every=k)
        for k in (1, every)
    ]  # fmt: skip
    (once, once_logp), (rarely, rarely_logp) = runs
    assert once.shape[1] <= 17  # every row stopped before the limit
    assert torch.equal(once, rarely) and torch.equal(once_logp, rarely_logp)


@pytest.mark.parametrize("cuda_graphs", [False, True], ids=["eager", "static"])
@pytest.mark.parametrize(("every", "reads"), [(1, 19), (5, 3 + 1)])
def test_the_host_waits_once_per_check_not_once_per_token(tiny_llama_dir, every, reads, cuda_graphs):
    """No row stops (no stop tokens): 20 decode steps of the lean decoder read the finished flag at every k-th step
    but the last (the loop ends by its count), and once more at the end the column count (k > 1). Nothing else in
    the loop, nor in the decoder, reads a tensor on the host (transformers' own forward does: its mask checks); the
    static loop a CUDA graph replays (run as is here) reads the same."""
    llama = AutoModelForCausalLM.from_pretrained(tiny_llama_dir).eval()
    ids = torch.tensor([[7, 8, 9], [10, 11, 12]])
    params = SamplingParams(max_new_tokens=20, temperature=1.0)
    with _HostReads() as counter:
        out, _ = sample(llama, ids, torch.ones_like(ids), params, [], 0, RowGenerators.of([0, 1]),
                        stop_every=every, engine="lean", cuda_graphs=cuda_graphs)  # fmt: skip
    assert out.shape[1] == 20
    assert counter.count == reads
