"""Shared fixtures: a locally trained tokenizer and tiny random-init models saved to disk — offline, built once.

Session-scoped fixtures yield *directories* (``save_pretrained`` model + tokenizer), so tests load them with
``from_pretrained`` exactly as a user would load a checkpoint and can never leak mutations into each other.
The ``tokenizer``/``other_tokenizer`` fixtures are fresh per test for the same reason (tests may set
``padding_side``). Everything is built lazily on first use and cached for the session.

| fixture | yields |
|---|---|
| ``tokenizer_dir`` / ``tokenizer`` | the main tokenizer (specials at ids 0..5): its directory / a fresh instance |
| ``other_tokenizer_dir`` / ``other_tokenizer`` | a different tokenizer (other corpus and vocab size, specials last) |
| ``tiny_llama_dir``, ``tiny_gpt2_dir``, ``tiny_qwen2_dir`` | causal LM + main tokenizer, one per architecture |
| ``tiny_model_dir`` | parametrised over the three architectures above |
| ``chat_policy`` | the tiny llama after SFT on conversations of ``episode_envs.py:CodeWord``'s format (multi-turn) |
| ``tiny_reward_model_dir`` | llama reward model (one output) + main tokenizer |
| ``tiny_reward_model_other_tokenizer_dir`` | gpt2 reward model + ``other_tokenizer`` |
| ``ragged`` | trainer runs whose sampled responses have different lengths (some stopped, some cut) |
| ``adam_steps`` | predicts the weights after clipped AdamW steps from the recorded gradients |
| ``clipped_gradients`` | a list that collects every trainable gradient passed to ``clip_grad_norm_`` |
| ``on_cpu`` | the library and the processes a test starts see no GPU: for a test that pins the CPU's numerics |
| ``fake_gpu`` | a CUDA GPU that computes on the CPU and raises CUDA's error where GPU and CPU tensors meet |

Tests run on whatever device the library picks (a GPU when torch sees one). One that pins the CPU's numerics —
which samples a seed draws (CUDA's generators draw other numbers than the CPU's), bits compared with a CPU run —
states it with ``@pytest.mark.usefixtures("on_cpu")`` and says why beside it; comparisons within one run or between
two runs on the same device need nothing.

Precision: the suite's runs compute in float32 unless they set ``model.bf16`` (``_float32_unless_set``): their
tolerances are float32's, and on a GPU ``model.bf16`` unset would mean bfloat16 mixed precision. The bfloat16
paths are tested where a test asks for them (tests/trainers/test_precision.py, and ``fake_gpu``, which reports a
bfloat16 GPU).
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import torch

import offline

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

# transformers (≈2 s to import) and rlhf.models are imported inside the fixtures, so runs that need no model
# (tests/core) do not pay for them.
ARCHS = ("llama", "gpt2", "qwen2")  # = rlhf.models.tiny.ARCHS, checked in tests/models/test_tiny.py

# One intra-op thread, here and in the processes a test starts (torch reads OMP_NUM_THREADS when it is imported).
# The suite must not crawl on a busy machine, and `make test` runs two test processes at once on CI's 2 cores
# (pytest-xdist): with two threads, OpenMP's threads spin waiting for each other whenever another process holds a
# core (measured on 2 cores with two CPU-bound processes beside it: tests/trainers/test_grpo.py 77 s with two
# threads, 10 s with one; the default demo's test 2,285 s with two threads beside the other test process, 1,788 s
# with one, 955 s alone with two). Results do not depend on it: every comparison is within one process or between
# processes that compute alike, and the demo's figures were measured identical with 1 and 2 threads
# (docs/reproducibility.md).
torch.set_num_threads(1)
os.environ.setdefault("OMP_NUM_THREADS", "1")

# No test needs the network (tests/offline.py): the Hub's client answers from the cache here and in the processes a
# test starts (set before huggingface_hub is imported: it reads the variable once), and this process refuses any
# connection outside the machine, failing the test that tried (`_offline`).
os.environ["HF_HUB_OFFLINE"] = "1"
offline.install()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The tests marked ``longest`` first; skip tests marked ``gpu`` when no CUDA device is available.

    Run in parallel (`make test`: ``-n 2 --dist loadfile --no-loadscope-reorder``), the suite hands out whole files
    in this order, the longest first (each 200-600 s of one process: the torchrun, kill-and-resume, vLLM and
    multi-turn files), so that the two processes end together on short files instead of one waiting for the
    other's last long file."""
    items.sort(key=lambda item: "longest" not in item.keywords)  # stable: the rest keep their order
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device (torch.cuda.is_available() is False)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture(autouse=True)
def _float32_unless_set(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a GPU, ``model.bf16`` unset resolves to float32 in this process's runs, as it does on a CPU
    (`rlhf.models.precision.bf16_enabled` asks ``torch.cuda.is_bf16_supported``): the tests' tolerances are
    float32's. Runs that set ``model.bf16`` get what they set; processes a test starts get the real default."""
    if torch.cuda.is_available():
        monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kwargs: False)


