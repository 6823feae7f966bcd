"""The orders data is read in, exactly resumable: the prompt stream of RL (PPO, GRPO) and the epochs of SFT and
RM (`EpochOrder`).

In the prompt stream epoch ``e`` visits every prompt once, in an order fixed by ``(seed, e)``; batches run across
the epoch boundary, so no prompt is ever skipped and any batch size works (one larger than the dataset may hold a
prompt twice). `PromptStream.state_dict` saves the position ``(epoch, index)`` with the seed, and a stream loaded
from it yields exactly the batches the original would have yielded next.
"""

from __future__ import annotations

import functools
import hashlib
import random
from array import array
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from rlhf.config import ConfigError
from rlhf.data.records import Message
from rlhf.data.tokenization import TokenizedPrompt


@dataclass(frozen=True)
class PromptBatch:
    """``B`` prompts for one RL iteration: ``texts`` as reward functions receive them, unpadded ``input_ids``
    (`left_pad` them for generation), the extra ``columns`` as keyword lists for ``reward(..., **columns)`` (None
    where a prompt lacks one), chat ``messages`` (None for plain prompts), each prompt's index in the dataset."""

    texts: list[str]
    input_ids: list[list[int]]
    columns: dict[str, list[Any]]
    messages: list[list[Message] | None]
    indices: list[int]

    def __len__(self) -> int:
        return len(self.texts)

    @classmethod
    def of(cls, prompts: Sequence[TokenizedPrompt], indices: Sequence[int]) -> PromptBatch:
        """The batch of ``prompts[i] for i in indices``."""
        chosen = [prompts[i] for i in indices]
        keys = list(dict.fromkeys(k for p in chosen for k in p.columns))
        return cls(
            texts=[p.text for p in chosen],
            input_ids=[list(p.input_ids) for p in chosen],
            columns={k: [p.columns.get(k) for p in chosen] for k in keys},
            messages=[p.messages for p in chosen],
            indices=list(indices),
        )


@functools.lru_cache(maxsize=2)  # a batch may straddle two epochs
def _permutation(n: int, key: str) -> tuple[int, ...]:
    """``range(n)`` shuffled from the string ``key``. `random` hashes a string seed with SHA-512: stable across
    runs, platforms and PYTHONHASHSEED, and (seed, epoch) pairs never collide as seed + epoch would."""
    order = list(range(n))
    random.Random(key).shuffle(order)
    return tuple(order)


def _fingerprint(prompts: Sequence[TokenizedPrompt]) -> str:
    h = hashlib.sha256()
    for p in prompts:
        h.update(p.text.encode("utf-8", "surrogatepass"))
        h.update(b"\x00")
    return h.hexdigest()[:16]


