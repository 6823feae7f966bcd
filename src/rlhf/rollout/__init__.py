"""Rollouts: generating responses from the policy (``engine``, ``decoder``, ``generation``) and scoring them
(``rewards``, ``verifiers``, ``scoring``); the map of its modules: docs/architecture.md.

Submodules are imported explicitly; ``import rlhf.rollout`` loads nothing heavy."""
