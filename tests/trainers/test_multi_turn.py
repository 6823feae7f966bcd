"""`rlhf grpo` and `rlhf ppo` on multi-turn episodes (``rollout.environment``), end to end on the tiny llama: what
the rollout trains on (only the model's tokens, the sampled ids and log-probs), the runs, resume, the errors, and
a learning test whose reward needs the environment's reply (``episode_envs.py:CodeWord``)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from chat_models import CHAT_MODELS, TOOL_FORMATS
from configs import nested
from episode_envs import WORDS
from rlhf import cli, report
from rlhf.config import ConfigError, config_from_dict
from rlhf.data.stream import PromptBatch
from rlhf.runlog.distributed import SINGLE
from rlhf.trainers import sft, update
from rlhf.trainers.rl import grpo, ppo
from rlhf.trainers.rl.inputs import load_inputs
from rlhf.trainers.rl.models import Models
from rlhf.trainers.rl.rollout import sample_and_score
from runs import (
    assert_rows_match,
    assert_same_checkpoint,
    comparable,
    counting,
    dies_after_checkpoint,
    max_abs_diff,
    metric_rows,
    train_rows,
)

pytestmark = pytest.mark.longest  # its learning tests and tool-calling fixtures: minutes (tests/conftest.py)

ENVS = Path(__file__).resolve().parents[1] / "episode_envs.py"
EPISODE_METRICS = ["episode/turns_mean", "episode/tool_calls_mean", "episode/tool_errors", "episode/truncated"]


@pytest.fixture(scope="module")
def word_prompts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """64 rows, each naming the index of its code word (``word``); the prompt text is not read (reset opens)."""
    path = tmp_path_factory.mktemp("episodes") / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": "x", "word": i % len(WORDS)}) + "\n" for i in range(64)))
    return path


def make_config(command: str, policy: Path, prompts: Path, out: Path, **overrides: object):
    """2 iterations of CodeWord episodes (2 model turns of at most 6 tokens), no checkpoints."""
    values = {
        "model.name": str(policy),
        "reward.source": "environment",
        "data.train": str(prompts),
        "output_dir": str(out),
        f"{command}.steps": 2,
        "batch.size": 2 if command == "grpo" else 4,
        "sampling.max_new_tokens": 6,
        "sampling.temperature": 1.0,
        "optim.learning_rate": 1e-3,
        "rollout.environment": f"{ENVS}:CodeWord",
        "rollout.max_turns": 2,
        "run.eval_every": 0,
        "run.save_every": 0,
        "run.progress": False,
    }
    values |= {"grpo.group_size": 4} if command == "grpo" else {}
    return config_from_dict(command, nested(values | overrides))


def rollout_of(command: str, policy: Path, prompts: Path, out: Path, **overrides: object):
    """One sampled and scored batch of episodes of ``command``'s config, the models and the inputs."""
    config = make_config(command, policy, prompts, out, **overrides)
    inputs = load_inputs(config)
    models = Models(config, SINGLE) if command == "grpo" else ppo.build_models(config, inputs.rewards, SINGLE)
    batch = PromptBatch.of(inputs.train_prompts, range(4 if command == "grpo" else 16))  # 16 episodes either way
    repeat = config.grpo.group_size if command == "grpo" else 1
    sampled = sample_and_score(config, inputs, models, batch, torch.Generator().manual_seed(0), None, repeat=repeat)
    return config, models, sampled


