"""The policy (a causal LM), its value function, its reference, and the one scoring forward every trainer shares.

Notation: B sequences, C query (prompt) columns, T response columns, L = C + T, H hidden size, V vocab. Sequences are
``query ⊕ response``: the query is left-padded, the response right-padded after its stop token, so the T response
positions are always the last T columns (checklist items 2, 4)."""

from __future__ import annotations

import inspect
from typing import NamedTuple

import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule

from rlhf.core.kl import follow_
from rlhf.core.logprobs import entropy_from_logits, selective_log_softmax
from rlhf.data.collate import position_ids_from_mask


def disable_dropout(model: nn.Module) -> None:
    """Set every dropout probability to 0 (checklist item 7). With dropout on, the first PPO ratio is not 1 and the KL
    penalty is not reproducible. Attention dropout in many HF models is a float read from the config at call time, not
    an ``nn.Dropout``."""
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = 0.0
        for attr in ("attention_dropout", "dropout", "attn_dropout"):
            if isinstance(getattr(module, attr, None), float):
                setattr(module, attr, 0.0)
    config = getattr(model, "config", None)
    if config is not None:
        for key, value in list(vars(config).items()):
            if ("dropout" in key or key.endswith("pdrop")) and isinstance(value, float):
                setattr(config, key, 0.0)


def accepts_logits_to_keep(model: nn.Module) -> bool:
    """Whether ``model.forward`` can project only the last positions onto the vocabulary."""
    try:
        return "logits_to_keep" in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return False


def unwrap(model: nn.Module) -> nn.Module:
    """The ``transformers`` model inside a ``peft`` wrapper, or ``model`` itself."""
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) else model


def cache_keyword(model: nn.Module) -> str:
    """The name under which ``model.forward`` takes and returns its KV cache: ``cache`` in the transformers
    versions that renamed it (``past_key_values`` is deprecated there and goes in 5.40), else
    ``past_key_values``. A PEFT wrapper passes keywords through, so its base model's forward decides."""
    try:
        return "cache" if "cache" in inspect.signature(unwrap(model).forward).parameters else "past_key_values"
    except (TypeError, ValueError):
        return "past_key_values"


class ScoredTokens(NamedTuple):
    """Per-response-token quantities from one forward pass.

    logprobs: (B, T) float32, log π(a_t | s_t) at sampling temperature.
    values:   (B, T) float32 or None, V(s_t) read at the state before token t (checklist item 9).
    entropy:  (B, T) float32 or None, entropy of the tempered next-token distribution.
    """

    logprobs: torch.Tensor
    values: torch.Tensor | None
    entropy: torch.Tensor | None


