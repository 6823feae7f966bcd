"""Chat templates: the one module that renders a run's conversations and finds what a template writes for a turn.

**Template arguments** (``data.chat_template_kwargs``, TRL's name): extra variables every render of a run's chat
template gets, such as Qwen3's ``enable_thinking``. They live on the tokenizer, in
``tokenizer.init_kwargs["chat_template_kwargs"]``: one setting per run reaches every render (SFT labels, preference
pairs, prompts, episode deltas, the reward model's re-render) without being passed down each call, and
``save_pretrained`` writes them into the saved ``tokenizer_config.json``, so a model trained with ``enable_thinking:
false`` is sampled and evaluated that way by ``rlhf sample`` / ``rlhf eval`` (and an ``AutoTokenizer`` loads them
back into ``init_kwargs``). ``transformers`` itself does not read them when rendering: :func:`render` passes them;
``rlhf.models.loading.load_tokenizer`` sets them on every tokenizer that renders a run's data.

**Turns of a conversation** (:func:`turn_spans`, SFT's labels): where each assistant turn lies in the rendering of
the whole conversation. **Deltas** (:class:`Format`, multi-turn episodes): the ids a template appends after a
model turn. Both compare renderings token by token (:func:`common_prefix`); a template's quirks are met here once.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rlhf.config import ConfigError
from rlhf.data.files import Problem

KEY = "chat_template_kwargs"
"""The key in ``tokenizer.init_kwargs`` and tokenizer_config.json."""

Messages = list[dict[str, Any]]
"""A conversation in transformers' message schema (``role``, ``content``, ``tool_calls``...)."""
Schemas = list[dict[str, Any]] | None
"""Tools' JSON schemas, passed to the template (None: no tools)."""

RESERVED = frozenset({"messages", "conversation", "tools", "documents", "add_generation_prompt", "tokenize"})
"""Arguments of ``apply_chat_template`` itself, which a template argument cannot replace."""


def template_kwargs(tokenizer: Any) -> dict[str, Any]:
    """The template arguments ``tokenizer`` carries (none: ``{}``)."""
    return dict((getattr(tokenizer, "init_kwargs", None) or {}).get(KEY) or {})


def set_template_kwargs(tokenizer: Any, kwargs: Mapping[str, Any] | None) -> None:
    """Give ``tokenizer`` the template arguments ``kwargs``; None keeps those it was saved with (a model trained by
    rlhf with them), ``{}`` renders with the template's defaults."""
    if kwargs is None:
        return
    clash = sorted(RESERVED & kwargs.keys())
    if clash:
        raise ValueError(
            f"chat_template_kwargs: {', '.join(clash)} {'is an argument' if len(clash) == 1 else 'are arguments'} "
            "of apply_chat_template itself, which rlhf sets; use template variables only (e.g. enable_thinking)"
        )
    tokenizer.init_kwargs[KEY] = dict(kwargs)


def render(tokenizer: Any, messages: Messages, *, add_generation_prompt: bool, tools: Schemas = None) -> str:
    """The chat template's text for ``messages`` with the tokenizer's template arguments (and ``tools``' schemas);
    `Problem` when the template fails."""
    try:
        return tokenizer.apply_chat_template(
            messages,
            tools=tools,
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
            **template_kwargs(tokenizer),
        )
    # Jinja raises its own types (TemplateError, UndefinedError) and templates raise_exception anything.
    except Exception as e:
        raise Problem(f"the chat template failed: {type(e).__name__}: {e}") from e


def encode(tokenizer: Any, messages: Messages, *, add_generation_prompt: bool, tools: Schemas = None) -> list[int]:
    """The ids of :func:`render`'s text, tokenised without the tokenizer's added special tokens (the template writes
    its own)."""
    text = render(tokenizer, messages, add_generation_prompt=add_generation_prompt, tools=tools)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def writes_reasoning(tokenizer: Any) -> bool:
    """Whether ``tokenizer``'s chat template renders an assistant message's ``reasoning_content`` (Qwen3, and the
    reasoning models that follow transformers' message schema): its model writes traces in ``<think>`` blocks."""
    return "reasoning_content" in (getattr(tokenizer, "chat_template", None) or "")


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens ``a`` and ``b`` share: the index of the first that differs."""
    return next((k for k, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def extend(ids: list[int], longer: list[int], what: str) -> list[int]:
    """The tokens ``longer`` adds after ``ids``, checking the prefix property of the chat template."""
    if longer[: len(ids)] != ids:
        raise Problem(
            f"the chat template breaks the prefix property at {what}: the conversation rendered so far "
            f"({len(ids)} tokens) is not a prefix of the longer rendering (they differ from token "
            f"{common_prefix(ids, longer)}); a template that rewrites earlier turns cannot mark the assistant tokens "
            "incrementally — use a template where adding a message only appends text"
        )
    return longer[len(ids) :]


# ---- the turns of a conversation (SFT's labels) ----------------------------------------------------------------

_PROBE = "\x1frlhf-probe\x1f"
"""Content of the probe message that measures an assistant message's role header (`role_header`)."""


