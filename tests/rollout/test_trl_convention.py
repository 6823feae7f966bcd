"""Reward functions in TRL's convention: what they are given, the rewards they give, what they log.

The reference is TRL's own calling code, ``GRPOTrainer._calculate_rewards`` (trl/trainer/grpo_trainer.py,
TRL 1.16): when ``trl`` is importable the tests build a real ``GRPOTrainer`` on the tiny model and call it;
otherwise :func:`reproduced_calculate_rewards`, a copy of its reward-function path, stands in (and is itself
checked against the real one whenever ``trl`` is there). The samples are real: prompts read from a file by
``rlhf.data.load_prompts``, completions sampled from the tiny llama by ``rlhf.rollout.generation.generate``.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
import math
from collections import defaultdict
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import TrainerState

from configs import nested
from rlhf.config import config_from_dict
from rlhf.data import load_prompts
from rlhf.data.stream import PromptBatch
from rlhf.data.tokenization import stop_token_ids
from rlhf.models.loading import load_causal_lm, load_tokenizer
from rlhf.rollout import generation, scoring, verifiers
from rlhf.rollout.engine import SamplingParams
from rlhf.rollout.rewards import FunctionReward, RewardContext, RewardError, RewardSet
from rlhf.runlog import samples
from rlhf.trainers.rl import grpo, ppo

HERE = Path(__file__).resolve().parent
TRL_STYLE = HERE / "trl_style_rewards.py"
G = 2  # completions per prompt, consecutive rows (GRPO's layout; TRL repeats each input row G times)


def fn(name: str) -> FunctionReward:
    return FunctionReward.load(f"{TRL_STYLE}:{name}")


def spec(name: str) -> str:
    return f"{TRL_STYLE}:{name}"


# --------------------------------------------------------------------------------------------------------------
# TRL's calling code
# --------------------------------------------------------------------------------------------------------------


def _is_async_callable(func) -> bool:
    """trl/trainer/utils.py ``is_async_callable``."""
    while isinstance(func, functools.partial):
        func = func.func
    return inspect.iscoroutinefunction(func) or inspect.iscoroutinefunction(func.__call__)


def reproduced_calculate_rewards(reward_funcs, inputs, prompts, completions, completion_ids_list, state):
    """TRL 1.16 ``GRPOTrainer._calculate_rewards`` (trl/trainer/grpo_trainer.py) for reward *functions*, copied
    line for line but for the trainer plumbing: the kwargs (every input column but prompt/completion/
    completion_ids as a list, ``trainer_state``, ``log_extra`` = ``_log_completion_extra`` extending a list per
    column, ``log_metric`` = ``_log_metric`` appending per name), the synchronous functions in order, then the
    async ones together under ``asyncio.gather`` (TRL: on a daemon-thread loop), None → NaN.

    Returns ``(rewards_per_func (B, K), pending metrics, pending extra columns)``.
    """
    pending_extra, pending_metrics = defaultdict(list), defaultdict(list)
    rewards_per_func = torch.zeros(len(prompts), len(reward_funcs))
    keys = [key for key in inputs[0] if key not in ["prompt", "completion", "completion_ids"]]
    reward_kwargs = {key: [example[key] for example in inputs] for key in keys}
    reward_kwargs["trainer_state"] = state
    reward_kwargs["log_extra"] = lambda column, values: pending_extra[column].extend(values)
    reward_kwargs["log_metric"] = lambda name, value: pending_metrics[name].append(value)
    async_funcs_info = []
    for i, reward_func in enumerate(reward_funcs):
        if _is_async_callable(reward_func):
            async_funcs_info.append((i, reward_func))
        else:
            output = reward_func(
                prompts=prompts, completions=completions, completion_ids=completion_ids_list, **reward_kwargs
            )
            output = [reward if reward is not None else torch.nan for reward in output]
            rewards_per_func[:, i] = torch.tensor(output, dtype=torch.float32)
    if async_funcs_info:

        async def _invoke_async(index, func):
            output = await func(
                prompts=prompts, completions=completions, completion_ids=completion_ids_list, **reward_kwargs
            )
            return index, [r if r is not None else torch.nan for r in output]

        async def _run_async_funcs():
            return await asyncio.gather(*[_invoke_async(i, func) for i, func in async_funcs_info])

        for idx, output in asyncio.run(_run_async_funcs()):
            rewards_per_func[:, idx] = torch.tensor(output, dtype=torch.float32)
    return rewards_per_func, dict(pending_metrics), dict(pending_extra)


def trl_calculate_rewards(model_dir, tmp_path, reward_funcs, inputs, prompts, completions, ids, state_values):
    """The real ``GRPOTrainer._calculate_rewards`` on the tiny model: ``(rewards (B, K), metrics, extra)``."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    args = GRPOConfig(
        output_dir=str(tmp_path / "trl"), per_device_train_batch_size=G, num_generations=G, report_to=[],
        use_cpu=True, max_completion_length=8,
    )  # fmt: skip
    trainer = GRPOTrainer(
        model=str(model_dir), reward_funcs=list(reward_funcs), args=args,
        train_dataset=Dataset.from_list(inputs), processing_class=load_tokenizer(str(model_dir)),
    )  # fmt: skip
    for key, value in state_values.items():  # the state TRL would have at that point of training
        setattr(trainer.state, key, value)
    rewards = trainer._calculate_rewards(inputs, prompts, completions, ids)
    return rewards.cpu(), dict(trainer._pending_metrics), dict(trainer._pending_extra_logs)


