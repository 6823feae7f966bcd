"""Loading and building Hugging Face models (policies, value heads, critics, references, reward models, LoRA, FSDP2)
and, in ``rlhf.models.tiny``, tiny offline ones; the map of its modules: docs/architecture.md.

Modules here import ``transformers`` (and ``peft`` where needed); ``import rlhf`` does not pull them in."""