def role_header(tokenizer: Any) -> str | None:
    """The text the template writes before a plain assistant message between two user messages (Qwen3's
    ``<|im_start|>assistant\\n``), or None when the probe cannot tell."""
    question = {"role": "user", "content": "?"}
    try:
        before = render(tokenizer, [question], add_generation_prompt=False)
        text = render(
            tokenizer, [question, {"role": "assistant", "content": _PROBE}, question], add_generation_prompt=False
        )
    except Exception:  # a template that refuses the probe: the header stays unknown
        return None
    return text[len(before) : text.index(_PROBE)] if text.startswith(before) and _PROBE in text else None


@dataclass(frozen=True)
class Marks:
    """What finding a tokenizer's turns needs to know once: its eos and special tokens (where a turn ends,
    `_end_of_turn`) and its template's role header (`role_header`)."""

    eos: int
    specials: frozenset[int]
    role_header: str | None

    @classmethod
    def of(cls, tokenizer: Any, eos: int) -> Marks:
        # special: the tokenizer's named special tokens and every added token marked special (Gemma's <end_of_turn>)
        added = getattr(tokenizer, "added_tokens_decoder", {})
        specials = frozenset(tokenizer.all_special_ids) | {i for i, token in added.items() if token.special}
        return cls(eos, specials, role_header(tokenizer))


def _end_of_turn(turn: list[int], eos: int, specials: frozenset[int]) -> int:
    """Length of ``turn`` through its end-of-turn token: the last eos, else the last special token (Gemma's
    ``<end_of_turn>``), else all of it. What the template writes after it (a newline) is context."""
    for ends in ({eos}, specials):
        last = [i for i, token in enumerate(turn) if token in ends]
        if last:
            return last[-1] + 1
    return len(turn)


@dataclass(frozen=True)
class _Turn:
    """Assistant message ``index`` as the template renders it as the last message: ``prompt``, the conversation
    before it with the generation prompt, whose last ``header`` tokens that prompt adds, and ``tokens``, what the
    model writes after it through its end of turn; ``role`` is the part of ``header`` the history writes before
    every assistant message, when shorter."""

    index: int
    prompt: list[int]
    header: list[int]
    tokens: list[int]
    role: list[int] | None


def _turn(tokenizer: Any, messages: Messages, i: int, tools: Schemas, marks: Marks) -> _Turn:
    before, prompt, alone = (
        encode(tokenizer, messages[: i + j], add_generation_prompt=g, tools=tools)
        for j, g in ((0, False), (0, True), (1, False))
    )
    header = _header(before, prompt, marks.specials, f"message {i}")
    if alone[: len(prompt)] != prompt:
        raise Problem(
            f"the chat template breaks the prefix property at message {i}: rendered as the last message, it does not "
            f"continue its generation prompt ({len(prompt)} tokens; they differ from token "
            f"{common_prefix(prompt, alone)}), so what the model writes for it is not defined. Known causes: Qwen3 "
            "with enable_thinking false and a reasoning_content, which the template writes where the generation "
            "prompt has closed an empty think block (drop the reasoning_content or turn thinking on); Mistral v0.3's "
            "template, which writes a system message only into a conversation that ends with a user message (put "
            "the instruction in the first user message)"
        )
    tokens = alone[len(prompt) :]
    tokens = tokens[: _end_of_turn(tokens, marks.eos, marks.specials)]
    role = next((header[:k] for k in range(1, len(header)) if tokenizer.decode(header[:k]) == marks.role_header), None)
    return _Turn(i, prompt, header, tokens, role)


def _header(before: list[int], prompt: list[int], specials: frozenset[int], what: str) -> list[int]:
    """What the generation prompt adds to the conversation ``before`` it (``prompt`` is both): the tokens after
    their common start. A template may end a conversation without the generation prompt with special tokens that
    the prompt does not write (Phi-3 writes its eos there); anything else ``before`` has that ``prompt`` lacks is a
    template rewriting the conversation, refused as `extend` refuses it."""
    n = common_prefix(before, prompt)
    if all(token in specials for token in before[n:]):
        return prompt[n:]
    return extend(before, prompt, what)