def has_trl() -> bool:
    try:
        import trl  # noqa: F401
    except ImportError:
        return False
    return True


# --------------------------------------------------------------------------------------------------------------
# Samples: prompts from a file, completions from the tiny llama
# --------------------------------------------------------------------------------------------------------------

QUESTIONS = ["the red cat sees", "what is two and two", "a dog in the park", "count the birds"]


def dataset_rows(form: str) -> list[dict]:
    """Four prompts with a ``ground_truth`` and a ``level`` column (None on the last: unscored there) in one
    of three forms: ``standard`` (TRL's standard prompt), ``conversational`` (TRL's: ``"prompt"`` is a message
    list) and ``messages`` (rlhf's chat form)."""
    rows = []
    for i, question in enumerate(QUESTIONS):
        chat = [{"role": "system", "content": "answer briefly"}, {"role": "user", "content": question}]
        prompt = {"standard": {"prompt": question}, "conversational": {"prompt": chat}, "messages": {"messages": chat}}
        rows.append(prompt[form] | {"ground_truth": str(i), "level": None if i == 3 else i})
    return rows


def sampled(model_dir: Path, path: Path) -> tuple[PromptBatch, generation.Generated]:
    """Every prompt of ``path``, G samples each, 8 new tokens at temperature 1 from a fixed seed."""
    tokenizer = load_tokenizer(str(model_dir))
    prompts = load_prompts(path, tokenizer, 64)
    batch = PromptBatch.of(prompts, range(len(prompts)))
    model = load_causal_lm(str(model_dir))
    stops = stop_token_ids(tokenizer, "eos")
    generator = torch.Generator().manual_seed(0)
    params = SamplingParams(8, 1.0, 0, 1.0)
    return batch, generation.generate(model, tokenizer, batch, params, stops, generator, torch.device("cpu"), G)


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


STATE = {"global_step": 3, "max_steps": 10, "epoch": 0.25}

STANDARD = ["example_1_token_length", "example_3_boxed", "example_5_async", "example_6_logging", "curriculum",
            "columns_and_prompts", "async_token_share"]  # fmt: skip
CONVERSATIONAL = ["example_1_token_length", "example_2_format", "chat_length", "curriculum", "columns_and_prompts",
                  "async_token_share"]  # fmt: skip


def trl_rewards() -> dict[str, list]:
    """TRL's own reward functions for each format (``trl.rewards``), when TRL is installed."""
    if not has_trl():
        return {"standard": [], "conversational": []}
    from trl.rewards import get_repetition_penalty_reward, get_soft_overlong_punishment, think_format_reward

    by_ids = [get_repetition_penalty_reward(ngram_size=2), get_soft_overlong_punishment(8, 4)]
    return {"standard": by_ids, "conversational": [think_format_reward, *by_ids]}


