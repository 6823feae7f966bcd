"""vLLM as a rollout engine over HTTP (server mode): a client of a running vLLM server that samples token ids with the
log-probs of the distribution it drew them from, and pushes the policy's weights to it after each update. The same
interface as the colocated `rlhf.rollout.vllm_engine.VLLMEngine`; standard library and torch only (vLLM runs in the
server's environment, not this one).

Never silently stale (docs/vllm.md, "How the weights travel"): the version of each push is read back and checked
against the one vLLM reports for every sampled token; a mismatch raises `ServiceError`, as does every failure of the
server (down, slow, HTTP errors, malformed replies)."""

from __future__ import annotations

import json
import os
import tempfile
import urllib.parse
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch
from safetensors.torch import save_file
from torch import nn

from rlhf.httpclient import HttpFailure, ServiceError, cut, send
from rlhf.rollout.engine import Samples, SamplingParams, TokenRows
from rlhf.rollout.vllm_engine import plain_weights, request

BACKOFF = 1.0
"""Seconds before a request's second try, doubled before each further one."""

STARTUP_VERSION = "default"
"""vLLM's weight version until someone sets one: the checkpoint the server was started with."""

SETUP = (
    "VLLM_SERVER_DEV_MODE=1 python -m vllm.entrypoints.openai.api_server --model DIR --enable-scale-out "
    "--logprobs-mode processed_logprobs"
)
"""The server's command line (docs/vllm.md, "Server", says why each part)."""


