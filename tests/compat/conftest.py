"""The compatibility matrix's models and data: one tiny model per family, built once per session, and small
data files for every command.

Each family (``tiny_models.FAMILIES``) gets a tokenizer trained locally with its quirks (no pad, pad =
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

from configs import nested

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
            [{"messages": [*m, {"role": "assistant", "content": t}]} for m, t in zip(chat, tails, strict=True)],
        ),
        "prefs": _write_jsonl(
            root / "prefs.jsonl",
            [{"prompt": h, "chosen": t, "rejected": t[::-1] + " no"} for h, t in zip(heads, tails, strict=True)],
        ),
        "prompts": _write_jsonl(root / "prompts.jsonl", [{"prompt": h} for h in heads[:12]]),
        "chat_prompts": _write_jsonl(root / "chat_prompts.jsonl", [{"messages": m} for m in chat[:12]]),
    }


@pytest.fixture(scope="session")
def family_dir(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """``family_dir(name) -> Path``: the family's tiny causal LM + tokenizer directory, built once."""
    from rlhf.models.tiny import save_tiny, toy_corpus
    from tiny_models import tiny_family_lm, train_family_tokenizer

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
            self.done[key, family] = getattr(self, key.replace("-", "_"))(family, self.root / f"{key}-{family}")
        return self.done[key, family]

    # -- the runs ------------------------------------------------------------------------------------------

    def _train(self, command: str, values: dict[str, Any]) -> Path:
        from rlhf.config import config_from_dict
        from rlhf.trainers import reward_model, sft
        from rlhf.trainers.rl import grpo, ppo

        trainer = {"sft": sft, "rm": reward_model, "ppo": ppo, "grpo": grpo}[command]
        return trainer.run(config_from_dict(command, nested({"run.progress": False, "run.save_every": 0} | values)))

    def _sft(self, family: str, out: Path, **values: Any) -> Path:
        return self._train("sft", {
            "model.name": str(self.family_dir(family)), "data.train": str(self.data["sft"]), "output_dir": str(out),
            "sft.epochs": 1, "batch.size": 12, "data.max_length": 48, "optim.learning_rate": 1e-3, "run.eval_every": 0,
        } | values)  # fmt: skip

    def sft(self, family: str, out: Path) -> Path:
        return self._sft(family, out)

    def sft_chat(self, family: str, out: Path) -> Path:
        return self._sft(family, out, **{"data.train": str(self.data["sft_chat"])})

    def sft_lora(self, family: str, out: Path) -> Path:
        return self._sft(family, out, **{"model.lora": {"r": 4, "alpha": 8, "dropout": 0.0}})

    def rm(self, family: str, out: Path) -> Path:
        return self._train("rm", {
            "model.name": str(self.family_dir(family)), "data.train": str(self.data["prefs"]), "output_dir": str(out),
            "rm.epochs": 1, "batch.size": 12, "data.max_length": 48, "optim.learning_rate": 1e-3, "run.eval_every": 0,
        })  # fmt: skip

    def _ppo(self, family: str, out: Path, command: str = "ppo", **values: Any) -> Path:
        base = {
            "model.name": str(self.family_dir(family)), "reward.source": f"{REWARDS}:length_chars",
            "data.train": str(self.data["prompts"]), "output_dir": str(out), f"{command}.steps": 2, "batch.size": 4,
            "sampling.max_new_tokens": 6, "sampling.temperature": 1.0, "optim.learning_rate": 1e-3, "run.eval_every": 0,
        }  # fmt: skip
        if command == "ppo":
            base |= {"ppo.epochs": 1, "ppo.num_minibatches": 2}
        else:
            base |= {"batch.size": 2, "grpo.group_size": 2}
        return self._train(command, base | values)

    def ppo(self, family: str, out: Path) -> Path:
        """Shared critic; the sft policy against the trained reward model (its tokenizer is the policy's)."""
        return self._ppo(family, out, **{"model.name": str(self.get("sft", family)), "reward.source": str(self.get("rm", family)),
                                         "ppo.critic": "shared"})  # fmt: skip

    def ppo_separate(self, family: str, out: Path) -> Path:
        """A separate critic, started from the reward model (which reads the policy's tokens)."""
        return self._ppo(family, out, **{"ppo.critic": "separate", "reward.source": str(self.get("rm", family))})

    def ppo_lora(self, family: str, out: Path) -> Path:
        return self._ppo(family, out, **{"model.lora": {"r": 4, "alpha": 8, "dropout": 0.0}})

    def ppo_chat(self, family: str, out: Path) -> Path:
        """Chat prompts; a template whose turns end with a token other than eos stops at that token."""
        stop = {"gemma2": "<end_of_turn>", "phi3": "<|end|>"}.get(family, "eos")
        return self._ppo(family, out, **{"data.train": str(self.data["chat_prompts"]), "sampling.stop": stop})

    def grpo(self, family: str, out: Path) -> Path:
        return self._ppo(family, out, command="grpo", **{"model.name": str(self.get("sft", family))})

    def sample(self, family: str, out: Path) -> Path:
        from rlhf import sample
        from rlhf.config import config_from_dict

        output = out / "preferences.jsonl"
        sample.run(config_from_dict("sample", nested({
            "model.name": str(self.get("sft", family)), "prompts": str(self.data["prompts"]), "output": str(output),
            "mode": "preferences", "num_samples": 2, "judge.source": str(self.get("rm", family)), "sampling.max_new_tokens": 6,
            "progress": False,
        })))  # fmt: skip
        return output

    def eval(self, family: str, out: Path) -> dict[str, Any]:
        from rlhf import evaluate
        from rlhf.config import config_from_dict

        return evaluate.run(config_from_dict("eval", nested({
            "model.name": str(self.get("ppo", family)), "baseline": str(self.get("sft", family)),
            "eval_data": str(self.data["prompts"]), "reward.source": str(self.get("rm", family)),
            "output": str(out / "eval.json"), "sampling.max_new_tokens": 6, "progress": False,
        })))  # fmt: skip


@pytest.fixture(scope="session")
def runs(tmp_path_factory: pytest.TempPathFactory, family_dir, compat_data) -> Runs:
    return Runs(tmp_path_factory.mktemp("compat_runs"), family_dir, compat_data)
