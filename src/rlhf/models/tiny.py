"""Tiny random-init models and locally trained tokenizers, for tests and ``rlhf demo`` — no downloads.

Built offline in seconds: byte-level BPE tokenizers trained on :func:`toy_corpus` (or any texts) and causal LMs and
reward models of :data:`ARCHS` with random weights, ordinary Hugging Face objects that :func:`save_tiny` writes and
``from_pretrained`` loads back like a hub checkpoint. Their conventions (distinct pad/bos/eos, no special tokens added
to plain text, right padding) and chat format: docs/architecture.md, "How the code is tested". The tests' model families
and BERT classifier (tests/tiny_models.py) build on :func:`train_bpe_tokenizer`, :func:`tiny_config` and :func:`seeded`.
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
    """``n`` short lines of a toy language, the same for the same ``(n, seed)``, of four kinds drawn uniformly: a
    sentence ("the red cat sees a dog in the park."), an addition ("3 + 4 = 7"), counting ("count to 4: 1 2 3 4")
    and a question with its answer ("what is 2 + 5? 7"). Enough structure for a tokenizer to learn useful merges
    and for a tiny model to learn something within a CPU minute."""
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
    """A byte-level BPE tokenizer trained on ``texts``, a Hugging Face fast tokenizer with the conventions of
    docs/architecture.md ("How the code is tested") and :data:`CHAT_TEMPLATE`; any text round-trips (the 256 byte
    symbols are always in the vocabulary). ``vocab_size`` counts the special tokens and is an upper bound (training
    stops when the corpus has no more pairs to merge: ``len(tokenizer)`` is the real size); ``model_max_length`` is
    also the tiny models' number of positions; ``specials_last`` puts the special tokens after the trained
    vocabulary (bos and eos before pad, as GPT-2 and Llama 3 do) instead of at ids 0..5, so two tokenizers that
    differ here disagree on every special-token id (what tests of re-encoding between tokenizers rely on)."""
    named = (BOS_TOKEN, EOS_TOKEN, PAD_TOKEN) if specials_last else (PAD_TOKEN, BOS_TOKEN, EOS_TOKEN)
    spec = TokenizerSpec(
        "tiny",  # no model_type of its own: any of ARCHS
        (*named, *ROLE_TOKENS.values()),
        eos=EOS_TOKEN,
        bos=BOS_TOKEN,
        pad=PAD_TOKEN,
        specials_last=specials_last,
        chat_template=CHAT_TEMPLATE,
    )
    return train_bpe_tokenizer(spec, texts, vocab_size, model_max_length)


@dataclass(frozen=True)
class TokenizerSpec:
    """The special tokens of a tokenizer :func:`train_bpe_tokenizer` builds. ``name``: the ``config.model_type`` it
    goes with; ``specials``: the special tokens in id order, at ids 0.. or (``specials_last``) after the trained
    vocabulary; ``eos``/``bos``/``pad``/``unk`` name some of them (None = the tokenizer has none; the same token
    twice = shared, e.g. GPT-2's bos = eos); ``add_bos``: encoding a text puts bos in front; ``chat_template``:
    None = a base model without one."""

    name: str
    specials: tuple[str, ...]
    eos: str
    bos: str | None = None
    pad: str | None = None
    unk: str | None = None
    specials_last: bool = False
    add_bos: bool = False
    chat_template: str | None = None


def train_bpe_tokenizer(
    spec: TokenizerSpec, texts: Iterable[str], vocab_size: int, model_max_length: int
) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer trained on ``texts`` with ``spec``'s special tokens, bos added when ``add_bos``, its
    chat template, padding on the right as the hub's tokenizers do."""
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


_GPT2_DROPOUTS = ("resid_pdrop", "embd_pdrop", "attn_pdrop", "summary_first_dropout")
"""GPT-2's dropout probabilities; the other architectures' (llama, qwen2): ``attention_dropout``."""


def tiny_config(
    model_type: str,
    tokenizer: PreTrainedTokenizerBase,
    hidden_size: int,
    num_layers: int,
    num_heads: int,
    positions: int | None = None,
    dropout: float | None = None,
    **fields: Any,
) -> PretrainedConfig:
    """A tiny ``model_type`` config for ``tokenizer``: the sizes under GPT-2's names or the usual ones (MLP 4× wide;
    qwen2: grouped-query attention with half the heads), ``positions`` (default ``tokenizer.model_max_length``),
    every dropout probability of :data:`ARCHS` set to ``dropout`` when given, and the tokenizer's vocabulary size and
    pad/bos/eos ids, which ``fields`` may override."""
    positions = positions or int(tokenizer.model_max_length)
    if model_type == "gpt2":
        sizes = {"n_embd": hidden_size, "n_layer": num_layers, "n_head": num_heads, "n_positions": positions}
    else:
        sizes = {
            "hidden_size": hidden_size,
            "num_hidden_layers": num_layers,
            "num_attention_heads": num_heads,
            "max_position_embeddings": positions,
            "intermediate_size": 4 * hidden_size,
        }
        if model_type == "qwen2":
            sizes["num_key_value_heads"] = max(1, num_heads // 2)
    if dropout is not None:
        sizes |= dict.fromkeys(_GPT2_DROPOUTS if model_type == "gpt2" else ("attention_dropout",), dropout)
    tokens = {"vocab_size": len(tokenizer), "pad_token_id": tokenizer.pad_token_id}
    tokens |= {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id}
    return AutoConfig.for_model(model_type, **sizes, **(tokens | fields))


def seeded(build: Any, config: PretrainedConfig, seed: int) -> PreTrainedModel:
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
    reward: bool = False,
) -> PreTrainedModel:
    """A randomly initialised causal LM (``AutoModelForCausalLM``) of architecture ``arch`` for ``tokenizer``
    (:func:`tiny_config`), in torch's default dtype and in train mode (as ``from_config`` returns it); with
    ``reward``, the same trunk as a reward model (:func:`tiny_reward_model`). The architectures differ on purpose
    so the library is tested against them: gpt2 has learned absolute positions, tied embeddings and dropout 0.1 by
    default; llama rotary positions, untied embeddings and no dropout; qwen2 adds attention biases and
    grouped-query attention. ``dropout=None`` keeps the architecture's, so code that must disable dropout in RLHF
    is really exercised. The same ``seed`` gives the same weights; the global torch RNG is left as it was."""
    if arch not in ARCHS:
        raise ValueError(f"unknown architecture {arch!r}; expected one of {', '.join(ARCHS)}")
    head = {"num_labels": 1} if reward else {}
    config = tiny_config(arch, tokenizer, hidden_size, num_layers, num_heads, max_position_embeddings, dropout, **head)
    return seeded((AutoModelForSequenceClassification if reward else AutoModelForCausalLM).from_config, config, seed)


def tiny_reward_model(arch: Arch, tokenizer: PreTrainedTokenizerBase, **options: Any) -> PreTrainedModel:
    """A randomly initialised reward model: ``AutoModelForSequenceClassification`` with one output (logits
    ``(B, 1)``, read by transformers at the rightmost non-pad token of each row); ``options`` (sizes, seed,
    dropout, positions) as :func:`tiny_causal_lm`'s."""
    return tiny_causal_lm(arch, tokenizer, reward=True, **options)


def save_tiny(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, path: str | Path) -> Path:
    """``save_pretrained`` the model and the tokenizer into one directory (created if needed), which then loads
    like any checkpoint (``AutoModelFor...`` and ``AutoTokenizer.from_pretrained(path)``); returns it."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