class VLLMServer:
    """A client of the vLLM server (0.32) at ``url`` (``http://host:port``, with or without ``/v1``), started as
    :data:`SETUP` over the policy saved (architecture, tokenizer, starting weights); docs/vllm.md, "Server", says why
    each part. :meth:`sync` has it reload the weights from a temporary directory (under ``$TMPDIR``) it must be able to
    read (docs/vllm.md, "How the weights travel", says why this way). ``timeout``: seconds per HTTP request (a reload
    of a large model, a long rollout); ``tries``: attempts per request, 1 = no retry. Under torchrun every rank samples
    its rows from the one server; rank 0 alone pushes, and the others take its ``client`` and ``version``
    (`rlhf.trainers.rl.models.Models.sync_engine`)."""

    shared = True
    """One server for all ranks (a colocated engine is each rank's own)."""

    def __init__(self, url: str, *, timeout: float = 300.0, tries: int = 3):
        parsed = urllib.parse.urlparse(url)
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise ValueError(f"vLLM server URL {url!r} must look like http://host:port")
        self.url = url.rstrip("/").removesuffix("/v1")
        self.timeout, self.tries = float(timeout), int(tries)
        self.version = 0
        """How many times :meth:`sync` has pushed the policy's weights."""
        self.client = uuid.uuid4().hex[:12]
        """Names this client's weight versions, so that another client's push shows."""
        try:  # a dev-mode endpoint: the sync ones answer if this one does
            config = self._call("GET", "/server_info?config_format=json", None, "reading its configuration")
        except ServiceError as error:
            raise ServiceError(f"{error}. Is it up, and started as VLLMServer says? {SETUP}") from error
        try:
            mode = config["vllm_config"]["model_config"]["logprobs_mode"]
            self._concurrency = int(config["vllm_config"]["scheduler_config"]["max_num_seqs"])
        except (KeyError, TypeError, ValueError) as error:
            raise self._unexpected("reading its configuration", error, config) from error
        if mode != "processed_logprobs":
            raise ServiceError(
                f"vLLM server {self.url} gives {mode}, not the log-probs of the distribution it samples; start it as "
                f"{SETUP}"
            )

    def sync(self, policy: nn.Module) -> None:
        """Push ``policy``'s current weights (a LoRA policy: its base weights with the adapters added) and check the
        server now serves them."""
        version = self.version + 1
        label = self._label(version)
        with tempfile.TemporaryDirectory(prefix="rlhf-vllm-weights-") as directory:
            save_file(checkpoint(policy), os.path.join(directory, "model.safetensors"))
            # The label goes first: a server that restarts from here on is back at "default", which the read-back
            # below (or the next sample) sees; a reload that fails leaves a label `sample` does not expect.
            self._call("POST", "/update_weight_version", {"new_version": label}, "labelling the new weights")
            reload = {"method": "reload_weights", "kwargs": {"weights_path": directory}}
            self._call("POST", "/collective_rpc", reload, f"loading the weights saved in {directory}")
        # the cached prompt states were computed by the old weights; vLLM refuses while requests hold them
        reset = self._call("POST", "/reset_prefix_cache", None, "resetting its prefix cache")
        if not isinstance(reset, dict) or reset.get("success") is not True:
            raise ServiceError(f"vLLM server {self.url} did not reset its prefix cache: {cut(json.dumps(reset))}")
        reply = self._call("GET", "/weight_info", None, "reading its weight version")
        try:
            served = reply["weight_version"]
        except (KeyError, TypeError) as error:
            raise self._unexpected("reading its weight version", error, reply) from error
        if served != label:
            raise ServiceError(
                f"vLLM server {self.url} serves weight version {served!r} right after the push of {label!r}: "
                "it restarted meanwhile, or another client pushed its weights"
            )
        self.version = version

    def close(self) -> None:
        """Nothing to release: each request opens its own connection, and the server keeps running."""

    def sample(
        self, prompts: TokenRows, params: SamplingParams, stops: Sequence[int], pad_token_id: int, seeds: Sequence[int]
    ) -> Samples:
        """As `VLLMEngine.sample`; `ServiceError` if any token was sampled by other weights than the last :meth:`sync`
        pushed (before any: the server's startup checkpoint)."""
        # this endpoint takes vLLM's SamplingParams as they are (the OpenAI ones clamp logit_bias to ±100)
        sampling = request(params, stops, pad_token_id)
        bodies = [
            {"token_ids": list(prompt), "sampling_params": sampling | {"seed": seed}}
            for prompt, seed in zip(prompts, seeds, strict=True)
        ]
        # one request per row (a request's seed is shared by all its prompts), as many at once as the server batches
        with ThreadPoolExecutor(max_workers=max(1, min(len(bodies), self._concurrency))) as pool:
            try:
                rows = list(pool.map(self._generate, bodies))
            except BaseException:
                pool.shutdown(cancel_futures=True)  # the server is failing: do not queue the other rows at it
                raise
        return [ids for ids, _ in rows], [logprobs for _, logprobs in rows]

    def _generate(self, body: dict[str, Any]) -> tuple[list[int], list[float]]:
        """One row's token ids and log-probs, checked to come from the weights this client expects."""
        reply = self._call("POST", "/inference/v1/generate", body, "sampling")
        try:
            (choice,) = reply["choices"]
            ids = [int(token) for token in choice["token_ids"]]
            steps = choice["logprobs"]["content"]
            logprobs = [float(step["logprob"]) for step in steps]
            drawn = [int(step["token_id"]) for step in steps]
            versions = {span["version"] for span in choice["weight_versions"]}
            finish = choice["finish_reason"]
        except (KeyError, TypeError, ValueError) as error:
            raise self._unexpected("sampling", error, reply) from error
        if drawn != ids:
            raise self._unexpected("sampling", ValueError("log-probs of other tokens than the sampled ones"), reply)
        if finish not in ("stop", "length"):  # aborted: a cut row would pass for one that reached max_tokens
            raise ServiceError(f"vLLM server {self.url} ended a request with finish_reason {finish!r}")
        expected = self._label(self.version)
        if versions != {expected}:
            pushed = f"sync() #{self.version}" if self.version else "the server's startup checkpoint: no sync() yet"
            raise ServiceError(
                f"vLLM server {self.url}: stale weights: tokens sampled by weight version(s) {sorted(versions)}, "
                f"expected {expected!r} ({pushed}). The server restarted (back at {STARTUP_VERSION!r}, its startup "
                "checkpoint), a push failed, or another client pushed weights: sync() again"
            )
        return ids, logprobs

    def _label(self, version: int) -> str:
        """The server's weight version once :meth:`sync` has pushed ``version`` times."""
        return f"rlhf-{self.client}-{version}" if version else STARTUP_VERSION

    def _call(self, method: str, path: str, body: dict[str, Any] | None, what: str) -> Any:
        """The JSON reply to one request (None for an empty one); `ServiceError` naming the URL and each try."""
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        try:
            reply = send(method, self.url + path, data, headers, self.timeout, self.tries, BACKOFF)
        except HttpFailure as error:
            raise ServiceError(f"vLLM server {self.url}, {what}: {error}") from error
        try:
            return json.loads(reply) if reply.strip() else None
        except ValueError as error:
            raise ServiceError(f"vLLM server {self.url}, {what}: the reply is not JSON: {cut(reply)}") from error

    def _unexpected(self, what: str, error: Exception, reply: Any) -> ServiceError:
        return ServiceError(f"vLLM server {self.url}, {what}: unexpected reply ({error!r}): {cut(json.dumps(reply))}")


def checkpoint(policy: nn.Module) -> dict[str, torch.Tensor]:
    """``policy``'s weights (`plain_weights`) as safetensors saves them: on the CPU, contiguous, and a tensor that
    shares memory with an earlier one (tied embeddings) copied, since safetensors refuses shared tensors."""
    tensors, storages = {}, set()
    for name, tensor in plain_weights(policy):
        tensor = tensor.detach().to("cpu").contiguous()
        if tensor.untyped_storage().data_ptr() in storages:
            tensor = tensor.clone()
        storages.add(tensor.untyped_storage().data_ptr())
        tensors[name] = tensor
    return tensors
