"""Tiny random-init models and locally trained tokenizers, for tests and ``rlhf demo`` — no downloads.

Everything here is built offline in seconds: a byte-level BPE tokenizer trained with the ``tokenizers``
library on :func:`toy_corpus` (or any texts), and causal LMs / reward models built from a ``transformers``
config with random weights. The results are ordinary Hugging Face objects: save them with :func:`save_tiny`
and load them back with ``AutoTokenizer`` / ``AutoModelForCausalLM`` / ``AutoModelForSequenceClassification``
exactly as a user would load a hub checkpoint. For encoder reward models there is a BERT classifier
(:func:`tiny_bert_classifier`) with its own WordPiece tokenizer (:func:`train_wordpiece_tokenizer`).
For the model families users bring (GPT-2, GPT-NeoX/Pythia, OPT, Qwen2, Gemma-2, Phi-3, Llama-3, see
:data:`FAMILIES`) :func:`train_family_tokenizer` mimics each family's tokenizer quirks (no pad, pad = eos,
bos = eos, bos added, chat template or none) and :func:`tiny_family_lm` builds a tiny model of its
architecture (spare embedding rows where the real checkpoints have them); the conventions below are those of
:func:`train_tokenizer` only.

Tokenizer conventions (checklist items 1-2):

* ``<|pad|>``, ``<|bos|>`` and ``<|eos|>`` are three distinct special tokens: pad is never eos, so masks
  built from ``ids != pad_token_id`` never hide a real end-of-sequence.
* Encoding plain text adds no special tokens (no automatic bos/eos, like GPT-2 and Qwen2); the chat
  template writes ``<|bos|>`` itself and closes every assistant turn with ``<|eos|>``.
* ``padding_side`` is ``"right"`` (the Hugging Face default). Code that generates from a batch of prompts
  must pad on the left; it sets ``tokenizer.padding_side = "left"`` itself (or pads by hand).

Chat format rendered by the template (``add_generation_prompt=True`` appends the final ``<|assistant|>\\n``)::

    <|bos|><|system|>\\n{system}\\n<|user|>\\n{user}\\n<|assistant|>\\n{assistant}<|eos|><|user|>\\n...
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import (
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    BertConfig,
    BertForSequenceClassification,
    GPT2Config,
    LlamaConfig,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
    Qwen2Config,
)

Arch = Literal["llama", "gpt2", "qwen2"]
ARCHS: tuple[Arch, ...] = ("llama", "gpt2", "qwen2")
"""Architectures :func:`tiny_causal_lm` and :func:`tiny_reward_model` can build."""

PAD_TOKEN = "<|pad|>"
BOS_TOKEN = "<|bos|>"
EOS_TOKEN = "<|eos|>"
# Split before byte-level encoding: contractions, letter runs (with one leading non-letter such as a space),
# single digits (so "123" is 1 2 3: arithmetic stays learnable), punctuation runs, newlines, other spaces.
# This is the regex of transformers' Qwen2Tokenizer (GPT-4 style), see train_tokenizer for why it must be.
PRETOKENIZE_REGEX = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
ROLE_TOKENS = {"system": "<|system|>", "user": "<|user|>", "assistant": "<|assistant|>"}
"""Role markers of the chat template; special tokens, so user text can never split into them."""

# Jinja chat template. HF renders it with trim_blocks/lstrip_blocks, so all literal text (newlines included)
# lives inside {{ }} expressions. The assistant content and its eos sit in a {% generation %} block, which is
# what `apply_chat_template(..., return_assistant_tokens_mask=True)` uses to mark the tokens SFT trains on —
# the eos included, so the model learns to stop.
CHAT_TEMPLATE = (
    "{{- bos_token -}}"
    "{%- for message in messages -%}"
    "{%- if message['role'] not in ['system', 'user', 'assistant'] -%}"
    "{{- raise_exception('unknown chat role ' ~ message['role'] ~ '; expected system, user or assistant') -}}"
    "{%- endif -%}"
    "{{- '<|' ~ message['role'] ~ '|>\\n' -}}"
    "{%- if message['role'] == 'assistant' -%}"
    "{%- generation -%}{{- message['content'] ~ eos_token -}}{%- endgeneration -%}"
    "{%- else -%}"
    "{{- message['content'] ~ '\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|assistant|>\\n' -}}{%- endif -%}"
)


# --------------------------------------------------------------------------------------------------------------
# Corpus and tokenizer
# --------------------------------------------------------------------------------------------------------------

_NOUNS = ["cat", "dog", "bird", "fish", "child", "cow", "robot", "farmer", "river", "tree", "book", "ball"]
_ADJECTIVES = ["small", "big", "red", "blue", "happy", "quiet", "old", "young", "fast", "slow"]
_VERBS = ["sees", "likes", "finds", "follows", "helps", "watches", "reads", "builds"]
_PLACES = ["in the park", "by the river", "at home", "under the tree", "on the hill", "at school"]


def toy_corpus(n: int = 2000, seed: int = 0) -> list[str]:
    """``n`` short lines of a toy language, the same for the same ``(n, seed)``.

    Four kinds of line, drawn uniformly: a simple sentence ("the red cat sees a dog in the park."),
    an addition ("3 + 4 = 7"), counting ("count to 4: 1 2 3 4") and a question with its answer
    ("what is 2 + 5? 7"). Enough structure for a tokenizer to learn useful merges and for a tiny model
    to learn something within a CPU minute.
    """
    rng = random.Random(seed)
    lines = []
    for _ in range(n):
        kind = rng.randrange(4)
        if kind == 0:
            adjective, noun, verb, other = (rng.choice(x) for x in (_ADJECTIVES, _NOUNS, _VERBS, _NOUNS))
            lines.append(f"the {adjective} {noun} {verb} a {other} {rng.choice(_PLACES)}.")
        elif kind == 1:
            a, b = rng.randrange(10), rng.randrange(10)
            lines.append(f"{a} + {b} = {a + b}")
        elif kind == 2:
            k = rng.randint(1, 9)
            lines.append(f"count to {k}: " + " ".join(str(i) for i in range(1, k + 1)))
        else:
            a, b = rng.randrange(10), rng.randrange(10)
            lines.append(f"what is {a} + {b}? {a + b}")
    return lines


def _train_bpe(texts: Iterable[str], vocab_size: int, specials: list[str], specials_last: bool) -> Tokenizer:
    """A byte-level BPE backend trained on ``texts``: ``specials`` at ids 0.. (or none yet when
    ``specials_last``: the wrapper appends them after the trained vocabulary)."""
    backend = Tokenizer(models.BPE())
    # The same normaliser and pre-tokeniser as transformers' Qwen2Tokenizer, because AutoTokenizer always
    # loads a directory whose config.json says model_type "qwen2" as a Qwen2Tokenizer, rebuilt from our
    # vocab and merges with its own pre-tokeniser: matching it makes every tiny directory tokenise alike.
    backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(specials) if specials_last else vocab_size,
        special_tokens=[] if specials_last else specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(texts, trainer=trainer)
    return backend


def train_tokenizer(
    texts: Iterable[str], vocab_size: int = 512, *, model_max_length: int = 512, specials_last: bool = False
) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer on ``texts`` and wrap it as a Hugging Face fast tokenizer.

    Args:
        texts: training text, e.g. :func:`toy_corpus`. Any text round-trips through encode/decode whatever
            the corpus: the 256 byte symbols are always in the vocabulary.
        vocab_size: total vocabulary size, special tokens included (an upper bound: training stops early
            when the corpus has no more pairs to merge). Use ``len(tokenizer)`` for the real size.
        model_max_length: longest sequence the tokenizer reports (``tokenizer.model_max_length``); the tiny
            models use it as their number of positions.
        specials_last: put the special tokens at the end of the vocabulary (as GPT-2 and Llama 3 do) instead
            of at ids 0..5. Two tokenizers that differ here disagree on every special-token id, which
            tests of re-encoding between tokenizers rely on.

    Returns:
        A ``PreTrainedTokenizerFast`` with distinct ``pad``/``bos``/``eos`` tokens, the chat template
        :data:`CHAT_TEMPLATE`, ``padding_side="right"`` and no automatically added special tokens.
    """
    specials = [PAD_TOKEN, BOS_TOKEN, EOS_TOKEN, *ROLE_TOKENS.values()]
    backend = _train_bpe(texts, vocab_size, specials, specials_last)
    # Special tokens not known to the trained model are appended at the end of the vocabulary when the
    # wrapper registers them below; ones already trained in keep their ids 0..5.
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD_TOKEN,
        # Byte-level BPE has no unknown token. Saying so explicitly (null in tokenizer_config.json) stops
        # Qwen2Tokenizer from adding its default unk "<|endoftext|>" when a qwen2 directory is loaded.
        unk_token=None,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        # `additional_special_tokens` is accepted by transformers 4.x and 5.x (5.x renames it
        # `extra_special_tokens` and converts the old name).
        additional_special_tokens=list(ROLE_TOKENS.values()),
        model_max_length=model_max_length,
        padding_side="right",
        clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    ids = {tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id}
    if len(ids) != 3 or None in ids:  # checklist 1; cannot happen unless the token constants are edited
        raise RuntimeError(f"pad, bos and eos must be three distinct tokens, got ids {ids}")
    return tokenizer


