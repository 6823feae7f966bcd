"""A learned reward model: a ``transformers`` sequence-classification model with one output.

Notation: B samples, L tokens of ``prompt ⊕ completion``, H hidden size.

How a sample is scored (checklist items 7, 14, 21; Part 3 §5):

1. **Tokens.** ``prompt + completion`` is tokenised as one text with the reward model's *own* tokenizer
   (its default special tokens, except that a text already starting with the bos token gets none added,
   so a chat-rendered prompt does not get a second bos).
2. **EOS appended.** If the tokens do not already end with the tokenizer's eos, it is appended — reward
   models are trained on ``chosen/rejected + eos`` and read the score on that eos (TRL, N+); a completion
   cut at ``max_new_tokens`` is scored the same way. ``append_eos=False`` turns this off.
3. **Read at the last real token, explicitly.** Rows are right-padded and the model's trunk is run with the
   attention mask; the hidden state at index ``mask.sum(-1) − 1`` goes through the model's ``score`` head.
   We do not use the pooled logits of ``*ForSequenceClassification``: they look for the pad token id, which
   breaks with left padding or pad == eos (transformers#35909). Scores therefore do not depend on padding
   or on which other samples share the micro-batch (tested to 1e-5). Models without a ``score`` head
   (encoder classifiers such as BERT/DeBERTa reward models, which pool the first token) fall back to the
   model's own pooled output, which is correct for them with right padding.
4. Sequences longer than the model's positions keep their *last* tokens (the completion and its eos);
   a warning says so once.
5. **Normalisation.** When the model's ``config.json`` holds ``rlhf_reward_gain`` and ``rlhf_reward_bias``
   (written by ``rlhf rm`` with ``normalize_policy``, checklist item 19), every score is
   ``gain · head + bias``, on both paths; without them the head's output is the score. ``gain`` and
   ``bias`` are readable as attributes. See ``rlhf.models.reward``.

**Pad token.** :meth:`RewardModelReward.load` gives the tokenizer the pad token the policy's gets (distinct
from eos, ``rlhf.data.ensure_pad_token``) and the model a row for it (``rlhf.models.loading.align_pad_token``),
so a reward model built on the policy's base model (GPT-2, Pythia, Llama-3: no pad) shares its vocabulary.

The model is frozen: eval mode, every dropout probability 0, ``requires_grad=False``; forwards run under
``torch.inference_mode`` in micro-batches of ``batch_size`` (longest first, to pad little).

**Two paths.** :meth:`RewardModelReward.score` takes text — what the trainer must use when the policy's
tokenizer differs from the reward model's (completions decoded without special tokens, re-encoded here).
:meth:`RewardModelReward.score_ids` takes the policy's token ids directly and skips decode/re-encode; it is
valid only when ``shares_policy_tokenizer`` (identical vocabularies, checked once at construction).

**Chat prompts.** The trainer passes prompt *text* rendered with the policy's chat template. With a
different tokenizer that text is re-tokenised as plain text by the reward model (a known limitation:
the reward model sees the policy's chat format). When the batch has a ``messages`` column (the prompt
conversation, a list of ``{"role", "content"}`` per sample), the tokenizers differ and the reward
model's tokenizer has a chat template, the sample is instead rendered with the *reward model's*
template as ``messages + [{"role": "assistant", "content": completion}]``; that template closes the
turn itself, so no eos is appended.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from rlhf.rollout.rewards.base import RewardError

ModelLoader = Callable[[Callable[[str], nn.Module]], nn.Module]
"""Puts a model's weights in memory: given ``build(device)`` (``"meta"`` = the architecture, empty), returns
the model (see :meth:`RewardModelReward.load`)."""


class RewardModelReward:
    """A sequence-classification reward model with one output; see the module docstring.

    Args:
        model: a ``*ForSequenceClassification`` model with ``config.num_labels == 1``; it is put in eval
            mode, its dropout disabled and its parameters frozen, in place.
        tokenizer: the reward model's own tokenizer.
        name: metric name.
        policy_tokenizer: the policy's tokenizer, if known; sets ``shares_policy_tokenizer``.
        device: where the forwards run.
        batch_size: micro-batch size of the forwards.
        append_eos: append the eos token to sequences that do not end with it.
    """

    def __init__(
        self,
        model: nn.Module,
        tokenizer: Any,
        *,
        name: str = "reward_model",
        policy_tokenizer: Any = None,
        device: str | torch.device = "cpu",
        batch_size: int = 16,
        append_eos: bool = True,
    ):
        num_labels = getattr(getattr(model, "config", None), "num_labels", None)
        if num_labels != 1:
            raise RewardError(
                f"reward model {name!r} has num_labels={num_labels}; a reward model needs exactly one output "
                "(a causal LM or a multi-class classifier is not a reward model — train one with `rlhf rm`)"
            )
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        from rlhf.models.policy import disable_dropout  # lazily: function/HTTP sources need no models
        from rlhf.models.reward import reward_normalization

        try:
            gain, bias = reward_normalization(model.config)
        except ValueError as error:
            raise RewardError(f"reward model {name!r}: {error}") from error

        self.name = name
        self.model = model.to(device).eval()
        disable_dropout(self.model)
        self.model.requires_grad_(False)
        self.tokenizer = tokenizer
        self.device = torch.device(device)
        self.batch_size = batch_size
        self.append_eos = append_eos
        self.eos_id: int | None = tokenizer.eos_token_id
        self.pad_id: int = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        config = model.config
        self.max_length: int | None = getattr(config, "max_position_embeddings", None) or getattr(
            config, "n_positions", None
        )
        self.gain: float = gain
        """Scores are ``gain · head + bias`` (1 and 0 unless the model's config stores a normalisation)."""
        self.bias: float = bias
        self.shares_policy_tokenizer = policy_tokenizer is not None and (
            policy_tokenizer is tokenizer or policy_tokenizer.get_vocab() == tokenizer.get_vocab()
        )
        """True when the policy's token ids mean the same tokens here, so :meth:`score_ids` may be used."""
        self._warned_truncation = False

    @classmethod
    def load(
        cls,
        spec: str,
        *,
        name: str | None = None,
        policy_tokenizer: Any = None,
        device: str | torch.device = "cpu",
        batch_size: int = 16,
        dtype: torch.dtype | str | None = None,
        loader: ModelLoader | None = None,
    ) -> RewardModelReward:
        """Load model and tokenizer from a directory or a hub id; ``name`` defaults to its last path part.

        The configuration is read first, so a model with ``num_labels != 1`` is refused before its weights
        are loaded. ``dtype`` is passed to ``from_pretrained`` when given. ``loader`` puts the weights in
        memory: it gets ``build(device)`` (``from_pretrained`` and the pad row; ``"meta"`` builds the
        architecture empty) and returns the model; default ``build("cpu")``. Sharded runs pass
        ``rlhf.models.sharding.model_loader``, so each rank holds 1/world of a frozen reward model.

        Long because each refusal (no such directory, not a one-output model, a tokenizer that cannot
        re-encode the policy's text) is checked before the weights load, with its own message.
        """
        from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

        from rlhf.data.tokenization import ensure_pad_token
        from rlhf.models.loading import align_pad_token, pretrained

        path = Path(spec).expanduser()
        if path.exists() and not path.is_dir():
            raise RewardError(f"reward model {spec!r} is a file; expected the model's directory or a hub id")
        if not path.exists() and spec.startswith((".", "/", "~")):
            raise RewardError(f"reward model {spec!r}: no such directory ({path.resolve()})")
        source = str(path) if path.is_dir() else spec
        name = name or path.name or spec
        try:
            config = AutoConfig.from_pretrained(source)
        except Exception as error:
            where = "directory" if path.is_dir() else "directory or hub id"
            raise RewardError(
                f"reward model {spec!r}: cannot read its config as a {where}: {type(error).__name__}: {error}"
            ) from error
        if config.num_labels != 1:
            raise RewardError(
                f"reward model {spec!r} has num_labels={config.num_labels}; a reward model needs exactly one "
                "output (a causal LM or a multi-class classifier is not a reward model — train one with `rlhf rm`)"
            )
        kwargs = {} if dtype is None else {"dtype": dtype}

        def build(device: str) -> nn.Module:
            model = pretrained(AutoModelForSequenceClassification, source, device, **kwargs)
            # The pad token the policy's tokenizer gets too (a model trained by `rlhf rm` has it already), so
            # a reward model built on the policy's base still shares its vocabulary, and padding stays
            # embeddable.
            align_pad_token(model, tokenizer)
            return model

        try:
            tokenizer = AutoTokenizer.from_pretrained(source)
            ensure_pad_token(tokenizer)
            model = loader(build) if loader is not None else build("cpu")
        except Exception as error:
            raise RewardError(f"reward model {spec!r}: cannot load: {type(error).__name__}: {error}") from error
        return cls(model, tokenizer, name=name, policy_tokenizer=policy_tokenizer, device=device, batch_size=batch_size)

    def __repr__(self) -> str:
        return f"RewardModelReward({self.name!r}, {type(self.model).__name__}, shares_policy_tokenizer={self.shares_policy_tokenizer})"

    # ---------------------------------------------------------------------------------------------------------
    # text path
    # ---------------------------------------------------------------------------------------------------------

    def score(
        self, prompts: list[str], completions: list[str], columns: dict[str, list] | None = None
    ) -> list[float | None]:
        """Scores of ``prompt + completion`` texts, re-tokenised with the reward model's tokenizer."""
        return self._score_rows(self.encode(prompts, completions, columns)).tolist()

    def encode(
        self, prompts: Sequence[str], completions: Sequence[str], columns: dict[str, list] | None = None
    ) -> list[list[int]]:
        """The token ids this source scores for each sample (eos rule applied); see the module docstring."""
        tokenizer = self.tokenizer
        messages = (columns or {}).get("messages")
        use_chat = (
            messages is not None
            and bool(getattr(tokenizer, "chat_template", None))
            and not self.shares_policy_tokenizer
        )
        rows = []
        for i, (prompt, completion) in enumerate(zip(prompts, completions, strict=True)):
            if use_chat and isinstance(messages[i], list) and messages[i]:
                conversation = [*messages[i], {"role": "assistant", "content": completion}]
                text = tokenizer.apply_chat_template(conversation, tokenize=False)
                rows.append(list(tokenizer(text, add_special_tokens=False)["input_ids"]))
                continue
            text = prompt + completion
            bos = tokenizer.bos_token
            ids = tokenizer(text, add_special_tokens=not (bos and text.startswith(bos)))["input_ids"]
            rows.append(self._with_eos(list(ids)))
        return rows

    # ---------------------------------------------------------------------------------------------------------
    # token fast path
    # ---------------------------------------------------------------------------------------------------------

    def score_ids(self, query_response_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """(B, L) ids + (B, L) mask → (B,) float32 scores, on the ids' device.

        For the trainer when ``shares_policy_tokenizer``: the ids are ``query ⊕ response`` in the policy's
        layout (any padding: left, right or both; only positions with mask 1 are read). The eos rule of the
        text path applies, so this equals :meth:`score` on the decoded texts whenever re-encoding the text
        gives back the same tokens.
        """
        if query_response_ids.shape != attention_mask.shape or query_response_ids.dim() != 2:
            raise ValueError(
                f"query_response_ids {tuple(query_response_ids.shape)} and attention_mask "
                f"{tuple(attention_mask.shape)} must be the same (B, L) shape"
            )
        mask = attention_mask.bool().cpu()
        ids = query_response_ids.cpu()
        rows = [self._with_eos(row[keep].tolist()) for row, keep in zip(ids, mask, strict=True)]
        return self._score_rows(rows).to(query_response_ids.device)

    # ---------------------------------------------------------------------------------------------------------
    # shared
    # ---------------------------------------------------------------------------------------------------------

    def _with_eos(self, ids: list[int]) -> list[int]:
        if self.append_eos and self.eos_id is not None and (not ids or ids[-1] != self.eos_id):
            ids.append(self.eos_id)
        return ids

    def _score_rows(self, rows: list[list[int]]) -> torch.Tensor:
        """(B,) float32 CPU scores of token-id rows, in micro-batches sorted by length."""
        for i, row in enumerate(rows):
            if not row:
                raise RewardError(f"reward model {self.name!r}: sample {i} has no tokens to score")
        if self.max_length is not None and any(len(row) > self.max_length for row in rows):
            if not self._warned_truncation:
                warnings.warn(
                    f"reward model {self.name!r}: sequences longer than its {self.max_length} positions keep "
                    "their last tokens only",
                    stacklevel=3,
                )
                self._warned_truncation = True
            rows = [row[-self.max_length :] for row in rows]
        # Longest first, so each micro-batch pads little. Padding does not change scores (see _forward).
        order = sorted(range(len(rows)), key=lambda i: -len(rows[i]))
        scores = torch.empty(len(rows), dtype=torch.float32)
        with torch.inference_mode():
            for start in range(0, len(rows), self.batch_size):
                chunk = order[start : start + self.batch_size]
                width = len(rows[chunk[0]])
                ids = torch.full((len(chunk), width), self.pad_id, dtype=torch.long)
                mask = torch.zeros((len(chunk), width), dtype=torch.long)
                for j, i in enumerate(chunk):  # right padding
                    ids[j, : len(rows[i])] = torch.tensor(rows[i])
                    mask[j, : len(rows[i])] = 1
                scores[chunk] = self._forward(ids.to(self.device), mask.to(self.device)).float().cpu()
        # a new normal tensor, usable outside inference mode; gain 1, bias 0 leave every bit as it was
        return scores * self.gain + self.bias

    def _forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """(B, L) right-padded ids and mask → (B,) raw scores read at each row's last real token."""
        from rlhf.models.reward import reward_scores  # the same reading `rlhf rm` trains through

        return reward_scores(self.model, ids, mask)
