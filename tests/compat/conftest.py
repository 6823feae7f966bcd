"""The compatibility matrix's models and data: one tiny model per family, built once per session, and small
data files for every command.

Each family (``rlhf.models.tiny.FAMILIES``) gets a tokenizer trained locally with its quirks (no pad, pad =
eos, bos = eos, bos added in front, a chat template or none) and a random-init causal LM of its architecture
(hidden 32, 2 layers; spare embedding rows where the real checkpoints have them), saved as a directory that
loads with ``from_pretrained`` like a hub checkpoint. :class:`Runs` runs each command once per family on
first use and hands the ``final/`` directories on, so the commands chain as a user would run them
(sft → rm → ppo with the sft policy and the reward model → eval) without running anything twice.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

REWARDS = Path(__file__).resolve().parent / "compat_rewards.py"


def _write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@pytest.fixture(scope="session")
def compat_data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Data files of every kind, 8-12 rows each, from the toy language (single-turn chat: Phi-3's template
    ends a conversation with its eos, which a later turn removes, so multi-turn chat breaks its prefix)."""
    from rlhf.models.tiny import toy_corpus

    root = tmp_path_factory.mktemp("compat_data")
    lines = toy_corpus(24, seed=7)
    heads = [" ".join(line.split()[: 2 + i % 3]) for i, line in enumerate(lines)]  # prompts of 2-4 words
    tails = [" ".join(line.split()[2 + i % 3 :]) or "ok" for i, line in enumerate(lines)]
    chat = [[{"role": "user", "content": h}] for h in heads]
    return {
        "sft": _write_jsonl(
            root / "sft.jsonl", [{"prompt": h, "response": t} for h, t in zip(heads, tails, strict=True)]
        ),
        "sft_chat": _write_jsonl(
            root / "sft_chat.jsonl",
            [
                {"messages": [*m, {"role": "assistant", "content": t}]}
                for m, t in zip(chat, tails, strict=True)
            ],
        ),
        "prefs": _write_jsonl(
            root / "prefs.jsonl",
            [
                {"prompt": h, "chosen": t, "rejected": t[::-1] + " no"}
                for h, t in zip(heads, tails, strict=True)
            ],
        ),
        "prompts": _write_jsonl(root / "prompts.jsonl", [{"prompt": h} for h in heads[:12]]),
        "chat_prompts": _write_jsonl(root / "chat_prompts.jsonl", [{"messages": m} for m in chat[:12]]),
    }