class PromptStream:
    """An endless iterator of `PromptBatch` of ``batch_size`` prompts, shuffled per epoch from ``seed``."""

    def __init__(self, prompts: Sequence[TokenizedPrompt], batch_size: int, seed: int = 0, shuffle: bool = True):
        if not prompts:
            raise ValueError("PromptStream needs at least one prompt")
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        self.prompts = prompts
        self.batch_size = batch_size
        self.seed = seed
        self.shuffle = shuffle
        self.epoch = 0
        self.index = 0  # next position in this epoch's order
        self._fingerprint = _fingerprint(prompts)

    def order(self, epoch: int) -> Sequence[int]:
        """The visiting order of epoch ``epoch``: a permutation of ``range(len(prompts))``."""
        n = len(self.prompts)
        return _permutation(n, f"rlhf.prompts:{self.seed}:{epoch}") if self.shuffle else range(n)

    def __iter__(self) -> Iterator[PromptBatch]:
        return self

    def __next__(self) -> PromptBatch:
        n = len(self.prompts)
        start = self.epoch * n + self.index  # prompts taken so far, over all epochs
        indices = [self.order(i // n)[i % n] for i in range(start, start + self.batch_size)]
        self.epoch, self.index = divmod(start + self.batch_size, n)
        return PromptBatch.of(self.prompts, indices)

    def state_dict(self) -> dict[str, Any]:
        """The exact position: ``{"seed", "epoch", "index", "shuffle", "num_prompts", "fingerprint"}``."""
        return {
            "seed": self.seed,
            "epoch": self.epoch,
            "index": self.index,
            "shuffle": self.shuffle,
            "num_prompts": len(self.prompts),
            "fingerprint": self._fingerprint,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a saved position; refuses a state saved with different prompts."""
        if state["num_prompts"] != len(self.prompts) or state["fingerprint"] != self._fingerprint:
            raise ValueError(
                f"the prompt stream state was saved with other prompts ({state['num_prompts']} prompts, "
                f"fingerprint {state['fingerprint']}; now {len(self.prompts)}, {self._fingerprint}): "
                "resume with the same train_data"
            )
        if not 0 <= state["index"] < len(self.prompts) or state["epoch"] < 0:
            raise ValueError(f"invalid prompt stream position: epoch {state['epoch']}, index {state['index']}")
        self.seed, self.shuffle = state["seed"], state["shuffle"]
        self.epoch, self.index = state["epoch"], state["index"]


T = TypeVar("T")


def held_out(items: Sequence[T], n: int, seed: int = 0) -> tuple[list[T], list[T]]:
    """Split ``items`` into (train, held-out) with ``n`` held out — e.g. eval prompts when no eval_data is given;
    deterministic for a given ``seed`` and disjoint, both parts in the original order."""
    if not 0 <= n < len(items):
        raise ValueError(f"cannot hold out {n} of {len(items)} items and keep some for training")
    held = set(_permutation(len(items), f"rlhf.held_out:{seed}")[:n])
    return [x for i, x in enumerate(items) if i not in held], [x for i, x in enumerate(items) if i in held]


class EpochOrder:
    """Which examples each optimizer step of SFT and RM trains on, epoch after epoch, exactly resumable. Epoch ``e``
    visits all N examples once, in an order fixed by ``(name, seed, e)``; unlike `PromptStream` an epoch's last batch
    holds the remainder, so an epoch is ``steps_per_epoch = ceil(N / batch_size)`` steps. ``fingerprint`` names the
    data: a state saved on other data, seed or batch size is refused, since the same position would mean other examples.
    """

    def __init__(self, num_examples: int, batch_size: int, seed: int, fingerprint: str, name: str):
        if num_examples < 1 or batch_size < 1:
            raise ValueError(f"EpochOrder needs examples and a batch size, got {num_examples}, {batch_size}")
        self.num_examples, self.batch_size, self.seed = num_examples, batch_size, seed
        self.fingerprint, self.name = fingerprint, name
        self.steps_per_epoch = -(-num_examples // batch_size)
        self.steps = 0  # batches taken so far

    def __iter__(self) -> Iterator[list[int]]:
        return self

    def __next__(self) -> list[int]:
        """The example indices of the next step."""
        epoch, index = divmod(self.steps, self.steps_per_epoch)
        self.steps += 1
        order = _permutation(self.num_examples, f"rlhf.{self.name}:{self.seed}:{epoch}")
        return list(order[index * self.batch_size : (index + 1) * self.batch_size])

    def state_dict(self) -> dict[str, Any]:
        return {
            "steps": self.steps,
            "seed": self.seed,
            "batch_size": self.batch_size,
            "num_examples": self.num_examples,
            "fingerprint": self.fingerprint,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue after ``state["steps"]`` batches; refuses a state whose data, seed or batch size differ."""
        mine = self.state_dict()
        changed = [k for k in ("seed", "batch_size", "num_examples", "fingerprint") if state[k] != mine[k]]
        if changed:
            raise ConfigError(
                f"{self.name}: the checkpoint was written with other "
                + ", ".join(f"{k} ({state[k]}, now {mine[k]})" for k in changed)
                + "; resume with the data.train, run.seed and batch.size of the interrupted run"
            )
        self.steps = state["steps"]


def fingerprint_of(rows: Iterable[Sequence[Sequence[int]]]) -> str:
    """A short hash of tokenised examples, each given as its id lists (e.g. input ids and labels)."""
    h = hashlib.sha256()
    for row in rows:
        for ids in row:
            h.update(array("q", ids).tobytes() + b",")
        h.update(b"|")
    return h.hexdigest()[:16]
