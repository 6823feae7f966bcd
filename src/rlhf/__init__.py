"""rlhf: reinforcement learning from human feedback for causal language models.

The package is split by cost of import: ``rlhf.core`` is pure tensor math (torch + stdlib only);
models, rollout, data and trainers import ``transformers`` and friends lazily, when used.
"""

__version__ = "0.1.0"

LIBRARIES = ("torch", "transformers", "peft", "trl", "tokenizers", "huggingface_hub", "kernels")
"""The libraries whose versions a run's results depend on: `rlhf --version` prints them, every run's config.yaml
records them."""


def library_versions() -> dict[str, str]:
    """The version of each of :data:`LIBRARIES` installed: an imported module's own ``__version__`` (torch's names
    its build, ``2.14.1+cu130``, which the package metadata of a PyPI wheel does not), else the package metadata
    (nothing is imported); a library that is not installed is left out."""
    import sys
    from importlib import metadata

    versions = {}
    for name in LIBRARIES:
        loaded = getattr(sys.modules.get(name), "__version__", None)
        try:
            versions[name] = str(loaded) if loaded is not None else metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return versions
