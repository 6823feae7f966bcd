"""Multi-turn episodes: the policy talks with an environment and calls tools, token in, token out.

An episode's token ids are built as it goes and never decoded and encoded again: the model's ids are kept exactly as
sampled (env mask False), and everything else (tool results, the environment's replies, the template's turn markup) is
appended as the chat template's *delta* (env mask True, log-prob 0; `rlhf.data.chat.Format`). Decoding a turn and
re-rendering the conversation would give other tokens than the model sampled (BPE is not a bijection: trl#5224), so
the log-probs trained on would not be the policy's. The environment protocols (rlhf's ``reset``/``step``, TRL's
``environment_factory``: `has_step`), the rules and the references: docs/episodes.md."""

from __future__ import annotations

import dataclasses
import inspect
import math
import numbers
from collections.abc import Callable, Sequence
from typing import Any

from rlhf.config import ConfigError
from rlhf.data import chat
from rlhf.rollout.tools import (
    FORMATS,
    Tool,
    ToolCall,
    ToolFormat,
    ToolResult,
    call_id,
    detect_format,
    parse_tool_calls,
    run_tool,
    tools_of,
    unique_names,
)
from rlhf.rollout.user_code import load_callable

OBSERVATION_ROLES = ("user", "tool", "system")
"""Roles an environment may reply with; ``assistant`` is refused (its text would pass as the model's own)."""


class EpisodeError(RuntimeError):
    """An environment or chat template that cannot run an episode; the message names which and why."""


@dataclasses.dataclass(frozen=True)
class EpisodeLimits:
    """``max_turns`` model turns, ``max_tokens`` tokens after the opening (model and environment), at most
    ``max_tool_calls`` calls run per turn, each within ``tool_timeout`` seconds; an opening of at most
    ``max_opening_tokens`` (None: any length)."""

    max_turns: int
    max_tokens: int
    max_tool_calls: int
    tool_timeout: float
    max_opening_tokens: int | None = None


@dataclasses.dataclass
class Episode:
    """One conversation: the opening ``messages`` and their ids ``prompt_ids``; after them ``ids`` with
    ``env_mask`` (True: not sampled by the model) and the sampler's ``logprobs`` (0 on environment tokens); the
    transcript ``turns`` (assistant, tool, user... messages); the environment's ``rewards`` and the counts of the
    episode metrics. ``stopped``: the last model turn ended with the template's end of turn; ``ending``: why it
    ended (``done``, ``answer``, ``max_turns``, ``max_tokens``, ``no_stop``: a turn cut at max_new_tokens, ``stop``:
    a turn ended by a stop token other than the template's end of turn)."""

    messages: list[dict[str, Any]]
    prompt_ids: list[int]
    ids: list[int] = dataclasses.field(default_factory=list)
    env_mask: list[bool] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    turns: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    rewards: list[float] = dataclasses.field(default_factory=list)
    model_turns: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    tool_timeouts: int = 0
    stopped: bool = False
    ending: str = ""

    @property
    def truncated(self) -> bool:
        """Ended before it was over: at ``max_turns`` or ``max_tokens``, or a turn cut at ``max_new_tokens``."""
        return self.ending in ("max_turns", "max_tokens", "no_stop")

    @property
    def reward(self) -> float | None:
        """The environment's return: the sum of its rewards, None when it gave none."""
        return math.fsum(self.rewards) if self.rewards else None

    def add(self, ids: Sequence[int], logprobs: Sequence[float] | None, *, env: bool) -> None:
        self.ids += ids
        self.env_mask += [env] * len(ids)
        self.logprobs += list(logprobs) if logprobs is not None else [0.0] * len(ids)


def load_environment(spec: str) -> Callable[[], Any]:
    """The environment factory ``rollout.environment`` names (a class or a function of no arguments)."""
    return load_callable(spec, "environment", ConfigError)