def _find(ids: list[int], start: int, turn: _Turn) -> tuple[int, int]:
    """(begin, end) of ``turn``'s trained tokens in ``ids``: after ``start``, the first generation prompt (or role
    header) followed by the longest tail of ``turn.tokens``."""
    at: dict[int, list[int]] = {}  # token → the offsets where it starts a tail of the turn
    for k, token in enumerate(turn.tokens):
        at.setdefault(token, []).append(k)
    n = len(turn.tokens)
    for p in range(start, len(ids)):
        if turn.header and ids[p] != turn.header[0]:
            continue
        if ids[p : p + len(turn.header)] == turn.header:
            q = p + len(turn.header)
        elif turn.role and ids[p : p + len(turn.role)] == turn.role:
            q = p + len(turn.role)
        else:
            continue
        # the tail ids[q:] starts with: turn.tokens[k:] for the smallest k (k > 0 where the history dropped its start)
        for k in at.get(ids[q], []) if q < len(ids) else []:
            if ids[q : q + n - k] == turn.tokens[k:]:
                return q, q + n - k
        if turn.header:  # the turn's header, not followed by the turn
            break
    raise Problem(
        f"message {turn.index} cannot be found in the rendering of the whole conversation: the template writes it "
        "there as something other than (a tail of) what it writes for it as the last message, so its tokens cannot "
        "be labelled exactly"
    )


def turn_spans(
    tokenizer: Any, messages: Messages, marks: Marks, tools: Schemas = None
) -> tuple[list[int], list[tuple[int, int]]]:
    """The ids of the whole conversation, the text the model reads when it writes the last turn, and where each
    assistant message lies in them: ``(begin, end)``, what the model writes for it (its think block, content and
    tool calls, through its end-of-turn token: `_end_of_turn`).

    The template renders ``messages[:i]`` with the generation prompt and ``messages[:i+1]`` without, and the tokens
    the second adds are what the model writes for message ``i``; the turn is the first place after the previous one
    where the generation prompt (or the bare role header) is followed by those tokens, or by a tail of them (`_find`).
    Why a tail, and the templates that need it (Qwen3's think blocks): ``docs/episodes.md``, "SFT on conversations".
    The last turn is checked to be exactly the generation prompt's continuation. `Problem`, naming the message (and
    the known causes), when a turn does not continue its own generation prompt or is not found in the conversation
    as such a tail."""
    ids = encode(tokenizer, messages, add_generation_prompt=False, tools=tools)
    turns = [_turn(tokenizer, messages, i, tools, marks) for i, m in enumerate(messages) if m["role"] == "assistant"]
    spans = [(0, 0)]
    for turn in turns:
        spans.append(_find(ids, spans[-1][1], turn))
    (begin, end), last = spans[-1], turns[-1]
    if last.index == len(messages) - 1 and (ids[:begin] != last.prompt or ids[begin:end] != last.tokens):
        raise Problem(
            f"the last message ({last.index}) is not rendered in the whole conversation as its generation prompt "
            "and answer render it alone; the template changes the conversation once it is complete"
        )
    return ids, spans[1:]


# ---- deltas (multi-turn episodes) ------------------------------------------------------------------------------

USER, _ASSISTANT = "Hello there.", "General Kenobi."
"""The synthetic turns the deltas are rendered after (any text works: only what follows the assistant's close
token is kept)."""


