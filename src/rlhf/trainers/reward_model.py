"""Reward-model training (`rlhf rm`): a Bradley–Terry model on preference pairs, read top to bottom in `run`.

(1) Load the model and *all* the data (a malformed row stops the command with ``file:line`` before any step), the
pairs grouped by prompt (`rlhf.data.groups`) → (2)-(6) the loop SFT, RM and DPO share (`rlhf.trainers.supervised`),
each step's prompts in passes of answers, every answer forwarded once, the loss over the prompts' pairs
(docs/rankings.md) → (7) optional reward normalisation → (8) ``final/``. All math is in ``rlhf.core.preference``.

Conventions (checklist numbers from ``docs/ppo_checklist.md``):
- input = prompt ⊕ response + eos, the reward read at the last real token (items 14, 21), right padding; a
  decoder gets a fresh ``score`` head (item 15), an encoder keeps its classifier and reads its tokenizer's
  ``[CLS] prompt+response [SEP]``, no eos, as ``RewardModelReward`` scores it (``rlhf.models.reward``);
- loss ``−log σ(r_c − r_r − margin)`` (margin when ``use_margin`` and the data has one, else 0) plus
  ``center_rewards_coefficient · mean((r_c + r_r)²)`` (item 16, TRL); accuracy is strict, ``r_c > r_r``
  (item 17);
- normalisation (item 19, OAI "after training" only): ``gain = 1/σ_D``, ``bias = −gain·μ_D`` over the raw
  scores of ``normalize.samples`` responses of ``normalize.policy``, population std (OAI), an ensemble's members
  all on the same responses; how consumers apply it: docs/architecture.md, "Reward sources".
Deviations from the references: several epochs are allowed (OAI/N+ train one); the schedule is the shared
``lr_scheduler`` (``linear`` = OAI's anneal to 0); no "before training" normalisation (OAI sets one so that
the untrained head matches the label scale — irrelevant for comparisons).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import shutil
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from rlhf import planning
from rlhf.config import ConfigError, RMConfig, config_from_dict, config_to_dict
from rlhf.core.preference import ensemble_reward, normalization_gain_bias, pairwise_accuracy, ranking_loss
from rlhf.data import (
    PromptExample,
    TokenizedPreference,
    TokenizedPrompt,
    read_preferences,
    read_prompts,
    right_pad,
    tokenize_prompts,
)
from rlhf.data.groups import PreferenceGroup, group_preferences
from rlhf.data.stream import PromptBatch, fingerprint_of
from rlhf.data.tokenization import stop_token_ids
from rlhf.models.loading import apply_lora, checkpointed
from rlhf.models.precision import bf16_enabled, compute_in_bf16
from rlhf.models.reward import (
    RewardScorer,
    TrainableRewardModel,
    clear_reward_normalization,
    load_reward_model,
    max_positions,
    reward_normalization,
    set_reward_normalization,
    tokenize_pairs,
)
from rlhf.models.sharding import materialize, shard, shard_small, unsharded
from rlhf.rollout import generation
from rlhf.rollout.rewards.ensemble import MANIFEST
from rlhf.runlog import distributed, rundir
from rlhf.runlog.distributed import SINGLE, Dist
from rlhf.trainers import supervised
from rlhf.trainers.update import Trainable

MEMBERS = "members"
"""In an ensemble's ``output_dir``: each member's run directory, ``members/member_<m>/``."""
NORMALIZATION_FILE = "normalization.jsonl"
"""In ``output_dir``: one row per normalisation sample — prompt, completion, raw score, normalised score."""


@distributed.entry
@rundir.claims_output_dir
def run(config: RMConfig) -> Path:
    """Train a reward model on ``config.data.train``, or an ensemble of ``rm.ensemble`` (:func:`train_ensemble`);
    returns the ``final/`` directory."""
    return train_ensemble(config) if config.rm.ensemble > 1 else train_one(config)


def train_one(config: RMConfig) -> Path:
    """Train one reward model into ``config.output_dir``; returns its ``final/`` directory."""
    out, d = Path(config.output_dir), supervised.start(config)
    # 1. every pair, tokenized as the model reads them (its architecture and tokenizer: no weights yet), the
    # memory plan, then the model (fresh head N(0, 1/sqrt(H+1)) when it has none)
    with torch.device("meta"):
        shell = load_reward_model(config.model.name, config.model.dtype, "meta", config.data.chat_template_kwargs)
    train, held_out = load_pairs(config, shell)
    groups, held_out_groups = group_preferences(train), group_preferences(held_out)
    supervised.check_passes(config, groups, d)  # held-out answers are scored without gradient, in any passes
    positions, answers = planning.sequence_positions(train + held_out), planning.most_answers(groups)
    planning.check(config, d, positions, answers=answers)
    rm, scorer = load_scorer(config, d)
    say_pairs(rm, groups, held_out_groups, config.data.max_length)
    # 2-6. evaluation before training, then the steps: every answer of the step's prompts forwarded once, the
    # Bradley–Terry loss over their pairs, AdamW, evaluation, checkpoints
    trainable = Trainable(scorer, d)
    task = supervised.Task(
        trainable,
        supervised.OneModel("scorer", scorer, rm.model),
        step=functools.partial(train_step, config, rm, trainable, groups),
        evaluate=functools.partial(evaluate, config, scorer, rm, held_out_groups, d) if held_out else None,
        tokens=lambda rows: sum(groups[i].tokens() for i in rows),
    )
    fingerprint = fingerprint_of((g.prompt_ids, *g.answers, g.better, g.worse) for g in groups)
    supervised.train(config, task, len(groups), fingerprint, config.rm.epochs, d)
    # sharded: rank 0 alone continues, with a whole copy in a fresh model of the same build (the others are done)
    whole = [rm]

    def shell() -> nn.Module:
        whole[0] = load_trainable_reward_model(config, torch.device("cpu"))
        return RewardScorer(whole[0].hf_model)

    if unsharded(scorer, shell, d) is None:
        return out / "final"
    peft_or_hf = whole[0].model
    model = peft_or_hf.merge_and_unload() if hasattr(peft_or_hf, "merge_and_unload") else peft_or_hf
    # 7. gain and bias so that the policy's responses score mean 0, std 1 (stored in config.json)
    if config.normalize.policy:
        d_norm = SINGLE if d.sharded else d
        sample = normalization_sample(config, d.device, d_norm)
        normalize(config, model, rm.tokenizer, sample, device=d.device, out=out, d=d_norm)
    # 8. final/: loads with AutoModelForSequenceClassification (one output) and AutoTokenizer
    if d.is_main:
        with rundir.staged(out / "final") as staging:  # a crash while saving keeps the previous final/
            model.save_pretrained(staging / "final")
            rm.tokenizer.save_pretrained(staging / "final")
    return out / "final"


def train_ensemble(config: RMConfig) -> Path:
    """``rm.ensemble`` reward models, member m trained by :func:`train_one` with ``run.seed`` + m (the new head's
    draw and the order of the pairs) into ``members/member_<m>/``, a run directory of its own: on ``--run.resume``
    a finished member is kept (its config checked unchanged) and the one in progress continues from its checkpoint.
    With ``normalize.policy``, every member is then normalised on the same sample (:func:`normalize_members`). Then
    ``final/``: ``ensemble.json`` and each member's model (hard links to its ``final/``), which ``reward.source``
    reads as one source (`rlhf.rollout.rewards.ensemble`)."""
    out, d = Path(config.output_dir), distributed.current()
    members = [member_config(config, m) for m in range(config.rm.ensemble)]
    runs = [Path(member.output_dir) for member in members]
    finished = [config.run.resume and (run / "final").is_dir() for run in runs]
    for member, run, done in zip(members, runs, finished, strict=True):
        if done and (changed := rundir.config_changes(run / "config.yaml", member)):
            raise ConfigError(f"rm: resume: ensemble member {run.name} was trained with {'; '.join(changed)}")
    if d.is_main:
        if not config.run.resume:  # --run.overwrite: nothing of the previous run may pass for a finished member
            rundir.clear_run(out)
        rundir.write_run_config(out, config)
    for m, (member, done) in enumerate(zip(members, finished, strict=True)):
        if not done:
            print(f"rm: ensemble member {m + 1} of {len(members)}, run.seed {member.run.seed}", file=sys.stderr)
            rundir.claims_output_dir(train_one)(member)
    if d.is_main:
        if config.normalize.policy:  # after every member, on one sample (each member trained without normalize)
            normalize_members(config, runs, d.device)
        accuracy = held_out_accuracy(config, [run / "final" for run in runs], d.device)
        with rundir.staged(out / "final") as staging:
            for run in runs:
                shutil.copytree(run / "final", staging / "final" / run.name, copy_function=link_or_copy)
            manifest = {"members": [run.name for run in runs], "seeds": [member.run.seed for member in members]}
            text = json.dumps(manifest | {"held_out_accuracy": accuracy}, indent=1) + "\n"
            (staging / "final" / MANIFEST).write_text(text)
    return out / "final"


def member_config(config: RMConfig, m: int) -> RMConfig:
    """The config of ensemble member ``m``: one reward model, ``run.seed`` + m, in ``members/member_<m>/``, not
    normalised on its own (the ensemble normalises its members together: :func:`normalize_members`)."""
    values = config_to_dict(config)
    values["output_dir"] = str(Path(config.output_dir) / MEMBERS / f"member_{m}")
    values["run"]["seed"] = config.run.seed + m
    values["rm"]["ensemble"] = 1
    values["normalize"] = {}
    return config_from_dict("rm", values)


def link_or_copy(source: str, target: str) -> None:
    """A hard link of ``source`` at ``target`` (no second copy of the weights), a copy where links fail."""
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


@torch.no_grad()
def held_out_accuracy(config: RMConfig, members: list[Path], device: torch.device) -> dict[str, float]:
    """Strict accuracy (r_c > r_r) on ``data.eval`` of each member and of the ensemble by each objective without a
    parameter (mean, wco), every member's scores normalised as consumers read them; {} without held-out pairs."""
    if not config.data.eval:
        return {}
    chosen, rejected = [], []
    for path in members:
        rm = load_reward_model(str(path), config.model.dtype, device, config.data.chat_template_kwargs)
        scorer = RewardScorer(rm.hf_model).eval()
        groups = group_preferences(tokenize_pairs(config.data.eval, rm, config.data.max_length))
        gain, bias = reward_normalization(rm.model.config)
        size = config.effective_micro_batch_size
        scores = scores_of(rm, groups, device)
        rewards = torch.cat(supervised.group_scores(scorer, groups, size, scores, Dist(device=device)))
        pairs = supervised.group_pairs(groups, len(groups))
        chosen.append(rewards[pairs["better"]] * gain + bias)
        rejected.append(rewards[pairs["worse"]] * gain + bias)
    accuracy = {
        path.parent.name: pairwise_accuracy(c, r).item() for path, c, r in zip(members, chosen, rejected, strict=True)
    }
    for objective in ("mean", "wco"):
        ensemble = [ensemble_reward(torch.stack(scores, -1), objective) for scores in (chosen, rejected)]
        accuracy[objective] = pairwise_accuracy(*ensemble).item()
    print("rm: held-out accuracy " + ", ".join(f"{k} {v:.3f}" for k, v in accuracy.items()), file=sys.stderr)
    return accuracy