@pytest.mark.parametrize("form", ["standard", "conversational", "messages"])
def test_rewards_logs_and_arguments_are_trls(tiny_llama_dir, tmp_path, form):
    rows = dataset_rows(form)
    batch, generated = sampled(tiny_llama_dir, write_jsonl(tmp_path / "prompts.jsonl", rows))
    chat = form != "standard"
    functions = [fn(name).function for name in (CONVERSATIONAL if chat else STANDARD)]
    functions += trl_rewards()["conversational" if chat else "standard"]

    # rlhf: the trainers' scoring path
    rewards = RewardSet([FunctionReward(f) for f in functions])
    state = TrainerState(**STATE)
    context = scoring.reward_context(batch, generated, repeat=G, trainer_state=state)
    columns = {name: generation.repeat_each(values, G) for name, values in batch.columns.items()}
    ours = scoring.score(rewards, generation.repeat_each(batch.texts, G), generated.completions, columns, "sum",
                         context=context)  # fmt: skip

    # TRL: its inputs are the dataset rows, each repeated G times; a chat prompt is TRL's "prompt" message list
    inputs = [{"prompt": row.get("prompt", row.get("messages")), **row} for row in rows for _ in range(G)]
    for row in inputs:
        row.pop("messages", None)
    tokenizer = load_tokenizer(str(tiny_llama_dir))
    ids = generated.completion_ids
    contents = tokenizer.batch_decode(ids, skip_special_tokens=True)  # as _generate_and_score_completions does
    assert contents == generated.completions
    completions = [[{"role": "assistant", "content": c}] for c in contents] if chat else contents
    prompts = [row["prompt"] for row in inputs]
    args = (functions, inputs, prompts, completions, ids)
    if has_trl():
        reference = trl_calculate_rewards(tiny_llama_dir, tmp_path, *args, STATE)
        reproduced = reproduced_calculate_rewards(*args, TrainerState(**STATE))
        torch.testing.assert_close(reproduced[0], reference[0], rtol=0, atol=0, equal_nan=True)
        assert reproduced[1:] == reference[1:]
    else:
        reference = reproduced_calculate_rewards(*args, TrainerState(**STATE))
    expected, metrics, extra = reference

    # the same functions on the same samples give exactly the same rewards (both float32 of the same floats)
    torch.testing.assert_close(ours.per_source, expected, rtol=0, atol=0, equal_nan=True)
    assert ours.per_source[-G:, rewards.names.index("columns_and_prompts")].isnan().all()  # level None
    # log_metric: TRL keeps the values per name; rlhf per "<source>/<name>" (each name is one source's here)
    owners = {key.partition("/")[2]: key for key in ours.metrics}
    assert {owners[name]: values for name, values in metrics.items()} == ours.metrics
    # log_extra: TRL's completions-table columns, one value per sample; rlhf's "<source>/<column>"
    owners = {key.partition("/")[2]: key for key in ours.extra}
    assert {owners[column]: values for column, values in extra.items()} == ours.extra
    assert ours.metrics and (ours.extra or not chat)


