"""Reward models: loading one to train, reading its score at the last real token, and its normalisation.

Notation: B sequences, L tokens (right-padded), H hidden size.

**Two kinds**, told apart as every consumer tells them apart (:func:`decoder_parts`): a *decoder* (a causal LM loaded as
``AutoModelForSequenceClassification(num_labels=1)``: a ``score`` Linear(H, 1) on the causal trunk), whose score is read
at the last real token of each right-padded row explicitly (checklist item 14), never through the pooled logits, which
search for the pad token id (transformers#35909); an *encoder* (BERT-style: a ``classifier`` on its own pooled first
token), whose forward is right as is with right padding.

**A fresh head** (one the checkpoint did not hold: a causal LM, a bare encoder, or a classifier with another number of
labels) is re-initialised ``W ~ N(0, 1/sqrt(H + 1))``, bias 0 (checklist item 15; OAI ``fc_layer``, N-details, N+); a
head the checkpoint holds (continuing a reward model) is kept.

**Pad token**: as for every model rlhf loads (``rlhf.models.loading``), the tokenizer padding on the right.
``config.pad_token_id`` is never eos, so plain ``transformers`` pools a saved decoder's score at its last real token
(the eos ending every training sequence), as rlhf does. **Normalisation** (checklist item 19):
``reward = gain · score + bias``, stored in ``config.json`` (:data:`GAIN_KEY`, :data:`BIAS_KEY`; absent = 1 and 0) so it
travels with the model, applied by ``rlhf.rollout.rewards.RewardModelReward`` (docs/architecture.md, "Reward sources").
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from rlhf.data.collate import position_ids_from_mask

if TYPE_CHECKING:
    from transformers import PretrainedConfig

GAIN_KEY = "rlhf_reward_gain"
"""``config.json`` key of the normalisation gain (``reward = gain · score + bias``)."""
BIAS_KEY = "rlhf_reward_bias"
"""``config.json`` key of the normalisation bias."""


def reward_normalization(config: PretrainedConfig) -> tuple[float, float]:
    """(gain, bias) stored in a model config; (1.0, 0.0) when absent. Refuses non-finite or zero gains."""
    gain = getattr(config, GAIN_KEY, None)
    bias = getattr(config, BIAS_KEY, None)
    gain = 1.0 if gain is None else float(gain)
    bias = 0.0 if bias is None else float(bias)
    if not (math.isfinite(gain) and math.isfinite(bias)) or gain == 0:
        raise ValueError(
            f"the reward model's config has {GAIN_KEY}={gain}, {BIAS_KEY}={bias}; the gain must be a finite "
            "non-zero number and the bias finite (re-run the normalisation, or delete both keys)"
        )
    return gain, bias


def set_reward_normalization(config: PretrainedConfig, gain: float, bias: float) -> None:
    """Store (gain, bias) in the model config; ``save_pretrained`` writes them to ``config.json``."""
    setattr(config, GAIN_KEY, float(gain))
    setattr(config, BIAS_KEY, float(bias))
    reward_normalization(config)  # validates


def clear_reward_normalization(config: PretrainedConfig) -> None:
    """Remove a stored normalisation (it describes the head before training changed it)."""
    for key in (GAIN_KEY, BIAS_KEY):
        if hasattr(config, key):
            delattr(config, key)


def decoder_parts(model: nn.Module) -> tuple[nn.Module, nn.Module] | None:
    """(trunk, ``score`` head) of a decoder reward model (the head sits on its ``base_model_prefix`` trunk); ``None``
    for an encoder classifier (BERT, RoBERTa, DeBERTa: a ``classifier`` on a pooled output)."""
    trunk = getattr(model, getattr(model, "base_model_prefix", ""), None)
    head = getattr(model, "score", None)
    if isinstance(trunk, nn.Module) and isinstance(head, nn.Module):
        return trunk, head
    return None


def reward_scores(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """(B, L) right-padded ids and mask → (B,) scores (raw head output, no normalisation), with autograd. Decoders: the
    trunk runs with explicit position ids and the head reads each row's last real token, so a score depends neither on
    the padding nor on the other rows. Encoders: the model's own pooled logits."""
    parts = decoder_parts(model)
    if parts is None:  # encoder classifiers: their own pooling (first token) is right here
        return model(input_ids=input_ids, attention_mask=attention_mask).logits[:, 0]
    trunk, head = parts
    positions = position_ids_from_mask(attention_mask)  # right padding: 0..n-1, passed explicitly (checklist item 2)
    out = trunk(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions, use_cache=False)
    hidden = out[0]  # (B, L, H)
    last = attention_mask.sum(-1) - 1  # (B,) index of the last real token
    # gather: for b in range(B): h[b] = hidden[b, last[b]]
    h = hidden[torch.arange(input_ids.shape[0], device=input_ids.device), last]  # (B, H)
    return head(h)[:, 0]


