"""Rollouts: generating responses from the policy and scoring them.

* ``rlhf.rollout.engine`` — the default generation engine: batched, KV-cached sampling with any
  ``transformers`` causal LM (vLLM is the optional GPU engine).
* ``rlhf.rollout.rewards`` — reward sources (a reward model directory, a Python function, an HTTP
  endpoint, or a weighted list of them) and :func:`~rlhf.rollout.rewards.score_all`, which scores a batch
  with each source into a (B, K) matrix.

Submodules are imported explicitly; ``import rlhf.rollout`` loads nothing heavy.
"""