def test_conversational_batches_get_trls_shapes(tiny_llama_dir, tmp_path):
    """What one call receives, argument by argument (TRL's documented convention)."""
    seen = []

    def record(prompts, completions, completion_ids, trainer_state, log_metric, log_extra, **columns):
        seen.append({"prompts": prompts, "completions": completions, "completion_ids": completion_ids,
                     "trainer_state": trainer_state, "columns": columns, "callbacks": (log_metric, log_extra)})  # fmt: skip
        return [0.0] * len(completions)

    rows = dataset_rows("messages")
    batch, generated = sampled(tiny_llama_dir, write_jsonl(tmp_path / "prompts.jsonl", rows))
    state = TrainerState(**STATE)
    context = scoring.reward_context(batch, generated, repeat=G, trainer_state=state)
    columns = {name: generation.repeat_each(values, G) for name, values in batch.columns.items()}
    scoring.score(RewardSet([FunctionReward(record, name="record")]), generation.repeat_each(batch.texts, G),
                  generated.completions, columns, "sum", context=context)  # fmt: skip
    (call,) = seen
    assert call["prompts"] == [row["messages"] for row in rows for _ in range(G)]
    assert call["completions"] == [[{"role": "assistant", "content": c}] for c in generated.completions]
    assert call["completion_ids"] == generated.completion_ids
    assert call["trainer_state"] is state
    assert call["columns"] == {"ground_truth": columns["ground_truth"], "level": columns["level"]}
    assert all(callable(c) for c in call["callbacks"])
    # the completion ids end at the stop token (TRL: up to and including the first EOS), no padding
    eos = load_tokenizer(str(tiny_llama_dir)).eos_token_id
    for ids, stopped in zip(call["completion_ids"], generated.has_stop.tolist(), strict=True):
        assert (eos in ids) == stopped and (not stopped or ids.index(eos) == len(ids) - 1)


def test_a_plain_prompt_in_a_chat_batch_reads_as_one_user_message():
    seen = []

    def record(prompts, completions, **kwargs):
        seen.append((prompts, completions))
        return [1.0] * len(completions)

    chat = [{"role": "user", "content": "hi"}]
    context = RewardContext(messages=[chat, None])
    RewardSet([FunctionReward(record, name="r")]).score(["<rendered>", "plain"], ["a", "b"], context=context)
    assert seen == [([chat, [{"role": "user", "content": "plain"}]], [[{"role": "assistant", "content": c}]
                                                                       for c in "ab"])]  # fmt: skip


def test_a_function_without_kwargs_gets_only_what_it_declares():
    source = fn("declared_only")
    context = RewardContext(messages=[[{"role": "user", "content": "q"}]] * 2, completion_ids=[[7, 8], [9]])
    result = RewardSet([source]).score(["q", "q"], ["abc", "de"], {"level": [1, 2]}, context=context)
    assert result.scores[:, 0].tolist() == [1.0, 1.0]  # 3 − 2 and 2 − 1 characters over tokens


def test_a_missing_required_argument_is_named():
    """completion_ids are not available when answers of two models are judged together (rlhf eval)."""
    with pytest.raises(RewardError, match=r"example_1_token_length.*requires completion_ids"):
        RewardSet([fn("example_1_token_length")]).score(["q"], ["a"])


# --------------------------------------------------------------------------------------------------------------
# async functions
# --------------------------------------------------------------------------------------------------------------


def test_async_functions_run_concurrently_on_one_loop():
    """Two async functions that each wait for the other to start: only concurrent calls finish (sequential
    ones would time out and fail). Every batch runs on the same event loop (TRL's one daemon-thread loop)."""
    started = {}
    loops = []

    def waiting_for(me: str, other: str):
        async def reward(completions, **kwargs):
            loop = asyncio.get_running_loop()
            loops.append(loop)
            started.setdefault(loop, {}).setdefault(me, asyncio.Event()).set()
            await asyncio.wait_for(started[loop].setdefault(other, asyncio.Event()).wait(), timeout=30)
            return [1.0] * len(completions)

        return reward

    sources = [FunctionReward(waiting_for("a", "b"), name="a"), FunctionReward(waiting_for("b", "a"), name="b")]
    for _ in range(2):
        started.clear()
        result = RewardSet(sources).score(["p"], ["c"])
        assert result.scores.tolist() == [[1.0, 1.0]]
    assert len(loops) == 4 and len(set(map(id, loops))) == 1


def test_an_async_function_failing_on_one_sample_is_located():
    async def picky(completions, **kwargs):
        return [1.0 / len(c) for c in completions]  # an empty completion divides by zero

    with pytest.raises(RewardError, match=r"reward 'picky', sample 1 \(completion ''\): raised ZeroDivisionError"):
        RewardSet([FunctionReward(picky), fn("example_5_async")]).score(["p"] * 3, ["ab", "", "c"])


# --------------------------------------------------------------------------------------------------------------
# log_metric / log_extra
# --------------------------------------------------------------------------------------------------------------


