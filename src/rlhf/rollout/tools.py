"""Tools a policy calls during a multi-turn episode: plain Python functions with type hints and a Google-style docstring
(TRL's ``tools=`` convention), their JSON schemas for the chat template's ``tools=``, the calls parsed from a model turn
in the format its chat template writes (:data:`FORMATS`, found by :func:`detect_format`; docs/episodes.md, "Tool-call
formats") and each call run under a time limit. The built-in :func:`calculator` is the worked example (README,
"Multi-turn episodes")."""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import inspect
import json
import math
import operator
import re
import threading
from collections.abc import Callable, Sequence
from typing import Any

from rlhf.config import ConfigError
from rlhf.data.chat import tool_call
from rlhf.rollout.user_code import load_callable, run_coroutine


@dataclasses.dataclass(frozen=True)
class Tool:
    """A callable and the JSON schema the chat template shows the model (``transformers``' ``get_json_schema``)."""

    name: str
    function: Callable[..., Any]
    schema: dict[str, Any]

    @classmethod
    def of(cls, function: Callable[..., Any], spec: str | None = None) -> Tool:
        """``function``'s tool; a `ConfigError` naming it (``spec``, else its name) when its type hints or
        docstring cannot describe it (every parameter needs a hint and an ``Args:`` line)."""
        from transformers.utils import get_json_schema

        label = spec or getattr(function, "__name__", repr(function))
        try:
            schema = get_json_schema(function)
        except Exception as error:  # DocstringParsingException, TypeHintParsingException, ...
            raise ConfigError(
                f"tool {label!r}: {type(error).__name__}: {error}. A tool needs a type hint on every parameter and "
                "a Google-style docstring with a description and an `Args:` line per parameter"
            ) from error
        return cls(schema["function"]["name"], function, schema)

    @classmethod
    def load(cls, spec: str) -> Tool:
        """The tool ``path/to/file.py:function`` or ``package.module:function`` names."""
        return cls.of(load_callable(spec, "tool", ConfigError), spec)


def tools_of(functions: list[Callable[..., Any]], where: str) -> list[Tool]:
    """Tools from callables (an environment's ``tools`` attribute), names unique."""
    tools = [Tool.of(f, f"{where}: {getattr(f, '__name__', f)!r}") for f in functions]
    unique_names(tools, where)
    return tools


def unique_names(tools: list[Tool], where: str) -> None:
    names = [tool.name for tool in tools]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ConfigError(f"{where}: more than one tool is named {', '.join(map(repr, twice))}")


@dataclasses.dataclass(frozen=True)
class ToolCall:
    """One call parsed from a model turn: ``name`` and ``arguments``, or ``error`` when it could not be read;
    ``id`` links it to its result (Mistral's template needs one of 9 letters or digits on both)."""

    name: str
    arguments: dict[str, Any]
    error: str | None = None
    id: str | None = None

    def message(self) -> dict[str, Any]:
        """The call as the assistant message's ``tool_calls`` entry (`rlhf.data.chat.tool_call`)."""
        return tool_call(self.name, self.arguments, self.id)


def call_id(n: int) -> str:
    """The id of an episode's ``n``-th call when the model wrote none: 9 letters and digits, as Mistral's needs."""
    return f"call{n:05d}"


Parse = Callable[[str, dict[str, dict[str, Any]]], tuple[str, list[ToolCall]]]
"""``(turn text, the tools' schemas by name) → (the content without the calls, the calls)``."""


@dataclasses.dataclass(frozen=True)
class ToolFormat:
    """A way chat templates write tool calls: its ``name``, the models that use it, what marks it in a rendered
    call (``marker``, a regex) and how a model turn is read (``parse``). A call that cannot be read is a `ToolCall`
    with an ``error`` (the episode answers it with an error message and goes on), never an exception."""

    name: str
    models: str
    marker: str
    parse: Parse


def _hermes(text: str, schemas: dict[str, dict[str, Any]]) -> tuple[str, list[ToolCall]]:
    """Each ``<tool_call>…</tool_call>`` body is a JSON object with a string ``name``; ``arguments`` a JSON object
    or a JSON string of one (missing: none). An unclosed ``<tool_call>`` (the turn ran out of tokens) is no call."""
    calls = [_json_call(body.strip(), "arguments") for body in _HERMES.findall(text)]
    return _HERMES.sub("", text).strip(), calls


_HERMES = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


