"""Run bookkeeping shared by every trainer: seeding and RNG state, metric sinks, checkpoints and resume."""