def test_episodes_hold_both_turns_and_only_the_models_tokens_train(chat_policy, word_prompts, tmp_path):
    """The rollout's loss mask is the model's sampled tokens (the environment's reply between the turns is out),
    and the trainer's log-probs of them, one forward over the whole episode, equal the sampler's, taken turn by turn
    with a KV cache (float32 rounding: the lean decoder and the full forward agree to ~1e-6 per token)."""
    config, models, sampled = rollout_of("grpo", chat_policy, word_prompts, tmp_path / "run", **{"sampling.max_new_tokens": 4, "rollout.max_episode_tokens": 40})  # fmt: skip
    generated = sampled.generated
    assert generated.env_mask is not None and generated.env_mask.any()  # some episodes reached the reply
    for row, episode in enumerate(generated.episodes):
        n = len(episode.ids)
        assert generated.responses[row, :n].tolist() == episode.ids
        assert generated.env_mask[row, :n].tolist() == episode.env_mask
        if episode.model_turns == 2:
            assert "the word is" in generated.completions[row]
    rollout, _ = grpo.make_rollout(config, models, sampled)
    scored = ~sampled.rewards.isnan()
    assert torch.equal(rollout.mask, generated.model_tokens & scored[:, None])
    ids, mask, T = generated.query_responses, generated.attention_mask, generated.responses.shape[1]
    trainer = models.old_scores(ids, mask, T, 1.0).logprobs
    # Our samplers never draw PAD (a dedicated id, checklist item 1): their distribution is the model's without
    # it, so sampler = trainer − log(1 − p_PAD), p_PAD the model's probability of PAD at that position.
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    logits = models.policy(input_ids=ids, attention_mask=mask, position_ids=positions).logits[:, -T - 1 : -1]
    p_pad = logits.float().log_softmax(-1)[..., generated.pad_token_id].exp()
    model = generated.model_tokens
    # float32 log-softmax over a few hundred logits, incremental (KV cache) against one pass: ~1e-6 apart
    assert (trainer - generated.sampler_logprobs - torch.log1p(-p_pad))[model].abs().max() < 1e-5


@pytest.mark.parametrize("command", ["grpo", "ppo"])
def test_environment_tokens_get_no_gradient(chat_policy, word_prompts, tmp_path, monkeypatch, command):
    """The loss's gradient with respect to each token's log-prob is 0 on the environment's tokens, and not 0 on the
    model's; PPO's advantages and value targets leave them out too."""
    fields = {"rollout.max_episode_tokens": 40, "rollout.environment": f"{ENVS}:Chatty"}
    config, models, sampled = rollout_of(command, chat_policy, word_prompts, tmp_path, **fields)
    kept = []
    forward = models.trainable.forward

    def keeping(*args, **kwargs):
        out = forward(*args, **kwargs)
        out.logprobs.retain_grad()
        kept.append(out.logprobs)
        return out

    monkeypatch.setattr(models.trainable, "forward", keeping)
    generated = sampled.generated
    B, T = generated.responses.shape
    rows = torch.arange(B)
    micro = update.MicroBatch(rows, 0, T)
    if command == "grpo":
        rollout, _ = grpo.make_rollout(config, models, sampled)
        loss, _ = grpo.micro_step(config, models, rollout, micro, rows)
    else:
        rollout, _, _ = ppo.make_rollout(config, models, generated, sampled.rewards, config.kl.coef)
        loss, _ = ppo.micro_step(config, models, rollout, micro, rows, kl_coef=config.kl.coef)
        assert (rollout.advantages[generated.env_mask] == 0).all() and not rollout.value_mask[generated.env_mask].any()
    loss.backward()
    grad, env = kept[-1].grad, generated.env_mask
    assert env.any() and (grad[env] == 0).all()
    assert (grad[generated.model_tokens] != 0).any()


@pytest.mark.parametrize("command", ["grpo", "ppo"])
def test_runs_log_episodes_and_write_every_turn(chat_policy, word_prompts, tmp_path, command):
    out = tmp_path / "run"
    fields = {"run.eval_every": 2, "data.eval": str(word_prompts), "rollout.max_episode_tokens": 40}
    (grpo if command == "grpo" else ppo).run(make_config(command, chat_policy, word_prompts, out, **fields))
    rows = train_rows(out)
    assert len(rows) == 2
    for row in rows:
        assert all(key in row for key in EPISODE_METRICS), sorted(row)
        assert 1 <= row["episode/turns_mean"] <= 2 and row["episode/tool_calls_mean"] == 0
    samples = [json.loads(line) for line in (out / "samples" / "step_000002.jsonl").read_text().splitlines()]
    reached = [s for s in samples if len(s["episode"]["turns"]) == 3]
    assert reached, samples
    for sample in reached:
        roles = [turn["role"] for turn in sample["episode"]["turns"]]
        assert roles == ["assistant", "user", "assistant"] and sample["episode"]["turns"][1]["content"].startswith(
            "the word is"
        )
        assert sample["reward"] in (0.0, 1.0) and sample["episode"]["ended"] in ("done", "max_tokens", "no_stop")
        assert sample["episode"]["tool_calls"] == sample["episode"]["tool_timeouts"] == 0
    page = report.build(out)  # the report shows each held-out episode turn by turn
    assert "<b>user</b>: the word is" in page and "<b>assistant</b>: " in page and "ended: " in page


