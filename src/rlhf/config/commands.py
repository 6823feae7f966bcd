"""The other commands' configs (sample, eval, demo, report, doctor, label) and the table of every command."""

import difflib
from typing import Annotated, Literal

from pydantic import Field

from rlhf.config.base import ConfigError, Count, NonNegativeInt, Positive, Text, _defaults, section
from rlhf.config.sections import (
    BestOfSection,
    JudgeSection,
    ModelSection,
    RewardSection,
    SampleJudgeSection,
    SamplingSection,
    TemplateKwargs,
    _check_sources,
    llm_judge,
)
from rlhf.config.training import CommandConfig, DPOConfig, GRPOConfig, PPOConfig, RMConfig, SFTConfig


@section
class SampleConfig(CommandConfig, command="sample"):
    """Sample num_samples completions per prompt and write them as candidates, pairs for labelling, judge-labelled preferences (for `rlhf rm`) or best-of-N demonstrations (for `rlhf sft`)."""

    model: ModelSection
    """The model to sample from."""
    prompts: Text
    """Prompts file ({"prompt"} or {"messages"} rows; other keys are columns, passed to the judge): JSONL, JSON, Parquet or a `datasets` directory."""
    output: Text
    """JSONL file to write; its rows depend on mode (candidates: {prompt, completions, [rewards]}; pairs: {prompt, a, b}; preferences: {prompt, chosen, rejected}; best_of_n: {prompt, response, reward})."""
    mode: Literal["candidates", "pairs", "preferences", "best_of_n"] = "candidates"
    """candidates: one row per prompt with its num_samples completions; pairs: completion pairs for human labelling; preferences: the judge's best and worst completion as chosen/rejected (prompts where they tie are skipped); best_of_n: the judge's best completion as an SFT demonstration (rejection-sampling fine-tuning)."""
    num_samples: Count = 4
    """k, completions sampled per prompt (≥ 2 for pairs and preferences)."""
    pairing: Literal["adjacent", "all"] = "adjacent"
    """mode='pairs', and preferences with an LLM judge: adjacent = samples (1, 2), (3, 4), … (each completion in one pair, k // 2 pairs); all = every one of the k·(k−1)/2 pairs."""
    judge: SampleJudgeSection = _defaults(SampleJudgeSection)
    """Scores the completions (needed by preferences and best_of_n, optional for candidates, not used by pairs), or compares them (an LLM judge, mode preferences: each pair of `pairing` in both orders)."""
    sampling: SamplingSection = _defaults(SamplingSection)
    """Completion generation."""
    chat_template_kwargs: TemplateKwargs = None
    """Extra variables of the model's chat template for the prompts (TRL's chat_template_kwargs), e.g. {enable_thinking: false}; None = what the model's tokenizer records (a model trained by rlhf with data.chat_template_kwargs), else the template's defaults."""
    batch_size: Count = 8
    """Prompts per generation call (each sampled num_samples times)."""
    seed: NonNegativeInt = 0
    """Seed of sampling: the same seed, model, prompts and batch_size write the same file."""
    summary: bool = False
    """Also write the run's counts, mean judge score and timings to <output>.summary.json (they always go to stderr)."""
    overwrite: bool = False
    """Replace output (and <output>.summary.json) if it exists; without it an existing file is refused before any sampling."""
    progress: bool = True
    """Show a progress bar on the console."""

    def _check(self) -> None:
        if self.mode in ("pairs", "preferences") and self.num_samples < 2:
            raise ConfigError(
                f"num_samples={self.num_samples} is out of range; it must be ≥ 2 with mode='{self.mode}' "
                "(a pair needs two)"
            )
        if self.mode in ("preferences", "best_of_n") and self.judge.source is None:
            raise ConfigError(
                f"mode='{self.mode}' needs a judge to rank the samples; set judge.source to a reward-model "
                "directory, file.py:function, module:function, URL or a list of {source, weight, name} "
                "(or use mode='pairs' to label pairs by hand)"
            )
        if self.mode == "pairs" and self.judge.source is not None:
            raise ConfigError(
                "judge is not used by mode='pairs' (pairs are written for human labelling); use "
                "mode='preferences' to let the judge pick chosen and rejected, or leave judge.source unset"
            )
        _check_sources("judge", self.judge, pairwise=True)
        if llm_judge(self.judge.source) is not None and self.mode != "preferences":
            raise ConfigError(
                f"judge.source={self.judge.source!r} is an LLM judge, which compares pairs: it labels "
                f"mode='preferences' only (mode='{self.mode}' needs a score per answer)"
            )


