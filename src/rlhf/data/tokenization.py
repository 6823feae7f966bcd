"""Tokenisation of validated examples with a Hugging Face tokenizer (passed in; never imported here).

Conventions (``docs/ppo_checklist.md`` items 1, 2, 21):

- **Plain text** is encoded as the tokenizer encodes a single text with special tokens (Llama's ``<s>`` in
  front, nothing for GPT-2), except that a special token it would *append* (an eos) is left out of prompts: the
  response comes after. Responses are encoded without special tokens, apart from the prompt (so the boundary is
  where generation puts it), then ``eos_token_id`` is appended.
- **Chat** examples go through ``tokenizer.apply_chat_template``, whose own end of turn closes each assistant
  message.
- **Truncation**: prompts lose tokens on the *left* (the end, nearest the response, matters most; a leading bos
  is kept), responses on the *right*; each tokenised example says whether it was truncated.

Multi-turn SFT labels (`tokenize_sft`) come from one rendering of the whole conversation, each assistant turn
found in it by `rlhf.data.chat.turn_spans`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rlhf.config import ConfigError
from rlhf.data import chat
from rlhf.data.files import DataError, Problem, ProblemList
from rlhf.data.records import Message, PreferenceExample, PromptExample, SFTExample

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

IGNORE_INDEX = -100
"""Label of a token that carries no loss (prompt, padding, user/system turns); PyTorch's cross-entropy default."""

DEFAULT_PAD_TOKEN = "<|pad|>"


@dataclass(frozen=True)
class TokenizedPrompt:
    """A prompt ready for generation. ``text`` is what reward functions receive as the prompt: the prompt string, or for
    chat the rendered template (generation prompt included), before any truncation. ``columns`` are the record's other
    keys."""

    where: str
    text: str
    input_ids: list[int]
    columns: dict[str, Any] = field(default_factory=dict)
    messages: list[Message] | None = None
    truncated: bool = False


@dataclass(frozen=True)
class TokenizedSFT:
    """One SFT sequence: ``labels[i]`` is ``input_ids[i]`` on trained tokens, `IGNORE_INDEX` elsewhere."""

    where: str
    input_ids: list[int]
    labels: list[int]
    truncated: bool = False


@dataclass(frozen=True)
class TokenizedPreference:
    """One comparison: the reward model scores ``prompt_ids + chosen_ids`` against ``prompt_ids + rejected_ids``. Each
    response ends with the eos token (checklist item 21), unless it was truncated. Encoded as one text
    (``join_text=True``, for encoder reward models) ``prompt_ids`` is empty and ``chosen_ids`` / ``rejected_ids`` each
    hold the whole encoded ``prompt + response``, special tokens included."""

    where: str
    prompt_ids: list[int]
    chosen_ids: list[int]
    rejected_ids: list[int]
    margin: float = 0.0
    truncated: bool = False
    prompt_key: str = ""
    """Encoded as one text: the prompt (JSON), which groups the pairs of one prompt (`rlhf.data.groups`); else "" (the
    prompt ids group them)."""


def require_pad_token_id(tokenizer: PreTrainedTokenizerBase) -> int:
    """The tokenizer's pad id, refusing a tokenizer without a pad token or whose pad token is its eos. With pad == eos
    every mask built from ``ids != pad_token_id`` also hides the real end-of-sequence tokens, and the policy never
    learns to stop (checklist item 1)."""
    fix = (
        f'add a distinct pad token, e.g. tokenizer.add_special_tokens({{"pad_token": "{DEFAULT_PAD_TOKEN}"}}) '
        "(rlhf.data.ensure_pad_token does this)"
    )
    if tokenizer.pad_token is None or tokenizer.pad_token_id is None:
        raise ValueError(f"the tokenizer has no pad token; {fix}")
    if tokenizer.eos_token_id is not None and tokenizer.pad_token_id == tokenizer.eos_token_id:
        raise ValueError(
            f"the tokenizer's pad token {tokenizer.pad_token!r} is also its eos token, so padding would mask "
            f"real end-of-sequence tokens; {fix}"
        )
    return int(tokenizer.pad_token_id)


def ensure_pad_token(tokenizer: PreTrainedTokenizerBase, pad_token: str = DEFAULT_PAD_TOKEN) -> bool:
    """Give the tokenizer a pad token distinct from eos if it has none (or pad == eos); True if it did. The new token's
    id is ``len(tokenizer)`` before the call, which may lie beyond the model's embedding matrix:
    ``rlhf.models.loading.align_pad_token`` gives every model rlhf loads a row for it (a spare one when the matrix has
    one) and names it in the model's config, so a saved model and tokenizer agree."""
    if tokenizer.pad_token is not None and tokenizer.pad_token_id != tokenizer.eos_token_id:
        return False
    if pad_token == tokenizer.eos_token:
        raise ValueError(f"pad_token {pad_token!r} is the eos token; choose another string")
    tokenizer.add_special_tokens({"pad_token": pad_token})
    return True