# --------------------------------------------------------------------------------------------------------------
# Models
# --------------------------------------------------------------------------------------------------------------


def tiny_config(
    arch: Arch,
    tokenizer: PreTrainedTokenizerBase,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    *,
    dropout: float | None = None,
    max_position_embeddings: int | None = None,
    **overrides: object,
) -> PretrainedConfig:
    """A small ``transformers`` config of the given architecture, sized and tokenised for ``tokenizer``.

    ``vocab_size = len(tokenizer)``; ``pad/bos/eos_token_id`` come from the tokenizer; the number of
    positions defaults to ``tokenizer.model_max_length``. Differences between the architectures are kept on
    purpose so the library is tested against them: gpt2 has learned absolute positions, tied embeddings and
    dropout 0.1 by default; llama has rotary positions, untied embeddings and no dropout; qwen2 adds
    attention biases and grouped-query attention (``num_heads // 2`` key/value heads).

    Args:
        dropout: when given, every dropout probability of the config is set to it (gpt2: residual,
            embedding, attention and summary dropout; llama/qwen2: attention dropout). ``None`` keeps the
            architecture's defaults, so code that must disable dropout in RLHF is really exercised.
        overrides: any further config fields, passed to the config class as is.
    """
    if arch not in ARCHS:
        raise ValueError(f"unknown architecture {arch!r}; expected one of {', '.join(ARCHS)}")
    n_positions = max_position_embeddings or int(tokenizer.model_max_length)
    fields = _size_fields(arch, hidden_size, num_layers, num_heads, n_positions)
    fields |= {
        "vocab_size": len(tokenizer),
        "pad_token_id": tokenizer.pad_token_id,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
    }
    if dropout is not None:
        names = (
            ("resid_pdrop", "embd_pdrop", "attn_pdrop", "summary_first_dropout")
            if arch == "gpt2"
            else ("attention_dropout",)
        )
        fields |= dict.fromkeys(names, dropout)
    config_class = {"gpt2": GPT2Config, "llama": LlamaConfig, "qwen2": Qwen2Config}[arch]
    return config_class(**fields, **overrides)


