"""Tiny models of the families people post-train, and a BERT classifier, for the tests — no downloads.

For the families users bring (:data:`FAMILIES`): tokenizers with each family's quirks
(:func:`train_family_tokenizer`) and tiny random-init models of its architecture (:func:`tiny_family_lm`); for
encoder reward models, a BERT classifier with its own WordPiece tokenizer. Built on `rlhf.models.tiny`, which the
demo and the examples use too.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import (
    AutoModelForCausalLM,
    BertForSequenceClassification,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
)

from rlhf.models.tiny import TokenizerSpec, seeded, tiny_config, train_bpe_tokenizer

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
class Family(TokenizerSpec):
    """A model family's tokenizer (`rlhf.models.tiny.TokenizerSpec`: ``name`` is the ``config.model_type``) and
    checkpoint layout, as :func:`train_family_tokenizer` and :func:`tiny_family_lm` mimic it. ``spare_rows``:
    embedding rows beyond ``len(tokenizer)`` (the real checkpoints round the vocabulary up); ``tied``: input and
    output embeddings shared; ``pad_in_config``: the token the checkpoint's ``config.pad_token_id`` names (Phi-3: its
    eos); ``quirks``: one line for people.
    """

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
    family: str | TokenizerSpec, texts: Iterable[str], vocab_size: int = 320, *, model_max_length: int = 256
) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer trained on ``texts`` with the special tokens and quirks of ``family``
    (a key of :data:`FAMILIES`, or a spec of its own, e.g. an instruct model's added tokens and chat
    template): which tokens exist, which of pad/bos/eos are missing or shared, whether bos is added in front of
    every text, the chat template. ``padding_side="right"``, as the hub's."""
    spec = FAMILIES[family] if isinstance(family, str) else family
    return train_bpe_tokenizer(spec, texts, vocab_size, model_max_length)


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
    if family == "opt":
        fields |= {"ffn_dim": 4 * hidden_size, "word_embed_proj_dim": hidden_size}
    if family == "gemma2":  # grouped-query attention, as Gemma-2 ships
        fields |= {
            "head_dim": head_dim,
            "query_pre_attn_scalar": head_dim,
            "num_key_value_heads": max(1, num_heads // 2),
        }
    if family == "phi3":
        fields |= {"original_max_position_embeddings": int(tokenizer.model_max_length), "sliding_window": None}
    config = tiny_config(family, tokenizer, hidden_size, num_layers, num_heads, **fields)
    if family == "opt":
        del config.intermediate_size  # OPT names its MLP width ffn_dim
    return config


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
    return seeded(AutoModelForCausalLM.from_config, config, seed)


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
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        unk_token=unk,
        pad_token=pad,
        cls_token=cls,
        sep_token=sep,
        mask_token=mask,
        model_max_length=model_max_length,
        padding_side="right",  # as the hub's tokenizers
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
    """A randomly initialised ``BertForSequenceClassification`` (one output by default) for ``tokenizer``, sized
    and seeded as `rlhf.models.tiny.tiny_causal_lm`; BERT's dropout 0.1 unless ``dropout`` is given."""
    dropouts = (
        {} if dropout is None else dict.fromkeys(("hidden_dropout_prob", "attention_probs_dropout_prob"), dropout)
    )
    positions = max_position_embeddings
    config = tiny_config(
        "bert", tokenizer, hidden_size, num_layers, num_heads, positions, num_labels=num_labels, **dropouts
    )
    return seeded(BertForSequenceClassification, config, seed)