@pytest.mark.parametrize("command", ["grpo", "ppo"])
@pytest.mark.parametrize("split", [{"batch.micro_size": 2}, {"batch.micro_tokens": 40}], ids=["rows", "tokens"])
def test_micro_batching_episodes_gives_the_same_update(
    chat_policy, word_prompts, tmp_path, clipped_gradients, command, split
):
    """Episodes of different lengths (one or two turns, replies between) in one pass, or in micro-batches of rows
    or of tokens, each cut to its own columns: the same gradients (float32 sums of the same terms in another
    grouping: rel 1e-4 of each element, as the single-turn tests allow)."""
    fields = {"rollout.environment": f"{ENVS}:Chatty", "rollout.max_episode_tokens": 40, f"{command}.steps": 1,
              f"{command}.num_minibatches": 1, "kl.coef": 0.05}  # fmt: skip
    trainer = grpo if command == "grpo" else ppo
    trainer.run(make_config(command, chat_policy, word_prompts, tmp_path / "whole", **fields))
    whole = list(clipped_gradients)
    clipped_gradients.clear()
    trainer.run(make_config(command, chat_policy, word_prompts, tmp_path / "micro", **fields | split))
    assert len(clipped_gradients) == len(whole) > 0
    assert any(g.abs().sum() > 0 for g in whole)
    for g_micro, g_whole in zip(clipped_gradients, whole, strict=True):
        torch.testing.assert_close(g_micro, g_whole, rtol=1e-4, atol=1e-6)


def test_resume_reproduces_the_uninterrupted_run(chat_policy, word_prompts, tmp_path, monkeypatch):
    """Checkpoints fall between iterations, so no episode is in flight in one: the resumed run re-plays the same
    episodes (per-row, per-turn sampling seeds) and ends with the same weights."""
    fields = {"grpo.steps": 4, "run.save_every": 2, "rollout.max_episode_tokens": 40}
    whole = grpo.run(make_config("grpo", chat_policy, word_prompts, tmp_path / "whole", **fields))
    with dies_after_checkpoint(monkeypatch, 2):
        grpo.run(make_config("grpo", chat_policy, word_prompts, tmp_path / "resumed", **fields))
    with counting(monkeypatch, grpo, "grpo_update") as updates:
        resumed = grpo.run(make_config("grpo", chat_policy, word_prompts, tmp_path / "resumed", **{"run.resume": True}, **fields))  # fmt: skip
    assert len(updates) == 2
    expected, got = comparable(metric_rows(tmp_path / "whole")), comparable(metric_rows(tmp_path / "resumed"))
    assert_rows_match(expected, got, rel=1e-6, abs=1e-6)  # the same float32 operations in the same order
    assert max_abs_diff(load_file(resumed / "model.safetensors"), load_file(whole / "model.safetensors")) <= 1e-6
    assert_same_checkpoint(tmp_path / "whole", tmp_path / "resumed")


def test_configs_that_cannot_work_are_refused(
    tiny_llama_dir, tiny_reward_model_other_tokenizer_dir, word_prompts, tmp_path
):
    with pytest.raises(ConfigError, match="rollout.environment is not set"):
        make_config("grpo", tiny_llama_dir, word_prompts, tmp_path, **{"rollout.environment": None})
    with pytest.raises(ConfigError, match="overlong_buffer"):
        make_config("grpo", tiny_llama_dir, word_prompts, tmp_path, **{"grpo.overlong_buffer": 2})
    tools = {"rollout.tools": ["rlhf.rollout.tools:calculator"]}  # the tiny chat template has no tool calls
    with pytest.raises(ConfigError, match="cannot show tool calls"):
        load_inputs(make_config("grpo", tiny_llama_dir, word_prompts, tmp_path / "t", **tools))
    other = {"reward.source": ["environment", str(tiny_reward_model_other_tokenizer_dir)]}
    with pytest.raises(ConfigError, match="has another tokenizer than the policy"):
        load_inputs(make_config("grpo", tiny_llama_dir, word_prompts, tmp_path / "r", **other))
    with pytest.raises(ConfigError, match="environment 'nowhere.py:Env': no such file"):
        load_inputs(make_config("grpo", tiny_llama_dir, word_prompts, tmp_path / "e", **{"rollout.environment": "nowhere.py:Env"}))  # fmt: skip


