"""Tiny random-init models and locally trained tokenizers, for tests and ``rlhf demo`` — no downloads.

Built offline in seconds: byte-level BPE tokenizers trained with ``tokenizers`` on :func:`toy_corpus` (or
any texts) and ``transformers`` models with random weights, ordinary Hugging Face objects that
:func:`save_tiny` writes and ``AutoTokenizer`` / ``AutoModelFor...`` load back like a hub checkpoint. Besides
the causal LMs and reward models of :data:`ARCHS` there are a BERT classifier with its own WordPiece tokenizer
(encoder reward models) and, for the families users bring (:data:`FAMILIES`), tokenizers with each family's
quirks and tiny models of its architecture. :func:`train_tokenizer`'s conventions (distinct pad/bos/eos, no
special tokens added to plain text, right padding) and chat format: docs/architecture.md, "How the code is tested".
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
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    BertForSequenceClassification,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
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
        elif kind == 2:
            k = rng.randint(1, 9)
            lines.append(f"count to {k}: " + " ".join(str(i) for i in range(1, k + 1)))
        else:
            a, b = rng.randrange(10), rng.randrange(10)
            lines.append(f"{a} + {b} = {a + b}" if kind == 1 else f"what is {a} + {b}? {a + b}")
    return lines


def train_tokenizer(
    texts: Iterable[str], vocab_size: int = 512, *, model_max_length: int = 512, specials_last: bool = False
) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer on ``texts``, wrapped as a Hugging Face fast tokenizer with the
    conventions of docs/architecture.md ("How the code is tested") and the chat template :data:`CHAT_TEMPLATE`.

    Any text round-trips whatever the corpus (the 256 byte symbols are always in the vocabulary).
    ``vocab_size`` counts the special tokens and is an upper bound (training stops when the corpus has no more
    pairs to merge: ``len(tokenizer)`` is the real size); ``model_max_length`` is also the tiny models' number of
    positions; ``specials_last`` puts the special tokens after the trained vocabulary (bos and eos before pad, as
    GPT-2 and Llama 3 do) instead of at ids 0..5, so two tokenizers that differ here disagree on every
    special-token id (what tests of re-encoding between tokenizers rely on).
    """
    named = (BOS_TOKEN, EOS_TOKEN, PAD_TOKEN) if specials_last else (PAD_TOKEN, BOS_TOKEN, EOS_TOKEN)
    spec = Family(
        "tiny",  # no model_type of its own: any of ARCHS
        (*named, *ROLE_TOKENS.values()),
        eos=EOS_TOKEN,
        bos=BOS_TOKEN,
        pad=PAD_TOKEN,
        specials_last=specials_last,
        chat_template=CHAT_TEMPLATE,
    )
    tokenizer = _train_bpe(spec, texts, vocab_size, model_max_length)
    ids = {tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id}
    if len(ids) != 3 or None in ids:  # checklist 1; cannot happen unless the token constants are edited
        raise RuntimeError(f"pad, bos and eos must be three distinct tokens, got ids {ids}")
    return tokenizer


def _train_bpe(spec: Family, texts: Iterable[str], vocab_size: int, model_max_length: int) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer trained on ``texts`` with ``spec``'s special tokens (at ids 0.., or after
    the trained vocabulary when ``specials_last``), bos added when ``add_bos``, and its chat template."""
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
    specials = list(spec.specials)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(specials) if spec.specials_last else vocab_size,
        special_tokens=[] if spec.specials_last else specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(texts, trainer=trainer)
    backend.add_special_tokens(specials)  # when last: appended after the trained vocabulary
    if spec.add_bos:
        assert spec.bos is not None
        bos = (spec.bos, backend.token_to_id(spec.bos))
        backend.post_processor = processors.TemplateProcessing(
            single=f"{spec.bos} $A", pair=f"{spec.bos} $A {spec.bos} $B", special_tokens=[bos]
        )
    # Byte-level BPE needs no unknown token: unk None is written as null in tokenizer_config.json, which stops
    # Qwen2Tokenizer from adding its default unk "<|endoftext|>" when a qwen2 directory is loaded.
    named = {"bos_token": spec.bos, "eos_token": spec.eos, "pad_token": spec.pad, "unk_token": spec.unk}
    # `additional_special_tokens` is accepted by transformers 4.x and 5.x (5.x renames it `extra_special_tokens`)
    extra = [t for t in spec.specials if t not in named.values()]
    tokenizer = _wrap(backend, model_max_length, **named, additional_special_tokens=extra)
    tokenizer.chat_template = spec.chat_template
    return tokenizer


def _wrap(backend: Tokenizer, model_max_length: int, **special_tokens: Any) -> PreTrainedTokenizerFast:
    """``backend`` as a Hugging Face fast tokenizer padding on the right, as the hub's tokenizers do."""
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        **special_tokens,
        model_max_length=model_max_length,
        padding_side="right",
        clean_up_tokenization_spaces=False,
    )


