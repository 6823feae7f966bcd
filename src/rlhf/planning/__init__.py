"""The memory plan of a training run, each rank's predicted peak by phase and part before any weight loads: the
models' sizes (`sizes`), the parts by phase (`layout`), the cheapest change that fits (`fixes`), the check every
trainer runs at start against the device's budget (`device`), the data's longest row (`lengths`) and `rlhf plan`
(`command`). The derivation and its validation: docs/memory.md."""

from rlhf.planning.command import TRAINERS, command_of, report
from rlhf.planning.device import USABLE, available, budget, check, free_memory, refusal, worker_fits, worker_place
from rlhf.planning.fixes import Fix, alternatives, candidates, cheapest_fix, single_changes
from rlhf.planning.layout import REUSED, WORKSPACE, Plan, WorkerPlace, has_reference, micro_rows_now, plan, render
from rlhf.planning.lengths import data_positions, data_shape, most_answers, prompt_positions, sequence_positions
from rlhf.planning.sizes import lora_params, model_sizes