@pytest.fixture(scope="session")
def family_dir(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """``family_dir(name) -> Path``: the family's tiny causal LM + tokenizer directory, built once."""
    from rlhf.models.tiny import save_tiny, tiny_family_lm, toy_corpus, train_family_tokenizer

    root = tmp_path_factory.mktemp("compat_models")
    corpus = toy_corpus(400, seed=0)
    built: dict[str, Path] = {}

    def build(name: str) -> Path:
        if name not in built:
            tokenizer = train_family_tokenizer(name, corpus)
            built[name] = save_tiny(tiny_family_lm(name, tokenizer, seed=0), tokenizer, root / name)
        return built[name]

    return build


class Runs:
    """Each (command, variant, family) run at most once per session; returns its ``final/`` or output."""

    def __init__(self, root: Path, family_dir: Callable[[str], Path], data: dict[str, Path]):
        self.root, self.family_dir, self.data = root, family_dir, data
        self.done: dict[tuple[str, str], Any] = {}

    def get(self, key: str, family: str) -> Any:
        if (key, family) not in self.done:
            self.done[key, family] = getattr(self, key.replace("-", "_"))(
                family, self.root / f"{key}-{family}"
            )
        return self.done[key, family]

    # -- the runs ------------------------------------------------------------------------------------------

    def _train(self, command: str, values: dict[str, Any]) -> Path:
        from rlhf.config import config_from_dict
        from rlhf.trainers import grpo, ppo, reward_model, sft

        trainer = {"sft": sft, "rm": reward_model, "ppo": ppo, "grpo": grpo}[command]
        return trainer.run(config_from_dict(command, {"progress": False, "save_every": 0} | values))

    def _sft(self, family: str, out: Path, **values: Any) -> Path:
        return self._train("sft", {
            "model": str(self.family_dir(family)), "train_data": str(self.data["sft"]), "output_dir": str(out),
            "epochs": 1, "batch_size": 12, "max_length": 48, "learning_rate": 1e-3, "eval_every": 0,
        } | values)  # fmt: skip

    def sft(self, family: str, out: Path) -> Path:
        return self._sft(family, out)

    def sft_chat(self, family: str, out: Path) -> Path:
        return self._sft(family, out, train_data=str(self.data["sft_chat"]))

    def sft_lora(self, family: str, out: Path) -> Path:
        return self._sft(family, out, lora={"r": 4, "alpha": 8, "dropout": 0.0})

    def rm(self, family: str, out: Path) -> Path:
        return self._train("rm", {
            "model": str(self.family_dir(family)), "train_data": str(self.data["prefs"]), "output_dir": str(out),
            "epochs": 1, "batch_size": 12, "max_length": 48, "learning_rate": 1e-3, "eval_every": 0,
        })  # fmt: skip

    def _ppo(self, family: str, out: Path, command: str = "ppo", **values: Any) -> Path:
        base = {
            "policy": str(self.family_dir(family)), "reward": f"{REWARDS}:length_chars",
            "train_data": str(self.data["prompts"]), "output_dir": str(out), "steps": 2, "batch_size": 4,
            "max_new_tokens": 6, "temperature": 1.0, "learning_rate": 1e-3, "eval_every": 0,
        }  # fmt: skip
        if command == "ppo":
            base |= {"ppo_epochs": 1, "num_minibatches": 2}
        else:
            base |= {"batch_size": 2, "group_size": 2}
        return self._train(command, base | values)

    def ppo(self, family: str, out: Path) -> Path:
        """Shared critic; the sft policy against the trained reward model (its tokenizer is the policy's)."""
        return self._ppo(family, out, policy=str(self.get("sft", family)), reward=str(self.get("rm", family)))

    def ppo_separate(self, family: str, out: Path) -> Path:
        """A separate critic, started from the reward model (which reads the policy's tokens)."""
        return self._ppo(family, out, critic="separate", reward=str(self.get("rm", family)))

    def ppo_lora(self, family: str, out: Path) -> Path:
        return self._ppo(family, out, lora={"r": 4, "alpha": 8, "dropout": 0.0})

    def ppo_chat(self, family: str, out: Path) -> Path:
        """Chat prompts; a template whose turns end with a token other than eos stops at that token."""
        stop = {"gemma2": "<end_of_turn>", "phi3": "<|end|>"}.get(family, "eos")
        return self._ppo(family, out, train_data=str(self.data["chat_prompts"]), stop_token=stop)

    def grpo(self, family: str, out: Path) -> Path:
        return self._ppo(family, out, command="grpo", policy=str(self.get("sft", family)))

    def sample(self, family: str, out: Path) -> Path:
        from rlhf import sample
        from rlhf.config import config_from_dict

        output = out / "preferences.jsonl"
        sample.run(config_from_dict("sample", {
            "policy": str(self.get("sft", family)), "prompts": str(self.data["prompts"]), "output": str(output),
            "mode": "preferences", "num_samples": 2, "judge": str(self.get("rm", family)), "max_new_tokens": 6,
            "progress": False,
        }))  # fmt: skip
        return output

    def eval(self, family: str, out: Path) -> dict[str, Any]:
        from rlhf import evaluate
        from rlhf.config import config_from_dict

        return evaluate.run(config_from_dict("eval", {
            "policy": str(self.get("ppo", family)), "baseline": str(self.get("sft", family)),
            "eval_data": str(self.data["prompts"]), "reward": str(self.get("rm", family)),
            "output": str(out / "eval.json"), "max_new_tokens": 6, "progress": False,
        }))  # fmt: skip


@pytest.fixture(scope="session")
def runs(tmp_path_factory: pytest.TempPathFactory, family_dir, compat_data) -> Runs:
    return Runs(tmp_path_factory.mktemp("compat_runs"), family_dir, compat_data)