def _json_call(body: str, key: str) -> ToolCall:
    """``{"name": ..., key: {...}}`` (``key``: "arguments", Llama's "parameters"), with an optional ``id``."""
    try:
        call = json.loads(body)
    except json.JSONDecodeError as error:
        return ToolCall("", {}, f"the tool call is not valid JSON ({error.msg} at character {error.pos}): {body!r}")
    return _call_object(call, key, body)


def _call_object(call: Any, key: str, body: str) -> ToolCall:
    """A parsed JSON call (``body``: its text, for the errors) as a `ToolCall`: see :func:`_json_call`."""
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return ToolCall("", {}, f'a tool call is a JSON object {{"name": ..., "{key}": {{...}}}}, not {body!r}')
    arguments = call.get(key, call.get("arguments", {}))
    if isinstance(arguments, str):
        with contextlib.suppress(json.JSONDecodeError):  # not JSON: refused just below as not an object
            arguments = json.loads(arguments)
    if not isinstance(arguments, dict):
        return ToolCall(call["name"], {}, f"the arguments of {call['name']!r} are not a JSON object: {arguments!r}")
    given = call.get("id")
    return ToolCall(call["name"], arguments, id=given if isinstance(given, str) and _ID.fullmatch(given) else None)


_ID = re.compile(r"[A-Za-z0-9]{9}")


def _llama3_json(text: str, schemas: dict[str, dict[str, Any]]) -> tuple[str, list[ToolCall]]:
    """Llama-3.1/3.2: a call is the whole turn, one JSON object ``{"name": ..., "parameters": {...}}`` (after an
    optional ``<|python_tag|>``); a turn that starts like one but does not parse is a call with an error, any other
    turn is content. The template renders one call per turn."""
    body = text.strip().removeprefix("<|python_tag|>").strip()
    if not re.match(r'\{\s*"name"\s*:', body):
        return text.strip(), []
    return "", [_json_call(body, "parameters")]


def _mistral(text: str, schemas: dict[str, dict[str, Any]]) -> tuple[str, list[ToolCall]]:
    """Mistral v0.3: ``[TOOL_CALLS] [{"name": ..., "arguments": {...}, "id": ...}, ...]`` ends the turn; an id
    that is not 9 letters or digits is replaced (the template refuses it)."""
    content, marker, body = text.partition("[TOOL_CALLS]")
    if not marker:
        return text.strip(), []
    try:
        calls = json.loads(body.strip())
    except json.JSONDecodeError as error:
        problem = f"the tool calls are not a valid JSON list ({error.msg} at character {error.pos}): {body.strip()!r}"
        return content.strip(), [ToolCall("", {}, problem)]
    if not isinstance(calls, list):
        return content.strip(), [ToolCall("", {}, f"[TOOL_CALLS] is followed by a JSON list of calls, not {body!r}")]
    return content.strip(), [_call_object(call, "arguments", json.dumps(call)) for call in calls]


_XML_CALL = re.compile(r"<tool_call>\s*<function=([^>\n]*)>(.*?)</function>\s*</tool_call>", re.DOTALL)
_XML_PARAMETER = re.compile(r"<parameter=([^>\n]*)>\n?(.*?)\n?</parameter>", re.DOTALL)


def _qwen3_coder(text: str, schemas: dict[str, dict[str, Any]]) -> tuple[str, list[ToolCall]]:
    """Qwen3-Coder: ``<tool_call>\\n<function=NAME>\\n<parameter=KEY>\\nVALUE\\n</parameter>…</function>\\n
    </tool_call>``. Values are text; a parameter the tool's schema types as other than a string is read as JSON
    (as vLLM's qwen3_coder parser does), and one that does not parse is an error."""
    calls = []
    for name, body in _XML_CALL.findall(text):
        name = name.strip()
        types = schemas.get(name, {}).get("function", {}).get("parameters", {}).get("properties", {})
        arguments: dict[str, Any] = {}
        error = None
        for key, value in _XML_PARAMETER.findall(body):
            key = key.strip()
            if types.get(key, {}).get("type", "string") == "string":
                arguments[key] = value
                continue
            try:
                arguments[key] = json.loads(value)
            except json.JSONDecodeError:
                error = f"the value of {key!r} is not a JSON {types[key]['type']}: {value!r}"
        calls.append(ToolCall(name, {} if error else arguments, error))
    rest = _XML_CALL.sub("", text)  # a closed block that is not one: a call with an error; an unclosed one: content
    problem = "a tool call is <function=NAME> then <parameter=KEY> blocks, not {!r}"
    calls += [ToolCall("", {}, problem.format(body.strip())) for body in _HERMES.findall(rest)]
    return _HERMES.sub("", rest).strip(), calls