def logging(metric_value=0.5, extra_values=None, metric_name="accuracy"):
    def reward(completions, log_metric, log_extra, **kwargs):
        log_metric(metric_name, metric_value)
        log_extra("note", extra_values if extra_values is not None else ["x"] * len(completions))
        return [1.0] * len(completions)

    return FunctionReward(reward, name="judge")


@pytest.mark.parametrize(
    ("source", "message"),
    [
        (logging(extra_values=["only one"]), r"reward 'judge': log_extra\('note', …\) got 1 values for a batch of 2"),
        (logging(extra_values="xy"), r"log_extra\('note', …\) got a str; it takes a list with one value per sample"),
        (logging(metric_value="high"), r"log_metric\('accuracy', …\) got 'high', a str; it takes one number"),
        (logging(metric_name="mean"), r"log_metric name must be .* other than mean or std"),
    ],
)
def test_logging_mistakes_are_named(source, message):
    with pytest.raises(RewardError, match=message):
        RewardSet([source]).score(["p", "q"], ["a", "b"])


def test_logged_metrics_are_averaged_per_step_and_land_under_reward():
    """Two batches of one step (GRPO's dynamic sampling scores several): the step's value is the mean of the
    calls, NaN left out as in TRL's ``GRPOTrainer.log``; held-out rows get the ``eval/`` prefix."""
    values = iter([0.25, math.nan, 0.75])

    def reward(completions, log_metric, **kwargs):
        for _ in completions[1:] or completions:  # the first batch (3 samples) logs twice, the second once
            log_metric("accuracy", next(values))
        return [1.0] * len(completions)

    rewards = RewardSet([FunctionReward(reward, name="judge")])
    parts = [scoring.score(rewards, ["p"] * n, ["c"] * n, {}, "sum") for n in (3, 1)]
    scores = scoring.concat_scores(parts)
    (a, b, c) = scores.metrics["judge/accuracy"]
    assert (a, c) == (0.25, 0.75) and math.isnan(b)
    assert scoring.reward_metrics(scores)["reward/judge/accuracy"] == 0.5  # (0.25 + 0.75) / 2, exact in binary
    assert scoring.reward_metrics(scores, "eval/reward")["eval/reward/judge/accuracy"] == 0.5


def test_extra_columns_follow_their_rows():
    """Rows selected (dynamic sampling keeps whole groups) or concatenated keep their own extra values; a part
    whose functions logged nothing has None there."""

    def reward(completions, log_extra, **kwargs):
        if completions[0] != "skip":
            log_extra("seen", [c.upper() for c in completions])
        return [1.0] * len(completions)

    rewards = RewardSet([FunctionReward(reward, name="r")])
    a = scoring.score(rewards, ["p"] * 3, ["x", "y", "z"], {}, "sum")
    b = scoring.score(rewards, ["p"] * 2, ["skip", "w"], {}, "sum")
    merged = scoring.concat_scores([a, b])
    assert merged.extra == {"r/seen": ["X", "Y", "Z", None, None]}
    assert merged.select(torch.tensor([2, 0])).extra == {"r/seen": ["Z", "X"]}
    rows = samples.sample_rows(7, ["p"] * 5, ["x", "y", "z", "skip", "w"], merged)
    assert [row.get("extra") for row in rows][:2] == [{"r/seen": "X"}, {"r/seen": "Y"}]


# --------------------------------------------------------------------------------------------------------------
# reward/mean: the weighted sum of the raw rewards, also under GDPO
# --------------------------------------------------------------------------------------------------------------


