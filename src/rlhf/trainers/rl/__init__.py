"""The RL trainer: the loop PPO and GRPO share (`loop.train`), as `rlhf.trainers.supervised` is sft's, rm's and dpo's,
each algorithm (`ppo.PPO`, `grpo.GRPO`) a `loop.Algorithm`. What each file holds: docs/architecture.md (layer 7)."""