def load_trainable_reward_model(config: RMConfig, device: str | torch.device) -> TrainableRewardModel:
    """The model to train (fresh head N(0, 1/sqrt(H+1)) when it has none), with LoRA adapters and gradient
    checkpointing when asked."""
    rm = load_reward_model(config.model.name, config.model.dtype, device, config.data.chat_template_kwargs)
    if config.model.lora:
        rm.model = apply_lora(rm.model, config.model.lora, task_type="SEQ_CLS")
    if config.model.gradient_checkpointing:
        rm.model = checkpointed(rm.model)
    return rm


def load_scorer(config: RMConfig, d: Dist) -> tuple[TrainableRewardModel, RewardScorer]:
    """The model to train and the `RewardScorer` module its forwards go through (the HF model's: LoRA layers
    sit inside it). Sharded runs build it empty on every rank, shard each decoder layer and the scorer as the
    root (embeddings, final norm, head), and fill it from rank 0's load (`rlhf.models.sharding.materialize`)."""
    if not d.sharded:
        rm = load_trainable_reward_model(config, d.device)
        scorer = RewardScorer(rm.hf_model)
    else:
        with torch.device("meta"):
            rm = load_trainable_reward_model(config, "meta")
        scorer = RewardScorer(rm.hf_model)
        shard(rm.hf_model, d.mesh, root=False)
        shard_small(scorer, d)
        full = load_trainable_reward_model(config, "cpu") if d.is_main else None
        materialize(scorer, RewardScorer(full.hf_model) if full is not None else None, d.mesh)
        rm = dataclasses.replace(rm, fresh_head=d.broadcast(full is not None and full.fresh_head))
    return rm, compute_in_bf16(scorer, d.device) if bf16_enabled(config.model.bf16, d.device) else scorer