@section
class EvalConfig(CommandConfig, command="eval"):
    """Generate on held-out prompts and score the completions with a reward; with a baseline, also the policy's win rate against it under a judge."""

    model: ModelSection
    """The model to evaluate (e.g. a run's final/)."""
    eval_data: Text
    """Held-out prompts ({"prompt"} or {"messages"} rows; other keys are columns, passed to the reward)."""
    reward: RewardSection
    """Reported as reward/mean, reward/std and reward/<name>/mean."""
    baseline: Text | None = None
    """Model B to compare the policy with (a hub id or a directory), sampled on the same prompts with the same seed; None = no comparison."""
    judge: JudgeSection = _defaults(JudgeSection)
    """Decides each policy-vs-baseline comparison (higher score wins, equal scores tie); source None = the reward. Needs baseline."""
    reference: Text | None = None
    """Measure the KL of the policy's answers from this model (usually the one it was trained from; same tokenizer): kl/mean = the mean over answers of Σ_t log π(y_t) − log π_ref(y_t) at the sampling temperature; None = not measured."""
    best_of: BestOfSection = _defaults(BestOfSection)
    """Best-of-N: the policy's answer to a prompt is the best of best_of.n samples under best_of.source (the baseline still answers once)."""
    sampling: SamplingSection = _defaults(SamplingSection, temperature=0.7)
    """Completion generation."""
    chat_template_kwargs: TemplateKwargs = None
    """Extra variables of the policy's chat template for its prompts (TRL's chat_template_kwargs), e.g. {enable_thinking: false}; None = what the model's tokenizer records (a model trained by rlhf with data.chat_template_kwargs), else the template's defaults. The baseline renders with its own."""
    output: Text | None = None
    """JSON file for the results; None = print them to stdout."""
    samples_output: Text | None = None
    """JSONL file with one row per prompt: its completion(s) and scores; None = not written."""
    max_prompts: Count | None = None
    """Evaluate only the first this many prompts; None = all."""
    batch_size: Count = 16
    """Prompts per generation call."""
    seed: NonNegativeInt = 0
    """Seed of sampling (the policy and the baseline each start from it): the same seed gives the same results."""
    overwrite: bool = False
    """Replace output and samples_output if they exist; without it an existing file is refused before any work."""
    progress: bool = True
    """Show a progress bar on the console."""

    def _check(self) -> None:
        _check_sources("reward", self.reward)
        if self.judge.source is not None and self.baseline is None:
            raise ConfigError(
                "judge decides the win rate against baseline, which is not set; set baseline "
                "(model B) or leave judge.source unset"
            )
        _check_sources("judge", self.judge)
        _check_sources("best_of", self.best_of)
        if self.reference is not None and self.best_of.n > 1:
            raise ConfigError(
                f"reference measures the KL of the policy's own samples, and a best-of-{self.best_of.n} "
                "answer is not one (its KL from the sampled model is at most log n − (n−1)/n, reported as "
                "kl/best_of_n_bound); drop reference or set best_of.n to 1"
            )
        if self.output is not None and self.output == self.samples_output:
            raise ConfigError(f"output and samples_output are both {self.output!r}; give them different files")


@section
class DemoConfig(CommandConfig, command="demo"):
    """The whole RLHF pipeline on a built-in advice task, offline: pretrain → SFT → sample → gold-judged rankings → reward models and DPO → PPO (and PPO without its KL penalty, to show what the penalty prevents) and GRPO → SFT, best-of-N, DPO, PPO and GRPO compared on the same held-out prompts under the gold judge → report.html."""

    output_dir: Text = "runs/demo"
    """Directory for the demo: one run directory per stage, summary.json."""
    preset: Literal["tiny", "small"] = "small"
    """Size of the demo (sizes in rlhf.demo.pipeline.PRESETS): tiny (seconds; a smoke test of every stage) or small (a few CPU minutes; every method beats SFT under the gold judge)."""
    steps: Count | None = None
    """Iterations of both PPO and GRPO; None = the preset's own."""
    seed: NonNegativeInt = 0
    """Seed for every random number generator."""
    overwrite: bool = False
    """Replace a demo already in output_dir (its stage directories, data/, summary.json and report.html; other files are left alone); without it such a directory is refused."""
    progress: bool = True
    """Show a progress bar on the console."""


@section
class ReportConfig(CommandConfig, command="report"):
    """A self-contained HTML report of a ppo/grpo run, or of an rlhf demo directory: training curves, reward against KL, held-out answers, the config. `rlhf report RUN_DIR` is short for --run_dir RUN_DIR."""

    run_dir: Text
    """The output_dir of a ppo or grpo run (config.yaml, metrics.jsonl, samples/), or of rlhf demo."""
    output: Text | None = None
    """Where to write the HTML file; None = RUN_DIR/report.html."""
    max_samples: Count = 12
    """Held-out prompts shown in the answers table."""


