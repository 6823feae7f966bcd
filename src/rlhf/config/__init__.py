"""One frozen, typed config per command (`COMMANDS`), built from shared sections — what ``rlhf <command>``
accepts; the commands: the README's 'Commands', the package's modules: docs/architecture.md.

Values are resolved in one order: defaults < the ``--config`` YAML file < command-line flags (`load_config`).
pydantic checks every field's type and range (the field docstrings are the ``--help`` text, which tyro reads),
then the command's ``_check`` every rule that spans fields, once, on the merged config. Every refusal is a
`ConfigError` naming the field's path, the value and what is allowed. The flat keys of version 0.1
(``learning_rate``, ``kl_coef``, …) are still read, with a `FutureWarning` naming the new key (`FLAT_KEYS`).
Batch sizes are global (all ranks together); trainers split them over ``torchrun`` ranks.

It must stay light: no torch, no transformers (``import rlhf.cli`` is checked not to load torch).
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
    RankingBatch,
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