def test_gdpo_reports_the_raw_weighted_sum_and_the_normalised_value_apart():
    def chars(completions, **kwargs):
        return [float(len(c)) for c in completions]

    def first_is_a(completions, **kwargs):
        return [None if c == "" else float(c.startswith("a")) for c in completions]

    rewards = RewardSet([FunctionReward(chars), FunctionReward(first_is_a)], [1.0, 2.0])
    completions = ["abc", "b", "ab", ""]
    scores = scoring.score(rewards, ["p"] * 4, completions, {}, "gdpo", group_size=2)
    # raw: 3 + 2·1, 1 + 2·0, 2 + 2·1, 0 (+ nothing: the second source could not score ""); population std
    # √((2.5² + 1.5² + 1.5² + 2.5²) / 4) = √4.25
    assert scores.raw.tolist() == [5.0, 1.0, 4.0, 0.0]
    metrics = scoring.reward_metrics(scores)
    assert metrics["reward/mean"] == 2.5 and metrics["reward/std"] == pytest.approx(math.sqrt(4.25), rel=1e-6)
    assert metrics["reward/chars/mean"] + 2 * metrics["reward/first_is_a/mean"] == pytest.approx(
        1.5 + 2 * 2 / 3, rel=1e-6
    )  # per-source means over the samples each scored (float32 division: rel 1e-6)
    assert abs(metrics["reward/normalized_mean"]) < 1e-6  # GDPO's value: mean 0 by construction
    assert "reward/normalized_mean" not in scoring.reward_metrics(scoring.score(rewards, ["p"], ["a"], {}, "sum"))
    rows = samples.sample_rows(1, ["p"] * 4, completions, scores)
    assert [row["reward"] for row in rows] == [5.0, 1.0, 4.0, 0.0]


# --------------------------------------------------------------------------------------------------------------
# the built-in verifiers read both completion forms
# --------------------------------------------------------------------------------------------------------------


def test_verifiers_score_conversational_completions_as_their_text():
    texts = ["<think>a</think> <answer>4</answer>", "so \\boxed{5}", ""]
    chat = [[{"role": "assistant", "content": t}] for t in texts]
    answers = ["4", "5", "1"]
    assert verifiers.exact_match(chat, answer=answers) == verifiers.exact_match(texts, answer=answers)
    assert verifiers.exact_match(chat, answer=answers) == [1.0, 1.0, 0.0]
    assert verifiers.format_regex(chat) == verifiers.format_regex(texts) == [1.0, 0.0, 0.0]
    assert verifiers.length_penalty(chat) == verifiers.length_penalty(texts)


# --------------------------------------------------------------------------------------------------------------
# ppo and grpo runs on a conversational dataset with TRL-style rewards
# --------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def chat_prompts_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """40 conversational prompts (36 train, 4 held out), each with a ``level`` column."""
    from rlhf.models.tiny import toy_corpus

    path = tmp_path_factory.mktemp("chat_prompts") / "prompts.jsonl"
    lines = toy_corpus(40, seed=3)
    rows = [{"messages": [{"role": "user", "content": " ".join(line.split()[:4])}], "level": i % 3}
            for i, line in enumerate(lines)]  # fmt: skip
    return write_jsonl(path, rows)


def run_config(command: str, policy: Path, prompts: Path, out: Path, **overrides: object):
    """2 steps of 4 sequences (ppo: 4 prompts; grpo: 2 prompts × 2), 8 new tokens, eval at the end."""
    values = {
        "model.name": str(policy), "data.train": str(prompts), "output_dir": str(out), f"{command}.steps": 2,
        "batch.size": 4 if command == "ppo" else 2, "sampling.max_new_tokens": 8, "sampling.temperature": 1.0,
        "optim.learning_rate": 1e-3, "run.eval_every": 0, "run.save_every": 0, "run.progress": False,
    }  # fmt: skip
    if command == "ppo":
        values |= {"ppo.epochs": 1}
    else:
        values |= {"grpo.group_size": 2}
    return config_from_dict(command, nested(values | overrides))


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


TRL_REWARDS = [
    {"source": spec("chat_length"), "name": "chat"},
    {"source": spec("async_token_share"), "name": "share", "weight": 0.5},
    {"source": spec("columns_and_prompts"), "name": "level", "weight": 0.0},
]


