"""Loading models the ordinary way (``from_pretrained`` on a hub id or a directory) and preparing them for RL.

Every model that is scored is put through :func:`disable_dropout` (checklist item 7). The tokenizer gets a
pad token distinct from EOS when it has none (item 1); the embeddings are not resized — pad ids are
replaced by 0 before every forward, and padded positions are masked anyway.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from rlhf.data.tokenization import ensure_pad_token
from rlhf.models.policy import ValueHead, disable_dropout

if TYPE_CHECKING:
    from rlhf.config import LoRAConfig

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def load_tokenizer(name_or_path: str) -> Any:
    """The policy's tokenizer, left-padding (prompts are generated from) and with a distinct pad token."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(name_or_path)
    ensure_pad_token(tokenizer)
    tokenizer.padding_side = "left"
    return tokenizer


def load_causal_lm(
    name_or_path: str, dtype: str = "float32", device: str | torch.device = "cpu"
) -> nn.Module:
    """``AutoModelForCausalLM.from_pretrained`` with dropout off, on ``device``."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(name_or_path, dtype=DTYPES[dtype]).to(device)
    disable_dropout(model)
    return model


def apply_lora(model: nn.Module, lora: LoRAConfig, task_type: str = "CAUSAL_LM") -> nn.Module:
    """Wrap ``model`` in LoRA adapters (peft). The base weights are frozen; only the adapters train.

    ``task_type="SEQ_CLS"`` for a reward model: peft then trains its scalar head in full as well.
    """
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=list(lora.target_modules) if lora.target_modules else None,
        task_type=task_type,
    )
    peft_model = get_peft_model(model, config)
    # LoRA's own dropout would make the first PPO ratio ≠ 1, like any dropout (checklist item 7)
    disable_dropout(peft_model)
    return peft_model


def trainable_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The trained weights only, for a checkpoint: all of them, or just the LoRA adapters (and a head)."""
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    return {k: v for k, v in model.state_dict().items() if k in trainable}


def load_trainable_state(model: nn.Module, state: dict[str, torch.Tensor], what: str = "weights") -> None:
    """Load `trainable_state` back; ``what`` names the weights in the error (e.g. "policy weights")."""
    # strict=False: the frozen weights are not in the checkpoint, they come from `model` as configured
    result = model.load_state_dict(state, strict=False)
    if result.unexpected_keys:
        raise ValueError(f"checkpoint has {what} this model lacks: {result.unexpected_keys[:5]}")


def frozen_copy(model: nn.Module) -> nn.Module:
    """A frozen, eval-mode deep copy: the reference policy when there is no LoRA adapter to switch off."""
    ref = copy.deepcopy(model).eval()
    ref.requires_grad_(False)
    return ref


def compile_blocks(model: nn.Module) -> int:
    """``torch.compile`` each transformer block of ``model`` in place, with dynamic shapes; returns how many.

    The blocks are the largest ``nn.ModuleList`` of same-type modules (``model.layers`` in Llama, ``h`` in
    GPT-2), LoRA-wrapped or not. Blocks rather than the whole model: the model's own forward (masks, caches,
    the LM head) stays eager, every block shares one compiled graph, and response lengths that change from
    step to step do not recompile. Inductor fuses each block's elementwise work (norms, rotary, SwiGLU,
    their backward), which is what an update spends outside matrix products on CPU: on the benchmark's 3.4M
    model the PPO updates took 9-10% less time at 32 and at 128 new tokens. The first forwards compile
    (about 35 s on 2 cores, 8-10 s once inductor's on-disk cache is warm).
    """
    lists = [
        m for m in model.modules() if isinstance(m, nn.ModuleList) and len(m) and len({type(c) for c in m}) == 1
    ]
    if not lists:
        raise ValueError(f"compile: found no list of transformer blocks in {type(model).__name__}")
    blocks = max(lists, key=lambda m: sum(p.numel() for p in m.parameters()))
    for block in blocks:
        block.compile(dynamic=True)
    return len(blocks)


def compile_models(models: list[nn.Module | None], device: torch.device) -> None:
    """``compile: true``: check for a C++ compiler once, then :func:`compile_blocks` of each model given
    (``None`` entries, such as an absent reference or critic, are skipped)."""
    check_compiler(device)
    for model in models:
        if model is not None:
            compile_blocks(model)


def check_compiler(device: torch.device) -> None:
    """``torch.compile`` on CPU builds C++ kernels: fail at start-up, not at the first forward, without one."""
    import os
    import shutil

    if device.type == "cpu" and not (os.environ.get("CXX") or shutil.which("g++") or shutil.which("clang++")):
        raise RuntimeError(
            "compile: true needs a C++ compiler on CPU (torch.compile builds its kernels with it): "
            "install g++ (e.g. `apt install g++`) or set CXX, or set compile: false"
        )


class Critic(nn.Module):
    """A separate value model: its own transformer trunk and a scalar head read at every response state.

    Initialised from the reward model when the reward is a model sharing the policy's tokenizer (N+
    ``ppo.py`` L478-489, TRL ``PolicyAndValueWrapper``), so the value function starts from a network that
    already rates responses; otherwise from the policy's weights with a zero head.
    """

    def __init__(self, trunk: nn.Module, head: ValueHead):
        super().__init__()
        self.trunk = trunk
        self.head = head

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, response_length: int
    ) -> torch.Tensor:
        """(B, L) → values (B, T) at the states before each of the last T tokens (checklist item 9)."""
        from rlhf.data.collate import position_ids_from_mask

        T = response_length
        hidden = self.trunk(
            input_ids=input_ids.masked_fill(attention_mask == 0, 0),
            attention_mask=attention_mask,
            position_ids=position_ids_from_mask(attention_mask),
            use_cache=False,
        ).last_hidden_state
        return self.head(hidden[:, -(T + 1) : -1]).float()


def load_critic(
    name_or_path: str, from_reward_model: bool, dtype: str = "float32", device: str | torch.device = "cpu"
) -> Critic:
    """A :class:`Critic` from a reward-model directory (head copied) or from a causal-LM directory (zero head)."""
    from transformers import AutoModel, AutoModelForSequenceClassification

    if from_reward_model:
        rm = AutoModelForSequenceClassification.from_pretrained(name_or_path, dtype=DTYPES[dtype])
        trunk = rm.base_model
        head = ValueHead(rm.config.hidden_size)
        score = getattr(rm, "score", None)
        if isinstance(score, nn.Linear) and score.out_features == 1:
            from rlhf.models.reward import reward_normalization

            # fold the stored normalisation in, so the critic starts on the scale of the rewards it predicts
            gain, bias = reward_normalization(rm.config)
            with torch.no_grad():
                head.linear.weight.copy_(gain * score.weight.float())
                raw_bias = score.bias.float() if score.bias is not None else torch.zeros(1)
                head.linear.bias.copy_(gain * raw_bias + bias)
    else:
        trunk = AutoModel.from_pretrained(name_or_path, dtype=DTYPES[dtype])
        head = ValueHead(trunk.config.hidden_size)
    critic = Critic(trunk, head).to(device)
    disable_dropout(critic)
    return critic
