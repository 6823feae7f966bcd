"""The loop PPO and GRPO share (`train`, its phases numbered; function by function: docs/architecture.md, "One PPO
step"), its held-out evaluation and the doctor's stop."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from rlhf.config import PolicyGradientConfig
from rlhf.data.stream import PromptBatch, PromptStream
from rlhf.rollout import generation, scoring
from rlhf.runlog.distributed import SINGLE, Dist
from rlhf.runlog.metrics import MetricsLogger, NoLogger, Stopwatch, open_run
from rlhf.runlog.progress import StepProgress
from rlhf.runlog.train_state import TrainState
from rlhf.trainers.rl.inputs import Inputs, load_inputs, make_trainer_state
from rlhf.trainers.rl.models import Models, write_final
from rlhf.trainers.rl.rollout import Sampled, sample_and_score

if TYPE_CHECKING:
    from rlhf.trainers.rl.producer import Producer


class Algorithm:
    """What PPO and GRPO supply to :func:`train`: their models, how they sample and what they learn; an algorithm
    with state of its own (PPO's β) also overrides the after-step and the checkpoint methods."""

    config: PolicyGradientConfig
    inputs: Inputs
    models: Models
    updates_per_step: int
    """Optimizer steps per iteration (the schedule spans ``steps`` × this)."""

    @staticmethod
    def draw(
        config: PolicyGradientConfig,
        inputs: Inputs,
        models: Models,
        stream: PromptStream,
        generator: torch.Generator,
        trainer_state: Any,
    ) -> Sampled:
        """Phases 1-2: sample responses to the next prompts of ``stream`` with ``models`` and score them; a function
        of its arguments alone, which a sampling worker (`rlhf.trainers.rl.producer`) runs with models of its own."""
        raise NotImplementedError

    def learn(self, step: int, sampled: Sampled, state: TrainState, watch: Stopwatch) -> dict[str, float]:
        """The rollout's passes and the update (timed as ``logprobs`` and ``train``); their stats."""
        raise NotImplementedError

    def after_step(self, stats: dict[str, float]) -> dict[str, float]:
        """After the update (or its skip), with the step's stats so far: what to add to the row."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        """The algorithm's own state in a checkpoint."""
        return {}

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` from a checkpoint's entries."""


def train(config: PolicyGradientConfig, make: Callable[[Any, Inputs], Algorithm]) -> Path:
    """Train ``config.model.name`` with the algorithm ``make(config, inputs)`` builds; returns ``final/``."""
    inputs = load_inputs(config)
    out, d = Path(config.output_dir), inputs.d
    d.check_batch(config.COMMAND, config.batch.size)
    algorithm = make(config, inputs)
    models = algorithm.models
    stream = PromptStream(inputs.train_prompts, config.batch.size, seed=config.run.seed)
    total = config.steps * algorithm.updates_per_step
    params = models.trainable.parameters()
    state = TrainState.create(params, optim=config.optim, seed=config.run.seed, total_updates=total, stream=stream)
    checkpoint, saved = state.resume(config, models, d)
    algorithm.load_state_dict(saved)
    models.sync_engine()  # the policy as trained so far: adapters, a resumed checkpoint
    start = saved.get("step", 0)
    logger = open_run(config, checkpoint, start, d)
    if start == 0 and inputs.eval_prompts:  # step 0 (a resumed run has its row): every curve's own starting point
        logger.log({"step": 0, **evaluate(config, inputs, models, 0, stream)})
    unscored = scoring.UnscoredSteps()
    generator = state.generators["sampling"]
    if config.sampling.max_staleness == 0:
        batches: InProcess | Producer = InProcess(algorithm, stream, generator)
    else:  # a worker, started after step start with the batches the checkpoint held
        from rlhf.trainers.rl.producer import Producer

        pending = saved.get("in_flight", [])
        draw = type(algorithm).draw
        batches = Producer(
            config, draw, models.policy, done=start, pending=pending, stream=stream, generator=generator, d=d
        )
    progressing = StepProgress(config.steps, start, enabled=config.run.progress and d.is_main, health=logger.health)
    with batches, progressing as progress:
        for step in range(start + 1, config.steps + 1):
            watch = Stopwatch("rollout", "logprobs", "train")
            with watch("rollout"):  # 1. sample and score (k > 0: the worker's batch, drawn while the last one trained)
                sampled = batches.take(step)
            if isinstance(batches, InProcess):  # scoring has its own time/score_s (k > 0: rollout_s is the wait)
                watch.seconds["rollout"] -= sampled.scores.seconds
            learned = {}
            if not unscored.skip(step, sampled.rewards, sampled.scores.names):  # else nothing to learn: no update
                learned = algorithm.learn(step, sampled, state, watch)  # 2. rollout passes and update
                models.sync_engine()  # vLLM samples the updated policy from the next rollout (and eval) on
                if models.reference is not None:
                    models.reference.follow()  # 3. kl.reference_ema: the anchor moves after each update
            batches.publish(step, models.policy)  # k > 0: the weights after this step, for the worker
            stats = sampled.stats | learned
            stats |= algorithm.after_step(stats)  # 4. e.g. PPO's β for the next step
            metrics = step_metrics(step, sampled, state.scheduler.get_last_lr()[0], watch, stats)
            # 5. when due: the completions (rank 0), the held-out answers (every run.eval_every steps and at the last,
            # in this step's row), the row (every run.log_every steps)
            logging = step % config.run.log_every == 0 or step == config.steps
            if d.is_main and logging and sampled.scores.extra:  # a reward function logged columns (log_extra)
                sampled.write("completions", out, step)
            every = config.run.eval_every
            evaluating = bool(inputs.eval_prompts) and ((every > 0 and step % every == 0) or step == config.steps)
            if evaluating:
                metrics |= evaluate(config, inputs, models, step, stream)
            if evaluating or logging:
                logger.log(metrics)
            progress.update(step, metrics)
            stop = doctor_stops(config, logger, d)  # 6. doctor.stop_on: a finding that severe started
            if stop or (config.run.save_every and step % config.run.save_every == 0):  # 7.
                state.save(out, step, models, algorithm.state_dict() | batches.in_flight(step), d)
            if stop:
                break
    logger.close()
    write_final(models, inputs.tokenizer, out / "final", d)
    return out / "final"


class InProcess:
    """``sampling.max_staleness`` 0: the algorithm samples the batch of a step in this process, with the weights of
    the step before (the loop's batches, as `rlhf.trainers.rl.producer.Producer` is for k > 0)."""

    def __init__(self, algorithm: Algorithm, stream: PromptStream, generator: torch.Generator):
        self.algorithm, self.stream, self.generator = algorithm, stream, generator

    def take(self, step: int) -> Sampled:
        algorithm, stream = self.algorithm, self.stream
        trainer_state = make_trainer_state(algorithm.config, step - 1, stream)
        return algorithm.draw(
            algorithm.config, algorithm.inputs, algorithm.models, stream, self.generator, trainer_state
        )

    def publish(self, step: int, policy: torch.nn.Module) -> None:
        """Nothing: the next batch is sampled by the policy itself."""

    def in_flight(self, step: int) -> dict[str, Any]:
        return {}

    def __enter__(self) -> InProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


def step_metrics(step: int, sampled: Sampled, lr: float, watch: Stopwatch, stats: dict[str, float]) -> dict:
    """The training row of one step: ``step``, ``reward/*``, the step's ``stats``, ``response/*``, ``lr``,
    ``time/*`` (scoring's own seconds as ``time/score_s``) and ``throughput/tokens_per_s``."""
    metrics = {"step": step, **scoring.reward_metrics(sampled.scores), **stats}
    metrics |= generation.response_metrics(sampled.generated)
    times = watch.metrics() | {"time/score_s": sampled.scores.seconds}
    return metrics | {"lr": lr, **times, "throughput/tokens_per_s": metrics["response/tokens"] / times["time/step_s"]}


@torch.no_grad()
def evaluate(
    config: PolicyGradientConfig, inputs: Inputs, models: Models, step: int, stream: PromptStream
) -> dict[str, float]:
    """Answer the held-out prompts (same sampler, a fixed seed so steps are comparable), write them to
    ``samples/step_NNNNNN.jsonl`` (rank 0) and return ``eval/reward/*`` and ``time/eval_s``. Each rank answers and
    scores its share. Its own generator leaves training's trajectory the same with or without it."""
    t0 = time.perf_counter()
    trainer_state = make_trainer_state(config, step, stream)
    generator = torch.Generator().manual_seed(config.run.seed + 2)  # row seeds only: the same on any device
    batch = PromptBatch.of(inputs.eval_prompts, range(len(inputs.eval_prompts)))
    answered = sample_and_score(
        config, inputs, models, batch, generator, trainer_state, max_rows=config.effective_micro_batch_size
    )
    if inputs.d.is_main:
        answered.write("samples", Path(config.output_dir), step)
    return scoring.reward_metrics(answered.scores, prefix="eval/reward") | {"time/eval_s": time.perf_counter() - t0}


def doctor_stops(config: PolicyGradientConfig, logger: MetricsLogger | NoLogger, d: Dist = SINGLE) -> bool:
    """Whether the run stops now: a finding at least as severe as ``doctor.stop_on`` started at this step. Rank 0
    watches the metrics; every rank gets its answer (a collective, so only when stop_on is set)."""
    if config.doctor.stop_on == "never" or not config.doctor.alarms:
        return False
    event = d.broadcast(logger.health.stop if logger.health is not None else None)
    if event is not None and d.is_main:
        print(
            f"doctor: stopping at step {event.step} (doctor.stop_on: {config.doctor.stop_on}) on {event.rule.name}; "
            f"a checkpoint is saved and final/ holds this step's policy. To go on: --run.resume "
            f"--doctor.stop_on never",
            file=sys.stderr,
        )
    return event is not None
