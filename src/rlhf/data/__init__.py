"""Data files for every command: reading, validation with ``file:line`` errors, tokenisation, collation.

The three ``load_*`` functions are what trainers call; each reads, validates and tokenises a whole file
before any training starts, and raises one `DataError` listing every problem found::

    tokenizer = AutoTokenizer.from_pretrained(...)
    ensure_pad_token(tokenizer)                   # a pad token distinct from eos (checklist item 1)
    prompts = load_prompts("prompts.jsonl", tokenizer, max_prompt_length=256)
    stream = PromptStream(prompts, batch_size=64, seed=0)
    batch = next(stream)
    input_ids, attention_mask = left_pad(batch.input_ids, require_pad_token_id(tokenizer))

Formats: `read_records`; shapes per kind: `rlhf.data.records`; special tokens and truncation: `rlhf.data.tokenization`.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any

from rlhf.data.files import DataError, Record, read_records
from rlhf.data.labels import is_label_file, live_preferences
from rlhf.data.records import (
    PreferenceExample,
    PromptExample,
    SFTExample,
    validate_preferences,
    validate_prompts,
    validate_sft,
)
from rlhf.data.stream import PromptBatch, PromptStream, held_out
from rlhf.data.tokenization import (
    IGNORE_INDEX,
    TokenizedPreference,
    TokenizedPrompt,
    TokenizedSFT,
    ensure_pad_token,
    require_pad_token_id,
    tokenize_preferences,
    tokenize_prompts,
    tokenize_sft,
)

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from rlhf.data.collate import (
        PreferenceBatch,
        SFTBatch,
        collate_preferences,
        collate_sft,
        left_pad,
        pad_sequences,
        position_ids_from_mask,
        right_pad,
    )

_COLLATE = {
    "PreferenceBatch",
    "SFTBatch",
    "collate_preferences",
    "collate_sft",
    "left_pad",
    "pad_sequences",
    "position_ids_from_mask",
    "right_pad",
}


def __getattr__(name: str) -> object:
    # `rlhf.data.collate` needs torch: imported on first use, so that reading or checking a data file (``rlhf label``)
    # need not wait for it
    if name in _COLLATE:
        from rlhf.data import collate

        return getattr(collate, name)
    raise AttributeError(f"module 'rlhf.data' has no attribute {name!r}")


PathLike = str | os.PathLike[str]


def warn(message: str) -> None:
    """A warning about the user's data, on stderr: printed rather than `warnings.warn`, so that it shows once
    per call and is never filtered with the libraries' warnings (`rlhf.runlog.progress.quiet_libraries`)."""
    print(f"warning: {message}", file=sys.stderr)


def read_prompts(path: PathLike) -> list[PromptExample]:
    """Read and validate a prompts file (no tokenizer needed): raises `DataError` with ``file:line``."""
    return validate_prompts(read_records(path))


def read_sft(path: PathLike) -> list[SFTExample]:
    """Read and validate an SFT file (no tokenizer needed): raises `DataError` with ``file:line``."""
    return validate_sft(read_records(path))


def read_preferences(path: PathLike) -> list[PreferenceExample]:
    """Read and validate a preferences file (no tokenizer needed): raises `DataError` with ``file:line``. A labels
    file (`rlhf.data.labels`) gives its live preferences, and stderr says how many labels were left out."""
    records = read_records(path)
    if is_label_file(records):
        records, counts = live_preferences(records)
        if not records:
            raise DataError([f"{path}: a labels file with no preference to train on ({counts.summary()})"])
        print(f"{path}: labels file: {counts.summary()}", file=sys.stderr)
    return validate_preferences(records)


def load_prompts(
    path: PathLike, tokenizer: PreTrainedTokenizerBase, max_prompt_length: int | None = None
) -> list[TokenizedPrompt]:
    """Read, validate and tokenise prompts for generation; says on stderr how many were cut to fit."""
    require_pad_token_id(tokenizer)
    prompts = tokenize_prompts(read_prompts(path), tokenizer, max_prompt_length)
    _say_cut(path, prompts, "prompts", max_prompt_length)
    return prompts


def load_sft(path: PathLike, tokenizer: PreTrainedTokenizerBase, max_length: int | None = None) -> list[TokenizedSFT]:
    """Read, validate and tokenise SFT demonstrations: (input_ids, labels) with loss on responses only."""
    require_pad_token_id(tokenizer)
    examples = tokenize_sft(read_sft(path), tokenizer, max_length)
    _say_cut(path, examples, "examples", max_length)
    return examples


_CUT = {
    "prompts": ("sampling.max_prompt_length", "keep only their last tokens (the start is cut)"),
    "examples": ("data.max_length", "lose their end (the rest of the response is not trained on)"),
}
"""What is cut off the rows of a kind that are too long: the limit's field and what the rows lose."""


def _say_cut(path: PathLike, rows: list[TokenizedPrompt] | list[TokenizedSFT], what: str, limit: int | None) -> None:
    """A warning when some of ``rows`` (``what``: a key of `_CUT`) were longer than ``limit`` and were cut."""
    n, (field, cut) = sum(row.truncated for row in rows), _CUT[what]
    if n:
        warn(
            f"{path}: {n} of {len(rows)} {what} are longer than {field}={limit} tokens and {cut}; "
            f"raise {field} to keep them whole"
        )


def load_preferences(
    path: PathLike, tokenizer: PreTrainedTokenizerBase, max_length: int | None = None, **encoding: Any
) -> list[TokenizedPreference]:
    """Read, validate and tokenise comparisons for the reward model and DPO (eos appended to each response);
    ``encoding``: the other options of `tokenize_preferences` (max_prompt_length, model_max_length, join_text)."""
    require_pad_token_id(tokenizer)
    return tokenize_preferences(read_preferences(path), tokenizer, max_length, **encoding)