@pytest.fixture(autouse=True)
def _offline() -> Iterator[None]:
    """A test that reached for a host outside this machine fails, whether or not the code under test swallowed the
    refusal (a library that falls back to its cache, say)."""
    offline.ATTEMPTS.clear()
    yield
    assert not offline.ATTEMPTS, f"the test reached for the network: {sorted(set(offline.ATTEMPTS))}"


@pytest.fixture(autouse=True)
def _seed_everything() -> None:
    """Every test starts from the same torch and ``random`` RNG state, whatever ran before it."""
    torch.manual_seed(0)
    random.seed(0)


# --------------------------------------------------------------------------------------------------------------
# Tokenizers
# --------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def tiny_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Session directory holding every tiny tokenizer and model."""
    return tmp_path_factory.mktemp("tiny")


@pytest.fixture(scope="session")
def tokenizer_dir(tiny_root: Path) -> Path:
    """The main tokenizer: 512-token byte-level BPE on ``toy_corpus(2000, seed=0)``, specials at ids 0..5."""
    from rlhf.models.tiny import toy_corpus, train_tokenizer

    path = tiny_root / "tokenizer"
    train_tokenizer(toy_corpus(2000, seed=0), vocab_size=512).save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def other_tokenizer_dir(tiny_root: Path) -> Path:
    """A second tokenizer whose ids differ from the main one's, special tokens included (they come last)."""
    from rlhf.models.tiny import toy_corpus, train_tokenizer

    path = tiny_root / "other_tokenizer"
    train_tokenizer(toy_corpus(500, seed=1), vocab_size=384, specials_last=True).save_pretrained(path)
    return path


@pytest.fixture
def tokenizer(tokenizer_dir: Path) -> PreTrainedTokenizerBase:
    """A fresh instance of the main tokenizer (``padding_side="right"``), loaded from ``tokenizer_dir``."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tokenizer_dir)


@pytest.fixture
def other_tokenizer(other_tokenizer_dir: Path) -> PreTrainedTokenizerBase:
    """A fresh instance of the second tokenizer."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(other_tokenizer_dir)


# --------------------------------------------------------------------------------------------------------------
# Models
# --------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def tiny_model_dir_factory(tiny_root: Path, tokenizer_dir: Path) -> Callable[[str], Path]:
    """``factory(arch) -> Path``: builds (once per session) and saves a tiny causal LM with the main tokenizer."""
    from transformers import AutoTokenizer

    from rlhf.models.tiny import save_tiny, tiny_causal_lm

    built: dict[str, Path] = {}
    tok = AutoTokenizer.from_pretrained(tokenizer_dir)

    def factory(arch: str) -> Path:
        if arch not in built:
            built[arch] = save_tiny(tiny_causal_lm(arch, tok, seed=0), tok, tiny_root / f"{arch}_causal_lm")
        return built[arch]

    return factory


@pytest.fixture(scope="session")
def tiny_llama_dir(tiny_model_dir_factory: Callable[[str], Path]) -> Path:
    """Llama causal LM (2 layers, hidden 64, rotary, untied embeddings, no dropout) + main tokenizer."""
    return tiny_model_dir_factory("llama")


@pytest.fixture(scope="session")
def tiny_gpt2_dir(tiny_model_dir_factory: Callable[[str], Path]) -> Path:
    """GPT-2 causal LM (absolute positions, tied embeddings, dropout 0.1) + main tokenizer."""
    return tiny_model_dir_factory("gpt2")


