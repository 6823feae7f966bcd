"""The shared scoring forward: shift, temperature, padding independence, value head, dropout."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM

from rlhf.core.logprobs import selective_log_softmax
from rlhf.models.policy import ValueHead, disable_dropout, score_response_tokens


def _left_pad(rows: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(map(len, rows))
    ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows])
    return ids, (ids != pad).long()


def test_logprobs_match_full_logits_reference(tiny_llama_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_llama_dir).eval()
    ids = torch.randint(3, 100, (3, 9))
    mask = torch.ones_like(ids)
    scored = score_response_tokens(model, ids, mask, response_length=4, temperature=0.7, with_entropy=True)
    full = model(ids).logits  # every position's logits; those at 4 … 7 predict the response tokens 5 … 8
    expected = selective_log_softmax(full[:, 4:-1], ids[:, 5:], temperature=0.7)
    torch.testing.assert_close(scored.logprobs, expected, rtol=1e-5, atol=1e-6)
    assert scored.entropy.shape == (3, 4) and bool((scored.entropy > 0).all())
    # without the temperature the numbers differ: the test can tell the two apart
    assert not torch.allclose(scored.logprobs, selective_log_softmax(full[:, 4:-1], ids[:, 5:], 1.0))


def test_left_padding_does_not_change_logprobs(tiny_gpt2_dir, tokenizer):
    # GPT-2 has absolute positions, so a missing position_ids would show here (see tests/models/test_tiny.py)
    model = AutoModelForCausalLM.from_pretrained(tiny_gpt2_dir).eval()
    pad = tokenizer.pad_token_id
    prompts = [[5, 6, 7, 8, 9, 10], [11, 12]]
    response = [[20, 21, 22], [23, 24, 25]]
    ids, mask = _left_pad([p + r for p, r in zip(prompts, response, strict=True)], pad)
    head = ValueHead(model.config.hidden_size)
    torch.nn.init.normal_(head.linear.weight)
    batched = score_response_tokens(model, ids, mask, 3, 1.0, value_head=head)
    for i, (p, r) in enumerate(zip(prompts, response, strict=True)):
        one = torch.tensor([p + r])
        single = score_response_tokens(model, one, torch.ones_like(one), 3, 1.0, value_head=head)
        torch.testing.assert_close(batched.logprobs[i], single.logprobs[0], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(batched.values[i], single.values[0], rtol=1e-5, atol=1e-5)


def test_value_head_starts_at_zero_and_reads_state_before_token(tiny_llama_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_llama_dir).eval()
    head = ValueHead(model.config.hidden_size)
    ids = torch.randint(3, 100, (2, 7))
    scored = score_response_tokens(model, ids, torch.ones_like(ids), 3, 1.0, value_head=head)
    assert torch.equal(scored.values, torch.zeros(2, 3))
    torch.nn.init.normal_(head.linear.weight)
    scored = score_response_tokens(model, ids, torch.ones_like(ids), 3, 1.0, value_head=head)
    hidden = model(ids, output_hidden_states=True).hidden_states[-1]
    # V(s_t) for response token t uses the hidden state at C−1+t, i.e. positions 3, 4, 5 of 7
    torch.testing.assert_close(scored.values, head(hidden[:, 3:6]), rtol=1e-5, atol=1e-6)


def test_disable_dropout_makes_train_mode_deterministic(tiny_gpt2_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_gpt2_dir).train()
    assert model.config.resid_pdrop > 0  # the fixture keeps GPT-2's dropout so this test means something
    ids = torch.randint(3, 100, (2, 8))
    assert not torch.equal(model(ids).logits, model(ids).logits)
    disable_dropout(model)
    assert torch.equal(model(ids).logits, model(ids).logits)


def test_entropy_as_a_metric_only_builds_no_graph(tiny_llama_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_llama_dir)
    ids = torch.tensor([[5, 6, 7, 8, 9, 10]])
    mask = torch.ones_like(ids)
    tracked = score_response_tokens(model, ids, mask, 3, 0.7, with_entropy=True)
    metric = score_response_tokens(model, ids, mask, 3, 0.7, with_entropy=True, entropy_grad=False)
    assert tracked.entropy.requires_grad and not metric.entropy.requires_grad
    assert metric.logprobs.requires_grad  # the log-probs still train
    assert torch.equal(tracked.entropy.detach(), metric.entropy)