def load_pairs(config: RMConfig, rm: TrainableRewardModel) -> tuple[list[TokenizedPreference], list]:
    """Training and held-out pairs, each file read, validated and tokenised whole (``DataError``: file:line):
    `rlhf.models.reward.tokenize_pairs`."""
    train = tokenize_pairs(config.data.train, rm, config.data.max_length)
    held_out = tokenize_pairs(config.data.eval, rm, config.data.max_length) if config.data.eval else []
    return train, held_out


def say_pairs(rm: TrainableRewardModel, train: list[PreferenceGroup], held_out: list, max_length: int) -> None:
    """One line on stderr: the model's kind, its head's origin, the prompts, answers and pairs and how many pairs
    were cut; a second when some prompt has contradicting labels."""
    kind = "decoder (score head on the causal trunk)" if rm.is_decoder else "encoder (its own classifier)"
    head = "fresh head N(0, 1/sqrt(H+1))" if rm.fresh_head else "head from the checkpoint"
    pairs, answers = sum(g.num_pairs for g in train), sum(len(g.answers) for g in train)
    cut = sum(g.truncated for g in train)
    print(
        f"rm: {kind}, {head}; {len(train)} training prompts with {answers} answers, each forwarded once per epoch, "
        f"and {pairs} pairs among them ({cut} cut to data.max_length={max_length}); "
        f"{sum(g.num_pairs for g in held_out)} pairs of {len(held_out)} prompts held out",
        file=sys.stderr,
    )
    if contradicting := sum(g.contradictions() > 0 for g in train):
        print(
            f"rm: {contradicting} training prompts have labels that contradict each other (a preferred to b and b "
            "to a): all are kept, as Bradley–Terry reads label noise (docs/rankings.md)",
            file=sys.stderr,
        )