def _eos_id(tokenizer: PreTrainedTokenizerBase) -> int:
    if tokenizer.eos_token_id is None:
        raise ValueError("the tokenizer has no eos token: responses must end with one (checklist item 21)")
    return int(tokenizer.eos_token_id)


def special_prefix(tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """The special tokens the tokenizer puts *before* a single text (e.g. Llama's bos), found by probing."""
    bare = tokenizer("a", add_special_tokens=False)["input_ids"]
    full = tokenizer("a", add_special_tokens=True)["input_ids"]
    for k in range(len(full) - len(bare) + 1):
        if full[k : k + len(bare)] == bare:
            return list(full[:k])
    return []


def _encode_batch(tokenizer: PreTrainedTokenizerBase, texts: Sequence[str]) -> list[list[int]]:
    if not texts:
        return []
    return [list(ids) for ids in tokenizer(list(texts), add_special_tokens=False)["input_ids"]]


def _encode_plain(
    tokenizer: PreTrainedTokenizerBase, examples: Sequence[Any], answers: Sequence[str], eos: int
) -> Iterator[tuple[list[int], ...]]:
    """Per plain example, its prompt ids (the tokenizer's leading special tokens + the text) and the ids of each
    of its ``answers`` + ``[eos]``, encoded in a batch per field."""
    prefix = special_prefix(tokenizer)
    prompts = [prefix + ids for ids in _encode_batch(tokenizer, [ex.prompt for ex in examples])]
    fields = [_encode_batch(tokenizer, [getattr(ex, key) for ex in examples]) for key in answers]
    return zip(prompts, *([[*ids, eos] for ids in field] for field in fields), strict=True)


def truncate_left(ids: list[int], max_length: int | None, keep_first: int | None = None) -> tuple[list[int], bool]:
    """Keep the last ``max_length`` tokens (and ``ids[0]`` if it is ``keep_first``, e.g. bos); (ids, truncated)."""
    if max_length is None or len(ids) <= max_length:
        return ids, False
    if keep_first is not None and ids and ids[0] == keep_first and max_length > 1:
        return [ids[0], *ids[len(ids) - (max_length - 1) :]], True
    return ids[len(ids) - max_length :], True


def _check_chat_template(tokenizer: PreTrainedTokenizerBase, chat: Sequence[Any]) -> None:
    """A `DataError` at the first of the ``chat`` examples if the tokenizer has no chat template."""
    if chat and getattr(tokenizer, "chat_template", None) is None:
        problem = "chat messages need a chat template, but the tokenizer has none (set tokenizer.chat_template)"
        raise DataError([f"{chat[0].where}: {problem}"])


def _check_max(name: str, value: int | None) -> None:
    if value is not None and value < 1:
        raise ValueError(f"{name} must be a positive number of tokens or None, got {value}")


def tokenize_prompts(
    examples: Sequence[PromptExample], tokenizer: PreTrainedTokenizerBase, max_prompt_length: int | None = None
) -> list[TokenizedPrompt]:
    """Prompt ids for generation (chat rendered with the generation prompt); longer than ``max_prompt_length``,
    a prompt keeps its last tokens (`truncate_left`). `DataError` (``file:line``) when the chat template fails."""
    _check_max("max_prompt_length", max_prompt_length)
    _check_chat_template(tokenizer, [ex for ex in examples if ex.messages is not None])
    problems = ProblemList()
    texts: list[str] = []
    for ex in examples:
        with problems.at(ex.where):
            texts.append(
                ex.prompt if ex.messages is None else chat.render(tokenizer, ex.messages, add_generation_prompt=True)
            )
    problems.raise_if_any()
    prefix = special_prefix(tokenizer)
    out = []
    for ex, text, row in zip(examples, texts, _encode_batch(tokenizer, texts), strict=True):
        row, truncated = truncate_left(
            prefix + row if ex.messages is None else row, max_prompt_length, keep_first=tokenizer.bos_token_id
        )
        out.append(TokenizedPrompt(ex.where, text, row, dict(ex.columns), ex.messages, truncated))
    return out


def tokenize_sft(
    examples: Sequence[SFTExample], tokenizer: PreTrainedTokenizerBase, max_length: int | None = None
) -> list[TokenizedSFT]:
    """(input_ids, labels) per example, loss on the response and its eos (plain) or on each assistant turn and its
    end of turn (chat) only; longer than ``max_length``, a sequence loses its end. `DataError` (``file:line``) for
    a template failure, a broken prefix property, or an example left with no trained token once cut."""
    _check_max("max_length", max_length)
    eos = _eos_id(tokenizer)
    chats = [ex for ex in examples if ex.messages is not None]
    _check_chat_template(tokenizer, chats)
    marks = chat.Marks.of(tokenizer, eos) if chats else None
    problems = ProblemList()
    plain = _encode_plain(tokenizer, [ex for ex in examples if ex.messages is None], ("response",), eos)
    out = []
    for ex in examples:
        with problems.at(ex.where):
            if ex.messages is None:
                prompt, response = next(plain)
                ids, labels = prompt + response, [IGNORE_INDEX] * len(prompt) + response
            else:
                ids, spans = chat.turn_spans(tokenizer, ex.messages, marks, ex.tools)
                labels = [IGNORE_INDEX] * len(ids)
                for begin, end in spans:  # each assistant turn, its tool calls included; the rest is context
                    labels[begin:end] = ids[begin:end]
            truncated = max_length is not None and len(ids) > max_length
            if truncated:
                ids, labels = ids[:max_length], labels[:max_length]
                if all(label == IGNORE_INDEX for label in labels):
                    raise Problem(
                        f"nothing left to train on after truncating to data.max_length={max_length} "
                        "(the response starts after it); shorten the prompt or raise data.max_length"
                    )
            out.append(TokenizedSFT(ex.where, ids, labels, truncated))
    problems.raise_if_any()
    return out


def tokenize_preferences(
    examples: Sequence[PreferenceExample],
    tokenizer: PreTrainedTokenizerBase,
    max_length: int | None = None,
    max_prompt_length: int | None = None,
    *,
    model_max_length: int | None = None,
    join_text: bool = False,
) -> list[TokenizedPreference]:
    """Prompt, chosen and rejected ids per comparison, each response ending with eos (checklist item 21).

    Plain and chat as the module docstring says; a chat answer is what ``prompt + answer`` adds to the rendered
    prompt, through its last eos (eos appended when the template ends turns with another token). Prompts longer
    than ``max_prompt_length`` keep their end; then responses are cut on the right to fit ``max_length``.

    ``join_text=True`` (encoder reward models, e.g. BERT): ``prompt + response`` is one text with the tokenizer's
    own special tokens (``[CLS] … [SEP]``) and no eos — the tokens ``RewardModelReward`` scores; the tokenizer
    cuts it to ``max_length``, keeping its closing special token; ``max_prompt_length`` does not apply.

    ``model_max_length`` (the positions the model reads): a prompt that leaves no room for a response, or a
    prompt + response longer than it, is an error, as is a pair whose two sides encode to the same tokens; one
    `DataError` lists every problem as ``file:line``.
    """
    _check_max("max_length", max_length)
    _check_max("max_prompt_length", max_prompt_length)
    _check_max("model_max_length", model_max_length)
    problems = ProblemList()
    if join_text:
        encoded = _joined_preferences(examples, tokenizer, max_length, problems)
    else:
        encoded = _split_preferences(examples, tokenizer, max_length, max_prompt_length, problems)
    out = []
    for item in encoded:
        with problems.at(item.where):
            _check_preference(item, model_max_length, max_length, join_text)
            out.append(item)
    problems.raise_if_any()
    return out


def _check_preference(
    ex: TokenizedPreference, model_max_length: int | None, max_length: int | None, joined: bool
) -> None:
    """Raises `Problem` for a tokenised comparison that cannot be used."""
    if model_max_length is not None:
        limit = f"the model's {model_max_length} positions"
        if not joined and len(ex.prompt_ids) >= model_max_length:
            raise Problem(
                f"the prompt takes {len(ex.prompt_ids)} tokens, leaving no room for a response within {limit}; "
                "shorten it"
            )
        for key, ids in (("chosen", ex.chosen_ids), ("rejected", ex.rejected_ids)):
            n = len(ex.prompt_ids) + len(ids)
            if n > model_max_length:
                raise Problem(
                    f'prompt + "{key}" takes {n} tokens, more than {limit}; shorten it, or set '
                    f"max_length ≤ {model_max_length} to cut long responses"
                )
    if ex.chosen_ids == ex.rejected_ids:
        cut = f" once cut to data.max_length={max_length}; raise data.max_length" if ex.truncated else ""
        raise Problem(f'"chosen" and "rejected" encode to the same tokens{cut}: the pair cannot be learned from')


def _chat_answer(
    tokenizer: PreTrainedTokenizerBase, ex: PreferenceExample, prompt_ids: list[int], key: str, eos: int
) -> list[int]:
    full = chat.encode(tokenizer, [*ex.prompt, *getattr(ex, key)], add_generation_prompt=False)
    ids = chat.extend(prompt_ids, full, f'"{key}"')
    # Score on an eos hidden state (checklist item 21): cut what the template writes after the last eos,
    # or append one when its end of turn is some other token.
    return ids[: len(ids) - ids[::-1].index(eos)] if eos in ids else [*ids, eos]


def _split_preferences(
    examples: Sequence[PreferenceExample],
    tokenizer: PreTrainedTokenizerBase,
    max_length: int | None,
    max_prompt_length: int | None,
    problems: ProblemList,
) -> list[TokenizedPreference]:
    """Decoder encoding (see `tokenize_preferences`); an example with a problem is added to ``problems``."""
    eos = _eos_id(tokenizer)
    _check_chat_template(tokenizer, [ex for ex in examples if ex.is_chat])
    plain = _encode_plain(tokenizer, [ex for ex in examples if not ex.is_chat], ("chosen", "rejected"), eos)
    out: list[TokenizedPreference] = []
    for ex in examples:
        with problems.at(ex.where):
            if not ex.is_chat:
                prompt, chosen, rejected = next(plain)
            else:
                prompt = chat.encode(tokenizer, ex.prompt, add_generation_prompt=True)
                chosen = _chat_answer(tokenizer, ex, prompt, "chosen", eos)
                rejected = _chat_answer(tokenizer, ex, prompt, "rejected", eos)
            prompt, truncated = truncate_left(prompt, max_prompt_length, keep_first=tokenizer.bos_token_id)
            if max_length is not None:
                room = max_length - len(prompt)
                if room < 1:
                    raise Problem(
                        f"the prompt takes {len(prompt)} tokens, leaving no room for a response within "
                        f"max_length={max_length}; set max_prompt_length below max_length"
                    )
                truncated = truncated or len(chosen) > room or len(rejected) > room
                chosen, rejected = chosen[:room], rejected[:room]
            out.append(TokenizedPreference(ex.where, prompt, chosen, rejected, ex.margin, truncated))
    return out


def _joined_preferences(
    examples: Sequence[PreferenceExample],
    tokenizer: PreTrainedTokenizerBase,
    max_length: int | None,
    problems: ProblemList,
) -> list[TokenizedPreference]:
    """Encoder encoding (see `tokenize_preferences`); an example with a problem is added to ``problems``."""
    _check_chat_template(tokenizer, [ex for ex in examples if ex.is_chat])
    pairs: list[tuple[PreferenceExample, list[str]]] = []
    for ex in examples:
        answers = (ex.chosen, ex.rejected)
        if not ex.is_chat:
            pairs.append((ex, [ex.prompt + answer for answer in answers]))
            continue
        with problems.at(ex.where):
            pairs.append((ex, [chat.render(tokenizer, [*ex.prompt, *a], add_generation_prompt=False) for a in answers]))
    flat = [text for _, pair in pairs for text in pair]
    rows = iter(tokenizer(flat)["input_ids"] if flat else [])
    out: list[TokenizedPreference] = []
    for ex, pair in pairs:
        chosen, rejected = list(next(rows)), list(next(rows))
        truncated = max_length is not None and max(len(chosen), len(rejected)) > max_length
        if truncated:
            chosen, rejected = (
                list(tokenizer(text, truncation=True, max_length=max_length)["input_ids"]) for text in pair
            )
        key = json.dumps(ex.prompt, ensure_ascii=False, sort_keys=True)
        out.append(TokenizedPreference(ex.where, [], chosen, rejected, ex.margin, truncated, prompt_key=key))
    return out


def stop_token_ids(tokenizer: Any, stop_token: str) -> list[int]:
    """Token ids that end a response: EOS always, plus ``stop_token`` when it names another single token. Raises
    `ConfigError` for a text the tokenizer does not encode as exactly one token: a response is cut at one sampled token,
    so a multi-token text could never be matched."""
    eos = tokenizer.eos_token_id
    if eos is None:
        raise ConfigError("the policy's tokenizer has no eos token; responses need a stop token")
    if stop_token == "eos":
        return [int(eos)]
    ids = tokenizer.encode(stop_token, add_special_tokens=False)
    if len(ids) != 1:
        pieces = tokenizer.convert_ids_to_tokens(ids)
        candidates = ("\n", ".", "\n\n", "</s>", "<|im_end|>")  # some single tokens to suggest
        examples = [repr(t) for t in candidates if len(tokenizer.encode(t, add_special_tokens=False)) == 1]
        raise ConfigError(
            f"sampling.stop={stop_token!r} is {len(ids)} tokens for the policy's tokenizer "
            f"({', '.join(f'{i}={p!r}' for i, p in zip(ids, pieces, strict=True)) or 'none'}); it must be exactly "
            f"one token: 'eos' (the tokenizer's {tokenizer.eos_token!r}) or a text that is one token, such as "
            f"{' or '.join(examples[:3]) or 'a special token of the tokenizer'}"
        )
    return sorted({int(eos), int(ids[0])})