class ChatFormat(chat.Format):
    """`rlhf.data.chat.Format` with the ``tools``' schemas in every render, and the format the template writes their
    calls in (``tool_format``, `rlhf.rollout.tools.FORMATS`); a template that fails mid-run is an `EpisodeError`."""

    error = EpisodeError

    def __init__(self, tokenizer: Any, stops: Sequence[int], tools: Sequence[Tool] = ()):
        # None, not []: Llama-3.1 prints its preamble for []
        super().__init__(tokenizer, stops, [tool.schema for tool in tools] or None)
        self.tool_format = self._tool_format([tool.name for tool in tools]) if tools else None

    def _tool_format(self, names: list[str]) -> ToolFormat:
        """The format the template writes tool calls in, from a rendered sentinel call and its result; refuses a
        template that drops either (it would show the model neither) or writes a format rlhf does not read."""
        call = ToolCall(names[0], {"sentinel_key": "sentinel_value"}, id="sentinel1")
        conversation = [
            {"role": "user", "content": chat.USER},
            {"role": "assistant", "content": "", "tool_calls": [call.message()]},
            {"role": "tool", "name": names[0], "content": "sentinel_result", "tool_call_id": "sentinel1"},
        ]
        formats = "; ".join(f"{f.name} ({f.models})" for f in FORMATS.values())
        try:
            ids = self.render(conversation, generation_prompt=True)
        except EpisodeError as error:
            problem = f"rendering a tool call failed: {error}"
        else:
            # after the synthetic user turn: a system prompt that describes the format is not a call
            text = self.tokenizer.decode(ids[len(self._user) :] if ids[: len(self._user)] == self._user else ids)
            lost = [s for s in (names[0], "sentinel_key", "sentinel_value", "sentinel_result") if s not in text]
            found = detect_format(text)
            if not lost and found is not None:
                return found
            problem = (
                f"it drops {', '.join(lost)}" if lost else f"it writes a call in a format rlhf does not read: {text!r}"
            )
        raise ConfigError(
            f"tools: the policy's chat template cannot show tool calls and their results ({problem}); tools need a "
            f"template that writes them in one of the formats rlhf reads: {formats}; an environment without tools "
            "works with any chat template"
        )


SampleTurn = Callable[[list[int], list[list[int]], int], list[tuple[list[int], list[float]]]]
"""``(episodes, prompts, turn) → [(sampled ids, their log-probs)]``: one model turn for each of ``prompts``, the
ids so far of the episodes with those indices (the sampler of `rlhf.rollout.generation`, seeded per row and turn)."""