class Format:
    """How an episode's messages become token ids under ``tokenizer``'s chat template (with the tools' ``schemas``
    in every render): the opening (:meth:`opening`), the template's end-of-turn token ``close`` (one of ``stops``)
    and the delta after a model turn (:meth:`delta`). Built once per run; refuses a template it cannot work with
    (`ConfigError`; once running, :attr:`error`)."""

    error: type[Exception] = RuntimeError
    """What a template that fails mid-run raises (the episode runner's ``EpisodeError``)."""

    def __init__(self, tokenizer: Any, stops: Sequence[int], schemas: Schemas = None):
        if getattr(tokenizer, "chat_template", None) is None:
            raise ConfigError("multi-turn episodes need a chat template, and the policy's tokenizer has none")
        self.tokenizer, self.stops, self.schemas = tokenizer, list(stops), schemas
        self.pad_token_id = tokenizer.pad_token_id
        user = self.render([{"role": "user", "content": USER}], generation_prompt=False)
        self.close, start = self._close_token(user)
        self._user = user[:start]  # the synthetic user turn as every render starts
        specials = getattr(tokenizer, "all_special_tokens", [])
        self._specials = sorted({s for s in specials if len(s) > 1}, key=len, reverse=True)

    def render(self, messages: Messages, generation_prompt: bool) -> list[int]:
        """The template's ids of ``messages`` (:func:`encode`)."""
        try:
            return encode(self.tokenizer, messages, add_generation_prompt=generation_prompt, tools=self.schemas)
        except Problem as problem:
            roles = ", ".join(m.get("role", "?") for m in messages)
            raise self.error(f"{problem} (rendering a conversation of {roles})") from problem

    def opening(self, messages: Messages) -> list[int]:
        """The ids the first model turn continues: ``messages`` with the generation prompt."""
        return self.render(self.escaped(messages), generation_prompt=True)

    def delta(self, messages: Messages) -> list[int]:
        """The ids that follow a model turn ended by :attr:`close` when ``messages`` (one group of tool results, or
        the environment's reply) come next, through the next generation prompt. Rendered after a synthetic
        exchange and cut after its assistant's close token, so it starts with whatever the template writes there."""
        messages = self.escaped(messages)
        assistant: dict[str, Any] = {"role": "assistant", "content": _ASSISTANT}
        results = [m for m in messages if m["role"] == "tool"]
        if results:  # a tool message answers a call: templates group results under the assistant's calls
            assistant["tool_calls"] = [tool_call(m.get("name") or "tool", {}, m.get("tool_call_id")) for m in results]
        full = self.render([{"role": "user", "content": USER}, assistant, *messages], generation_prompt=True)
        delta = full[self._after_close(full) :]
        text = self.tokenizer.decode(delta)
        missing = [m["content"] for m in messages if not _shown(m["content"], text)]
        if missing:
            raise self.error(
                f"the chat template drops {', '.join(m['role'] for m in messages)} messages after an assistant turn "
                f"(rendered: {text!r}; missing: {missing[0][:80]!r}); use a template that renders them"
            )
        if self.pad_token_id is not None and self.pad_token_id in delta:
            raise self.error(f"the chat template writes the padding token into a turn: {text!r}")
        return delta

    def unspecial(self, text: str) -> str:
        """``text`` without the tokenizer's special-token strings (what decoding with skip_special_tokens drops)."""
        for special in self._specials:
            text = text.replace(special, "")
        return text.strip()

    def escaped(self, messages: Messages) -> Messages:
        """``messages`` with the tokenizer's special-token strings in their text broken by a zero-width space, so
        a tool or environment that returns ``<|im_end|>`` cannot end a turn or pose as the model."""
        out = []
        for message in messages:
            content = message.get("content")
            if isinstance(content, str):
                for special in self._specials:
                    content = content.replace(special, special[0] + "\u200b" + special[1:])
                message = {**message, "content": content}
            out.append(message)
        return out

    def _close_token(self, user: list[int]) -> tuple[int, int]:
        """The token that ends an assistant turn (it must be a stop token, so a sampled turn ends with it) and how
        many leading ids the synthetic user turn renders to."""
        conversation = [{"role": "user", "content": USER}, {"role": "assistant", "content": _ASSISTANT}]
        ids = self.render(conversation, generation_prompt=False)
        start, tokenizer = common_prefix(user, ids), self.tokenizer
        after = tokenizer.decode(ids[start:])
        if _ASSISTANT not in after:
            raise ConfigError(f"the chat template does not render an assistant turn's content: {after!r}")
        for i in range(start, len(ids)):
            if ids[i] in self.stops and _ASSISTANT in tokenizer.decode(ids[start:i]):
                if tokenizer.decode(ids[start:i]).rstrip().endswith(_ASSISTANT):
                    return ids[i], start
                break
        ending = after[after.index(_ASSISTANT) + len(_ASSISTANT) :]
        stops = ", ".join(repr(tokenizer.decode([s])) for s in self.stops)
        raise ConfigError(
            f"an assistant turn of this chat template ends with {ending!r}, which does not start with a stop token "
            f"({stops}): set sampling.stop to the template's end-of-turn token, so a turn the model samples ends "
            "where the template's does"
        )

    def _after_close(self, ids: list[int]) -> int:
        """The index after the synthetic assistant's close token in a render that starts with the synthetic user."""
        start = len(self._user)
        if ids[:start] != self._user:
            raise self.error(
                "the chat template renders the first user turn differently when more turns follow: "
                f"{self.tokenizer.decode(self._user)!r} vs {self.tokenizer.decode(ids[:start])!r}"
            )
        if self.close not in ids[start:]:
            raise self.error(f"the chat template's render has no end-of-turn token after the assistant: {ids}")
        return ids.index(self.close, start) + 1


def tool_call(name: str, arguments: dict[str, Any], call_id: str | None) -> dict[str, Any]:
    """A call as an assistant message's ``tool_calls`` entry (transformers' convention)."""
    entry: dict[str, Any] = {"type": "function", "function": {"name": name, "arguments": arguments}}
    return entry | ({"id": call_id} if call_id is not None else {})


def _shown(content: str, text: str) -> bool:
    """Whether a rendered delta ``text`` shows a message's ``content``: as it is, or as a JSON string's inside
    (Llama-3.1's template writes a tool's text through tojson, so its quotes, backslashes and newlines are escaped)."""
    content = content.strip()
    return not content or content in text or json.dumps(content, ensure_ascii=False)[1:-1] in text
