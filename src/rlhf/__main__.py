"""`python -m rlhf <command> ...` — the same as the `rlhf` command (and what `torchrun -m rlhf` runs)."""

from rlhf.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