@dataclass
class TrainableRewardModel:
    """What :func:`load_reward_model` returns. ``model``: ``*ForSequenceClassification`` with one output (wrapped by
    peft with LoRA: :attr:`hf_model` scores and saves). ``fresh_head``: the head was initialised here.
    ``max_positions``: None = unknown."""

    model: nn.Module
    tokenizer: Any
    is_decoder: bool
    fresh_head: bool
    max_positions: int | None

    @property
    def hf_model(self) -> nn.Module:
        """The transformers model itself (inside a peft wrapper when there is one)."""
        from rlhf.models.policy import unwrap

        return unwrap(self.model)


def init_reward_head(head: nn.Linear) -> None:
    """``W ~ N(0, 1/sqrt(H + 1))``, bias 0 (checklist item 15), from torch's global RNG."""
    with torch.no_grad():
        head.weight.normal_(0.0, 1.0 / math.sqrt(head.in_features + 1))
        if head.bias is not None:
            head.bias.zero_()


def max_positions(config: PretrainedConfig) -> int | None:
    """How many tokens a model reads (``max_position_embeddings`` or GPT-2's ``n_positions``), if it says."""
    value = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    return int(value) if value else None


def load_reward_model(
    name_or_path: str,
    dtype: str = "float32",
    device: str | torch.device = "cpu",
    chat_template_kwargs: Mapping[str, Any] | None = None,
) -> TrainableRewardModel:
    """A reward model to train from a causal LM, an encoder or a reward-model checkpoint (dir or hub id), as the
    module docstring says: one output, a head missing from the checkpoint (or of another size) re-initialised,
    a distinct pad token, right padding, the chat template arguments ``chat_template_kwargs``
    (:func:`~rlhf.models.loading.load_tokenizer`), dropout off (checklist item 7), a normalisation stored by an
    earlier run dropped. ``device="meta"``: the architecture only, ``fresh_head`` False
    (:func:`~rlhf.models.loading.pretrained`)."""
    from transformers import AutoModelForSequenceClassification
    from transformers.utils import logging as hf_logging

    from rlhf.models.loading import DTYPES, align_pad_token, load_tokenizer, pretrained
    from rlhf.models.policy import disable_dropout

    tokenizer = load_tokenizer(name_or_path, chat_template_kwargs, padding_side="right")
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # its "LOAD REPORT" (lm_head unexpected, score missing) is expected here;
    try:  # the trainer says in one line whether the head is fresh
        loaded = pretrained(
            AutoModelForSequenceClassification,
            name_or_path,
            device,
            num_labels=1,
            dtype=DTYPES[dtype],
            output_loading_info=True,
            ignore_mismatched_sizes=True,  # a classifier with another number of labels gets a fresh head
        )
    finally:
        hf_logging.set_verbosity(verbosity)
    # on the meta device nothing is read, so nothing is missing: the head's origin is rank 0's to say
    model, info = loaded if isinstance(loaded, tuple) else (loaded, {"missing_keys": [], "mismatched_keys": []})
    new_keys = set(info["missing_keys"]) | {key for key, *_ in info["mismatched_keys"]}
    fresh = False
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear) and module.out_features == 1 and f"{name}.weight" in new_keys:
            init_reward_head(module)
            fresh = True
    align_pad_token(model, tokenizer)  # the saved model embeds its pad id; config.pad_token_id says which
    clear_reward_normalization(model.config)
    disable_dropout(model)
    model.to(device)
    return TrainableRewardModel(
        model=model,
        tokenizer=tokenizer,
        is_decoder=decoder_parts(model) is not None,
        fresh_head=fresh,
        max_positions=max_positions(model.config),
    )


def tokenize_pairs(path: str, rm: TrainableRewardModel, max_length: int) -> list[Any]:
    """The preference pairs of ``path`` as ``rm`` reads them (``DataError``: file:line). Decoders: ``prompt ids +
    response ids + eos``, responses cut to ``max_length``; encoders: the one text ``prompt + response`` with the
    tokenizer's specials. A pair longer than the model's positions is an error."""
    from rlhf.data import load_preferences

    kwargs = {"model_max_length": rm.max_positions, "join_text": not rm.is_decoder}
    return load_preferences(path, rm.tokenizer, max_length, **kwargs)


class RewardScorer(nn.Module):
    """:func:`reward_scores` as a module, so that data parallelism (which must see the forward) can wrap it."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """(B,) float32 scores (a bfloat16 head under mixed precision is upcast: the loss is taken in float32)."""
        return reward_scores(self.model, input_ids, attention_mask).float()