LEARNING = {
    "grpo": {"grpo.steps": 150, "batch.size": 16, "grpo.group_size": 8, "optim.learning_rate": 1e-3},
    "ppo": {"ppo.steps": 100, "batch.size": 64, "ppo.num_minibatches": 2, "ppo.epochs": 2, "optim.learning_rate": 5e-4},
}
"""Per trainer, 128 (GRPO: 16 × 8) or 64 (PPO) episodes an iteration, a constant learning rate and kl.coef 0.05."""


@pytest.mark.slow
@pytest.mark.parametrize("command", list(LEARNING))
def test_the_reward_rises_only_by_reading_the_environments_reply(chat_policy, word_prompts, tmp_path, command):
    """CodeWord with 8 words: the reply to the first turn names the row's word, the second turn scores 1 when it
    starts with it. A policy that ignores the reply is right 1 time in 8 at best. The SFT'd tiny llama
    (``chat_policy``: the format and the words, not the copying) trains with GRPO or PPO (:data:`LEARNING`), the
    reference (kl.coef 0.05) holding the format: without it some seeds lose the stop token in the first turn, and
    then every episode ends before the reply (no signal), or come to answer nothing.

    Observed (seeds 0-3 × the default AVX-512 and the avx2 kernels, 2 cores; docs/episodes.md has the longer
    runs): GRPO from 0.10-0.13 in the first 5 iterations to 0.75-0.88 around iteration 150 (0.96-0.97 at 300);
    PPO from 0.13-0.16 to 0.69-0.96 around iteration 100 (0.73-0.99 at 200). The runs here stop there (about 40
    s each). The bar asserted, 0.5, is four times the best blind policy's and below the weakest run's."""
    out = tmp_path / command
    fields = LEARNING[command] | {"optim.scheduler": "constant", "kl.coef": 0.05}
    (grpo if command == "grpo" else ppo).run(make_config(command, chat_policy, word_prompts, out, **fields))
    rewards = [row["reward/mean"] for row in train_rows(out)]
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    assert first < 0.3 and last > 0.5, (first, last, rewards)


def calculator_conversation(a: int, b: int, tools: list[dict]) -> dict:
    """An SFT row (the OpenAI/HF message schema, TRL's ``tools`` column): "what is a + b?", a calculator call, its
    result as a tool message, the answer."""
    call = {"type": "function", "id": "call00000", "function": {"name": "calculator", "arguments": {"expression": f"{a} + {b}"}}}  # fmt: skip
    return {"tools": tools, "messages": [
        {"role": "user", "content": f"what is {a} + {b}?"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "name": "calculator", "content": str(a + b), "tool_call_id": "call00000"},
        {"role": "assistant", "content": str(a + b)},
    ]}  # fmt: skip


