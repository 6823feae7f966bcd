"""rlhf: reinforcement learning from human feedback for causal language models.

The package is split by cost of import: ``rlhf.core`` is pure tensor math (torch + stdlib only);
models, rollout, data and trainers import ``transformers`` and friends lazily, when used.
"""

__version__ = "0.1.0"
