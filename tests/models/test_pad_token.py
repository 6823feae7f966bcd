"""The pad-token policy (rlhf.models.loading.align_pad_token): a pad id distinct from eos that every loaded
model embeds, in a spare embedding row when there is one, else in one new row set to the mean of the others.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

from rlhf.models.loading import load_causal_lm, load_tokenizer
from rlhf.models.policy import score_response_tokens
from rlhf.models.reward import load_reward_model
from rlhf.models.tiny import save_tiny, toy_corpus
from rlhf.rollout.rewards import RewardModelReward
from tiny_models import tiny_family_config, tiny_family_lm, train_family_tokenizer


@pytest.fixture(scope="module")
def family_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """GPT-2 (no pad, no spare row) and GPT-NeoX (no pad, spare rows) causal LMs, and a GPT-2 reward model."""
    root = tmp_path_factory.mktemp("pad_families")
    dirs = {}
    for family in ("gpt2", "gpt_neox"):
        tokenizer = train_family_tokenizer(family, toy_corpus(300))
        dirs[family] = save_tiny(tiny_family_lm(family, tokenizer, seed=0), tokenizer, root / family)
        if family == "gpt2":
            config = tiny_family_config(family, tokenizer)
            config.num_labels = 1
            torch.manual_seed(0)
            rm = AutoModelForSequenceClassification.from_config(config)
            dirs["gpt2_rm"] = save_tiny(rm, tokenizer, root / "gpt2_rm")
    return dirs


def test_a_model_without_a_spare_row_gets_one_mean_row(family_dirs):
    path = str(family_dirs["gpt2"])
    original = AutoModelForCausalLM.from_pretrained(path).eval()
    tokenizer = load_tokenizer(path)
    rows = original.get_input_embeddings().num_embeddings
    assert tokenizer.pad_token == "<|pad|>" and tokenizer.pad_token_id == rows != tokenizer.eos_token_id
    model = load_causal_lm(path, tokenizer=tokenizer).eval()
    weight = model.get_input_embeddings().weight
    assert weight.shape[0] == rows + 1 and model.get_output_embeddings().weight is weight  # still tied
    # float32 mean of `rows` numbers, recomputed here the same way: equal to rounding
    torch.testing.assert_close(weight[rows], original.get_input_embeddings().weight.mean(0), atol=1e-7, rtol=0)
    assert model.config.pad_token_id == model.generation_config.pad_token_id == tokenizer.pad_token_id
    ids = torch.tensor([tokenizer("the red cat sees a dog")["input_ids"]])
    with torch.no_grad():
        before, after = original(ids).logits, model(ids).logits
    # the old rows are untouched: the same products, float32 rounding of a 32-term dot product at most
    torch.testing.assert_close(after[..., :rows], before, atol=1e-5, rtol=1e-5)
    # the pad's logit is h·mean(W) = mean(h·W), the mean logit: linear, so equal up to the same rounding
    torch.testing.assert_close(after[..., rows], before.mean(-1), atol=1e-5, rtol=1e-5)
    # no random numbers: a second load (e.g. the reference model) is bit for bit the same
    again = load_causal_lm(path, tokenizer=tokenizer)
    assert torch.equal(again.get_input_embeddings().weight, weight)


def test_spare_embedding_rows_hold_the_pad_and_nothing_is_resized(family_dirs):
    path = str(family_dirs["gpt_neox"])
    rows = AutoModelForCausalLM.from_pretrained(path).get_input_embeddings().num_embeddings
    tokenizer = load_tokenizer(path)
    assert tokenizer.pad_token_id == len(tokenizer) - 1 < rows  # Pythia: the vocabulary is rounded up
    model = load_causal_lm(path, tokenizer=tokenizer)
    assert model.get_input_embeddings().num_embeddings == rows
    assert model.config.pad_token_id == tokenizer.pad_token_id


def test_a_tokenizer_with_a_distinct_pad_leaves_the_model_as_it_was(tiny_gpt2_dir):
    before = AutoModelForCausalLM.from_pretrained(tiny_gpt2_dir)
    model = load_causal_lm(str(tiny_gpt2_dir))
    assert model.get_input_embeddings().num_embeddings == before.get_input_embeddings().num_embeddings
    assert model.config.pad_token_id == before.config.pad_token_id


def test_scoring_never_gathers_the_pad_id(family_dirs):
    # the reported crash: "index 320 is out of bounds for dimension 1 with size 320" when a response is
    # padded with a pad id the model has no row for (a model loaded without align_pad_token)
    path = str(family_dirs["gpt2"])
    tokenizer = load_tokenizer(path)
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    pad = tokenizer.pad_token_id
    assert pad == model.get_input_embeddings().num_embeddings
    ids = torch.tensor([[5, 6, 7, tokenizer.eos_token_id, pad], [5, 6, 7, 8, 9]])
    mask = (ids != pad).long()
    with torch.no_grad():
        scored = score_response_tokens(model, ids, mask, response_length=3, temperature=1.0)
    assert scored.logprobs.shape == (2, 3) and scored.logprobs.isfinite().all()


def test_reward_models_embed_the_pad_and_share_the_policys_vocabulary(family_dirs):
    rm = load_reward_model(str(family_dirs["gpt2"]))  # trained from a causal LM: `rlhf rm`
    assert rm.model.config.pad_token_id == rm.tokenizer.pad_token_id < rm.model.get_input_embeddings().num_embeddings
    # an existing GPT-2 reward model whose tokenizer has no pad: scored through the policy's token ids
    policy_tokenizer = load_tokenizer(str(family_dirs["gpt2"]))
    source = RewardModelReward.load(str(family_dirs["gpt2_rm"]), policy_tokenizer=policy_tokenizer)
    assert source.shares_policy_tokenizer and source.pad_id == policy_tokenizer.pad_token_id
    rows = [policy_tokenizer(text)["input_ids"] for text in ("the red cat", "3 + 4 = 7 and more")]
    width = max(map(len, rows))
    ids = torch.tensor([[policy_tokenizer.pad_token_id] * (width - len(r)) + r for r in rows])  # left-padded
    scores = source.score_ids(ids, (ids != policy_tokenizer.pad_token_id).long())
    alone = torch.cat([source.score_ids(torch.tensor([r]), torch.ones(1, len(r), dtype=torch.long)) for r in rows])
    # float32, one 2-layer forward with and without padding: rounding only
    torch.testing.assert_close(scores, alone, atol=1e-5, rtol=1e-5)
