"""rlhf: reinforcement learning from human feedback for causal language models.

The package is split by cost of import: ``rlhf.core`` is pure tensor math (torch + stdlib only);
models, rollout, data and trainers import ``transformers`` and friends lazily, when used.
"""

__version__ = "0.1.0"

LIBRARIES = ("torch", "transformers", "peft", "trl", "tokenizers", "huggingface_hub", "kernels")
"""The libraries whose versions a run's results depend on: `rlhf --version` prints them, every run's config.yaml
records them."""


def library_versions() -> dict[str, str]:
    """The installed version of each of :data:`LIBRARIES` (read from the package metadata: nothing is imported);
    a library that is not installed is left out."""
    from importlib import metadata

    versions = {}
    for name in LIBRARIES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return versions
