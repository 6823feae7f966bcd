"""A learned reward model as a reward source: a ``transformers`` sequence-classification model with one output.

How a sample is scored (checklist items 7, 14, 19, 21: its own tokenizer, eos appended, read at the last real token,
long sequences keep their last tokens, the stored normalisation), the pad token, the path for the policy's token ids and
chat prompts: docs/architecture.md, "Reward sources". B samples, L tokens of ``prompt ⊕ completion``."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from rlhf.data import chat
from rlhf.data.collate import right_pad
from rlhf.rollout.rewards.base import RewardError

ModelLoader = Callable[[Callable[[str], nn.Module]], nn.Module]
"""Puts a model's weights in memory: given ``build(device)`` (``"meta"`` = the architecture, empty), returns
the model (see :meth:`RewardModelReward.load`)."""


class RewardModelReward:
    """A sequence-classification reward model with one output, scoring as docs/architecture.md says. ``model``
    (``config.num_labels == 1``) is frozen in place; ``tokenizer`` is its own; the policy's, if known, sets
    ``shares_policy_tokenizer``; ``append_eos``: append eos to sequences that do not end with it."""

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
        _check_one_output(name, getattr(getattr(model, "config", None), "num_labels", None))
        from rlhf.models.critic import shares_vocabulary
        from rlhf.models.policy import disable_dropout  # lazily: function/HTTP sources need no models
        from rlhf.models.reward import GAIN_KEY, max_positions, reward_normalization

        try:  # scores are gain · head + bias: 1 and 0 unless the model's config stores a normalisation
            self.gain, self.bias = reward_normalization(model.config)
            self.normalised = getattr(model.config, GAIN_KEY, None) is not None
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
        self.max_length = max_positions(model.config)
        self.shares_policy_tokenizer = shares_vocabulary(policy_tokenizer, tokenizer)
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
        """Load model and tokenizer from a directory or a hub id; ``name`` defaults to its last path part. The
        configuration is read first, so a model with ``num_labels != 1`` is refused before its weights are loaded.
        ``dtype`` goes to ``from_pretrained`` when given; ``loader``: :data:`ModelLoader` (sharded runs:
        ``rlhf.models.sharding.model_loader``), default ``build("cpu")``."""
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
        _check_one_output(spec, config.num_labels)
        kwargs = {} if dtype is None else {"dtype": dtype}

        def build(device: str) -> nn.Module:
            model = pretrained(AutoModelForSequenceClassification, source, device, **kwargs)
            # the pad token the policy's tokenizer gets too (a model trained by `rlhf rm` has it already): a reward
            # model built on the policy's base still shares its vocabulary, and padding stays embeddable
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

    def score(
        self, prompts: list[str], completions: list[str], columns: dict[str, list] | None = None
    ) -> list[float | None]:
        """Scores of ``prompt + completion`` texts, re-tokenised with the reward model's tokenizer."""
        return self._score_rows(self.encode(prompts, completions, columns)).tolist()

    def encode(
        self, prompts: Sequence[str], completions: Sequence[str], columns: dict[str, list] | None = None
    ) -> list[list[int]]:
        """The token ids this source scores for each sample (eos rule applied; chat prompts rendered with this
        tokenizer's template when it has one and does not share the policy's)."""
        tokenizer = self.tokenizer
        use_chat = bool(getattr(tokenizer, "chat_template", None)) and not self.shares_policy_tokenizer
        messages = (columns or {}).get("messages") if use_chat else None
        rows = []
        for i, (prompt, completion) in enumerate(zip(prompts, completions, strict=True)):
            if messages is not None and isinstance(messages[i], list) and messages[i]:
                conversation = [*messages[i], {"role": "assistant", "content": completion}]
                text = chat.render(tokenizer, conversation, add_generation_prompt=False)  # its own template arguments
                rows.append(list(tokenizer(text, add_special_tokens=False)["input_ids"]))
                continue
            text = prompt + completion
            bos = tokenizer.bos_token
            ids = tokenizer(text, add_special_tokens=not (bos and text.startswith(bos)))["input_ids"]
            rows.append(self._with_eos(list(ids)))
        return rows

    def score_ids(self, query_response_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """(B, L) ids + (B, L) mask → (B,) float32 scores, on the ids' device. For the trainer when
        ``shares_policy_tokenizer``: the ids are ``query ⊕ response`` in the policy's layout (any padding: left, right
        or both; only positions with mask 1 are read). The eos rule of the text path applies, so this equals
        :meth:`score` on the decoded texts whenever re-encoding the text gives back the same tokens."""
        mask = attention_mask.bool().cpu()
        ids = query_response_ids.cpu()
        rows = [self._with_eos(row[keep].tolist()) for row, keep in zip(ids, mask, strict=True)]
        return self._score_rows(rows).to(query_response_ids.device)

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
        from rlhf.models.reward import reward_scores  # the same reading `rlhf rm` trains through

        # Longest first, so each micro-batch pads little; padding does not change scores (reward_scores).
        order = sorted(range(len(rows)), key=lambda i: -len(rows[i]))
        scores = torch.empty(len(rows), dtype=torch.float32)
        with torch.inference_mode():
            for start in range(0, len(rows), self.batch_size):
                chunk = order[start : start + self.batch_size]
                ids, mask = right_pad([rows[i] for i in chunk], self.pad_id)
                scores[chunk] = reward_scores(self.model, ids.to(self.device), mask.to(self.device)).float().cpu()
        # a new normal tensor, usable outside inference mode; gain 1, bias 0 leave every bit as it was
        return scores * self.gain + self.bias


def _check_one_output(name: str, num_labels: Any) -> None:
    if num_labels != 1:
        raise RewardError(
            f"reward model {name!r} has num_labels={num_labels}; a reward model needs exactly one output "
            "(a causal LM or a multi-class classifier is not a reward model — train one with `rlhf rm`)"
        )