@pytest.mark.parametrize("command", ["ppo", "grpo"])
def test_a_run_on_chat_prompts_with_trl_style_rewards(tiny_llama_dir, chat_prompts_file, tmp_path, command):
    out = tmp_path / command
    trainer = ppo if command == "ppo" else grpo
    config = run_config(command, tiny_llama_dir, chat_prompts_file, out, **{"reward.source": TRL_REWARDS})
    trainer.run(config)
    rows = read_jsonl(out / "metrics.jsonl")[1:]  # after the held-out answers before training (step 0)
    assert [row["step"] for row in rows] == [1, 2]
    for row in rows:
        # trainer_state while the step's batch is scored: the steps done before it, of config.steps
        assert row["reward/chat/global_step"] == row["step"] - 1 and row["reward/chat/max_steps"] == 2
        # epoch: passes over the 36 training prompts before this batch (4 rows per step = 4 or 2 prompts)
        prompts_per_step = 4 if command == "ppo" else 2
        assert row["reward/chat/epoch"] == (row["step"] - 1) * prompts_per_step / 36
        assert 0 < row["reward/share/distinct_share"] <= 1
        # reward/mean is the weighted sum of the sources' means (every sample scored by all three)
        expected = row["reward/chat/mean"] + 0.5 * row["reward/share/mean"]
        assert row["reward/mean"] == pytest.approx(expected, rel=1e-5)  # float32 means of 4 values: rel 1e-5
        assert "policy/loss" in row
    # held out at the last step: the state after it; rows carry what log_extra logged
    assert rows[-1]["eval/reward/chat/global_step"] == 2
    held_out = read_jsonl(out / "samples" / "step_000002.jsonl")
    assert len(held_out) == 4
    for sample in held_out:
        assert sample["extra"]["chat/role"] == "assistant"
        assert sample["extra"]["chat/num_ids"] >= 1
    # the training batch of each logged step, with its extra columns (TRL's completions table)
    for step in (1, 2):
        batch = read_jsonl(out / "completions" / f"step_{step:06d}.jsonl")
        assert len(batch) == 4 and all(row["step"] == step and row["extra"]["chat/role"] == "assistant"
                                       for row in batch)  # fmt: skip


def test_ppo_gdpo_reports_the_raw_weighted_sum(tiny_llama_dir, chat_prompts_file, tmp_path):
    out = tmp_path / "run"
    rewards = [{"source": spec("chat_length"), "name": "chat"},
               {"source": spec("curriculum"), "name": "curriculum", "weight": 0.5}]  # fmt: skip
    ppo.run(
        run_config(
            "ppo", tiny_llama_dir, chat_prompts_file, out, **{"reward.source": rewards, "reward.aggregation": "gdpo"}
        )
    )
    for row in read_jsonl(out / "metrics.jsonl"):
        for prefix in (p for p in ("reward", "eval/reward") if f"{p}/mean" in row):  # step 0: held-out only
            expected = row[f"{prefix}/chat/mean"] + 0.5 * row[f"{prefix}/curriculum/mean"]
            # float32 means of 4 values of size ≤ 80: rel 1e-5
            assert row[f"{prefix}/mean"] == pytest.approx(expected, rel=1e-5)
            assert abs(row[f"{prefix}/normalized_mean"]) < 1e-5  # GDPO's normalised value: mean 0
    assert "eval/reward/mean" in row  # the last step evaluates


# --------------------------------------------------------------------------------------------------------------
# a batch no reward could score
# --------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["ppo", "grpo"])
def test_an_unscored_batch_skips_its_update_with_a_warning(tiny_llama_dir, chat_prompts_file, tmp_path, command,
                                                           capfd):  # fmt: skip
    """Step 1 scores nothing (None for all): no update — the policy after it is the initial one, bit for bit
    (an optimizer step on a zero gradient would still move it through Adam's state and weight decay)."""
    out = tmp_path / "run"
    trainer = ppo if command == "ppo" else grpo
    config = run_config(command, tiny_llama_dir, chat_prompts_file, out, **{"reward.source": spec("none_at_first_step"), f"{command}.steps": 1, "optim.weight_decay": 0.1})  # fmt: skip
    final = trainer.run(config)
    assert "step 1: no sample of the batch could be scored" in capfd.readouterr().err
    (row,) = read_jsonl(out / "metrics.jsonl")[1:]  # after step 0's held-out answers
    assert row["reward/unscored"] == 4 and math.isnan(row["reward/mean"])
    assert "policy/loss" not in row
    initial, trained = load_file(tiny_llama_dir / "model.safetensors"), load_file(final / "model.safetensors")
    assert all(torch.equal(initial[k], trained[k]) for k in initial)

    # with a batch scored at step 2 the run goes on and updates
    out = tmp_path / "run2"
    trainer.run(
        run_config(command, tiny_llama_dir, chat_prompts_file, out, **{"reward.source": spec("none_at_first_step")})
    )
    rows = read_jsonl(out / "metrics.jsonl")[1:]
    assert "policy/loss" not in rows[0] and "policy/loss" in rows[1] and "reward/unscored" not in rows[1]


