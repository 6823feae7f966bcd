"""Every command on every model family users bring: GPT-2, GPT-NeoX (Pythia), OPT, Qwen2, Gemma-2, Phi-3, Llama-3.

Each family's tiny model and tokenizer mimic its quirks (see ``tiny_models.FAMILIES``). Every run is a
real in-process run (1-2 steps); every ``final/`` is then loaded with plain ``transformers`` and must
generate a left-padded batch of two prompts of different lengths exactly as it generates each prompt alone
(a reward model: score a padded batch as rlhf scores it), and must feed back into rlhf (ppo's policy is
sft's ``final/``, its reward the ``rm`` ``final/``; eval compares the two policies).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from transformers import AutoModel, AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

from rlhf.config import ConfigError, LoRAConfig
from rlhf.data.collate import position_ids_from_mask
from rlhf.models.loading import apply_lora, load_causal_lm, load_tokenizer
from rlhf.models.reward import reward_scores
from rlhf.rollout.engine import _decode_steps, lean_decoder

FAMILY_NAMES = ("gpt2", "gpt_neox", "opt", "qwen2", "gemma2", "phi3", "llama")  # = tiny_models.FAMILIES, checked below
CHAT_FAMILIES = ("qwen2", "gemma2", "phi3")  # the families whose tokenizer has a chat template
PROMPTS = ["the red cat", "what is 2 + 3? 5 and the big dog sees"]


def families(*names: str) -> pytest.MarkDecorator:
    return pytest.mark.parametrize("family", names or FAMILY_NAMES)


def test_the_matrix_covers_every_family() -> None:
    from tiny_models import FAMILIES

    assert set(FAMILY_NAMES) == set(FAMILIES)


def metrics(final: Path) -> list[dict]:
    return [json.loads(line) for line in (final.parent / "metrics.jsonl").read_text().splitlines()]


def training_rows(final: Path) -> list[dict]:
    """The rows of a ppo/grpo run's steps (not step 0's held-out answers before training)."""
    return [row for row in metrics(final) if "reward/mean" in row]


def assert_pad_policy(directory: Path, base: Path) -> None:
    """The saved tokenizer pads with a token that is not eos, which the model embeds and its configs name;
    the embedding matrix grew only if the base model had no row for it."""
    tokenizer = AutoTokenizer.from_pretrained(directory)
    pad = tokenizer.pad_token_id
    assert pad is not None and pad != tokenizer.eos_token_id
    config = json.loads((directory / "config.json").read_text())
    assert config["pad_token_id"] == pad
    base_tokenizer = AutoTokenizer.from_pretrained(base)
    base_rows = json.loads((base / "config.json").read_text())["vocab_size"]
    had_pad = base_tokenizer.pad_token is not None and base_tokenizer.pad_token_id != base_tokenizer.eos_token_id
    grows = not had_pad and len(base_tokenizer) >= base_rows  # no pad, and no spare row to put one in
    assert config["vocab_size"] == base_rows + grows
    assert pad < config["vocab_size"]


@torch.no_grad()
def assert_generates(final: Path, base: Path) -> None:
    """Plain transformers: a left-padded batch of two prompts greedily continues each as it does alone."""
    assert_pad_policy(final, base)
    tokenizer = AutoTokenizer.from_pretrained(final)
    model = AutoModelForCausalLM.from_pretrained(final).eval()
    assert model.generation_config.pad_token_id == tokenizer.pad_token_id
    tokenizer.padding_side = "left"
    batch = tokenizer(PROMPTS, return_tensors="pt", padding=True)
    assert (batch["attention_mask"] == 0).any()  # the short prompt really is padded
    width = batch["input_ids"].shape[1]
    together = model.generate(**batch, max_new_tokens=4, do_sample=False)[:, width:].tolist()
    for i, prompt in enumerate(PROMPTS):
        alone = tokenizer(prompt, return_tensors="pt")
        # a row that stops at eos ends there alone, and is filled with the pad id in the batch
        expected = model.generate(**alone, max_new_tokens=4, do_sample=False)[0, alone["input_ids"].shape[1] :]
        expected = expected.tolist() + [tokenizer.pad_token_id] * (len(together[i]) - len(expected))
        assert together[i] == expected, f"row {i} changes when padded"


# --------------------------------------------------------------------------------------------------------------
# sft
# --------------------------------------------------------------------------------------------------------------


@families()
def test_sft(runs, family_dir, family):
    assert_generates(runs.get("sft", family), family_dir(family))


@families(*CHAT_FAMILIES)
def test_sft_chat(runs, family_dir, family):
    final = runs.get("sft-chat", family)
    assert math.isfinite(metrics(final)[-1]["train/loss"])
    assert_generates(final, family_dir(family))


@families()
def test_sft_lora(runs, family_dir, family):
    assert_generates(runs.get("sft-lora", family), family_dir(family))


# --------------------------------------------------------------------------------------------------------------
# rm
# --------------------------------------------------------------------------------------------------------------


@families()
def test_rm_final_scores_a_padded_batch_with_plain_transformers(runs, family_dir, family):
    final = runs.get("rm", family)  # trains: outside no_grad
    assert_pad_policy(final, family_dir(family))
    with torch.no_grad():
        assert_scores_padded_batches(final)


def assert_scores_padded_batches(final: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(final)
    model = AutoModelForSequenceClassification.from_pretrained(final).eval()
    rows = [tokenizer(p)["input_ids"] + [tokenizer.eos_token_id] for p in PROMPTS]  # rm scores on the eos
    alone = torch.cat([reward_scores(model, torch.tensor([r]), torch.ones(1, len(r), dtype=torch.long)) for r in rows])
    for side in ("right", "left"):
        width = max(map(len, rows))
        pad = [[tokenizer.pad_token_id] * (width - len(r)) for r in rows]
        ids = torch.tensor([r + p if side == "right" else p + r for r, p in zip(rows, pad, strict=True)])
        mask = (ids != tokenizer.pad_token_id).long()
        # transformers pools at the last token that is not config.pad_token_id; positions as its generate does
        pooled = model(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask)).logits[:, 0]
        # float32, one 2-layer forward with and without padding columns: the sums differ in rounding only
        torch.testing.assert_close(pooled, alone, atol=1e-5, rtol=1e-5)


# --------------------------------------------------------------------------------------------------------------
# ppo, grpo
# --------------------------------------------------------------------------------------------------------------


# `ragged` (tests/conftest.py) stops most responses early, so padded response positions — where the pad id
# used to be gathered out of the vocabulary — are in every rollout.


def assert_consistent_first_ratio(final: Path) -> None:
    # the first minibatch's ratio is π/π_old of the same float32 forward: exactly 1 when fused, else rounding
    assert max(row["policy/first_ratio_max_dev"] for row in training_rows(final)) < 1e-4


@families()
def test_ppo_shared_critic_from_the_sft_policy_and_the_reward_model(runs, family_dir, family, ragged):
    final = runs.get("ppo", family)
    assert_consistent_first_ratio(final)
    assert (final / "value_head.safetensors").is_file()
    assert_generates(final, family_dir(family))


@families()
def test_ppo_separate_critic(runs, family_dir, family, ragged):
    final = runs.get("ppo-separate", family)
    assert_consistent_first_ratio(final)
    assert_generates(final, family_dir(family))
    critic = AutoModel.from_pretrained(final / "critic")  # the reward model's trunk, its own config
    tokenizer = AutoTokenizer.from_pretrained(final)
    assert critic.config.pad_token_id == tokenizer.pad_token_id < critic.get_input_embeddings().num_embeddings


@families()
def test_ppo_lora(runs, family_dir, family, ragged):
    final = runs.get("ppo-lora", family)
    assert_consistent_first_ratio(final)
    assert_generates(final, family_dir(family))


@families(*CHAT_FAMILIES)
def test_ppo_chat_prompts(runs, family_dir, family, ragged):
    final = runs.get("ppo-chat", family)
    assert_consistent_first_ratio(final)
    assert_generates(final, family_dir(family))


@families()
def test_grpo(runs, family_dir, family, ragged):
    final = runs.get("grpo", family)
    rows = training_rows(final)
    assert len(rows) == 2 and all(math.isfinite(row["policy/loss"]) for row in rows)
    assert_generates(final, family_dir(family))


# --------------------------------------------------------------------------------------------------------------
# sample, eval
# --------------------------------------------------------------------------------------------------------------


@families()
def test_sample_preferences_judged_by_the_reward_model(runs, family):
    rows = [json.loads(line) for line in runs.get("sample", family).read_text().splitlines()]
    assert rows and all({"prompt", "chosen", "rejected"} <= set(row) for row in rows)


@families()
def test_eval_ppo_against_sft(runs, family):
    results = runs.get("eval", family)
    assert results["num_prompts"] == 12 and math.isfinite(results["reward/mean"])
    assert 0 <= results["win_rate"] <= 1


# --------------------------------------------------------------------------------------------------------------
# sampling engine: the lean decoder or the model's own forward, against a full forward
# --------------------------------------------------------------------------------------------------------------


@families()
@torch.no_grad()
def test_sampling_logits_match_a_full_forward(family_dir, family):
    directory = str(family_dir(family))
    tokenizer = load_tokenizer(directory)
    model = load_causal_lm(directory, tokenizer=tokenizer).eval()
    batch = tokenizer(PROMPTS, return_tensors="pt", padding=True)
    ids, mask = batch["input_ids"], batch["attention_mask"]
    tokens = torch.randint(10, 200, (len(PROMPTS), 4), generator=torch.Generator().manual_seed(0))
    for engine in ("auto", "hf"):  # auto: the lean decoder where it covers the family
        step = _decode_steps(model, ids, mask, lean_decoder(model, ids.shape[1] + tokens.shape[1], len(ids), engine))
        got = [step(None)] + [step(tokens[:, t]) for t in range(tokens.shape[1] - 1)]
        for t, logits in enumerate(got):
            full_ids = torch.cat([ids, tokens[:, :t]], dim=1)
            full_mask = torch.cat([mask, torch.ones_like(tokens[:, :t])], dim=1)
            ids0 = full_ids.masked_fill(full_mask == 0, 0)
            out = model(input_ids=ids0, attention_mask=full_mask, position_ids=position_ids_from_mask(full_mask))
            # float32 through 2 layers of width 32, cached vs uncached attention: rounding of ~1e-6
            torch.testing.assert_close(logits, out.logits[:, -1], atol=1e-4, rtol=1e-4)


# --------------------------------------------------------------------------------------------------------------
# LoRA targets
# --------------------------------------------------------------------------------------------------------------


def lora_layers(model: torch.nn.Module) -> set[str]:
    return {name.rsplit(".", 1)[-1] for name, module in model.named_modules() if hasattr(module, "lora_A")}


@families()
def test_lora_default_targets(family_dir, family):
    from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as DEFAULTS

    model = apply_lora(load_causal_lm(str(family_dir(family))), LoRAConfig(r=2, alpha=4, dropout=0.0))
    adapted = lora_layers(model)
    if family in DEFAULTS:
        assert adapted == set(DEFAULTS[family])  # peft's choice for the architecture is kept
    else:  # Phi-3: every linear layer of the decoder, not the output layer
        assert adapted == {"qkv_proj", "o_proj", "gate_up_proj", "down_proj"}


def test_reward_model_lora_trains_the_score_head_in_full(family_dir):
    from rlhf.models.reward import load_reward_model

    rm = load_reward_model(str(family_dir("phi3")))
    model = apply_lora(rm.model, LoRAConfig(r=2, alpha=4, dropout=0.0), task_type="SEQ_CLS")
    assert "score" not in lora_layers(model) and "qkv_proj" in lora_layers(model)
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    assert any(".score." in name and "lora" not in name for name in trainable)


def test_lora_targets_matching_nothing_name_the_field_and_the_linear_layers(family_dir):
    model = load_causal_lm(str(family_dir("phi3")))
    with pytest.raises(ConfigError) as error:
        apply_lora(model, LoRAConfig(target_modules=("q_proj", "o_proj")))
    message = str(error.value)
    assert message.startswith("model.lora.target_modules: 'q_proj' match no module")
    assert "qkv_proj" in message and "gate_up_proj" in message and "lm_head" in message


def test_the_cli_reports_bad_lora_targets_in_one_line(family_dir, compat_data, tmp_path, capsys):
    from rlhf.cli import main

    argv = ["sft", "--model.name", str(family_dir("phi3")), "--data.train", str(compat_data["sft"]),
            "--output_dir", str(tmp_path / "out"), "--model.lora", "{target_modules: [q_proj]}", "--run.no_progress"]  # fmt: skip
    assert main(argv) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error")]
    assert len(err) == 1 and "model.lora.target_modules: 'q_proj' match no module" in err[0] and "qkv_proj" in err[0]
