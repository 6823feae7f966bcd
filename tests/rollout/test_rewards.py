"""Reward sources: Python functions, HTTP endpoints, reward models, and scoring a batch with all of them."""

from __future__ import annotations

import json
import math
import socket
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer, BertConfig, BertForSequenceClassification

from rlhf.rollout.rewards import (
    FunctionReward,
    HttpReward,
    RewardError,
    RewardModelReward,
    RewardSet,
    load_reward_set,
    load_reward_source,
)

HERE = Path(__file__).resolve().parent
TOY = HERE / "toy_rewards.py"

PROMPTS = ["what is 2 + 3?", "count to 4:", "the red cat"]
COMPLETIONS = ["5", "1 2 3 4", "sees a dog in the park."]


def fn(name: str) -> FunctionReward:
    return FunctionReward.load(f"{TOY}:{name}")


def score_one(source, completions, prompts=None, columns=None):
    prompts = prompts or ["p"] * len(completions)
    return RewardSet([source]).score(prompts, completions, columns or {})


# --------------------------------------------------------------------------------------------------------------
# Python functions
# --------------------------------------------------------------------------------------------------------------


def test_function_from_file_path_relative_to_current_dir(monkeypatch):
    monkeypatch.chdir(HERE)
    source = load_reward_source("toy_rewards.py:length_reward")
    assert isinstance(source, FunctionReward) and source.name == "length_reward"
    assert source.score(PROMPTS, COMPLETIONS, {}) == [1.0, 7.0, 23.0]


def test_function_from_module_path(monkeypatch):
    monkeypatch.syspath_prepend(str(HERE))
    source = load_reward_source("toy_rewards:length_reward", name="len")
    assert source.name == "len"
    assert source.score(PROMPTS, COMPLETIONS, {}) == [1.0, 7.0, 23.0]
    nested = load_reward_source("toy_rewards:Scorer.by_prompt")
    assert nested.name == "by_prompt" and nested.score(PROMPTS, COMPLETIONS, {}) == [14.0, 11.0, 11.0]


def test_columns_are_passed_through_as_keyword_lists():
    source = fn("recording_reward")
    module = sys.modules[source.function.__module__]
    module.CALLS.clear()
    columns = {"answer": ["5", "4", "x"], "level": [1, 2, 3]}
    result = RewardSet([source]).score(PROMPTS, COMPLETIONS, columns)
    (call,) = module.CALLS
    # TRL's extra keyword arguments ride along (tests/rollout/test_trl_convention.py checks their values)
    assert call.keys() == {"prompts", "completions", *columns, "trainer_state", "log_metric", "log_extra"}
    assert {key: call[key] for key in ("prompts", "completions", *columns)} == {
        "prompts": PROMPTS,
        "completions": COMPLETIONS,
        **columns,
    }
    assert result.scores.shape == (3, 1)


def test_function_without_kwargs_gets_only_declared_arguments():
    columns = {"answer": ["5", "1 2 3", "x"], "unrelated": [0, 0, 0]}
    result = RewardSet([fn("exact_match"), fn("only_completions")]).score(PROMPTS, COMPLETIONS, columns)
    assert result.scores.tolist() == [[1.0, 0.5], [0.0, 0.5], [0.0, 0.5]]
    assert result.names == ["exact_match", "only_completions"]


def test_function_missing_a_required_column_names_it():
    with pytest.raises(RewardError, match=r"exact_match.*requires answer.*available: prompts, completions, .*level"):
        RewardSet([fn("exact_match")]).score(PROMPTS, COMPLETIONS, {"level": [1, 2, 3]})


def test_function_without_completions_parameter_is_refused_at_load():
    with pytest.raises(RewardError, match=r"no_completions.*has no `completions` \(or `completion_ids`\) parameter"):
        fn("no_completions")


def test_none_becomes_nan():
    result = score_one(fn("unscorable_when_empty"), ["a", "", "b"])
    assert result.scores[:, 0].isnan().tolist() == [False, True, False]
    assert result.scores[0, 0] == 1.0


