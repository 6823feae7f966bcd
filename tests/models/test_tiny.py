"""Tiny tokenizer and models (rlhf.models.tiny) behave like real Hugging Face checkpoints.

The padding tests are the ones the rest of the library stands on: a left-padded batch forward with explicit
position ids must give the same logits at the real tokens as one unpadded forward per sequence.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

from rlhf.models.tiny import ARCHS, tiny_causal_lm, tiny_reward_model, toy_corpus, train_tokenizer

PROMPTS = ["the red cat sees a dog in the park.", "3 + 4 = 7", "count to 9: 1 2 3 4 5 6 7 8 9"]
MESSAGES = [
    {"role": "system", "content": "answer briefly"},
    {"role": "user", "content": "what is 2 + 3?"},
    {"role": "assistant", "content": "5"},
    {"role": "user", "content": "and 1 + 1?"},
]


def position_ids_from(attention_mask: torch.Tensor) -> torch.Tensor:
    """Real tokens get positions 0, 1, 2, … whatever padding precedes them; pads get 0 (never attended)."""
    return (attention_mask.cumsum(-1) - 1).clamp(min=0)


# --------------------------------------------------------------------------------------------------------------
# Corpus and tokenizer
# --------------------------------------------------------------------------------------------------------------


def test_toy_corpus_is_deterministic_and_seeded() -> None:
    assert toy_corpus(50, seed=3) == toy_corpus(50, seed=3)
    assert toy_corpus(50, seed=3) != toy_corpus(50, seed=4)
    assert len(toy_corpus(7)) == 7 and all(isinstance(line, str) and line for line in toy_corpus(7))


def test_special_tokens_are_distinct(tokenizer) -> None:
    ids = [tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id]
    assert None not in ids and len(set(ids)) == 3  # checklist 1: pad is never eos
    assert (tokenizer.pad_token, tokenizer.bos_token, tokenizer.eos_token) == ("<|pad|>", "<|bos|>", "<|eos|>")
    assert tokenizer.padding_side == "right"
    assert tokenizer.model_max_length == 512
    # plain text gets no automatic bos/eos: prompt + response concatenations stay clean
    assert tokenizer("3 + 4 = 7")["input_ids"] == tokenizer.encode("3 + 4 = 7", add_special_tokens=False)
    # special tokens in text are single tokens
    assert tokenizer("<|user|>")["input_ids"] == [tokenizer.convert_tokens_to_ids("<|user|>")]


@pytest.mark.parametrize(
    "text", ["the red cat sees a dog.", 'Hello, World!\n\tTabs,  double  spaces; ~`@#$%^&*()_+{}|:"<>?[]\\ 0123456789']
)
def test_ascii_round_trip(tokenizer, text: str) -> None:
    assert tokenizer.decode(tokenizer(text)["input_ids"]) == text


def test_chat_template_generation_prompt(tokenizer) -> None:
    rendered = tokenizer.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    assert rendered == (
        "<|bos|><|system|>\nanswer briefly\n<|user|>\nwhat is 2 + 3?\n"
        "<|assistant|>\n5<|eos|><|user|>\nand 1 + 1?\n<|assistant|>\n"
    )
    without = tokenizer.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=False)
    assert rendered == without + "<|assistant|>\n"


def test_chat_template_assistant_turn_ends_with_eos_and_is_masked(tokenizer) -> None:
    out = tokenizer.apply_chat_template(
        MESSAGES[:3], tokenize=True, return_dict=True, return_assistant_tokens_mask=True
    )
    ids, mask = out["input_ids"], out["assistant_masks"]
    assert ids[0] == tokenizer.bos_token_id and ids[-1] == tokenizer.eos_token_id
    # SFT trains on exactly the assistant content and its eos — so the model learns to stop
    assert tokenizer.decode([i for i, m in zip(ids, mask, strict=True) if m]) == "5<|eos|>"


def test_chat_template_rejects_unknown_role(tokenizer) -> None:
    with pytest.raises(Exception, match="unknown chat role tool"):
        tokenizer.apply_chat_template([{"role": "tool", "content": "x"}], tokenize=False)


def test_other_tokenizer_ids_differ(tokenizer, other_tokenizer) -> None:
    text = PROMPTS[0]
    assert tokenizer(text)["input_ids"] != other_tokenizer(text)["input_ids"]
    assert other_tokenizer.decode(other_tokenizer(text)["input_ids"]) == text
    assert len(tokenizer) != len(other_tokenizer)
    for name in ("pad_token_id", "bos_token_id", "eos_token_id"):
        assert getattr(tokenizer, name) != getattr(other_tokenizer, name)
    # same chat format, different ids
    rendered = tokenizer.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    assert rendered == other_tokenizer.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)


def test_train_tokenizer_round_trips_through_save(tmp_path: Path) -> None:
    tok = train_tokenizer(toy_corpus(200, seed=5), vocab_size=300, model_max_length=128, specials_last=True)
    tok.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    assert len(loaded) == len(tok) and loaded.model_max_length == 128
    assert loaded.chat_template == tok.chat_template
    assert (loaded.pad_token_id, loaded.eos_token_id) == (tok.pad_token_id, tok.eos_token_id)
    assert loaded(PROMPTS[2])["input_ids"] == tok(PROMPTS[2])["input_ids"]


# --------------------------------------------------------------------------------------------------------------
# Causal LMs
# --------------------------------------------------------------------------------------------------------------


def test_causal_lm_loads_and_gives_finite_logits(tiny_model_dir: Path) -> None:
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    assert model.dtype == torch.float32
    assert (model.config.pad_token_id, model.config.eos_token_id) == (tok.pad_token_id, tok.eos_token_id)
    batch = tok(PROMPTS, return_tensors="pt", padding=True)
    with torch.no_grad():
        logits = model(**batch).logits
    assert logits.shape == (len(PROMPTS), batch["input_ids"].shape[1], len(tok))
    assert torch.isfinite(logits).all()


def test_every_model_dir_loads_the_same_tokenizer(tiny_model_dir: Path, tokenizer) -> None:
    """transformers 5 loads a model_type "qwen2" directory as a Qwen2Tokenizer rebuilt with its own
    pre-tokeniser and a default unk token; train_tokenizer is built so that this changes nothing."""
    loaded = AutoTokenizer.from_pretrained(tiny_model_dir)
    assert len(loaded) == len(tokenizer) == AutoModelForCausalLM.from_pretrained(tiny_model_dir).config.vocab_size
    assert loaded.all_special_tokens == tokenizer.all_special_tokens and loaded.unk_token is None
    for text in [*PROMPTS, "count to 12: 123 456", "Hello, World!  x\n\n y", "café"]:
        assert loaded(text)["input_ids"] == tokenizer(text)["input_ids"], text
    rendered = loaded.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    assert rendered == tokenizer.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)


def test_left_padded_batch_matches_unpadded_forwards(tiny_model_dir: Path) -> None:
    """Checklist 2: left padding + explicit position ids changes nothing at the real tokens."""
    tok = AutoTokenizer.from_pretrained(tiny_model_dir, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    batch = tok(PROMPTS, return_tensors="pt", padding=True)
    mask = batch["attention_mask"]
    assert (mask[:, 0] == 0).any() and (mask[:, -1] == 1).all(), "the batch must really be left-padded"
    with torch.no_grad():
        padded = model(**batch, position_ids=position_ids_from(mask)).logits
        for row, prompt in enumerate(PROMPTS):
            ids = tok(prompt, return_tensors="pt")["input_ids"]
            alone = model(input_ids=ids).logits[0]
            torch.testing.assert_close(padded[row, -1], alone[-1], atol=1e-5, rtol=1e-5)  # last token
            torch.testing.assert_close(padded[row, mask[row].bool()], alone, atol=1e-5, rtol=1e-5)  # every real one


def test_absolute_positions_need_position_ids(tiny_gpt2_dir: Path) -> None:
    """Why the test above is parametrised over gpt2: rotary models (llama, qwen2) are invariant to shifting
    all positions, so they pass without position_ids; learned absolute positions are not."""
    tok = AutoTokenizer.from_pretrained(tiny_gpt2_dir, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(tiny_gpt2_dir).eval()
    batch = tok(PROMPTS, return_tensors="pt", padding=True)
    with torch.no_grad():
        without = model(**batch).logits[:, -1]
        with_ids = model(**batch, position_ids=position_ids_from(batch["attention_mask"])).logits[:, -1]
    assert (without - with_ids).abs().max() > 1e-3


def test_same_seed_same_weights_and_save_round_trip(tiny_llama_dir: Path) -> None:
    tok = AutoTokenizer.from_pretrained(tiny_llama_dir)
    loaded = AutoModelForCausalLM.from_pretrained(tiny_llama_dir)
    rebuilt = tiny_causal_lm("llama", tok, seed=0)
    assert loaded.state_dict().keys() == rebuilt.state_dict().keys()
    for name, tensor in rebuilt.state_dict().items():
        assert torch.equal(tensor, loaded.state_dict()[name]), name
    other = tiny_causal_lm("llama", tok, seed=1)
    assert not torch.equal(other.lm_head.weight, rebuilt.lm_head.weight)


def test_builders_leave_the_global_rng_alone(tokenizer) -> None:
    state = torch.random.get_rng_state()
    tiny_causal_lm("llama", tokenizer, seed=123)
    assert torch.equal(torch.random.get_rng_state(), state)


@pytest.mark.parametrize("arch", ARCHS)
def test_architectures_are_distinct_and_sized_for_the_tokenizer(tokenizer, arch: str) -> None:
    model = tiny_causal_lm(arch, tokenizer)
    assert model.config.model_type == arch
    assert model.get_input_embeddings().weight.shape == (len(tokenizer), 64)
    assert model.config.bos_token_id == tokenizer.bos_token_id


def test_dropout_kept_by_default_and_overridable(tokenizer) -> None:
    def dropout_ps(model: nn.Module) -> set[float]:
        return {m.p for m in model.modules() if isinstance(m, nn.Dropout)}

    # gpt2 keeps its default 0.1 so that code which must disable dropout is really tested
    assert dropout_ps(tiny_causal_lm("gpt2", tokenizer)) == {0.1}
    assert dropout_ps(tiny_causal_lm("gpt2", tokenizer, dropout=0.0)) == {0.0}
    assert tiny_causal_lm("gpt2", tokenizer, dropout=0.0).config.attn_pdrop == 0.0
    assert tiny_causal_lm("llama", tokenizer, dropout=0.2).config.attention_dropout == 0.2


def test_unknown_architecture_is_refused(tokenizer) -> None:
    with pytest.raises(ValueError, match="unknown architecture 'bert'"):
        tiny_causal_lm("bert", tokenizer)  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------------------------
# Reward models
# --------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("which", ["tiny_reward_model_dir", "tiny_reward_model_other_tokenizer_dir"])
def test_reward_model_scores_shape_and_padding(request: pytest.FixtureRequest, which: str) -> None:
    path: Path = request.getfixturevalue(which)
    tok = AutoTokenizer.from_pretrained(path, padding_side="left")
    model = AutoModelForSequenceClassification.from_pretrained(path).eval()
    assert model.config.num_labels == 1 and model.config.pad_token_id == tok.pad_token_id
    batch = tok(PROMPTS, return_tensors="pt", padding=True)
    with torch.no_grad():
        scores = model(**batch, position_ids=position_ids_from(batch["attention_mask"])).logits
        alone = torch.cat([model(**tok(p, return_tensors="pt")).logits for p in PROMPTS])
    assert scores.shape == (len(PROMPTS), 1) and torch.isfinite(scores).all()
    torch.testing.assert_close(scores, alone, atol=1e-5, rtol=1e-5)


def test_reward_model_builder_returns_one_output(tokenizer) -> None:
    model = tiny_reward_model("qwen2", tokenizer).eval()
    batch = tokenizer(PROMPTS, return_tensors="pt", padding=True)
    with torch.no_grad():
        assert model(**batch).logits.shape == (len(PROMPTS), 1)


def test_conftest_architectures_match_the_library(request: pytest.FixtureRequest) -> None:
    # tests/conftest.py by its path: "import conftest" may find tests/compat/conftest.py, also on sys.path
    conftest = request.config.pluginmanager.get_plugin(str(Path(__file__).parents[1] / "conftest.py"))
    assert tuple(conftest.ARCHS) == ARCHS
