"""Loading and building Hugging Face models: policies (with a value head or a separate critic), reference
models, reward models, LoRA adapters — and, in ``rlhf.models.tiny``, random-init tiny models and locally
trained tokenizers for tests and ``rlhf demo`` (no downloads).

Modules here import ``transformers`` (and ``peft`` where needed); ``import rlhf`` does not pull them in.
"""