def test_exception_names_source_sample_and_completion():
    with pytest.raises(
        RewardError, match=r"'fails_on_boom', sample 2 \(completion 'it went boom'\).*ZeroDivisionError"
    ):
        score_one(fn("fails_on_boom"), ["fine", "also fine", "it went boom", "boom again"])


@pytest.mark.parametrize(
    ("function", "message"),
    [
        ("nan_on_second", r"'nan_on_second', sample 1 \(completion 'b'\): score is nan \(return None"),
        ("inf_reward", r"'inf_reward', sample 0 \(completion 'a'\): score is inf"),
        ("string_score", r"sample 0 .*score '1.0' is a str, not a number"),
        ("too_few", r"'too_few' returned 2 scores for 3 completions"),
    ],
)
def test_invalid_scores_are_errors(function, message):
    with pytest.raises(RewardError, match=message):
        score_one(fn(function), ["a", "b", "c"])


def test_long_completions_are_cut_in_messages():
    with pytest.raises(RewardError, match=r"completion '(x){80}…'\)"):
        score_one(fn("nan_on_second"), ["a", "x" * 500])


def test_import_errors_are_clear(tmp_path, monkeypatch):
    with pytest.raises(RewardError, match=r"no such file 'missing.py'"):
        load_reward_source("missing.py:f")
    broken = tmp_path / "broken.py"
    broken.write_text("raise ValueError('boom at import')\n")
    with pytest.raises(RewardError, match=r"importing .*broken.py failed: ValueError: boom at import"):
        load_reward_source(f"{broken}:f")
    with pytest.raises(RewardError, match=r"cannot import module 'no_such_module_xyz': ModuleNotFoundError"):
        load_reward_source("no_such_module_xyz:f")
    with pytest.raises(RewardError, match=r"has no attribute 'lenght_reward'; its callables: .*length_reward"):
        load_reward_source(f"{TOY}:lenght_reward")
    with pytest.raises(RewardError, match=r"'NOT_CALLABLE' is a float, not a callable"):
        load_reward_source(f"{TOY}:NOT_CALLABLE")
    with pytest.raises(RewardError, match=r"names a Python file but no function"):
        load_reward_source("rewards.py")


# --------------------------------------------------------------------------------------------------------------
# HTTP
# --------------------------------------------------------------------------------------------------------------


class _QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):  # a client that timed out closes the socket; fine
        pass


@pytest.fixture
def server() -> Iterator[dict]:
    """A local reward endpoint: rewards = completion lengths; ``state["plan"]`` scripts failures first."""
    state: dict = {"requests": [], "plan": []}

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            state["requests"].append(body)
            action = state["plan"].pop(0) if state["plan"] else ("ok",)
            if action[0] == "sleep":
                time.sleep(action[1])
                return
            if action[0] == "status":
                payload, code = action[2].encode(), action[1]
            elif action[0] == "raw":
                payload, code = action[1].encode(), 200
            else:
                payload, code = json.dumps({"rewards": [len(c) for c in body["completions"]]}).encode(), 200
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args):
            pass

    httpd = _QuietServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    state["url"] = f"http://127.0.0.1:{httpd.server_address[1]}/score"
    yield state
    httpd.shutdown()
    httpd.server_close()


def test_http_success_with_columns(server):
    source = load_reward_source(server["url"])
    assert isinstance(source, HttpReward) and source.name == "127.0.0.1"
    result = RewardSet([source]).score(PROMPTS, COMPLETIONS, {"answer": ["5", "4", "x"]})
    assert result.scores[:, 0].tolist() == [1.0, 7.0, 23.0]
    assert server["requests"] == [{"prompts": PROMPTS, "completions": COMPLETIONS, "answer": ["5", "4", "x"]}]


def test_http_retries_a_server_error(server):
    server["plan"] = [("status", 500, "overloaded")]
    source = HttpReward(server["url"], backoff=0.01)
    assert source.score(PROMPTS, COMPLETIONS, {}) == [1, 7, 23]
    assert len(server["requests"]) == 2


