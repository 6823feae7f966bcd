"""No command fetches code from the Hub unless asked (docs/dependencies.md): transformers 5.25 turns Hub kernels on
by default and, once a model is on a GPU, fetches ``kernels-community`` code when the model goes into training mode.
rlhf loads every model with them off unless ``model.use_kernels`` is set.

The suite refuses the network (tests/offline.py) and the ``_offline`` fixture fails a test that reached for it;
here the Hub client's own offline switch is lifted too, so that the refusal is the only thing in the way."""

from __future__ import annotations

import os

import pytest

import offline
from rlhf.cli import main
from rlhf.models.loading import HUB_KERNELS, checkpointed, hub_kernels_wanted, load_causal_lm, use_hub_kernels


@pytest.fixture
def hub_reachable(monkeypatch: pytest.MonkeyPatch) -> None:
    """The Hub client believes it is online (the suite sets HF_HUB_OFFLINE) and USE_HUB_KERNELS is unset; whatever
    the test sets it to is undone afterwards (setenv records the value to restore, which delenv of an absent name
    would not)."""
    import huggingface_hub

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv(HUB_KERNELS, "")
    monkeypatch.delenv(HUB_KERNELS)


@pytest.mark.usefixtures("hub_reachable")
def test_loading_and_training_on_a_gpu_fetch_nothing(fake_gpu, tiny_llama_dir):
    """Where transformers 5.25 fetches: loading onto the GPU, then ``train()`` (as every trainer does) and
    ``eval()``. The model runs its own torch code: no kernel was asked for, none is installed."""
    model = load_causal_lm(str(tiny_llama_dir), device="cuda")
    checkpointed(model)  # model.train(): the kernelize step of transformers 5.25
    model.eval()
    assert not getattr(model, "use_kernels", False)
    assert offline.ATTEMPTS == []  # (the _offline fixture checks it too; here it is the test's point)


@pytest.mark.usefixtures("hub_reachable")
def test_use_kernels_is_handed_to_transformers(fake_gpu, tiny_llama_dir):
    """Asked for (``model.use_kernels: true``, which a command writes as USE_HUB_KERNELS=1), models load with
    transformers' ``use_kernels=True``: on this offline machine loading then fails where transformers reaches for the
    Hub. The check of the check: the same load with the default fetches nothing (the test above)."""
    pytest.importorskip("kernels")  # transformers before 5.25 does not install it: no kernel to fetch
    use_hub_kernels(True)
    assert hub_kernels_wanted()
    with pytest.raises(Exception):  # noqa: B017 - the kernels library's own error for a Hub it cannot reach
        checkpointed(load_causal_lm(str(tiny_llama_dir), device="cuda"))
    assert offline.ATTEMPTS, "transformers did not reach for the Hub: use_kernels=True did not get through"
    offline.ATTEMPTS.clear()  # reaching for it was this test's point


@pytest.mark.parametrize(("flags", "switch"), [([], "0"), (["--model.use_kernels"], "1")])
def test_a_command_sets_the_switch_from_its_config(monkeypatch, tmp_path, flags, switch):
    """``rlhf <command>`` writes ``model.use_kernels`` to USE_HUB_KERNELS before it loads anything, so the processes
    a run starts (torchrun ranks, the rollout worker) load alike; a value left in the environment does not decide."""
    monkeypatch.setenv(HUB_KERNELS, "1" if switch == "0" else "0")
    args = ["sft", "--data.train", "x.jsonl", "--model.name", str(tmp_path / "no"), "--output_dir", str(tmp_path)]
    assert main([*args, *flags]) == 2  # refused at the model's check, after the switch was set
    assert os.environ[HUB_KERNELS] == switch