class ValueHead(nn.Module):
    """A scalar head on the last hidden state: V(s) = w·h + b. Zero-initialised (OAI ``model.py`` L368, N-details L318)
    so the first advantages equal the shaped rewards, not noise from a random head."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.linear = nn.Linear(hidden_size, 1)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """(..., H) -> (...). A copy, not a view of the linear's output: FSDP2 hooks the backward of a module's
        output, which an in-place op on a view would bypass (a few floats per token)."""
        return self.linear(hidden.to(self.linear.weight.dtype)).squeeze(-1).clone()


def score_response_tokens(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    response_length: int,
    temperature: float,
    value_head: ValueHead | None = None,
    with_entropy: bool = False,
    entropy_grad: bool = True,
) -> ScoredTokens:
    """One forward of ``query ⊕ response`` giving response log-probs (and values, entropy).

    input_ids, attention_mask: (B, L); the response is the last ``response_length`` = T columns. Logits at position i
    predict token i+1, so response token t is scored by the logits at C−1+t (checklist item 9); logits are divided by
    the sampling temperature (item 10). Only the T needed positions are projected onto the vocabulary
    (``logits_to_keep``), which saves B·C·V floats. Pad ids are replaced by 0 before the forward and in the gathered
    tokens (item 1; padded log-probs are masked by the caller) and explicit position ids are passed (item 2).
    ``entropy_grad=False`` computes the entropy outside autograd: a metric only (entropy_coef 0) then costs no softmax
    graph of B·T·V floats and no backward through it."""
    T = response_length
    ids = input_ids.masked_fill(attention_mask == 0, 0)
    kwargs = dict(
        input_ids=ids,
        attention_mask=attention_mask,
        position_ids=position_ids_from_mask(attention_mask),
        use_cache=False,
        output_hidden_states=value_head is not None,
    )
    if accepts_logits_to_keep(model):
        kwargs["logits_to_keep"] = T + 1
    out = model(**kwargs)
    logits = out.logits[:, -(T + 1) : -1]  # (B, T, V): positions C−1 … L−2
    # ids, not input_ids: a padded response position holds 0, which any vocabulary has, whatever the pad id
    logprobs = selective_log_softmax(logits, ids[:, -T:], temperature)
    values = None if value_head is None else value_head(out.hidden_states[-1][:, -(T + 1) : -1]).float()
    entropy = None
    if with_entropy:
        with torch.set_grad_enabled(torch.is_grad_enabled() and entropy_grad):
            entropy = entropy_from_logits(logits, temperature=temperature).float()
    return ScoredTokens(logprobs, values, entropy)


class ActorCritic(nn.Module):
    """What an RL trainer trains, as one module (DDP wraps one): the policy and, for PPO, its value function —
    a head on the policy's trunk or a separate critic (None for both: GRPO; the values are then None)."""

    def __init__(self, policy: nn.Module, value_head: ValueHead | None, critic: nn.Module | None):
        super().__init__()
        self.policy, self.value_head, self.critic = policy, value_head, critic

    def forward(
        self,
        ids: torch.Tensor,
        mask: torch.Tensor,
        T: int,
        temperature: float,
        entropy: bool = False,
        entropy_grad: bool = True,
    ) -> ScoredTokens:
        """(log-probs, values, entropy) of the last T tokens under the current policy / value function."""
        scored = score_response_tokens(self.policy, ids, mask, T, temperature, self.value_head, entropy, entropy_grad)
        values = scored.values if self.critic is None else self.critic(ids, mask, T)  # a separate critic
        return ScoredTokens(scored.logprobs, values, scored.entropy)


class Reference:
    """The KL anchor of ppo and grpo: a copy of the initial policy — frozen, or following the policy as an
    exponential moving average (``kl.reference_ema``) — or, with LoRA, the policy's own base weights with the
    adapter switched off (no copy)."""

    def __init__(self, policy: nn.Module, copy: nn.Module | None, ema: float | None = None):
        # kl.reference_ema comes with a copy: the config refuses it with lora (`PolicyGradientConfig`)
        self.policy, self.copy, self.ema = policy, copy, ema

    def logprobs(self, ids: torch.Tensor, mask: torch.Tensor, T: int, temperature: float) -> torch.Tensor:
        """(B, T) float32 log-probs of the last T tokens under the reference."""
        if self.copy is not None:
            # float32 whatever the copy's dtype (model.reference_dtype): the KL subtracts it from the policy's
            return score_response_tokens(self.copy, ids, mask, T, temperature).logprobs.float()
        with self.policy.disable_adapter():  # LoRA: the base model *is* the reference
            return score_response_tokens(self.policy, ids, mask, T, temperature).logprobs

    @property
    def moves(self) -> bool:
        """Whether the reference changes during training (and is then part of a checkpoint)."""
        return self.ema is not None

    def follow(self) -> None:
        """One step of the moving average towards the policy (after an iteration's update); frozen: nothing."""
        if self.ema is None:
            return
        for model in (self.copy, self.policy):  # FSDP2 keeps a root's weights gathered after a forward:
            for module in model.modules():  # average the shards, which are laid out alike in both
                if isinstance(module, FSDPModule):
                    module.reshard()
        pairs = list(zip(self.copy.named_parameters(), self.policy.named_parameters(), strict=True))
        if any(mine != theirs for (mine, _), (theirs, _) in pairs):
            raise ValueError("the reference's parameters are not the policy's: it cannot follow it")
        follow_([ref for (_, ref), _ in pairs], [new for _, (_, new) in pairs], self.ema)