def _size_fields(model_type: str, hidden_size: int, num_layers: int, num_heads: int, positions: int) -> dict:
    """The sizes of a tiny model under its architecture's own config names (MLP 4× wide; grouped-query
    attention with half the heads where the family ships it)."""
    if model_type == "gpt2":
        return {"n_embd": hidden_size, "n_layer": num_layers, "n_head": num_heads, "n_positions": positions}
    fields: dict[str, object] = {
        "hidden_size": hidden_size,
        "num_hidden_layers": num_layers,
        "num_attention_heads": num_heads,
        "max_position_embeddings": positions,
    }
    if model_type == "opt":
        fields |= {"ffn_dim": 4 * hidden_size, "word_embed_proj_dim": hidden_size}
    else:
        fields["intermediate_size"] = 4 * hidden_size
    if model_type in ("qwen2", "gemma2"):
        fields["num_key_value_heads"] = max(1, num_heads // 2)
    return fields


def _seeded(build: Any, config: PretrainedConfig, seed: int) -> PreTrainedModel:
    """``build(config)`` with weights drawn from ``seed``; the global torch RNG is left as it was."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build(config)


def tiny_causal_lm(
    arch: Arch,
    tokenizer: PreTrainedTokenizerBase,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    seed: int = 0,
    *,
    dropout: float | None = None,
    max_position_embeddings: int | None = None,
) -> PreTrainedModel:
    """A randomly initialised causal LM (``AutoModelForCausalLM``) of architecture ``arch`` for ``tokenizer``.

    The same ``seed`` gives the same weights; the global torch RNG is left as it was. The model is in torch's default
    dtype (float32), in train mode (as ``from_config`` returns it), and ``save_pretrained``/``from_pretrained`` round-trippable.
    See :func:`tiny_config` for sizes, ``dropout`` and the differences between architectures.
    """
    sizes = {"hidden_size": hidden_size, "num_layers": num_layers, "num_heads": num_heads}
    config = tiny_config(arch, tokenizer, **sizes, dropout=dropout, max_position_embeddings=max_position_embeddings)
    return _seeded(AutoModelForCausalLM.from_config, config, seed)


def tiny_reward_model(
    arch: Arch,
    tokenizer: PreTrainedTokenizerBase,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    seed: int = 0,
    *,
    dropout: float | None = None,
    max_position_embeddings: int | None = None,
) -> PreTrainedModel:
    """A randomly initialised reward model: ``AutoModelForSequenceClassification`` with one output.

    ``num_labels=1`` and ``pad_token_id`` set, so the model returns logits of shape ``(B, 1)``, read by
    transformers at the rightmost non-pad token of each row. Same arguments and guarantees as
    :func:`tiny_causal_lm`.
    """
    sizes = {"hidden_size": hidden_size, "num_layers": num_layers, "num_heads": num_heads}
    config = tiny_config(
        arch, tokenizer, **sizes, dropout=dropout, max_position_embeddings=max_position_embeddings, num_labels=1
    )
    return _seeded(AutoModelForSequenceClassification.from_config, config, seed)


# --------------------------------------------------------------------------------------------------------------
# Model families: a tokenizer with each family's quirks and a tiny model of its architecture
# --------------------------------------------------------------------------------------------------------------

CHATML_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' ~ message['role'] ~ '\\n' ~ message['content'] ~ '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)
"""Qwen2's ChatML: every turn ends with ``<|im_end|>`` (its eos) and a newline; no bos."""
GEMMA_TEMPLATE = (
    "{{- bos_token -}}"
    "{%- for message in messages -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}"
    "{{- '<start_of_turn>' ~ role ~ '\\n' ~ message['content'] ~ '<end_of_turn>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<start_of_turn>model\\n' -}}{%- endif -%}"
)
"""Gemma's: the template writes bos; turns end with ``<end_of_turn>``, which is not the eos."""
PHI3_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|' ~ message['role'] ~ '|>\\n' ~ message['content'] ~ '<|end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|assistant|>\\n' -}}{%- else -%}{{- eos_token -}}{%- endif -%}"
)
"""Phi-3's: turns end with ``<|end|>``; a conversation without the generation prompt ends with the eos."""


