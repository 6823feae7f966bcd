"""Loading models the ordinary way (``from_pretrained`` on a hub id or a directory) and preparing them for RL.

Every model that is scored is put through :func:`disable_dropout` (checklist item 7). The pad token (checklist item 1;
README, "Models and tokenizers"): a tokenizer without one, or whose pad is its EOS, gets a new ``<|pad|>``
(:func:`load_tokenizer`), and :func:`align_pad_token` makes every model loaded here embed it and name it in its config
and generation config, so a saved ``final/`` works with plain ``transformers`` and loads back unchanged. What a pad
position holds never matters: pad ids become 0 before every forward and are masked."""

from __future__ import annotations

import copy
import os
import shutil
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from rlhf.config import ConfigError
from rlhf.data.chat import set_template_kwargs
from rlhf.data.tokenization import ensure_pad_token, require_pad_token_id
from rlhf.models.policy import disable_dropout, unwrap

if TYPE_CHECKING:
    from rlhf.config import LoRAConfig

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def load_tokenizer(
    name_or_path: str, chat_template_kwargs: Mapping[str, Any] | None = None, padding_side: str = "left"
) -> Any:
    """A model's tokenizer with a distinct pad token and the chat template arguments ``chat_template_kwargs`` (None:
    those it was saved with; `rlhf.data.chat`), padding on the left (a policy's: prompts are generated from) or the
    right (a reward model's). Every tokenizer that renders a run's data is loaded here, with the run's arguments."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(name_or_path)
    set_template_kwargs(tokenizer, chat_template_kwargs)
    ensure_pad_token(tokenizer)
    tokenizer.padding_side = padding_side
    return tokenizer


HUB_KERNELS = "USE_HUB_KERNELS"
"""transformers' own switch for layers replaced by kernels fetched from the Hub. Unset, transformers 5.25 reads it as
on and rlhf as off; each command sets it from ``model.use_kernels``, so the processes a run starts (torchrun ranks,
the rollout worker) load their models alike (docs/dependencies.md)."""


def hub_kernels_wanted() -> bool:
    """Whether models load with kernels fetched from the Hub: only when :data:`HUB_KERNELS` says so."""
    return os.environ.get(HUB_KERNELS, "").strip().lower() in ("1", "true", "y", "yes", "on")


def use_hub_kernels(wanted: bool) -> None:
    """Set :data:`HUB_KERNELS` for this process and the processes it starts (a command's ``model.use_kernels``)."""
    os.environ[HUB_KERNELS] = "1" if wanted else "0"


def pretrained(auto_class: Any, name_or_path: str, device: str | torch.device, **kwargs: Any) -> nn.Module:
    """``auto_class.from_pretrained(name_or_path, **kwargs)``; on the ``"meta"`` device, the same architecture
    with no weights read (``from_config``; call it inside ``with torch.device("meta")``), which is how a
    sharded run builds a model before rank 0 sends the weights (:func:`rlhf.models.sharding.load_sharded`).
    Config overrides among ``kwargs`` (``num_labels``) apply to both. Hub kernels stay off unless asked for
    (:func:`hub_kernels_wanted`): transformers 5.25 turns them on by default and, on a GPU, fetches code from the Hub at
    the model's first ``train()``, which an offline machine cannot do and a run should not do unasked.
    ``from_config`` never fetches any."""
    if torch.device(device).type != "meta":
        return auto_class.from_pretrained(name_or_path, use_kernels=hub_kernels_wanted(), **kwargs)
    from transformers import AutoConfig

    overrides = {key: kwargs.pop(key) for key in ("num_labels",) if key in kwargs}
    for key in ("output_loading_info", "ignore_mismatched_sizes"):  # about reading weights: none are read
        kwargs.pop(key, None)
    return auto_class.from_config(AutoConfig.from_pretrained(name_or_path, **overrides), **kwargs)


def load_causal_lm(
    name_or_path: str, dtype: str = "float32", device: str | torch.device = "cpu", tokenizer: Any = None
) -> nn.Module:
    """``AutoModelForCausalLM.from_pretrained`` with dropout off, on ``device``, able to embed the pad id of
    ``tokenizer`` (default: :func:`load_tokenizer` of the same directory; see :func:`align_pad_token`).
    ``device="meta"``: the architecture only (:func:`pretrained`)."""
    from transformers import AutoModelForCausalLM

    model = pretrained(AutoModelForCausalLM, name_or_path, device, dtype=DTYPES[dtype])
    align_pad_token(model, tokenizer if tokenizer is not None else load_tokenizer(name_or_path))
    model.to(device)
    disable_dropout(model)
    return model


def align_pad_token(model: nn.Module, tokenizer: Any) -> None:
    """Make ``model`` embed ``tokenizer``'s pad id and record it in its config. The tokenizer must
    have a pad token distinct from EOS (:func:`~rlhf.data.tokenization.ensure_pad_token`). The embedding matrix grows
    only when the pad id lies beyond it: spare rows (Pythia, Qwen2, Phi-3) are used."""
    pad = require_pad_token_id(tokenizer)
    if pad >= model.get_input_embeddings().num_embeddings:
        grow_embeddings(model, pad + 1)
    model.config.pad_token_id = pad
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.pad_token_id = pad


@torch.no_grad()
def grow_embeddings(model: nn.Module, rows: int) -> None:
    """Resize the input (and output) embeddings to ``rows`` rows; each new row is the mean of the old ones. Hewitt's
    initialisation: the new token's logit is the mean logit, so the distribution barely moves. The mean rather than
    transformers' ``mean_resizing`` draw: no random numbers (the policy and its reference agree exactly) and no (H, H)
    covariance of the vocabulary (seconds for a 128k × 4096 matrix on a CPU)."""
    old = model.get_input_embeddings().num_embeddings
    model.resize_token_embeddings(rows, mean_resizing=False)
    for layer in (model.get_input_embeddings(), model.get_output_embeddings()):
        if layer is not None:  # a tied output layer is the same tensor: setting it twice is harmless
            layer.weight[old:] = layer.weight[:old].float().mean(0).to(layer.weight.dtype)
            bias = getattr(layer, "bias", None)
            if bias is not None:
                bias[old:] = bias[:old].float().mean().to(bias.dtype)


def apply_lora(model: nn.Module, lora: LoRAConfig, task_type: str = "CAUSAL_LM") -> nn.Module:
    """Wrap ``model`` in LoRA adapters (peft) on the layers :func:`lora_targets` names. The base weights are frozen;
    only the adapters train. ``task_type="SEQ_CLS"`` for a reward model: peft then trains its scalar head in full as
    well (and ``all-linear`` leaves it out of the adapted layers). A value head is not part of ``model``: it trains in
    full beside the adapters."""
    from peft import LoraConfig, get_peft_model

    targets = lora_targets(model, lora.target_modules)
    config = LoraConfig(
        r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout, target_modules=targets, task_type=task_type
    )
    try:
        peft_model = get_peft_model(model, config)
    except ValueError as error:  # e.g. a target that is not a layer type LoRA supports (a norm, say)
        raise ConfigError(f"model.lora.target_modules: {error}") from error
    # LoRA's own dropout would make the first PPO ratio ≠ 1, like any dropout (checklist item 7)
    disable_dropout(peft_model)
    return peft_model


def checkpointed(model: nn.Module) -> nn.Module:
    """``model`` (a ``transformers`` model, in a peft wrapper or not) with gradient checkpointing on, non-reentrant,
    in training mode: ``transformers`` recomputes a layer only in training mode and with gradients on, so no-grad
    passes (rollouts, reference, scoring) run as before. Dropout is off (:func:`disable_dropout`): training mode
    changes nothing else."""
    base = unwrap(model)
    enable = getattr(base, "activation_checkpointing_enable", None)  # the name since transformers 5.2x
    if enable is not None:
        enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model.train()


def lora_targets(model: nn.Module, target_modules: tuple[str, ...] | None) -> list[str] | str | None:
    """What peft's ``target_modules`` gets (the rule: README, "Models and tokenizers"): ``model.lora.target_modules``
    when set, each entry naming a module of the model (else ConfigError); otherwise None or ``"all-linear"``."""
    from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as DEFAULTS

    if target_modules is None:
        model_type = getattr(getattr(model, "config", None), "model_type", None)
        return None if model_type in DEFAULTS else "all-linear"
    targets = list(target_modules)
    if [t.lower() for t in targets] == ["all-linear"]:
        return "all-linear"
    names = [name for name, _ in model.named_modules()]
    # peft's rule for a list: a module is targeted when its name is the entry or ends with "." + entry
    missing = [t for t in targets if not any(n == t or n.endswith(f".{t}") for n in names)]
    if missing:
        # what LoRA can adapt as a linear layer: nn.Linear or GPT-2's Conv1D (a transposed linear)
        layers = [n for n, m in model.named_modules() if isinstance(m, nn.Linear) or type(m).__name__ == "Conv1D"]
        linear = sorted({n.rsplit(".", 1)[-1] for n in layers})
        raise ConfigError(
            f"model.lora.target_modules: {', '.join(map(repr, missing))} match no module of this "
            f"{type(model).__name__}; its linear layers are {', '.join(linear)} (or use ['all-linear'], or "
            "null for the default)"
        )
    return targets


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


def frozen_copy(model: nn.Module, dtype: str | torch.dtype | None = None) -> nn.Module:
    """A frozen, eval-mode deep copy (cast to ``dtype`` when given): the reference policy when there is no LoRA
    adapter to switch off."""
    ref = copy.deepcopy(model).eval().requires_grad_(False)
    if dtype is not None:
        ref.to(getattr(torch, dtype) if isinstance(dtype, str) else dtype)
    return ref


def compile_blocks(model: nn.Module) -> int:
    """``torch.compile`` each transformer block of ``model`` in place, with dynamic shapes; returns how many.

    The blocks are the largest ``nn.ModuleList`` of same-type modules (``layers`` in Llama, ``h`` in GPT-2),
    LoRA-wrapped or not. Blocks, not the whole model: the model's forward (masks, caches, LM head) stays eager, the
    blocks share one graph, and response lengths that change do not recompile. Inductor fuses each block's elementwise
    work (norms, rotary, SwiGLU, their backward), what an update spends outside matrix products on CPU (measured:
    benchmarks/results/results.md, summed up in docs/config.md)."""
    lists = [m for m in model.modules() if isinstance(m, nn.ModuleList) and len(m) and len({type(c) for c in m}) == 1]
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
    if device.type == "cpu" and not (os.environ.get("CXX") or shutil.which("g++") or shutil.which("clang++")):
        raise RuntimeError(
            "compile: true needs a C++ compiler on CPU (torch.compile builds its kernels with it): "
            "install g++ (e.g. `apt install g++`) or set CXX, or set compile: false"
        )
