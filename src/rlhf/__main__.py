"""`python -m rlhf <command> ...` — the same as the `rlhf` command (and what `torchrun -m rlhf` runs)."""

from rlhf.cli import exit_process, main

if __name__ == "__main__":
    exit_process(main())