@dataclass(frozen=True)
class Family:
    """A model family's tokenizer and checkpoint layout, as :func:`train_family_tokenizer` and
    :func:`tiny_family_lm` mimic it.

    ``name`` is the ``config.model_type``; ``specials`` the special tokens in id order, at ids 0.. or
    (``specials_last``) after the trained vocabulary; ``eos``/``bos``/``pad``/``unk`` name some of them (None =
    the tokenizer has none; the same token twice = shared, e.g. GPT-2's bos = eos); ``add_bos``: encoding a
    text puts bos in front; ``chat_template``: None = a base model without one; ``spare_rows``: embedding
    rows beyond ``len(tokenizer)`` (the real checkpoints round the vocabulary up); ``tied``: input and output
    embeddings shared; ``pad_in_config``: the token the checkpoint's ``config.pad_token_id`` names (Phi-3:
    its eos); ``quirks``: one line for people.
    """

    name: str
    specials: tuple[str, ...]
    eos: str
    bos: str | None = None
    pad: str | None = None
    unk: str | None = None
    specials_last: bool = False
    add_bos: bool = False
    chat_template: str | None = None
    spare_rows: int = 0
    tied: bool = False
    pad_in_config: str | None = None
    quirks: str = ""


FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        Family(
            "gpt2",
            ("<|endoftext|>",),
            eos="<|endoftext|>",
            bos="<|endoftext|>",
            unk="<|endoftext|>",
            specials_last=True,
            tied=True,
            quirks="no pad; bos = eos = unk; vocabulary = embedding rows",
        ),
        Family(
            "gpt_neox",
            ("<|endoftext|>", "<|padding|>"),
            eos="<|endoftext|>",
            bos="<|endoftext|>",
            unk="<|endoftext|>",
            spare_rows=27,
            quirks="Pythia: no pad (an unused <|padding|> token); bos = eos; spare embedding rows",
        ),
        Family(
            "opt",
            ("<s>", "<pad>", "</s>", "<unk>"),
            eos="</s>",
            bos="</s>",
            pad="<pad>",
            unk="<unk>",
            add_bos=True,
            spare_rows=7,
            tied=True,
            quirks="bos = eos, added in front of every text",
        ),
        Family(
            "qwen2",
            ("<|endoftext|>", "<|im_start|>", "<|im_end|>"),
            eos="<|im_end|>",
            pad="<|endoftext|>",
            specials_last=True,
            chat_template=CHATML_TEMPLATE,
            spare_rows=17,
            tied=True,
            quirks="no bos; ChatML; spare embedding rows",
        ),
        Family(
            "gemma2",
            ("<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"),
            eos="<eos>",
            bos="<bos>",
            pad="<pad>",
            unk="<unk>",
            add_bos=True,
            chat_template=GEMMA_TEMPLATE,
            tied=True,
            quirks="bos added; turns end with <end_of_turn>, not eos; soft-capped logits",
        ),
        Family(
            "phi3",
            ("<unk>", "<s>", "</s>", "<|endoftext|>", "<|assistant|>", "<|system|>", "<|end|>", "<|user|>"),
            eos="<|endoftext|>",
            bos="<s>",
            pad="<|endoftext|>",
            unk="<unk>",
            chat_template=PHI3_TEMPLATE,
            spare_rows=53,
            pad_in_config="<|endoftext|>",
            quirks="pad = eos (tokenizer and config); fused qkv_proj / gate_up_proj; spare embedding rows",
        ),
        Family(
            "llama",
            ("<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>", "<|reserved_special_token_1|>"),
            eos="<|end_of_text|>",
            bos="<|begin_of_text|>",
            specials_last=True,
            add_bos=True,
            quirks="Llama-3 base: no pad; bos added; no chat template",
        ),
    )
}
"""The families :func:`train_family_tokenizer` and :func:`tiny_family_lm` build, by ``config.model_type``."""


