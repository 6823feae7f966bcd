"""Pure tensor math of RLHF: one function per equation, tensors in, tensors (and small stat dicts) out.

Rules for this package (docs/architecture.md): imports only ``torch`` and the standard library; no models, no config
objects, no ``self``, no distributed calls, never writes into its inputs.

Notation used in every docstring:
    B   sequences in a batch (prompts × samples)
    T   response tokens (the response part of ``query ⊕ response``)
    G   samples per prompt (group size); N = B / G prompts
    V   vocabulary size
    K   number of reward functions (multi-reward)
    mask  bool or {0,1} tensor, True/1 = a real response token that counts
"""
