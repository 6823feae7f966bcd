"""Run bookkeeping shared by every command: the run directory (lock, refusal, resume check, atomic writes),
seeding and RNG state, metric sinks, checkpoints and resume."""