FORMATS: dict[str, ToolFormat] = {
    f.name: f
    for f in (
        # the order is the detection order: Qwen3-Coder's XML sits inside <tool_call> too
        ToolFormat("qwen3_coder", "Qwen3-Coder", r"<tool_call>\s*<function=", _qwen3_coder),
        ToolFormat("hermes", "Qwen2.5, Qwen3, Hermes", r"<tool_call>\s*\{", _hermes),
        ToolFormat("mistral", "Mistral v0.3 (7B, Mixtral 8x22B)", r"\[TOOL_CALLS\]", _mistral),
        ToolFormat("llama3_json", "Llama-3.1, Llama-3.2", r'\{"name": "[^"]*", "parameters": \{', _llama3_json),
    )
}
"""The tool-call formats rlhf reads, by name."""


def detect_format(rendered_call: str) -> ToolFormat | None:
    """The format of a chat template's rendering of a tool call (None: none rlhf reads)."""
    return next((f for f in FORMATS.values() if re.search(f.marker, rendered_call)), None)


def parse_tool_calls(text: str, format: str = "hermes", tools: Sequence[Tool] = ()) -> tuple[str, list[ToolCall]]:
    """A model turn → (its content without the calls, the calls), read in ``format`` (:data:`FORMATS`) with the
    schemas of ``tools`` (Qwen3-Coder's typed values). A call that does not parse is a call with an ``error``."""
    return FORMATS[format].parse(text, {tool.name: tool.schema for tool in tools})


@dataclasses.dataclass(frozen=True)
class ToolResult:
    """What a call gave: the ``content`` of its tool message, and whether it failed (``error``) or ran out of time
    (``timed_out``, an error too)."""

    content: str
    error: bool = False
    timed_out: bool = False


def run_tool(call: ToolCall, tools: dict[str, Tool], timeout: float) -> ToolResult:
    """Run ``call`` with at most ``timeout`` seconds, in a daemon thread (one that overruns is left running, its
    result discarded: docs/episodes.md). A call that could not be parsed, names no tool, has arguments the function
    does not take, raises or times out gives an ``error:`` message for the model (the episode goes on)."""
    if call.error is not None:
        return ToolResult(f"error: {call.error}", error=True)
    tool = tools.get(call.name)
    if tool is None:
        return ToolResult(f"error: no tool named {call.name!r}; the tools are {', '.join(sorted(tools))}", error=True)
    try:
        inspect.signature(tool.function).bind(**call.arguments)
    except TypeError as error:
        return ToolResult(f"error: {call.name}: {error}", error=True)
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            result = tool.function(**call.arguments)
            outcome["value"] = run_coroutine(result) if inspect.isawaitable(result) else result
        except Exception as error:  # the model sees what went wrong, as a tool message
            outcome["error"] = f"{type(error).__name__}: {error}"

    worker = threading.Thread(target=target, name=f"tool-{call.name}", daemon=True)
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        return ToolResult(f"error: {call.name} did not return within {timeout:g} s", error=True, timed_out=True)
    if "error" in outcome:
        return ToolResult(f"error: {outcome['error']}", error=True)
    return ToolResult(as_text(outcome.get("value")))


def as_text(value: Any) -> str:
    """A tool's return value as a message's text: strings as they are, other values as JSON (else ``str``)."""
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return str(value)


_OPERATORS: dict[type, Callable[..., Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}
MAX_EXPONENT = 100
"""The calculator refuses larger powers (an exponent of a billion would stall the trainer)."""


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression and return the result.

    Args:
        expression: An arithmetic expression with numbers, + - * / // % ** and parentheses, e.g. "(3 + 4) * 2".
    """
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as error:
        raise ValueError(f"not an arithmetic expression: {expression!r}") from error
    value = _evaluate(tree.body)
    if isinstance(value, float) and value.is_integer() and math.isfinite(value):
        value = int(value)
    return str(value)


def _evaluate(node: ast.AST) -> int | float:
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPERATORS:
        return _OPERATORS[type(node.op)](_evaluate(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise ValueError(f"exponent {right} is larger than {MAX_EXPONENT}")
        return _OPERATORS[type(node.op)](left, right)
    raise ValueError(f"only numbers and + - * / // % ** are allowed, not {ast.unparse(node)!r}")