def train_family_tokenizer(
    family: str, texts: Iterable[str], vocab_size: int = 320, *, model_max_length: int = 256
) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer trained on ``texts`` with the special tokens and quirks of ``family``
    (a key of :data:`FAMILIES`): which tokens exist, which of pad/bos/eos are missing or shared, whether
    bos is added in front of every text, the chat template. ``padding_side="right"``, as the hub's."""
    spec = FAMILIES[family]
    backend = _train_bpe(texts, vocab_size, list(spec.specials), spec.specials_last)
    backend.add_special_tokens(list(spec.specials))  # when last: appended after the trained vocabulary
    if spec.add_bos:
        assert spec.bos is not None
        bos = (spec.bos, backend.token_to_id(spec.bos))
        backend.post_processor = processors.TemplateProcessing(
            single=f"{spec.bos} $A", pair=f"{spec.bos} $A {spec.bos} $B", special_tokens=[bos]
        )
    named = {"bos_token": spec.bos, "eos_token": spec.eos, "pad_token": spec.pad, "unk_token": spec.unk}
    extra = [t for t in spec.specials if t not in named.values()]
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        **named,
        additional_special_tokens=extra,
        model_max_length=model_max_length,
        padding_side="right",
        clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = spec.chat_template
    return tokenizer


def tiny_family_config(
    family: str, tokenizer: PreTrainedTokenizerBase, hidden_size: int = 32, num_layers: int = 2, num_heads: int = 4
) -> PretrainedConfig:
    """A tiny config of ``family``'s architecture for ``tokenizer``: ``len(tokenizer) + spare_rows``
    embedding rows, its bos/eos ids (pad too, when the family's config names one), tied or untied embeddings
    as the family ships, positions = ``tokenizer.model_max_length``."""
    from transformers import AutoConfig

    spec = FAMILIES[family]
    head_dim = hidden_size // num_heads
    n_positions = int(tokenizer.model_max_length)
    fields = _size_fields(family, hidden_size, num_layers, num_heads, n_positions)
    fields |= {
        "vocab_size": len(tokenizer) + spec.spare_rows,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.convert_tokens_to_ids(spec.pad_in_config) if spec.pad_in_config else None,
        "tie_word_embeddings": spec.tied,
    }
    if family == "gpt_neox":
        fields["rotary_pct"] = 0.25
    if family == "gemma2":
        fields |= {"head_dim": head_dim, "query_pre_attn_scalar": head_dim}
    if family == "phi3":
        fields |= {"original_max_position_embeddings": n_positions, "sliding_window": None}
    return AutoConfig.for_model(family, **fields)


def tiny_family_lm(
    family: str,
    tokenizer: PreTrainedTokenizerBase,
    hidden_size: int = 32,
    num_layers: int = 2,
    num_heads: int = 4,
    seed: int = 0,
) -> PreTrainedModel:
    """A randomly initialised causal LM of ``family`` (see :func:`tiny_family_config`); the same seed gives the
    same weights and the global torch RNG is left as it was."""
    config = tiny_family_config(family, tokenizer, hidden_size, num_layers, num_heads)
    return _seeded(AutoModelForCausalLM.from_config, config, seed)