def answer_rewards(
    scorer: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    groups: Sequence[PreferenceGroup],
    pad_id: int,
    device: torch.device,
    chunk: slice | None = None,
) -> torch.Tensor:
    """(N,) the rewards of the groups' answers, group after group (``chunk``: of the one group's answers only): one
    right-padded forward of ``scorer`` (`RewardScorer`, or the wrapper that trains it)."""
    sequences = [s for group in groups for s in group.sequences()]
    ids, mask = right_pad(sequences if chunk is None else sequences[chunk], pad_id)
    return scorer(ids.to(device), mask.to(device)).float()


def groups_loss(
    config: RMConfig, rewards: torch.Tensor, groups: Sequence[PreferenceGroup], step_groups: int, step_pairs: int
) -> tuple[torch.Tensor, dict[str, float]]:
    """The groups' share of the step's loss (`rlhf.core.preference.ranking_loss`; the step has ``step_groups``
    prompts and ``step_pairs`` pairs over all ranks) and their share of its ``loss``, ``accuracy`` (strict, over
    pairs) and ``reward_margin`` (mean r_better − r_worse over pairs)."""
    pairs = {key: value.to(rewards.device) for key, value in supervised.group_pairs(groups, step_groups).items()}
    margin = pairs["margin"].to(rewards.dtype) if config.rm.use_margin else None
    center = config.rm.center_rewards_coefficient or 0.0
    weights = pairs["weight"].to(rewards.dtype)
    loss, sums = ranking_loss(rewards, pairs["better"], pairs["worse"], weights, margin, center)
    return loss, {
        "loss": loss.item(),
        "accuracy": sums["correct"].item() / step_pairs,
        "reward_margin": sums["margin_sum"].item() / step_pairs,
    }


