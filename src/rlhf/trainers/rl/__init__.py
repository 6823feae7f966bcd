"""The RL trainer: the loop PPO and GRPO share (`loop.train`), as `rlhf.trainers.supervised` is sft's, rm's and dpo's.
Each algorithm (`ppo.PPO`, `grpo.GRPO`) supplies its models, how it samples, what it learns from a scored batch and
what it adds after each step (`loop.Algorithm`). By file: `inputs` (set-up before the models), `models` (policy,
reference, value function, engine; ``final/``), `rollout` (sampling, scoring and the no-grad pass), `updates` (the
update passes, the surrogate's weights, the warm-ups), `loop` (the step loop, evaluation, the doctor)."""