class EpisodeRunner:
    """Runs a batch of episodes: the environment (``factory``, None: tools only), the ``tools`` of every
    episode, the chat ``format`` and the ``limits``."""

    def __init__(
        self,
        tokenizer: Any,
        stops: Sequence[int],
        *,
        factory: Callable[[], Any] | None,
        tools: Sequence[Tool],
        limits: EpisodeLimits,
        name: str = "environment",
    ):
        self.factory, self.limits, self.name, self.tokenizer = factory, limits, name, tokenizer
        self.tools = list(tools)
        if factory is not None:  # the schemas of its tools, from one instance (each episode calls its own's)
            probe = self._make()
            self.tools += tools_of(environment_tools(probe), f"{name}'s tools")
            _close(probe)
        unique_names(self.tools, "rollout.tools and the environment's tools")
        self.format = ChatFormat(tokenizer, stops, self.tools)
        self.by_name = {tool.name: tool for tool in self.tools}

    def run(self, rows: list[dict[str, Any]], sample: SampleTurn, group_size: int = 1) -> list[Episode]:
        """One episode per row (``group_size`` consecutive rows share a row and must open alike): model turns in
        rounds, every unfinished episode one turn per round."""
        envs = [self._make() if self.factory is not None else None for _ in rows]
        try:
            episodes = [self._open(row, env, i) for i, (row, env) in enumerate(zip(rows, envs, strict=True))]
            self._check_groups(episodes, group_size)
            active = list(range(len(rows)))
            turn = 0
            while active:
                outs = sample(active, [episodes[i].prompt_ids + episodes[i].ids for i in active], turn)
                active = [i for i, out in zip(active, outs, strict=True) if self._turn(episodes[i], envs[i], out, i)]
                turn += 1
            for env, episode in zip(envs, episodes, strict=True):
                self._final_reward(env, episode)
        finally:
            for env in envs:
                _close(env)
        return episodes

    def _make(self) -> Any:
        return _guarded(f"{self.name}: making an instance", self.factory)

    def _open(self, row: dict[str, Any], env: Any, index: int) -> Episode:
        """The episode's opening: ``env.reset(row)``, or the row's own prompt (a TRL environment's reset text
        appended to its last message)."""
        where = f"{self.name}.reset (episode {index})"
        prompt = row["prompt"] if isinstance(row["prompt"], list) else [{"role": "user", "content": row["prompt"]}]
        opened = None
        if env is not None:  # ours takes the row; TRL's its columns as keywords, returning text for the last message
            opened = _guarded(where, lambda: env.reset(dict(row)) if has_step(env) else env.reset(**row))
        if env is not None and not has_step(env):
            if opened is not None and not isinstance(opened, str):
                raise EpisodeError(f"{where}: an environment without step returns text or None, not {opened!r:.200}")
            messages = [dict(m) for m in prompt]
            messages[-1]["content"] += opened or ""
        else:
            messages = prompt if opened is None else opened
        messages = _messages(messages, where, roles=("system", "user", "assistant", "tool"))
        ids = self.format.opening(messages)
        longest = self.limits.max_opening_tokens
        if longest is not None and len(ids) > longest:  # cutting it would cut the system turn and the tools
            raise EpisodeError(
                f"{where}: the opening is {len(ids)} tokens, longer than sampling.max_prompt_length={longest}; "
                "raise it (the memory plan counts it) or open with less"
            )
        return Episode(messages=messages, prompt_ids=ids)

    def _check_groups(self, episodes: list[Episode], group_size: int) -> None:
        for start in range(0, len(episodes), group_size):
            group = episodes[start : start + group_size]
            if any(e.messages != group[0].messages for e in group):
                raise EpisodeError(
                    f"{self.name}.reset gave the episodes of one group different openings (episodes {start}-"
                    f"{start + group_size - 1}): a group compares answers to one opening, so reset must depend on the "
                    "row alone (draw any randomness from a row column, e.g. a seed)"
                )

    def _turn(self, episode: Episode, env: Any, out: tuple[list[int], list[float]], index: int) -> bool:
        """Append one sampled model turn and what answers it; whether the episode goes on."""
        turn = self._model_turn(episode, out)
        if turn is None:
            return False
        observations = self._reply(episode, env, *turn, index)
        if observations is None:
            return False
        delta = self.format.delta(observations)
        if len(episode.ids) + len(delta) >= self.limits.max_tokens:  # no room for them and a model token
            episode.ending = "max_tokens"
            return False
        episode.add(delta, None, env=True)
        episode.turns += observations
        return True

    def _model_turn(
        self, episode: Episode, out: tuple[list[int], list[float]]
    ) -> tuple[dict[str, Any], list[ToolCall]] | None:
        """Append the sampled ids (cut to the budget) and the assistant message; the message and its tool calls, or
        None when the turn did not end with the template's end of turn (the episode ends there)."""
        ids, logprobs = out
        room = self.limits.max_tokens - len(episode.ids)
        cut = len(ids) > room
        ids, logprobs = ids[:room], logprobs[:room]
        episode.add(ids, logprobs, env=False)
        episode.model_turns += 1
        end = ids[-1] if ids and not cut else None
        episode.stopped = end in self.format.stops
        if end != self.format.close:  # cut, or ended by another stop: the template would not go on from here
            episode.ending = "max_tokens" if cut else "stop" if episode.stopped else "no_stop"
            episode.turns.append({"role": "assistant", "content": self._text(ids[:-1] if episode.stopped else ids)})
            return None
        text = self._text(ids[:-1])
        calls: list[ToolCall] = []
        if self.format.tool_format is not None:  # read with special tokens kept: Mistral's [TOOL_CALLS] is one
            raw = self.tokenizer.decode(ids[:-1], skip_special_tokens=False)
            content, calls = parse_tool_calls(raw, self.format.tool_format.name, self.tools)
            calls = [
                c if c.id else dataclasses.replace(c, id=call_id(episode.tool_calls + k)) for k, c in enumerate(calls)
            ]
            text = self.format.unspecial(content) if calls else text
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if calls:
            message["tool_calls"] = [call.message() for call in calls if call.error is None]
        episode.turns.append(message)
        return message, calls

    def _reply(
        self, episode: Episode, env: Any, message: dict[str, Any], calls: list[ToolCall], index: int
    ) -> list[dict[str, Any]] | None:
        """What answers a model turn: its tool calls' results, else the environment's step; None when the episode
        is over (done, its last turn, or an answer without an environment that steps)."""
        final = episode.model_turns >= self.limits.max_turns
        if calls:
            if final:  # no turn left to read the results in
                episode.ending = "max_turns"
                return None
            return self._call_tools(episode, env, calls)
        if env is None or not has_step(env):
            episode.ending = "answer"  # a turn without a tool call is the answer
            return None
        observations, done = self._step(env, message, episode, index)
        if done or final:
            episode.ending = "done" if done else "max_turns"
            return None
        return observations

    def _text(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def _call_tools(self, episode: Episode, env: Any, calls: list[ToolCall]) -> list[dict[str, Any]]:
        """Run the turn's calls in order (past ``max_tool_calls``, each gets an error), an environment's tools on
        this episode's instance: one tool message each."""
        tools = dict(self.by_name)
        for function in environment_tools(env) if env is not None else []:
            tools[function.__name__] = dataclasses.replace(tools[function.__name__], function=function)
        messages = []
        for k, call in enumerate(calls):
            if k < self.limits.max_tool_calls:
                result = run_tool(call, tools, self.limits.tool_timeout)
            else:
                result = ToolResult(f"error: at most {self.limits.max_tool_calls} calls a turn", error=True)
            episode.tool_calls += 1
            episode.tool_errors += result.error
            episode.tool_timeouts += result.timed_out
            message = {"role": "tool", "name": call.name or "tool", "content": result.content, "tool_call_id": call.id}
            messages.append(message)
        return messages

    def _step(
        self, env: Any, message: dict[str, Any], episode: Episode, index: int
    ) -> tuple[list[dict[str, Any]], bool]:
        where = f"{self.name}.step (episode {index}, turn {episode.model_turns})"
        result = _guarded(where, lambda: env.step(dict(message)))
        if not isinstance(result, tuple | list) or len(result) != 3:
            raise EpisodeError(f"{where} must return (messages, reward or None, done), not {result!r:.200}")
        messages, reward, done = result
        if not isinstance(done, bool):
            raise EpisodeError(f"{where}: done must be True or False, not {done!r}")
        self._reward(reward, episode, where)
        return _messages(messages or [], where, roles=OBSERVATION_ROLES), done

    def _final_reward(self, env: Any, episode: Episode) -> None:
        """``env.get_reward()`` at the episode's end, when the environment has it (TRL's environments do)."""
        if env is None or not callable(getattr(env, "get_reward", None)):
            return
        where = f"{self.name}.get_reward"
        self._reward(_guarded(where, env.get_reward), episode, where)

    @staticmethod
    def _reward(reward: Any, episode: Episode, where: str) -> None:
        if reward is None:
            return
        if isinstance(reward, bool) or not isinstance(reward, numbers.Real) or not math.isfinite(reward):
            raise EpisodeError(f"{where}: a reward is a finite number or None, not {reward!r}")
        episode.rewards.append(float(reward))


RESERVED = ("reset", "step", "get_reward", "close", "tools")
"""Method names of the environment protocols that are never tools."""


def has_step(env: Any) -> bool:
    """Whether ``env`` follows rlhf's protocol (``reset(row)``, ``step``), else TRL's ``environment_factory`` one
    (docs/episodes.md, "The two protocols")."""
    return callable(getattr(env, "step", None))


def environment_tools(env: Any) -> list[Callable[..., Any]]:
    """The tools an environment instance offers: its ``tools`` attribute (rlhf's protocol), or (TRL's) its public
    methods other than :data:`RESERVED`."""
    if has_step(env):
        return list(getattr(env, "tools", None) or [])
    methods = inspect.getmembers(env, inspect.ismethod)
    return [method for name, method in methods if not name.startswith("_") and name not in RESERVED]


def _messages(value: Any, where: str, roles: Sequence[str]) -> list[dict[str, Any]]:
    """``value`` as a list of chat messages: a string is one user message; each message needs a role of ``roles``
    and string content."""
    if isinstance(value, str):
        value = [{"role": "user", "content": value}]
    if isinstance(value, dict):
        value = [value]
    if not isinstance(value, list):
        raise EpisodeError(f"{where}: messages are a list of {{'role', 'content'}} dicts, not {value!r:.200}")
    for message in value:
        if not isinstance(message, dict) or not isinstance(message.get("content"), str):
            raise EpisodeError(f"{where}: a message is a dict with a string 'content', not {message!r:.200}")
        if message.get("role") not in roles:
            raise EpisodeError(f"{where}: a message's role is one of {', '.join(roles)}, not {message.get('role')!r}")
    return [dict(m) for m in value]


def _guarded(where: str, call: Callable[[], Any]) -> Any:
    """``call()``; what it raises, as an `EpisodeError` naming ``where`` (the environment's method and episode)."""
    try:
        return call()
    except Exception as error:
        raise EpisodeError(f"{where} raised {type(error).__name__}: {error}") from error


def _close(env: Any) -> None:
    if env is not None and callable(getattr(env, "close", None)):
        env.close()