def test_http_timeout_names_the_url(server):
    server["plan"] = [("sleep", 1.0)] * 2
    source = HttpReward(server["url"], timeout=0.2, tries=2, backoff=0.01)
    start = time.perf_counter()
    with pytest.raises(RewardError, match=rf"{server['url']} failed after 2 tries.*no reply within 0.2 s"):
        source.score(PROMPTS, COMPLETIONS, {})
    assert time.perf_counter() - start < 5.0  # 2 × 0.2 s timeouts, not the server's 1 s sleeps × 2


@pytest.mark.parametrize(
    ("action", "message"),
    [
        (("status", 400, "bad field"), r"refused the request: HTTP 400 .*'bad field'"),
        (("raw", '{"scores": [1]}'), r'reply has no "rewards" key'),
        (("raw", '{"rewards": [1]}'), r'"rewards" is 1 rewards, expected a list of 3'),
        (("raw", "<html>"), r"reply is not JSON: '<html>'"),
    ],
)
def test_http_bad_replies_fail_at_once(server, action, message):
    server["plan"] = [action]
    with pytest.raises(RewardError, match=message):
        HttpReward(server["url"], backoff=0.01).score(PROMPTS, COMPLETIONS, {})
    assert len(server["requests"]) == 1


@pytest.mark.parametrize(
    ("reply", "message"),
    [
        ('{"rewards": ["0.5", 1, 2]}', r'"rewards"\[0\] is \'"0.5"\' \(a JSON string\), expected a number, or null'),
        ('{"rewards": [1, {"score": 2}, 3]}', r'"rewards"\[1\] is .* \(a JSON object\)'),
        ('{"rewards": [1, 2, [3]]}', r'"rewards"\[2\] is .* \(a JSON array\)'),
        ('{"rewards": [1, 2, NaN]}', r'"rewards"\[2\] is nan; send null'),
    ],
)
def test_http_rewards_that_are_not_numbers_name_the_url(server, reply, message):
    """Scored the way the trainers score (RewardSet.score): the error names the URL, not just the source's name."""
    server["plan"] = [("raw", reply)]
    with pytest.raises(RewardError, match=f"reward {server['url']}: " + message):
        RewardSet([HttpReward(server["url"], backoff=0.01)]).score(PROMPTS, COMPLETIONS)
    assert len(server["requests"]) == 1  # a malformed reply is not retried


def test_http_unreachable_is_retried_then_named():
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{probe.getsockname()[1]}/x"
    with pytest.raises(RewardError, match=rf"{url} failed after 2 tries.*cannot connect"):
        HttpReward(url, tries=2, backoff=0.01, timeout=1.0).score(["p"], ["c"], {})


# --------------------------------------------------------------------------------------------------------------
# Reward models
# --------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def policy_tokenizer(tokenizer_dir):
    return AutoTokenizer.from_pretrained(tokenizer_dir)


@pytest.fixture(scope="module")
def rm(tiny_reward_model_dir, policy_tokenizer) -> RewardModelReward:
    """Llama reward model sharing the policy's tokenizer."""
    return load_reward_source(str(tiny_reward_model_dir), policy_tokenizer=policy_tokenizer, batch_size=4)


@pytest.fixture(scope="module")
def rm_other(tiny_reward_model_other_tokenizer_dir, policy_tokenizer) -> RewardModelReward:
    """GPT-2 reward model with a different tokenizer than the policy's."""
    return load_reward_source(str(tiny_reward_model_other_tokenizer_dir), policy_tokenizer=policy_tokenizer)


def chat_prompts(tokenizer) -> list[str]:
    """Prompts rendered by the chat template, as the trainer passes them (ending in '<|assistant|>\\n')."""
    return [
        tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)
        for p in PROMPTS
    ]


def hf_score(model, ids: list[int]) -> float:
    """Reference: the HF model's own pooled output on one unpadded sequence (its last token is the last real one)."""
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits[0, 0].item()