@pytest.mark.parametrize("command", ["ppo", "grpo"])
def test_a_reward_that_never_scores_stops_the_run(tiny_llama_dir, chat_prompts_file, tmp_path, command):
    trainer = ppo if command == "ppo" else grpo
    config = run_config(command, tiny_llama_dir, chat_prompts_file, tmp_path / "run", **{"reward.source": spec("never_scores"), f"{command}.steps": 10})  # fmt: skip
    with pytest.raises(RewardError, match=rf"step {scoring.MAX_UNSCORED_STEPS}: no sample of the last "
                                          rf"{scoring.MAX_UNSCORED_STEPS} batches could be scored \(reward "
                                          r"'never_scores' returned None"):  # fmt: skip
        trainer.run(config)
    steps = [row["step"] for row in read_jsonl(tmp_path / "run" / "metrics.jsonl")]
    assert steps == list(range(scoring.MAX_UNSCORED_STEPS))  # step 0 (held-out answers), then the unscored ones


# --------------------------------------------------------------------------------------------------------------
# rlhf eval and rlhf sample
# --------------------------------------------------------------------------------------------------------------


def test_eval_and_sample_call_trl_style_rewards_on_chat_prompts(tiny_llama_dir, chat_prompts_file, tmp_path):
    """Outside training the state is a fresh TrainerState (step 0 of 0, as TRL's before training); reward/mean
    and each row's reward are the weighted sum of the raw rewards, also under GDPO."""
    from rlhf import evaluate, sample

    rewards = [{"source": spec("chat_length"), "name": "chat"},
               {"source": spec("curriculum"), "name": "curriculum", "weight": 2.0}]  # fmt: skip
    values = {"model.name": str(tiny_llama_dir), "eval_data": str(chat_prompts_file), "reward.source": rewards,
              "reward.aggregation": "gdpo", "batch_size": 4, "sampling.max_new_tokens": 8, "max_prompts": 8,
              "progress": False, "samples_output": str(tmp_path / "rows.jsonl")}  # fmt: skip
    results = evaluate.run(config_from_dict("eval", nested(values)))
    assert results["reward/chat/global_step"] == 0 and results["reward/chat/max_steps"] == 0
    expected = results["reward/chat/mean"] + 2.0 * results["reward/curriculum/mean"]
    assert results["reward/mean"] == pytest.approx(expected, rel=1e-5)  # float32 means of 8 values: rel 1e-5
    rows = read_jsonl(tmp_path / "rows.jsonl")
    for row in rows:
        assert row["reward"] == pytest.approx(row["rewards"]["chat"] + 2.0 * row["rewards"]["curriculum"], rel=1e-6)
        assert row["extra"]["chat/role"] == "assistant"

    values = {"model.name": str(tiny_llama_dir), "prompts": str(chat_prompts_file), "judge.source": rewards,
              "mode": "candidates", "num_samples": 2, "batch_size": 4, "sampling.max_new_tokens": 8, "progress": False,
              "output": str(tmp_path / "candidates.jsonl")}  # fmt: skip
    summary = sample.run(config_from_dict("sample", nested(values)))
    expected = summary["judge/chat/mean"] + 2.0 * summary["judge/curriculum/mean"]
    assert summary["judge/mean"] == pytest.approx(expected, rel=1e-5)  # float32 means of 80 values: rel 1e-5
    assert summary["judge/chat/global_step"] == 0