@pytest.fixture(scope="session")
def tiny_qwen2_dir(tiny_model_dir_factory: Callable[[str], Path]) -> Path:
    """Qwen2 causal LM (attention biases, grouped-query attention) + main tokenizer."""
    return tiny_model_dir_factory("qwen2")


@pytest.fixture(scope="session", params=ARCHS)
def tiny_model_dir(request: pytest.FixtureRequest, tiny_model_dir_factory: Callable[[str], Path]) -> Path:
    """Each architecture's causal LM directory in turn (test ids ``[llama]``, ``[gpt2]``, ``[qwen2]``)."""
    return tiny_model_dir_factory(request.param)


@pytest.fixture(scope="session")
def tiny_reward_model_dir(tiny_root: Path, tokenizer_dir: Path) -> Path:
    """Llama reward model (``num_labels=1``) with the main tokenizer — the policy's tokenizer."""
    from transformers import AutoTokenizer

    from rlhf.models.tiny import save_tiny, tiny_reward_model

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    return save_tiny(tiny_reward_model("llama", tok, seed=1), tok, tiny_root / "llama_reward_model")


@pytest.fixture(scope="session")
def tiny_reward_model_other_tokenizer_dir(tiny_root: Path, other_tokenizer_dir: Path) -> Path:
    """GPT-2 reward model with ``other_tokenizer``: scoring policy text with it needs decode + re-encode.

    GPT-2 on purpose: its absolute positions make a left-padded forward without ``position_ids`` wrong.
    """
    from transformers import AutoTokenizer

    from rlhf.models.tiny import save_tiny, tiny_reward_model

    tok = AutoTokenizer.from_pretrained(other_tokenizer_dir)
    return save_tiny(tiny_reward_model("gpt2", tok, seed=2), tok, tiny_root / "gpt2_reward_model_other_tokenizer")


# --------------------------------------------------------------------------------------------------------------
# Trainers
# --------------------------------------------------------------------------------------------------------------


@pytest.fixture
def ragged(monkeypatch: pytest.MonkeyPatch) -> None:
    """Responses of different lengths, most ending with EOS, some running to max_new_tokens (tests/ragged.py)."""
    from ragged import ragged as make_ragged
    from rlhf.rollout import generation

    monkeypatch.setattr(generation, "generate", make_ragged(generation.generate))