def test_reward_model_loads_frozen_and_named(rm, rm_other, tiny_reward_model_dir):
    assert isinstance(rm, RewardModelReward) and rm.name == tiny_reward_model_dir.name
    assert rm.shares_policy_tokenizer and not rm_other.shares_policy_tokenizer
    for source in (rm, rm_other):
        assert not source.model.training
        assert not any(p.requires_grad for p in source.model.parameters())
        assert all(m.p == 0 for m in source.model.modules() if isinstance(m, torch.nn.Dropout))
    assert any(isinstance(m, torch.nn.Dropout) for m in rm_other.model.modules())  # gpt2 had dropout 0.1


def test_reward_model_scores_match_hf_on_unpadded_sequences(rm, tiny_reward_model_dir):
    hf = AutoModelForSequenceClassification.from_pretrained(tiny_reward_model_dir).eval()
    prompts = chat_prompts(rm.tokenizer)
    expected = [hf_score(hf, ids) for ids in rm.encode(prompts, COMPLETIONS)]
    assert rm.score(prompts, COMPLETIONS, {}) == pytest.approx(expected, abs=1e-5)


@pytest.mark.parametrize("which", ["rm", "rm_other"])
def test_reward_model_scores_do_not_depend_on_padding_or_batch(which, request, monkeypatch):
    source: RewardModelReward = request.getfixturevalue(which)
    prompts = ["", "what is 2 + 3?", "count to 9:", "the red cat sees a dog", "x"]
    completions = ["7", "5", " 1 2 3 4 5 6 7 8 9", " in the park.", "y" * 40]
    alone = [source.score([p], [c], {})[0] for p, c in zip(prompts, completions, strict=True)]
    lengths = {len(ids) for ids in source.encode(prompts, completions)}
    assert len(lengths) == len(prompts)  # different lengths: the batch really pads
    monkeypatch.setattr(source, "batch_size", 16)
    together = source.score(prompts, completions, {})
    reversed_ = source.score(prompts[::-1], completions[::-1], {})[::-1]
    monkeypatch.setattr(source, "batch_size", 2)
    micro = source.score(prompts, completions, {})
    for scores in (together, reversed_, micro):
        assert scores == pytest.approx(alone, abs=1e-5)
    assert max(alone) - min(alone) > 1e-3  # not a constant model


def test_eos_is_appended_once(rm):
    eos = rm.tokenizer.eos_token
    plain, ended = rm.encode(["what is 2 + 3?"] * 2, ["5", "5" + eos])
    assert plain == ended and plain[-1] == rm.eos_id and plain[-2] != rm.eos_id
    assert rm.score(["q"] * 2, ["5", "5" + eos], {}) == pytest.approx([rm.score(["q"], ["5"], {})[0]] * 2, abs=1e-6)
    without = RewardModelReward(rm.model, rm.tokenizer, append_eos=False)
    assert without.encode(["what is 2 + 3?"], ["5"])[0] == plain[:-1]
    assert without.score(["q"], ["5"], {})[0] != pytest.approx(rm.score(["q"], ["5"], {})[0], abs=1e-4)


def test_too_long_sequences_keep_their_last_tokens(rm):
    short = RewardModelReward(rm.model, rm.tokenizer, name="short")
    short.max_length = 4
    full = rm.encode(["what is 2 + 3?"], [" 5"])[0]
    assert len(full) > 4
    with pytest.warns(UserWarning, match="longer than its 4 positions keep their last tokens"):
        cut = short.score(["what is 2 + 3?"], [" 5"], {})
    assert cut == pytest.approx(rm.score_ids(torch.tensor([full[-4:]]), torch.ones(1, 4)).tolist(), abs=1e-6)


