"""What every trainer's ``run`` shares around its loop: the RL inputs set up before the models, the run
directory opened (``config.yaml``, ``metrics.jsonl``, resume or a fresh start) and the held-out evaluation
of PPO and GRPO.

The parts a step is made of live by what they are about: sampling in `rlhf.rollout.generation`, scoring in
`rlhf.rollout.scoring`, micro-batching in `rlhf.trainers.update`, resumable state in
`rlhf.runlog.train_state`, samples on disk in `rlhf.runlog.samples`.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from rlhf.config import ConfigError, config_to_dict, config_to_yaml
from rlhf.data import held_out, load_prompts
from rlhf.data.stream import PromptBatch
from rlhf.data.tokenization import stop_token_ids
from rlhf.models.loading import load_tokenizer
from rlhf.rollout import generation, scoring
from rlhf.rollout.engine import SamplingParams
from rlhf.rollout.rewards import RewardSet
from rlhf.runlog import distributed, samples
from rlhf.runlog.distributed import SINGLE, Dist
from rlhf.runlog.health import HealthLog
from rlhf.runlog.metrics import MetricsLogger, NoLogger, Stopwatch
from rlhf.runlog.rundir import atomic_write_text, clear_run
from rlhf.runlog.seeding import seed_everything

MAX_HELD_OUT = 32
"""Held-out prompts answered at every eval step: the first ones of ``data.eval``, or a slice of ``data.train``."""


def device_for_run() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


@dataclasses.dataclass(frozen=True)
class RLInputs:
    """What PPO and GRPO set up before their models (:func:`rl_inputs`)."""

    d: Dist
    tokenizer: Any
    stops: list[int]
    train_prompts: list
    eval_prompts: list
    rewards: RewardSet
    sampling: SamplingParams


def rl_inputs(config: Any) -> RLInputs:
    """Check every input (model paths, reward sources, stop token) before anything loads, seed every generator,
    then the policy's tokenizer, the stop token ids, the training and held-out prompts, the reward sources and
    the sampling settings."""
    from rlhf.inputs import check_inputs

    check_inputs(config)
    d = distributed.current()
    seed_everything(config.run.seed)
    tokenizer = load_tokenizer(config.model.name)
    train_prompts, eval_prompts = rl_prompts(config, tokenizer)
    sampling = SamplingParams.of(config.sampling)
    stops = stop_token_ids(tokenizer, config.sampling.stop)
    rewards = scoring.load_rewards(config, tokenizer, d)
    return RLInputs(d, tokenizer, stops, train_prompts, eval_prompts, rewards, sampling)


def write_run_config(output_dir: Path, config: Any) -> None:
    atomic_write_text(output_dir / "config.yaml", config_to_yaml(config))


def open_run(
    output_dir: Path, config: Any, checkpoint: Path | None, start: int, d: Dist = SINGLE
) -> MetricsLogger | NoLogger:
    """Say whether the run resumes, write ``config.yaml`` and open ``metrics.jsonl``.

    Resuming from ``checkpoint`` (at step ``start``) keeps the metric rows before ``start + 1``. Otherwise
    the previous run's files are deleted first (``--run.overwrite``, or a resume with nothing to resume), so no
    stale checkpoint or sample survives; `rundir.claim` has already refused a run nobody asked to replace.
    Shared by every trainer so resumes read the same everywhere. Under ``torchrun`` rank 0 alone does this
    (the others get a `NoLogger`), after every rank has checked that the global batch gives it rows.
    """
    if config.batch.size < d.world_size:
        raise ConfigError(
            f"{config.COMMAND}: batch.size={config.batch.size} is global (all ranks together) and gives no rows to "
            f"some of the {d.world_size} ranks; use a batch.size of at least {d.world_size} or fewer processes"
        )
    if not d.is_main:
        return NoLogger()
    if checkpoint is not None:
        print(f"resuming from {checkpoint} (step {start})", file=sys.stderr)
    else:
        if config.run.resume:
            print(f"resume: no checkpoint under {output_dir / 'checkpoints'}; starting from step 0",
                  file=sys.stderr)  # fmt: skip
        clear_run(output_dir)
    write_run_config(output_dir, config)
    resume_step = start + 1 if checkpoint is not None else None
    logger = MetricsLogger(
        output_dir, config.run.report_to, resume_step=resume_step, run_config=config_to_dict(config),
        run_name=config.run.name,
    )
    doctor = getattr(config, "doctor", None)  # ppo and grpo
    if doctor is not None and doctor.alarms:
        logger.health = HealthLog(output_dir, config_to_dict(config), logger.kept, resume_step, doctor.stop_on)
    return logger


def doctor_stops(config: Any, logger: MetricsLogger | NoLogger, d: Dist = SINGLE) -> bool:
    """Whether the run stops now: a finding at least as severe as ``doctor.stop_on`` started at this step. Rank 0
    watches the metrics; every rank gets its answer (a collective, so only when stop_on is set)."""
    if config.doctor.stop_on == "never" or not config.doctor.alarms:
        return False
    event = d.broadcast(logger.health.stop if logger.health is not None else None)
    if event is not None and d.is_main:
        print(f"doctor: stopping at step {event.step} (doctor.stop_on: {config.doctor.stop_on}) on {event.rule.name}; "
              f"a checkpoint is saved and final/ holds this step's policy. To go on: --run.resume "
              f"--doctor.stop_on never", file=sys.stderr)  # fmt: skip
    return event is not None


def rl_prompts(config: Any, tokenizer: Any) -> tuple[list, list]:
    """Training prompts, and held-out ones: ``data.eval``, else a small deterministic slice of ``data.train``."""
    prompts = load_prompts(config.data.train, tokenizer, config.sampling.max_prompt_length)
    if config.data.eval:
        return prompts, load_prompts(config.data.eval, tokenizer, config.sampling.max_prompt_length)[:MAX_HELD_OUT]
    n = min(MAX_HELD_OUT, len(prompts) // 10)
    if n == 0:
        return prompts, []
    return held_out(prompts, n, seed=config.run.seed)


def clipped_objective(config: Any, step: int, d: Dist = SINGLE) -> bool:
    """Whether ``step`` trains on the clipped surrogate, or on the unclipped policy-gradient loss of the warm-up
    (the first ``warmup_pg_steps`` steps). The main rank says on stderr when the warm-up starts and ends."""
    warmup = config.algorithm.warmup_pg_steps
    if warmup and d.is_main and step in (1, warmup + 1):
        what = (f"steps 1-{warmup} use the vanilla policy-gradient loss (warmup_pg_steps={warmup})" if step == 1
                else f"step {step}: the vanilla policy-gradient warm-up is over; the clipped objective takes over")
        print(what, file=sys.stderr)
    return step > warmup


def policy_frozen(config: Any, step: int, d: Dist = SINGLE) -> bool:
    """Whether ``step`` is one of the critic warm-up's value-only steps (``ppo.critic_warmup_steps``): the policy's
    parameters are held. The main rank says on stderr when the warm-up starts and ends."""
    warmup = config.ppo.critic_warmup_steps
    if warmup and d.is_main and step in (1, warmup + 1):
        what = (f"steps 1-{warmup} fit the value function only; the policy is held (critic_warmup_steps={warmup})"
                if step == 1 else f"step {step}: the critic warm-up is over; the policy trains")  # fmt: skip
        print(what, file=sys.stderr)
    return step <= warmup


def step_metrics(step: int, scores: Any, generated: Any, lr: float, watch: Stopwatch, *stats: dict) -> dict:
    """The training row of one ppo/grpo step: ``step``, ``reward/*``, each phase's ``stats``, ``response/*``,
    ``lr``, ``time/*`` (scoring's own seconds as ``time/score_s``) and ``throughput/tokens_per_s``."""
    metrics = {"step": step, **scoring.reward_metrics(scores)}
    for part in stats:
        metrics.update(part)
    metrics.update(generation.response_metrics(generated))
    times = watch.metrics()
    metrics.update({"lr": lr, **times, "time/score_s": scores.seconds,
                    "throughput/tokens_per_s": metrics["response/tokens"] / times["time/step_s"]})  # fmt: skip
    return metrics


def end_step(
    config: Any, inputs: RLInputs, policy: nn.Module, logger: MetricsLogger | NoLogger, step: int,
    metrics: dict[str, Any], trainer_state: Any, prompts: list[str], generated: Any, scores: Any,
) -> None:  # fmt: skip
    """After a ppo/grpo update: this step's completions to ``completions/`` (rank 0, when due), then the
    held-out answers and the step's row (`evaluate_and_log`)."""
    out, d = Path(config.output_dir), inputs.d
    if d.is_main:
        samples.log_completions(config, out, step, prompts, generated.completions, scores)
    evaluate_and_log(config, policy, inputs.tokenizer, inputs.rewards, inputs.eval_prompts, inputs.stops, d.device,
                     out, step, metrics, logger, trainer_state, d)  # fmt: skip


def evaluate_start(
    config: Any, inputs: RLInputs, policy: nn.Module, logger: MetricsLogger | NoLogger, stream: Any, start: int
) -> None:
    """Step 0 of a fresh run: the policy's held-out answers before its first update, logged as the row ``{"step":
    0, "eval/reward/*"}`` (and ``samples/step_000000.jsonl``), so every run's curves start from its own starting
    point. A resumed run already has that row. Sampling uses the evaluation's own generator: training's
    trajectory is the same with or without it."""
    if start > 0 or not inputs.eval_prompts:
        return
    t0 = time.perf_counter()
    trainer_state = scoring.make_trainer_state(config, 0, stream, config.batch.size)
    metrics = evaluate(config, policy, inputs.tokenizer, inputs.rewards, inputs.eval_prompts, inputs.stops,
                       inputs.d.device, Path(config.output_dir), 0, trainer_state, inputs.d)  # fmt: skip
    logger.log({"step": 0, **metrics, "time/eval_s": time.perf_counter() - t0})


def evaluate_and_log(
    config: Any, policy: nn.Module, tokenizer: Any, rewards: Any, prompts: list, stops: list[int],
    device: torch.device, out: Path, step: int, metrics: dict[str, Any], logger: MetricsLogger | NoLogger,
    trainer_state: Any = None, d: Dist = SINGLE,
) -> None:  # fmt: skip
    """End of an RL step: answer the held-out prompts when due (every ``run.eval_every`` steps and at the last),
    adding ``eval/reward/*`` to this step's ``metrics``, then log the row when due (every ``log_every``).
    ``trainer_state``: what reward functions get as ``trainer_state`` on the held-out prompts."""
    evaluating = bool(prompts) and (
        (config.run.eval_every > 0 and step % config.run.eval_every == 0) or step == config.steps
    )
    if evaluating:
        start = time.perf_counter()
        metrics.update(
            evaluate(config, policy, tokenizer, rewards, prompts, stops, device, out, step, trainer_state, d)
        )
        metrics["time/eval_s"] = time.perf_counter() - start
    if evaluating or step % config.run.log_every == 0 or step == config.steps:
        logger.log(metrics)


@torch.no_grad()
def evaluate(
    config: Any, policy: nn.Module, tokenizer: Any, rewards: Any, prompts: list, stops: list[int],
    device: torch.device, out: Path, step: int, trainer_state: Any = None, d: Dist = SINGLE,
) -> dict[str, float]:  # fmt: skip
    """Answer the held-out prompts (same sampler, a fixed seed so steps are comparable), write them to
    ``samples/step_NNNNNN.jsonl`` (rank 0) and return ``eval/reward/*``. Each rank answers and scores its
    share; the rows are gathered."""
    sampling = SamplingParams.of(config.sampling)
    generator = torch.Generator(device).manual_seed(config.run.seed + 2)
    prompt_batch = PromptBatch.of(prompts, range(len(prompts)))
    generated = generation.generate(policy, tokenizer, prompt_batch, sampling, stops, generator, device, d=d,
                               max_rows=config.effective_micro_batch_size)  # fmt: skip
    context = scoring.reward_context(prompt_batch, generated, trainer_state=trainer_state)
    scores = scoring.score(rewards, prompt_batch.texts, generated.completions, prompt_batch.columns,
                           config.reward.aggregation, token_ids=generated.token_ids, context=context, d=d)
    if d.is_main:
        samples.write_samples(out, step, prompt_batch.texts, generated.completions, scores)
    return scoring.reward_metrics(scores, prefix="eval/reward")