# --------------------------------------------------------------------------------------------------------------
# Encoders (BERT-style reward models with their own WordPiece tokenizer)
# --------------------------------------------------------------------------------------------------------------

WORDPIECE_SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
"""Special tokens of :func:`train_wordpiece_tokenizer`, at ids 0..4 in this order (BERT's names)."""


def train_wordpiece_tokenizer(
    texts: Iterable[str], vocab_size: int = 512, *, model_max_length: int = 128
) -> PreTrainedTokenizerFast:
    """Train a lower-casing WordPiece tokenizer on ``texts``, wrapped as a Hugging Face fast tokenizer — BERT's.

    BERT normaliser (lower case, accents stripped) and pre-tokeniser (split on spaces and punctuation),
    ``##`` continuation pieces; the lower-case ASCII letters and digits are always in the vocabulary, so
    words outside the corpus split into pieces instead of becoming ``[UNK]``. A single text encodes as
    ``[CLS] text [SEP]`` and a pair as ``[CLS] a [SEP] b [SEP]`` (``BertProcessing``). Special tokens:
    :data:`WORDPIECE_SPECIALS` (no bos/eos: an encoder reward model reads its pooled ``[CLS]``).
    ``vocab_size`` is an upper bound (training stops when the corpus has no more pairs to merge).
    """
    backend = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    backend.normalizer = normalizers.BertNormalizer(lowercase=True)
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    backend.decoder = decoders.WordPiece(prefix="##")
    trainer = trainers.WordPieceTrainer(
        vocab_size=vocab_size,
        special_tokens=list(WORDPIECE_SPECIALS),
        initial_alphabet=list("abcdefghijklmnopqrstuvwxyz0123456789"),
        show_progress=False,
    )
    backend.train_from_iterator(texts, trainer=trainer)
    sep, cls = backend.token_to_id("[SEP]"), backend.token_to_id("[CLS]")
    backend.post_processor = processors.BertProcessing(("[SEP]", sep), ("[CLS]", cls))
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
        model_max_length=model_max_length,
        padding_side="right",
        clean_up_tokenization_spaces=False,
    )


def tiny_bert_classifier(
    tokenizer: PreTrainedTokenizerBase,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    seed: int = 0,
    *,
    num_labels: int = 1,
    dropout: float | None = None,
    max_position_embeddings: int | None = None,
) -> PreTrainedModel:
    """A randomly initialised ``BertForSequenceClassification`` (one output by default) for ``tokenizer``.

    ``vocab_size = len(tokenizer)``, ``pad_token_id`` from the tokenizer, positions default to
    ``tokenizer.model_max_length``; BERT's dropout 0.1 unless ``dropout`` is given. The same ``seed`` gives
    the same weights and the global torch RNG is left as it was.
    """
    fields: dict[str, object] = {}
    if dropout is not None:
        fields = {"hidden_dropout_prob": dropout, "attention_probs_dropout_prob": dropout}
    config = BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        intermediate_size=4 * hidden_size,
        max_position_embeddings=max_position_embeddings or int(tokenizer.model_max_length),
        pad_token_id=tokenizer.pad_token_id,
        num_labels=num_labels,
        **fields,
    )
    return _seeded(BertForSequenceClassification, config, seed)


def save_tiny(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, path: str | Path) -> Path:
    """``save_pretrained`` the model and the tokenizer into one directory (created if needed); returns it.

    The directory then loads with ``AutoModelForCausalLM`` (or ``...ForSequenceClassification``) and
    ``AutoTokenizer.from_pretrained(path)``, like any checkpoint.
    """
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


__all__ = [
    "ARCHS",
    "CHATML_TEMPLATE",
    "CHAT_TEMPLATE",
    "FAMILIES",
    "GEMMA_TEMPLATE",
    "PHI3_TEMPLATE",
    "WORDPIECE_SPECIALS",
    "Family",
    "Arch",
    "save_tiny",
    "tiny_bert_classifier",
    "tiny_causal_lm",
    "tiny_config",
    "tiny_family_config",
    "tiny_family_lm",
    "tiny_reward_model",
    "toy_corpus",
    "train_family_tokenizer",
    "train_tokenizer",
    "train_wordpiece_tokenizer",
]