def _adam_steps(
    initial: dict[str, torch.Tensor],
    steps: list[dict[str, torch.Tensor]],
    lrs: list[float],
    max_norm: float | None,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(predicted weights, per-element tolerance) after AdamW steps without weight decay, from ``initial`` and
    each step's recorded gradients (before clipping) and learning rate.

    Each step clips as ``clip_grad_norm_`` does (its own ``get_total_norm``, so the clip coefficient is
    bit-identical), then m ← β₁m + (1−β₁)g, v ← β₂v + (1−β₂)g², w ← w − lr·m̂/(√v̂ + ε) with m̂ = m/(1−β₁ᵗ),
    v̂ = v/(1−β₂ᵗ). Checking each run against its *own* gradients is how equivalence tests compare weights:
    two runs whose gradients agree to float noise can still differ by up to 2·lr in an entry where |g| ≈ ε
    (at the first step m̂/(√v̂ + ε) = g/(|g| + ε) turns that noise into a step of any size), so no fixed
    tolerance between two runs' weights follows from the arithmetic. The tolerance: per step, w − step rounds
    once in the run and once here (½ ulp of |w| each) and the step carries a few ulp of relative error from
    the clip, the moments, the sqrt and the division: 4 ulp of (|w| + lr) per step bounds both.

    Computed where the gradients are (the device the run trained on: there ``get_total_norm`` is the run's own
    kernel, so the clip coefficient stays bit-identical on a GPU too), returned on the device of ``initial`` (where
    the caller holds the weights it compares, usually read back from a saved file on the CPU). Both devices do
    IEEE float32 arithmetic with a correctly rounded sqrt and division, so the tolerance holds on either.
    """
    beta1, beta2 = betas
    ulp = torch.finfo(torch.float32).eps
    home = next(iter(initial.values())).device
    device = steps[0][next(iter(initial))].device if steps else home
    weights = {name: w.to(device=device, dtype=torch.float32, copy=True) for name, w in initial.items()}
    m = {name: torch.zeros_like(w) for name, w in weights.items()}
    v = {name: torch.zeros_like(w) for name, w in weights.items()}
    tolerance = {name: torch.zeros_like(w) for name, w in weights.items()}
    for t, (grads, lr) in enumerate(zip(steps, lrs, strict=True), start=1):
        scale = 1.0
        if max_norm is not None:
            total = torch.nn.utils.get_total_norm([grads[name] for name in weights])
            scale = torch.clamp(max_norm / (total + 1e-6), max=1.0)
        for name, w in weights.items():
            g = grads[name].float() * scale
            m[name] = beta1 * m[name] + (1 - beta1) * g
            v[name] = beta2 * v[name] + (1 - beta2) * g * g
            m_hat, v_hat = m[name] / (1 - beta1**t), v[name] / (1 - beta2**t)
            tolerance[name] += 4 * ulp * (w.abs() + lr)
            weights[name] = w - lr * m_hat / (v_hat.sqrt() + eps)
    return {name: w.to(home) for name, w in weights.items()}, {name: t.to(home) for name, t in tolerance.items()}


@pytest.fixture
def adam_steps():
    """``adam_steps(initial, steps, lrs, max_norm) -> (predicted, tolerance)``, see `_adam_steps`."""
    return _adam_steps


@pytest.fixture
def clipped_gradients(monkeypatch: pytest.MonkeyPatch) -> list[torch.Tensor]:
    """Every gradient handed to ``torch.nn.utils.clip_grad_norm_`` (before clipping), in parameter order, one
    optimizer step after the other (the trainers clip once per step, with no-grad parameters as zeros)."""
    grads: list[torch.Tensor] = []
    clip = torch.nn.utils.clip_grad_norm_

    def recording(params, max_norm, *args, **kwargs):
        params = list(params)
        grads.extend(torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in params)
        return clip(params, max_norm, *args, **kwargs)

    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", recording)
    return grads


@pytest.fixture
def on_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """The test runs on the CPU whatever the machine: ``torch.cuda.is_available()`` is False for the library's choice
    of device (`rlhf.runlog.distributed`'s ``_device`` and ``device_for_run``, `rlhf plan`), as a user gets it with
    ``CUDA_VISIBLE_DEVICES=`` — which the processes the test starts get as well (set before they import torch, it
    hides the GPUs from them; in this process CUDA may already be initialised, hence the patch)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")


@pytest.fixture(scope="session")
def chat_policy(tiny_llama_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny llama after SFT on CodeWord-shaped conversations whose answers are random words: it knows the format
    (short turns that stop) and the words, not to copy the reply (a random-init model rarely stops within 6
    tokens, so its episodes would seldom reach a second turn)."""
    import json

    from configs import nested
    from episode_envs import WORDS
    from rlhf.config import config_from_dict
    from rlhf.trainers import sft

    rng = random.Random(0)
    root = tmp_path_factory.mktemp("chat_policy")
    demos = root / "sft.jsonl"

    def conversation() -> list[dict]:
        return [
            {"role": "user", "content": "listen"},
            {"role": "assistant", "content": "ok"},
            {"role": "user", "content": f"the word is {rng.choice(WORDS)}"},
            {"role": "assistant", "content": rng.choice(WORDS)},
        ]

    demos.write_text("".join(json.dumps({"messages": conversation()}) + "\n" for _ in range(256)))
    values = {"model.name": str(tiny_llama_dir), "data.train": str(demos), "output_dir": str(root / "sft"),
              "sft.epochs": 10, "optim.learning_rate": 3e-3, "batch.size": 16, "run.eval_every": 0,
              "run.save_every": 0, "run.progress": False}  # fmt: skip
    return sft.run(config_from_dict("sft", nested(values)))


@pytest.fixture
def fake_gpu():
    """For the test, the library sees one CUDA GPU that computes on the CPU (tests/fake_cuda.py): its runs put their
    tensors on ``cuda:0``, and an op that mixes them with CPU tensors raises CUDA's error, as on a GPU (whatever the
    machine has). Yields a ``fake_cuda.FakeGPU`` (``.ops``: how many ops ran on it)."""
    from fake_cuda import fake_cuda

    with fake_cuda() as gpu:
        yield gpu