_DROPOUT_FIELDS = {
    "gpt2": ("resid_pdrop", "embd_pdrop", "attn_pdrop", "summary_first_dropout"),
    "bert": ("hidden_dropout_prob", "attention_probs_dropout_prob"),
}
"""The config's dropout probabilities by ``model_type``; any other (llama, qwen2): ``attention_dropout``."""


def _config(
    model_type: str,
    tokenizer: PreTrainedTokenizerBase,
    hidden_size: int,
    num_layers: int,
    num_heads: int,
    positions: int | None = None,
    dropout: float | None = None,
    **fields: Any,
) -> PretrainedConfig:
    """A tiny ``model_type`` config for ``tokenizer``: the sizes under the architecture's own names (MLP 4× wide;
    grouped-query attention with half the heads where the family ships it), ``positions`` (default
    ``tokenizer.model_max_length``), every dropout probability set to ``dropout`` when given, and the
    tokenizer's vocabulary size and pad/bos/eos ids, which ``fields`` may override."""
    positions = positions or int(tokenizer.model_max_length)
    if model_type == "gpt2":
        sizes = {"n_embd": hidden_size, "n_layer": num_layers, "n_head": num_heads, "n_positions": positions}
    else:
        sizes = {
            "hidden_size": hidden_size,
            "num_hidden_layers": num_layers,
            "num_attention_heads": num_heads,
            "max_position_embeddings": positions,
        }
        if model_type == "opt":
            sizes |= {"ffn_dim": 4 * hidden_size, "word_embed_proj_dim": hidden_size}
        else:
            sizes["intermediate_size"] = 4 * hidden_size
        if model_type in ("qwen2", "gemma2"):
            sizes["num_key_value_heads"] = max(1, num_heads // 2)
    if dropout is not None:
        sizes |= dict.fromkeys(_DROPOUT_FIELDS.get(model_type, ("attention_dropout",)), dropout)
    tokens = {"vocab_size": len(tokenizer), "pad_token_id": tokenizer.pad_token_id}
    tokens |= {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id}
    return AutoConfig.for_model(model_type, **sizes, **(tokens | fields))


def _seeded(build: Any, config: PretrainedConfig, seed: int) -> PreTrainedModel:
    """``build(config)`` with weights drawn from ``seed``; the global torch RNG is left as it was."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build(config)


def _arch(arch: str) -> str:
    if arch not in ARCHS:
        raise ValueError(f"unknown architecture {arch!r}; expected one of {', '.join(ARCHS)}")
    return arch


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
    """A randomly initialised causal LM (``AutoModelForCausalLM``) of architecture ``arch`` for ``tokenizer``, in
    torch's default dtype and in train mode (as ``from_config`` returns it).

    ``vocab_size = len(tokenizer)``, pad/bos/eos ids from it, positions default to ``tokenizer.model_max_length``.
    The architectures differ on purpose so the library is tested against them: gpt2 has learned absolute
    positions, tied embeddings and dropout 0.1 by default; llama rotary positions, untied embeddings and no
    dropout; qwen2 adds attention biases and grouped-query attention (``num_heads // 2`` key/value heads).
    ``dropout``, when given, sets every dropout probability of the config (gpt2: residual, embedding, attention
    and summary; llama/qwen2: attention); ``None`` keeps the architecture's, so code that must disable dropout
    in RLHF is really exercised. The same ``seed`` gives the same weights; the global torch RNG is left as it was.
    """
    config = _config(_arch(arch), tokenizer, hidden_size, num_layers, num_heads, max_position_embeddings, dropout)
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
    """A randomly initialised reward model: ``AutoModelForSequenceClassification`` with one output (logits
    ``(B, 1)``, read by transformers at the rightmost non-pad token of each row); as :func:`tiny_causal_lm`."""
    positions = max_position_embeddings
    config = _config(_arch(arch), tokenizer, hidden_size, num_layers, num_heads, positions, dropout, num_labels=1)
    return _seeded(AutoModelForSequenceClassification.from_config, config, seed)


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
    """A model family's tokenizer and checkpoint layout, as :func:`train_family_tokenizer` and :func:`tiny_family_lm`
    mimic it. ``name`` is the ``config.model_type``; ``specials`` the special tokens in id order, at ids 0.. or
    (``specials_last``) after the trained vocabulary; ``eos``/``bos``/``pad``/``unk`` name some of them (None =
    the tokenizer has none; the same token twice = shared, e.g. GPT-2's bos = eos); ``add_bos``: encoding a text
    puts bos in front; ``chat_template``: None = a base model without one; ``spare_rows``: embedding rows beyond
    ``len(tokenizer)`` (the real checkpoints round the vocabulary up); ``tied``: input and output embeddings
    shared; ``pad_in_config``: the token the checkpoint's ``config.pad_token_id`` names (Phi-3: its eos);
    ``quirks``: one line for people.
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
    family: str | Family, texts: Iterable[str], vocab_size: int = 320, *, model_max_length: int = 256
) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer trained on ``texts`` with the special tokens and quirks of ``family``
    (a key of :data:`FAMILIES`, or a `Family` of its own, e.g. an instruct model's added tokens and chat
    template): which tokens exist, which of pad/bos/eos are missing or shared, whether bos is added in front of
    every text, the chat template. ``padding_side="right"``, as the hub's."""
    return _train_bpe(FAMILIES[family] if isinstance(family, str) else family, texts, vocab_size, model_max_length)


def tiny_family_config(
    family: str, tokenizer: PreTrainedTokenizerBase, hidden_size: int = 32, num_layers: int = 2, num_heads: int = 4
) -> PretrainedConfig:
    """A tiny config of ``family``'s architecture for ``tokenizer``: ``len(tokenizer) + spare_rows``
    embedding rows, its bos/eos ids (pad too, when the family's config names one), tied or untied embeddings
    as the family ships, positions = ``tokenizer.model_max_length``."""
    spec = FAMILIES[family]
    head_dim = hidden_size // num_heads
    pad = tokenizer.convert_tokens_to_ids(spec.pad_in_config) if spec.pad_in_config else None
    fields = {"vocab_size": len(tokenizer) + spec.spare_rows, "pad_token_id": pad, "tie_word_embeddings": spec.tied}
    if family == "gpt_neox":
        fields["rotary_pct"] = 0.25
    if family == "gemma2":
        fields |= {"head_dim": head_dim, "query_pre_attn_scalar": head_dim}
    if family == "phi3":
        fields |= {"original_max_position_embeddings": int(tokenizer.model_max_length), "sliding_window": None}
    return _config(family, tokenizer, hidden_size, num_layers, num_heads, **fields)


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
    pad, unk, cls, sep, mask = WORDPIECE_SPECIALS
    backend = Tokenizer(models.WordPiece(unk_token=unk))
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
    backend.post_processor = processors.BertProcessing((sep, backend.token_to_id(sep)), (cls, backend.token_to_id(cls)))
    return _wrap(backend, model_max_length, unk_token=unk, pad_token=pad, cls_token=cls, sep_token=sep, mask_token=mask)


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
    """A randomly initialised ``BertForSequenceClassification`` (one output by default) for ``tokenizer``, sized
    and seeded as :func:`tiny_causal_lm`; BERT's dropout 0.1 unless ``dropout`` is given."""
    positions = max_position_embeddings
    config = _config("bert", tokenizer, hidden_size, num_layers, num_heads, positions, dropout, num_labels=num_labels)
    return _seeded(BertForSequenceClassification, config, seed)


def save_tiny(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, path: str | Path) -> Path:
    """``save_pretrained`` the model and the tokenizer into one directory (created if needed), which then loads
    like any checkpoint (``AutoModelFor...`` and ``AutoTokenizer.from_pretrained(path)``); returns it."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