@pytest.fixture(scope="module", params=[name for name in TOOL_FORMATS if name != "qwen3"])  # Qwen3: Hermes too
def calculator_policy(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Qwen2-layout model with one model's special tokens and chat template, one per tool-call format
    (``chat_models.TOOL_FORMATS``: Qwen2.5's Hermes JSON, Llama-3.1's JSON, Mistral v0.3's [TOOL_CALLS], Qwen3-Coder's
    XML), after SFT on "what is a + b?" conversations that call the calculator and then answer with its result.

    The tokenizer's corpus holds one such conversation as the template renders it (tool description, call, result):
    trained on the tool description alone, it spelled Mistral's call keys letter by letter, a 43-token call turn
    that sampling.max_new_tokens (32) cut before its </s>, so no call was ever read. The tool description makes
    the openings of Qwen2.5, Llama-3.1 (in the first user turn) and Qwen3-Coder 220-310 tokens: data.max_length
    256 cut every Llama-3.1 demo inside its call, and left nothing of Qwen3-Coder's to train on. At 6 epochs
    rather than 12, a Qwen2.5 policy garbled most of its calls."""
    from transformers.utils import get_json_schema

    from rlhf.models.tiny import save_tiny, toy_corpus
    from rlhf.rollout.tools import calculator
    from tiny_models import tiny_family_lm, train_family_tokenizer

    name = request.param
    root = tmp_path_factory.mktemp(f"calculator_{name}")
    tools = [get_json_schema(calculator)]
    probe = train_family_tokenizer(CHAT_MODELS[name], toy_corpus(50))
    rendered = probe.apply_chat_template(calculator_conversation(3, 4, tools)["messages"], tools=tools, tokenize=False)
    tokenizer = train_family_tokenizer(
        CHAT_MODELS[name], toy_corpus(300) + [rendered] * 20, vocab_size=1000, model_max_length=1024
    )
    base = save_tiny(tiny_family_lm("qwen2", tokenizer, hidden_size=64), tokenizer, root / "base")
    rng = random.Random(0)
    demos = root / "sft.jsonl"
    demos.write_text("".join(json.dumps(calculator_conversation(rng.randrange(10), rng.randrange(10), tools)) + "\n" for _ in range(192)))  # fmt: skip
    values = {"model.name": str(base), "data.train": str(demos), "output_dir": str(root / "sft"), "sft.epochs": 12,
              "optim.learning_rate": 3e-3, "batch.size": 16, "data.max_length": 512, "run.eval_every": 0,
              "run.save_every": 0, "run.progress": False}  # fmt: skip
    return sft.run(config_from_dict("sft", nested(values)))


@pytest.mark.parametrize("command", ["grpo", "ppo"])
def test_tool_calls_run_inside_training(calculator_policy, tmp_path, command):
    """The calculator as a tool (no environment), in each tool-call format (:func:`calculator_policy`): the
    policy's calls run, their results come back as tool messages the next turn reads, and the episode ends at the
    answer, scored by exact_match on the ``answer`` column; the run logs the calls. (The tiny model copies the
    numbers into its call poorly; this is the mechanics, not a learning test.)"""
    prompts = tmp_path / "sums.jsonl"
    pairs = [(a, b) for a in range(4) for b in range(4)]
    prompts.write_text(
        "".join(json.dumps({"prompt": f"what is {a} + {b}?", "answer": str(a + b)}) + "\n" for a, b in pairs)
    )
    fields = {"reward.source": "rlhf.rollout.verifiers:exact_match", "rollout.environment": None,
              "rollout.tools": ["rlhf.rollout.tools:calculator"], "sampling.max_new_tokens": 48,
              "sampling.max_prompt_length": 512, "rollout.max_episode_tokens": 96, "sampling.temperature": 0.7,
              "run.eval_every": 2, "data.eval": str(prompts)}  # fmt: skip
    out = tmp_path / "run"
    (grpo if command == "grpo" else ppo).run(make_config(command, calculator_policy, prompts, out, **fields))
    rows = train_rows(out)
    assert all(row["episode/tool_calls_mean"] > 0.5 for row in rows), rows
    samples = [json.loads(line) for line in (out / "samples" / "step_000002.jsonl").read_text().splitlines()]
    called = [s for s in samples if any(t["role"] == "tool" for t in s["episode"]["turns"])]
    ran = 0
    for sample in called:
        turns = sample["episode"]["turns"]
        assert [t["role"] for t in turns[:3]] == ["assistant", "tool", "assistant"]  # the model read the result
        tool = turns[1]
        if tool["content"].startswith("error: "):  # a call the tiny model garbled (1 in 16 or so): told, not run
            continue
        call = turns[0]["tool_calls"][0]["function"]
        assert call["name"] == "calculator" and tool["content"] == str(eval(call["arguments"]["expression"]))  # noqa: S307
        ran += 1
    assert ran > 0, samples


def test_the_command_line_names_an_environment_that_fails(chat_policy, word_prompts, tmp_path, capsys):
    """`rlhf grpo` with an environment whose step raises: exit 2 and one line naming the environment, the episode
    and the turn (no traceback: it is the user's code, not rlhf's)."""
    path = tmp_path / "grpo.yaml"
    path.write_text(yaml.safe_dump(nested({"model.name": str(chat_policy), "reward.source": "environment",
        "data.train": str(word_prompts), "output_dir": str(tmp_path / "run"), "rollout.environment": f"{ENVS}:Broken",
        "sampling.max_new_tokens": 6, "grpo.steps": 1, "batch.size": 2, "grpo.group_size": 2})))  # fmt: skip
    assert cli.main(["grpo", "--config", str(path), "--run.no-progress"]) == 2
    err = capsys.readouterr().err
    assert f"{ENVS}:Broken.step (episode " in err and "raised KeyError: 'score'" in err and "Traceback" not in err
