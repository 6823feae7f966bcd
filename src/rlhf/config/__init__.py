"""One frozen, typed config per command, built from shared sections — what ``rlhf <command>`` accepts.

| command  | class          | runs                                              |
|----------|----------------|---------------------------------------------------|
| `sft`    | `SFTConfig`    | supervised fine-tuning                            |
| `rm`     | `RMConfig`     | Bradley–Terry reward model                        |
| `dpo`    | `DPOConfig`    | DPO, cDPO, robust DPO, IPO, SimPO                 |
| `ppo`    | `PPOConfig`    | PPO with a critic                                 |
| `grpo`   | `GRPOConfig`   | GRPO / Dr. GRPO / RLOO / REINFORCE++              |
| `sample` | `SampleConfig` | candidates, pairs, judged preferences, best-of-N  |
| `eval`   | `EvalConfig`   | held-out rewards; win rate vs a baseline          |
| `demo`   | `DemoConfig`   | a tiny end-to-end run                             |
| `report` | `ReportConfig` | an HTML report of a run                           |
| `label`  | `LabelConfig`  | label pairs in the browser or by an LLM; stats    |

A config is nested the way its YAML is: ``model``, ``data``, ``sampling``, ``reward``, ``kl``, ``optim``,
``batch`` and ``run`` are section types that every command needing them shares, and each trainer has one
section of its own (``ppo:``, ``grpo:``, ``sft:``, ``rm:``). On the command line a field is ``--section.field``.

Values are resolved in one order: defaults < the ``--config`` YAML file < command-line flags (`load_config`).
pydantic checks every field's type and range when a section is built (the field docstrings are the
``--help`` text, which tyro reads); the command's ``_check`` then checks every rule that spans fields, once,
on the merged config. Every refusal is a `ConfigError` naming the field's path, the value and what is
allowed. The flat keys of version 0.1 (``learning_rate``, ``kl_coef``, …) are still read, with a
`FutureWarning` naming the new key (`FLAT_KEYS`).

Batch sizes are global (all ranks together); trainers split them over ``torchrun`` ranks.

The package, by concern: `base` (ConfigError, field types, the section decorator, the wording of
refusals), `sections` (the shared sections), `training` (sft, rm, dpo, ppo, grpo), `commands` (the other
commands and `COMMANDS`), `loading` (defaults < YAML < flags; YAML out) and `legacy` (the 0.1 flat keys,
deletable in one commit). It must stay light: no torch, no transformers (``import rlhf.cli`` is checked not to
load torch).
"""

from rlhf.config.base import ConfigError
from rlhf.config.commands import (
    COMMANDS,
    DemoConfig,
    DoctorConfig,
    EvalConfig,
    LabelConfig,
    ReportConfig,
    SampleConfig,
    config_class,
)
from rlhf.config.legacy import FLAT_KEYS
from rlhf.config.loading import config_from_dict, config_to_dict, config_to_yaml, flat_config, load_config, read_yaml
from rlhf.config.sections import (
    KLSection,
    LLMJudgeSection,
    LoRAConfig,
    OptimSection,
    PolicyBatch,
    RewardSpec,
    SampleJudgeSection,
    llm_judge,
)
from rlhf.config.training import (
    CommandConfig,
    DPOConfig,
    GRPOConfig,
    GRPOSection,
    PolicyGradientConfig,
    PPOConfig,
    PPOSection,
    RMConfig,
    SFTConfig,
    TrainingConfig,
)

__all__ = [
    "COMMANDS",
    "FLAT_KEYS",
    "CommandConfig",
    "ConfigError",
    "DPOConfig",
    "DemoConfig",
    "DoctorConfig",
    "EvalConfig",
    "GRPOConfig",
    "GRPOSection",
    "KLSection",
    "LLMJudgeSection",
    "LabelConfig",
    "LoRAConfig",
    "OptimSection",
    "PPOConfig",
    "PPOSection",
    "PolicyBatch",
    "PolicyGradientConfig",
    "RMConfig",
    "ReportConfig",
    "RewardSpec",
    "SFTConfig",
    "SampleConfig",
    "SampleJudgeSection",
    "TrainingConfig",
    "config_class",
    "config_from_dict",
    "config_to_dict",
    "config_to_yaml",
    "flat_config",
    "llm_judge",
    "load_config",
    "read_yaml",
]