def scores_of(rm: TrainableRewardModel, groups: list[PreferenceGroup], device: torch.device) -> supervised.Scores:
    """The reward model's `rlhf.trainers.supervised.Scores`: the rewards of answers (`answer_rewards`)."""
    pad = rm.tokenizer.pad_token_id
    return lambda model, ids, chunk: answer_rewards(model, [groups[i] for i in ids], pad, device, chunk)


def objective_of(config: RMConfig, groups: list[PreferenceGroup], prefix: str) -> supervised.Objective:
    """The reward model's `rlhf.trainers.supervised.Objective` (`groups_loss`), its stats named ``prefix/…``."""

    def objective(rewards: torch.Tensor, ids: list[int], step_groups: int, step_pairs: int):
        loss, stats = groups_loss(config, rewards, [groups[i] for i in ids], step_groups, step_pairs)
        return loss, {f"{prefix}/{key}": value for key, value in stats.items()}

    return objective


def train_step(
    config: RMConfig, rm: TrainableRewardModel, trainable: Trainable, groups: list[PreferenceGroup], indices: list[int]
) -> dict[str, float]:
    """Phase 4: backward of the step's loss over the prompts ``indices``, every answer forwarded once, in passes of
    at most ``batch.micro_size`` answers (`rlhf.trainers.supervised.group_step`); returns the step's train stats
    over all ranks."""
    scores, objective = scores_of(rm, groups, trainable.d.device), objective_of(config, groups, "train")
    return supervised.group_step(trainable, indices, groups, config.batch.micro_size, scores, objective)


@torch.no_grad()
def evaluate(
    config: RMConfig, scorer: nn.Module, rm: TrainableRewardModel, groups: list[PreferenceGroup], d: Dist = SINGLE
) -> dict[str, float]:
    """The training objective over all held-out prompts (each weighed as a step weighs its prompts), strict
    accuracy and mean r_better − r_worse over their pairs (each rank scores its share; the sums are added over
    ranks)."""
    size = config.effective_micro_batch_size
    rewards = supervised.group_scores(scorer, groups, size, scores_of(rm, groups, d.device), d)
    mine = list(range(d.rank, len(groups), d.world_size))
    totals = {"eval/loss": 0.0, "eval/accuracy": 0.0, "eval/reward_margin": 0.0}
    if mine:
        num_pairs = sum(group.num_pairs for group in groups)
        _, totals = objective_of(config, groups, "eval")(torch.cat(rewards), mine, len(groups), num_pairs)
    return d.sum_values(totals)


@dataclasses.dataclass(frozen=True)
class NormalizationSample:
    """The responses a reward model is normalised on: ``normalize.samples`` answers of ``normalize.policy``, the
    same for every member of an ensemble (its members then share one scale, which wco and uwo compare)."""

    policy_tokenizer: Any
    prompts: list[str]
    completions: list[str]
    columns: dict[str, list]


def normalization_sample(config: RMConfig, device: torch.device, d: Dist = SINGLE) -> NormalizationSample:
    """Phase 7a: sample ``normalize.samples`` responses of ``normalize.policy`` (prompts drawn with ``run.seed``,
    cycling when few; each rank generates its share)."""
    from rlhf.models.loading import load_causal_lm, load_tokenizer
    from rlhf.rollout.engine import SamplingParams

    policy_tokenizer = load_tokenizer(config.normalize.policy, config.data.chat_template_kwargs)
    policy = load_causal_lm(config.normalize.policy, config.model.dtype, device)
    prompts = normalization_prompts(config, policy_tokenizer, max_positions(policy.config))
    order = torch.randperm(len(prompts), generator=torch.Generator().manual_seed(config.run.seed))
    picks = [int(order[i % len(prompts)]) for i in range(config.normalize.samples)]  # cycles when few
    sampling = SamplingParams(config.normalize.max_new_tokens, config.normalize.temperature)
    stops = stop_token_ids(policy_tokenizer, "eos")
    generator = torch.Generator().manual_seed(config.run.seed)  # row seeds only: the same on any device
    batch = PromptBatch.of(prompts, picks)
    size = config.effective_micro_batch_size
    generated = generation.generate(
        policy, policy_tokenizer, batch, sampling, stops, generator, device, d=d, max_rows=size
    )
    return NormalizationSample(policy_tokenizer, batch.texts, generated.completions, batch.columns)