def test_token_fast_path_equals_text_path(rm, policy_tokenizer):
    tok = policy_tokenizer
    prompts = chat_prompts(tok)
    prompt_ids = [tok(p, add_special_tokens=False)["input_ids"] for p in prompts]
    # responses as the trainer holds them: one stopped with eos, two cut at max_new_tokens without
    response_ids = [tok(c, add_special_tokens=False)["input_ids"] for c in COMPLETIONS]
    response_ids[0] = response_ids[0] + [tok.eos_token_id]
    C, T = max(map(len, prompt_ids)), max(map(len, response_ids)) + 2
    ids = torch.full((3, C + T), tok.pad_token_id)
    mask = torch.zeros((3, C + T), dtype=torch.long)
    for b, (p, r) in enumerate(zip(prompt_ids, response_ids, strict=True)):  # left-padded query ⊕ right-padded response
        ids[b, C - len(p) : C], mask[b, C - len(p) : C] = torch.tensor(p), 1
        ids[b, C : C + len(r)], mask[b, C : C + len(r)] = torch.tensor(r), 1
    fast = rm.score_ids(ids, mask)
    decoded = tok.batch_decode(ids[:, C:], skip_special_tokens=True)
    assert decoded == COMPLETIONS
    text = rm.score(prompts, decoded, {})
    assert fast.shape == (3,) and fast.dtype == torch.float32
    assert fast.tolist() == pytest.approx(text, abs=1e-5)


def test_different_tokenizer_re_encodes_with_the_reward_models_own(
    rm_other, policy_tokenizer, tiny_reward_model_other_tokenizer_dir
):
    rm_tok = AutoTokenizer.from_pretrained(tiny_reward_model_other_tokenizer_dir)
    hf = AutoModelForSequenceClassification.from_pretrained(tiny_reward_model_other_tokenizer_dir).eval()
    prompts = chat_prompts(policy_tokenizer)
    expected = []
    for p, c in zip(prompts, COMPLETIONS, strict=True):
        ids = rm_tok(p + c, add_special_tokens=False)["input_ids"] + [rm_tok.eos_token_id]
        assert ids != policy_tokenizer(p + c)["input_ids"] + [policy_tokenizer.eos_token_id]
        expected.append(hf_score(hf, ids))
    assert rm_other.score(prompts, COMPLETIONS, {}) == pytest.approx(expected, abs=1e-5)


def test_messages_column_uses_the_reward_models_chat_template(rm_other):
    messages = [[{"role": "user", "content": p}] for p in PROMPTS]
    rows = rm_other.encode(["ignored"] * 3, COMPLETIONS, {"messages": messages})
    tok = rm_other.tokenizer
    for row, conversation, c in zip(rows, messages, COMPLETIONS, strict=True):
        text = tok.apply_chat_template([*conversation, {"role": "assistant", "content": c}], tokenize=False)
        assert row == tok(text, add_special_tokens=False)["input_ids"]
        assert row[-1] == tok.eos_token_id and row[-2] != tok.eos_token_id  # the template's eos, not a second


def test_reward_model_with_more_than_one_output_is_refused(tiny_llama_dir, rm):
    with pytest.raises(RewardError, match=r"num_labels=2; a reward model needs exactly one output"):
        load_reward_source(str(tiny_llama_dir))
    config = BertConfig(vocab_size=8, hidden_size=8, num_hidden_layers=1, num_attention_heads=1, num_labels=3)
    with pytest.raises(RewardError, match=r"num_labels=3"):
        RewardModelReward(BertForSequenceClassification(config), rm.tokenizer)


def test_encoder_reward_model_uses_its_own_pooling_padding_free(policy_tokenizer):
    config = BertConfig(
        vocab_size=len(policy_tokenizer),
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        num_labels=1,
        pad_token_id=policy_tokenizer.pad_token_id,
    )
    source = RewardModelReward(BertForSequenceClassification(config), policy_tokenizer, name="bert")
    completions = ["5", "1 2 3 4 5 6 7", "sees a dog"]
    alone = [source.score(["q"], [c], {})[0] for c in completions]
    assert source.score(["q"] * 3, completions, {}) == pytest.approx(alone, abs=1e-5)


def test_missing_reward_model_directory_is_named():
    with pytest.raises(RewardError, match=r"no such directory"):
        load_reward_source("./no/such/rm")


# --------------------------------------------------------------------------------------------------------------
# Several sources
# --------------------------------------------------------------------------------------------------------------