@section
class DoctorConfig(CommandConfig, command="doctor"):
    """The training doctor: replay its rules over a run's metrics (finished, crashed or running) and print a verdict — healthy, or each finding with its steps, evidence and the fix to try. Exit code 0 healthy, 1 warnings, 2 critical. `rlhf doctor RUN_DIR` is short for --run_dir RUN_DIR."""

    run_dir: Text
    """The output_dir of an sft, rm, dpo, ppo or grpo run (config.yaml, metrics.jsonl), or a directory of runs such as rlhf demo's."""
    json: bool = False
    """Print the verdict as JSON (status, exit_code, and per run its findings with steps, evidence and fix)."""


@section
class LabelConfig(CommandConfig, command="label"):
    """Label pairs: in the browser (a local web page, one or several people), or with an LLM judge; or print the statistics of labels files. `rlhf label PAIRS.jsonl --out PREFS.jsonl` is short for --pairs PAIRS.jsonl --out PREFS.jsonl."""

    pairs: Text | None = None
    """The pairs to label: what `rlhf sample` writes with mode pairs ({prompt, a, b}) or candidates ({prompt, completions}: every pair of them)."""
    out: Text | None = None
    """The labels file, appended to (a restart continues it): preference rows that `rlhf rm` trains on, plus ties, skips and undos."""
    stats: tuple[Text, ...] = ()
    """Instead of labelling: print the statistics of these labels files (counts per labeller, tie and skip rates, position bias, agreement)."""
    json: bool = False
    """With stats: print them as JSON."""
    host: Text = "127.0.0.1"
    """Address to listen on; anything but loopback (e.g. 0.0.0.0, for other machines) requires an access token."""
    port: Annotated[int, Field(ge=0, le=65535)] = 8765
    """Port to listen on; 0 = any free one (the URL printed says which)."""
    token: str | None = None
    """Access token required on every request; None = $RLHF_LABEL_TOKEN, else generated when host is not loopback (and printed in the URL), else none."""
    mode: Literal["auto", "pairs", "ranking"] = "auto"
    """How a candidates file ({prompt, completions}) is labelled: ranking = its k answers put in order at once (one row, kind ranking, read as its k(k−1)/2 pairs); pairs = two answers at a time; auto = ranking on the page when a row has 3 or more answers, pairs with an LLM judge. A pairs file ({prompt, a, b}) is always labelled in pairs."""
    labels_per_pair: Count = 1
    """How many different labellers decide each pair (agreement needs ≥ 2); a pair is never shown twice to one labeller."""
    lease_seconds: Positive = 600.0
    """How long a pair shown to a labeller is kept for them before another labeller may get it."""
    ratings: bool = True
    """Show the optional 👍 😐 👎 rating under each answer."""
    judge: SampleJudgeSection = _defaults(SampleJudgeSection)
    """Label the pairs with an LLM judge (source openai:URL#MODEL) instead of the web page."""

    def _check(self) -> None:
        if self.stats:
            if self.pairs is not None or self.judge.source is not None:
                raise ConfigError("stats prints the statistics of labels files; leave pairs and judge.source unset")
            return
        if self.pairs is None or self.out is None:
            missing = " and ".join(name for name in ("pairs", "out") if getattr(self, name) is None)
            raise ConfigError(
                f"{missing} not set: `rlhf label PAIRS.jsonl --out PREFS.jsonl` labels pairs, "
                "`rlhf label --stats PREFS.jsonl` prints statistics"
            )
        if self.judge.source is not None:
            _check_sources("judge", self.judge, pairwise=True)
            if llm_judge(self.judge.source) is None:
                raise ConfigError(
                    f"judge.source={self.judge.source!r}: labelling pairs takes an LLM judge "
                    "(openai:URL#MODEL); to rank answers with a reward model use `rlhf sample --mode preferences`"
                )


COMMANDS: dict[str, type[CommandConfig]] = {
    "sft": SFTConfig, "rm": RMConfig, "dpo": DPOConfig, "ppo": PPOConfig, "grpo": GRPOConfig,
    "sample": SampleConfig, "eval": EvalConfig, "demo": DemoConfig, "report": ReportConfig, "label": LabelConfig,
    "doctor": DoctorConfig,
}  # fmt: skip


def config_class(command: str) -> type[CommandConfig]:
    """The config class of `command`; ConfigError (with the closest command) when there is no such command."""
    if command not in COMMANDS:
        close = difflib.get_close_matches(command, list(COMMANDS), n=1)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        raise ConfigError(f"unknown command '{command}'{hint} (commands: {', '.join(COMMANDS)})")
    return COMMANDS[command]