def normalize(
    config: RMConfig,
    model: nn.Module,
    tokenizer: Any,
    sample: NormalizationSample,
    *,
    device: torch.device,
    out: Path,
    d: Dist = SINGLE,
) -> None:
    """Phase 7b (checklist item 19): score ``sample`` with the trained model exactly as consumers do
    (``RewardModelReward.score``, gain 1, bias 0) and store gain and bias in ``model.config``; writes
    ``normalization.jsonl`` into ``out`` (rank 0). Each rank scores its share."""
    from rlhf.rollout.rewards import RewardModelReward

    clear_reward_normalization(model.config)  # measure the raw head (OAI resets gain 1, bias 0 first)
    size = config.effective_micro_batch_size
    scorer = RewardModelReward(
        model, tokenizer, name="rm", policy_tokenizer=sample.policy_tokenizer, device=device, batch_size=size
    )
    mine = d.shard(len(sample.prompts))
    columns = {key: [values[i] for i in mine] for key, values in sample.columns.items()}
    local = scorer.score([sample.prompts[i] for i in mine], [sample.completions[i] for i in mine], columns)
    scores = d.gather_rows(local, len(sample.prompts))
    raw = torch.tensor(scores, dtype=torch.float64)
    gain, bias = (float(x) for x in normalization_gain_bias(raw, unbiased=False))
    if not (math.isfinite(gain) and math.isfinite(bias)):
        raise RuntimeError(
            f"normalisation: all {len(scores)} responses of {config.normalize.policy} got the same score "
            f"({scores[0]:.6g}); a gain cannot make them std 1 — is the reward model constant?"
        )
    set_reward_normalization(model.config, gain, bias)
    if not d.is_main:
        return
    with rundir.atomic_open(out / NORMALIZATION_FILE) as f:
        for prompt, completion, score in zip(sample.prompts, sample.completions, scores, strict=True):
            row = {"prompt": prompt, "completion": completion, "score": score, "normalized": gain * score + bias}
            f.write(json.dumps(row) + "\n")
    print(
        f"rm: normalised on {len(scores)} responses of {config.normalize.policy}: raw mean "
        f"{raw.mean().item():.4g}, std {raw.std(correction=0).item():.4g} → gain {gain:.4g}, bias {bias:.4g}",
        file=sys.stderr,
    )


def normalize_members(config: RMConfig, runs: list[Path], device: torch.device) -> None:
    """Normalise every member of an ensemble on one sample of the policy's responses (rank 0): the same prompts and
    answers score mean 0, std 1 under each member, so the members' scores share a scale (docs/ensembles.md). Each
    member's gain and bias go into its ``final/config.json``, its scores into its ``normalization.jsonl``."""
    sample = normalization_sample(config, device)
    for run in runs:
        rm = load_reward_model(str(run / "final"), config.model.dtype, device, config.data.chat_template_kwargs)
        normalize(config, rm.hf_model, rm.tokenizer, sample, device=device, out=run)
        rundir.atomic_write_text(run / "final" / "config.json", rm.hf_model.config.to_json_string())


def normalization_prompts(config: RMConfig, tokenizer: Any, positions: int | None) -> list[TokenizedPrompt]:
    """``normalize.prompts``, else the distinct prompts of ``data.train``, tokenised for the policy (kept short
    enough that ``normalize_max_new_tokens`` more fit its positions)."""
    if config.normalize.prompts:
        examples = read_prompts(config.normalize.prompts)
    else:
        examples = [
            PromptExample(ex.where, messages=ex.prompt)
            if isinstance(ex.prompt, list)
            else PromptExample(ex.where, prompt=ex.prompt)
            for ex in read_preferences(config.data.train)
        ]
    room = None if positions is None else positions - config.normalize.max_new_tokens
    if room is not None and room < 1:
        raise ValueError(
            f"normalize.max_new_tokens={config.normalize.max_new_tokens} leaves no room for a prompt in the "
            f"{positions} positions of {config.normalize.policy}; lower it"
        )
    distinct: dict[str, TokenizedPrompt] = {}
    for prompt in tokenize_prompts(examples, tokenizer, room):
        distinct.setdefault(prompt.text, prompt)
    return list(distinct.values())