def test_reward_set_stacks_sources_with_names(rm):
    result = RewardSet([fn("length_reward"), rm], [1.0, 0.5]).score(PROMPTS, COMPLETIONS, {})
    assert result.scores.shape == (3, 2) and result.scores.dtype == torch.float32
    assert result.names == ["length_reward", rm.name]
    assert result.scores[:, 1].tolist() == pytest.approx(rm.score(PROMPTS, COMPLETIONS, {}), abs=1e-6)
    empty = RewardSet([fn("length_reward")]).score([], [], {})
    assert empty.scores.shape == (0, 1)


def test_reward_set_scores_the_policys_tokens_with_models_that_share_its_tokenizer(rm, rm_other, policy_tokenizer):
    """With ``token_ids``, a shared-tokenizer reward model reads exactly the policy's ids (no decode/re-encode);
    function rewards and reward models with another tokenizer still get the texts."""
    tok = policy_tokenizer
    rows = [tok(p + c)["input_ids"] for p, c in zip(PROMPTS, COMPLETIONS, strict=True)]
    L = max(map(len, rows)) + 1
    ids = torch.full((3, L), tok.pad_token_id)
    mask = torch.zeros((3, L), dtype=torch.long)
    for b, row in enumerate(rows):  # left padding, as the trainer's query ⊕ response has
        ids[b, L - len(row) :], mask[b, L - len(row) :] = torch.tensor(row), 1
    # the ids say something else than the texts: each source must show which one it read
    texts = ["x " * (3 + i) for i in range(3)]
    result = RewardSet([fn("length_reward"), rm, rm_other]).score(PROMPTS, texts, {}, token_ids=(ids, mask))
    assert result.scores[:, 0].tolist() == score_one(fn("length_reward"), texts, PROMPTS).scores[:, 0].tolist()
    assert result.scores[:, 1].tolist() == pytest.approx(rm.score_ids(ids, mask).tolist(), abs=1e-6)
    assert result.scores[:, 1].tolist() != pytest.approx(rm.score(PROMPTS, texts, {}), abs=1e-3)
    assert result.scores[:, 2].tolist() == pytest.approx(rm_other.score(PROMPTS, texts, {}), abs=1e-6)


def test_reward_set_checks_its_inputs():
    with pytest.raises(ValueError, match=r"column 'answer' has 1 values for 3 completions"):
        RewardSet([fn("length_reward")]).score(PROMPTS, COMPLETIONS, {"answer": ["5"]})
    with pytest.raises(ValueError, match=r"'length_reward' appear more than once"):
        RewardSet([fn("length_reward"), fn("length_reward")])
    with pytest.raises(ValueError, match=r"got 1 weights for 2"):
        RewardSet([fn("length_reward"), fn("only_completions")], [1.0])
    with pytest.raises(ValueError, match=r"weight must be a finite number"):
        RewardSet([fn("length_reward")], [math.nan])


def test_load_reward_set_from_config_value(monkeypatch, tiny_reward_model_dir, server):
    monkeypatch.chdir(HERE)
    reward_set = load_reward_set(
        [
            "toy_rewards.py:length_reward",
            {"source": "toy_rewards.py:length_reward", "weight": 0.5, "name": "length_again"},
            {"source": str(tiny_reward_model_dir), "weight": 2},
            {"source": server["url"], "name": "remote"},
        ]
    )
    assert reward_set.names == ["length_reward", "length_again", tiny_reward_model_dir.name, "remote"]
    assert reward_set.weights.tolist() == [1.0, 0.5, 2.0, 1.0]
    assert reward_set.score(PROMPTS, COMPLETIONS).scores.shape == (3, 4)
    single = load_reward_set("toy_rewards.py:length_reward")
    assert single.names == ["length_reward"]
    with pytest.raises(ValueError, match=r"reward\[0\]: unknown key\(s\) wieght; valid keys: source, weight, name"):
        load_reward_set([{"source": "toy_rewards.py:length_reward", "wieght": 2}])
