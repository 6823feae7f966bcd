"""vLLM as a rollout engine in the trainer's own process (colocate): a `vllm.LLM` that samples token ids with the
log-probs of the distribution it drew them from, and takes the policy's weights after each update.

vLLM is imported here only (the ``vllm`` extra). Its engine runs in this process, so new weights reach it as tensors,
loaded in place by ``collective_rpc("reload_weights")`` (why, and the log-probs measured: docs/vllm.md, "Colocate")."""

from __future__ import annotations

import gc
import logging
import os
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from rlhf.config import ConfigError
from rlhf.rollout.engine import Samples, SamplingParams, TokenRows


class VLLMEngine:
    """A `vllm.LLM` over the policy saved at ``model_dir`` (its architecture and tokenizer; the weights follow the
    policy through :meth:`sync`). ``memory_fraction``: vLLM's ``gpu_memory_utilization``, the share of the device's
    memory it takes for weights and KV cache (on the CPU build, of the machine's memory). ``sleep``: between
    rollouts its weights wait in CPU memory and its KV cache is freed (vLLM's sleep mode, level 1), so the update has
    the device to itself; CUDA, ROCm and XPU only."""

    shared = False
    """Each rank's own engine."""

    def __init__(
        self,
        model_dir: str,
        *,
        dtype: str = "auto",
        memory_fraction: float = 0.3,
        max_model_len: int | None = None,
        seed: int = 0,
        sleep: bool = False,
    ):
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine in this process: weights as tensors
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")  # its INFO lines would bury the run's own output
        try:
            import vllm
        except ImportError as error:
            raise ConfigError(
                f"sampling.engine vllm needs vLLM in this environment ({error}): pip install 'rlhf-kit[vllm]' on a GPU "
                "machine; for its CPU build, `make vllm-venv` (docs/vllm.md)"
            ) from error

        from vllm.platforms import current_platform

        if sleep and not current_platform.is_sleep_mode_available():
            raise ConfigError(
                f"sampling.vllm.sleep: vLLM's sleep mode needs a CUDA, ROCm or XPU device; this is "
                f"{current_platform.device_name!r}"
            )
        if max_model_len is not None:  # vLLM refuses a length beyond the model's positions; prompts never reach it
            from transformers import AutoConfig

            positions = getattr(AutoConfig.from_pretrained(model_dir), "max_position_embeddings", None)
            max_model_len = min(max_model_len, positions or max_model_len)
        try:
            self.llm = vllm.LLM(
                model=model_dir,
                dtype=dtype,
                gpu_memory_utilization=memory_fraction,
                max_model_len=max_model_len,
                seed=seed,
                enforce_eager=True,
                logprobs_mode="processed_logprobs",  # after temperature, top-k, top-p: what the tokens were drawn from
                enable_sleep_mode=sleep,
            )
        except (ValueError, RuntimeError) as error:  # the model, the device or its memory: what the user can change
            raise ConfigError(
                f"sampling.engine vllm: vLLM could not start on {model_dir} ({' '.join(str(error).split())}); "
                "sampling.vllm.memory_fraction sets its share of the device's memory"
            ) from error
        self.sleeps = sleep
        # every reload warns that rotary embeddings "failed to load": they hold no weights (vLLM keeps its own table)
        logging.getLogger("vllm.model_executor.model_loader.reload.layerwise").setLevel(logging.ERROR)
        self.version = 0
        """How many times :meth:`sync` has loaded the policy's weights."""

    def sync(self, policy: nn.Module) -> None:
        """Load ``policy``'s current weights into vLLM (a LoRA policy: its base weights with the adapters added)."""
        self._wake()  # the weights must be on the device to be overwritten; the rollout that follows needs them there
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": plain_weights(policy)})
        self.llm.reset_prefix_cache()  # cached prompt states were computed by the old weights
        self.version += 1

    def _wake(self) -> None:
        if self.sleeps and self.llm.llm_engine.is_sleeping():
            self.llm.wake_up()

    def close(self) -> None:
        """Stop the engine and give its memory back: a second engine in the process (``rlhf eval``'s baseline) would
        otherwise find the first one's KV cache taken (vLLM sizes its cache by what the process already holds)."""
        self.llm.llm_engine.engine_core.shutdown()
        del self.llm
        gc.collect()

    def sample(
        self, prompts: TokenRows, params: SamplingParams, stops: Sequence[int], pad_token_id: int, seeds: Sequence[int]
    ) -> Samples:
        """Each prompt's response token ids (ending with its first stop token, if any) and their log-probs under the
        distribution vLLM drew them from; row i draws from its own seed ``seeds[i]``. The pad token is never drawn
        (PAD means "no token" downstream), as with the other engines."""
        import vllm

        requests = [vllm.SamplingParams(**request(params, stops, pad_token_id), seed=seed) for seed in seeds]
        self._wake()
        outputs = self.llm.generate([{"prompt_token_ids": list(p)} for p in prompts], requests, use_tqdm=False)
        if self.sleeps:  # level 1: the weights go to CPU memory (the next sync overwrites them), the KV cache is freed
            self.llm.sleep(level=1)
        ids = [list(out.outputs[0].token_ids) for out in outputs]
        logprobs = [
            [step[token].logprob for step, token in zip(out.outputs[0].logprobs, row, strict=True)]
            for out, row in zip(outputs, ids, strict=True)
        ]
        return ids, logprobs


def request(params: SamplingParams, stops: Sequence[int], pad_token_id: int) -> dict[str, Any]:
    """vLLM's sampling parameters (its ``SamplingParams`` fields, all but the seed) that draw as rlhf's engines do."""
    return {
        "max_tokens": params.max_new_tokens,
        "temperature": params.temperature,
        "top_k": params.top_k,
        "top_p": params.top_p,
        "stop_token_ids": list(stops),
        "ignore_eos": True,  # the run's stop tokens decide
        "logprobs": 0,  # the sampled token's own log-prob only
        "detokenize": False,
        "logit_bias": {pad_token_id: -1e4},  # PAD means "no token" downstream: never drawn
    }


def plain_weights(policy: nn.Module) -> list[tuple[str, torch.Tensor]]:
    """(checkpoint name, tensor) of ``policy``'s weights as the plain model holds them. A peft LoRA policy: each
    adapted weight is W + ΔW of its active adapters, computed (merging in place and back would leave the policy's
    own weights rounded differently), under the base model's names."""
    state = {name: tensor.detach() for name, tensor in policy.state_dict().items()}
    if not hasattr(policy, "peft_config"):
        return list(state.items())
    from peft.tuners.lora import LoraLayer

    for name, module in policy.named_modules():
        if isinstance(module, LoraLayer):
            adapters = [a for a in module.active_adapters if a in module.lora_A]
            key = f"{name}.base_layer.weight"
            state[key] = state[key] + sum(module.get_delta_weight(a) for a in adapters).detach()
    prefix = "base_model.model."
    return [
        (name.removeprefix(prefix).replace(".base_layer.", "."), tensor)
        for name, tensor in state.items()
        if "lora_" not in name
    ]
