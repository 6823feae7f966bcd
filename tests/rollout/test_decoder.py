"""The lean decoder gives the model's own logits at every step, for every layout it accepts, and refuses the rest.

Reference: the model's plain forward (no cache) over the whole left-padded sequence so far, read at the last
column, with the position ids the trainers use. Weights are drawn with a large init range so the logits
spread over several nats and a wrong mask, position or rotation shows up far above float noise.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
from transformers import AutoModelForCausalLM, GPT2Config, LlamaConfig, MistralConfig, Qwen2Config

from rlhf.data.collate import position_ids_from_mask
from rlhf.rollout import decoder as decoder_module
from rlhf.rollout.decoder import LlamaDecoder, build_decoder, keep_packed, reusing_packed
from rlhf.rollout.engine import RowGenerators, SamplingParams, draw, sample

VOCAB = 50
SMALL = {"vocab_size": VOCAB, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
         "num_attention_heads": 4, "max_position_embeddings": 64, "initializer_range": 0.3, "pad_token_id": 0}  # fmt: skip

LAYOUTS = {
    "llama": LlamaConfig(**SMALL),
    "llama-gqa-biases-tied": LlamaConfig(
        **SMALL, num_key_value_heads=2, attention_bias=True, mlp_bias=True, tie_word_embeddings=True
    ),
    "llama-head_dim-rope-scaling": LlamaConfig(
        **SMALL, head_dim=16, rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 500.0}
    ),
    "mistral": MistralConfig(**SMALL, num_key_value_heads=1, sliding_window=64),
    "qwen2": Qwen2Config(**SMALL, num_key_value_heads=2),
}


def model_for(config) -> torch.nn.Module:
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config).eval()


def left_padded(pads: list[int], length: int, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, VOCAB, (len(pads), length), generator=g)
    mask = torch.ones_like(ids)
    for row, pad in enumerate(pads):
        ids[row, :pad], mask[row, :pad] = 0, 0
    return ids, mask


@torch.no_grad()
def reference_logits(model, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    out = model(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask))
    return out.logits[:, -1]


@pytest.fixture(params=["onednn", "matmul", "views"])
def product(request, monkeypatch):
    """Every way the decoder multiplies: oneDNN's packed weights (where this torch has them), torch.matmul on a
    packed copy, and the layers' own weights (a GPU's way, taken here on the CPU)."""
    if request.param == "onednn" and not decoder_module._onednn_works():
        pytest.skip("this torch build has no oneDNN packed product")
    if request.param == "matmul":
        monkeypatch.setattr(decoder_module, "_onednn_works", lambda: False)
    if request.param == "views":
        monkeypatch.setattr(decoder_module, "READS_OWN_WEIGHTS", ("cpu",))
    return request.param


@pytest.mark.parametrize("static", [False, True], ids=["step", "static_step"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
@torch.no_grad()
def test_logits_match_the_models_forward_at_every_step(layout, product, static):
    model = model_for(LAYOUTS[layout])
    ids, mask = left_padded([0, 3, 5, 1], length=7)
    steps = 6
    decoder = build_decoder(model, ids.shape[1] + steps)
    assert isinstance(decoder, LlamaDecoder)
    logits = decoder.prefill(ids, mask)
    expected = reference_logits(model, ids, mask)
    assert expected.std() > 0.5  # spread enough that a wrong position or mask would show
    torch.testing.assert_close(logits, expected, rtol=1e-4, atol=1e-4)
    g = torch.Generator().manual_seed(2)
    for _ in range(steps):
        token = torch.randint(1, VOCAB, (ids.shape[0],), generator=g)
        ids = torch.cat([ids, token[:, None]], dim=1)
        mask = torch.cat([mask, torch.ones_like(token)[:, None]], dim=1)
        # static_step: the slot is a tensor, and all the cache's slots are attended (the unwritten ones masked)
        logits = decoder.static_step(token, torch.tensor([ids.shape[1] - 1])) if static else decoder.step(token)
        torch.testing.assert_close(logits, reference_logits(model, ids, mask), rtol=1e-4, atol=1e-4)


@torch.no_grad()
def test_repeated_prompts_are_prefilled_once_and_give_each_row_its_own_logits(monkeypatch):
    model = model_for(LAYOUTS["llama-gqa-biases-tied"])
    distinct, distinct_mask = left_padded([0, 3, 5], length=7)
    order = torch.tensor([1, 1, 0, 2, 1, 0])  # groups of a prompt need not be consecutive
    ids, mask = distinct[order], distinct_mask[order]
    prefilled = []
    original = LlamaDecoder._prefill
    monkeypatch.setattr(LlamaDecoder, "_prefill", lambda self, i, m: prefilled.append(len(i)) or original(self, i, m))
    decoder = build_decoder(model, ids.shape[1] + 3)
    torch.testing.assert_close(decoder.prefill(ids, mask), reference_logits(model, ids, mask), rtol=1e-4, atol=1e-4)
    assert prefilled == [3]
    g = torch.Generator().manual_seed(2)
    for _ in range(3):  # rows that shared a prompt go their own ways after it
        token = torch.randint(1, VOCAB, (ids.shape[0],), generator=g)
        ids = torch.cat([ids, token[:, None]], dim=1)
        mask = torch.cat([mask, torch.ones_like(token)[:, None]], dim=1)
        torch.testing.assert_close(decoder.step(token), reference_logits(model, ids, mask), rtol=1e-4, atol=1e-4)


@torch.no_grad()
def test_packed_weights_are_reused_until_a_parameter_changes():
    model = model_for(LAYOUTS["llama"])
    ids, mask = left_padded([0, 2], length=5)
    assert build_decoder(model, 6).weights is not build_decoder(model, 6).weights  # outside a block: packed each time
    with reusing_packed(model):
        first = build_decoder(model, 6).weights
        assert build_decoder(model, 6, rows=7).weights is first
        with torch.enable_grad():  # an optimizer step changes the weights in place
            optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
            model(input_ids=ids, attention_mask=mask).logits.pow(2).mean().backward()
            optimizer.step()
        decoder = build_decoder(model, 6)
        assert decoder.weights is not first
        torch.testing.assert_close(decoder.prefill(ids, mask), reference_logits(model, ids, mask), rtol=1e-4, atol=1e-4)
        with torch.no_grad():
            model.model.norm.weight.mul_(2.0)  # a module read as it is, not packed: nothing to refresh
        torch.testing.assert_close(
            build_decoder(model, 6).prefill(ids, mask), reference_logits(model, ids, mask), rtol=1e-4, atol=1e-4
        )
        kept = build_decoder(model, 6).weights
    assert model not in decoder_module._kept  # the block is over: the copy is freed
    assert build_decoder(model, 6).weights is not kept
    keep_packed(model)
    assert build_decoder(model, 6).weights is build_decoder(model, 6).weights


@torch.no_grad()
def test_switching_a_lora_adapter_off_repacks_the_weights():
    peft = pytest.importorskip("peft")
    lora = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "gate_proj"], init_lora_weights=False)
    wrapped = peft.get_peft_model(model_for(LAYOUTS["llama"]), lora)
    ids, mask = left_padded([2, 0], length=5)
    with reusing_packed(wrapped):
        adapted = build_decoder(wrapped, 6).prefill(ids, mask)
        torch.testing.assert_close(adapted, reference_logits(wrapped, ids, mask), rtol=1e-4, atol=1e-4)
        with wrapped.disable_adapter():
            base = build_decoder(wrapped, 6).prefill(ids, mask)
            torch.testing.assert_close(base, reference_logits(wrapped, ids, mask), rtol=1e-4, atol=1e-4)
        assert (base - adapted).abs().max() > 1e-2


@torch.no_grad()
def test_lora_adapter_is_folded_into_the_weights():
    peft = pytest.importorskip("peft")
    model = model_for(LAYOUTS["llama"])
    lora = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "gate_proj", "down_proj"],
                           init_lora_weights=False)  # fmt: skip  # random B: the adapter changes the logits
    wrapped = peft.get_peft_model(model, lora)
    ids, mask = left_padded([2, 0], length=5)
    decoder = build_decoder(wrapped, ids.shape[1] + 1)
    assert decoder is not None
    adapted = reference_logits(wrapped, ids, mask)
    with wrapped.disable_adapter():
        assert (reference_logits(wrapped, ids, mask) - adapted).abs().max() > 1e-2
    torch.testing.assert_close(decoder.prefill(ids, mask), adapted, rtol=1e-4, atol=1e-4)


def test_models_it_does_not_reproduce_are_refused():
    assert build_decoder(model_for(GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=1, n_head=4)), 10) is None
    mistral = model_for(MistralConfig(**SMALL, sliding_window=8))
    assert build_decoder(mistral, 8) is not None
    assert build_decoder(mistral, 9) is None  # the window would cut the attention: only the model knows how
    dynamic = LlamaConfig(**SMALL, rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4})
    assert build_decoder(model_for(dynamic), 10) is None

    class QuantisedLinear(torch.nn.Linear):
        pass

    custom = model_for(LAYOUTS["llama"])
    old = custom.model.layers[0].mlp.up_proj
    custom.model.layers[0].mlp.up_proj = QuantisedLinear(old.in_features, old.out_features, bias=False)
    assert build_decoder(custom, 10) is None


def test_dora_adapters_are_refused():
    peft = pytest.importorskip("peft")
    dora = peft.LoraConfig(r=2, target_modules=["q_proj"], use_dora=True)
    assert build_decoder(peft.get_peft_model(model_for(LAYOUTS["llama"]), dora), 10) is None


@pytest.mark.parametrize("layout", ["llama", "qwen2"])
def test_sampling_with_and_without_the_decoder_gives_the_same_tokens(layout):
    model = model_for(LAYOUTS[layout])
    ids, mask = left_padded([0, 4, 2, 6, 1, 0], length=8)
    params = SamplingParams(max_new_tokens=12, temperature=0.8, top_p=0.95)
    unstopped, _ = sample(model, ids, mask, params, [], 0, torch.Generator().manual_seed(5))
    stop = int(unstopped[0, 4])  # row 0 stops at its 5th token, the others where they happen to sample it
    fast, fast_logprobs = sample(model, ids, mask, params, [stop], 0, torch.Generator().manual_seed(5), engine="lean")
    slow, slow_logprobs = sample(model, ids, mask, params, [stop], 0, torch.Generator().manual_seed(5), engine="hf")
    assert torch.equal(fast, slow)
    # the same logits from two computations: float32 rounding apart (softmax of ~400 logits; 1e-5 is 100 ulps)
    torch.testing.assert_close(fast_logprobs, slow_logprobs, rtol=0, atol=1e-5)
    assert fast.shape[1] > 5 and int(fast[0, 4]) == stop and int(fast[0, 5]) == 0  # stops and padding covered


def _lora(model):
    peft = pytest.importorskip("peft")
    lora = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "gate_proj", "down_proj"],
                           init_lora_weights=False)  # fmt: skip  # random B: the adapter changes the logits
    return peft.get_peft_model(model, lora)


@pytest.mark.parametrize(
    ("layout", "params", "lora"),
    [
        ("llama", SamplingParams(max_new_tokens=14, temperature=0.8, top_p=0.95), False),
        ("llama-gqa-biases-tied", SamplingParams(max_new_tokens=14, temperature=1.3, top_k=7), False),
        ("qwen2", SamplingParams(max_new_tokens=14), False),
        ("llama", SamplingParams(max_new_tokens=14, temperature=0.8, top_k=10, top_p=0.9), True),
    ],
    ids=["top-p", "top-k", "plain", "lora"],
)
@pytest.mark.parametrize("every", [1, 4])
def test_the_static_loop_samples_what_the_eager_loop_samples(layout, params, lora, every):
    """The loop a CUDA graph replays (``cuda_graphs``: one static step over buffers allocated once, the column and
    slot as device counters), run as is on the CPU, against the eager loop: the same tokens, each row stopping at
    its own step, repeated prompts (GRPO's groups, prefilled once) going their own ways."""
    model = model_for(LAYOUTS[layout])
    model = _lora(model) if lora else model
    distinct, distinct_mask = left_padded([0, 4, 2], length=8)
    order = torch.tensor([0, 0, 1, 1, 2, 2, 0, 1])
    ids, mask = distinct[order], distinct_mask[order]
    seeds = range(10, 18)
    free, _ = sample(model, ids, mask, params, [], 0, RowGenerators.of(seeds), engine="lean")
    stops = sorted({int(free[0, 3]), int(free[5, 9])})  # rows stop at different steps, some never
    eager, eager_logprobs = sample(model, ids, mask, params, stops, 0, RowGenerators.of(seeds), stop_every=every)
    static, static_logprobs = sample(
        model, ids, mask, params, stops, 0, RowGenerators.of(seeds), stop_every=every, cuda_graphs=True
    )
    assert torch.equal(static, eager)
    # the same logits summed in another order (all S slots, the unwritten ones exact zeros): float32 rounding
    torch.testing.assert_close(static_logprobs, eager_logprobs, rtol=0, atol=1e-5)
    assert torch.isin(eager[0, :4], torch.tensor(stops)).any()  # row 0 stops by its 4th token (earlier if it drew one)
    assert 0 < int((eager == 0).sum()) < eager.numel()  # stops and padding covered


def test_draw_follows_the_distribution_and_never_picks_probability_zero():
    probs = torch.tensor([0.5, 0.0, 0.3, 0.2, 0.0]).expand(40_000, 5)
    tokens = draw(probs, torch.rand(40_000, generator=torch.Generator().manual_seed(0), dtype=torch.float64))
    freq = torch.bincount(tokens, minlength=5).float() / len(tokens)
    # binomial standard error ≤ 0.0025 at n = 40 000: 0.01 is four of them
    torch.testing.assert_close(freq, torch.tensor([0.5, 0.0, 0.3, 0.2, 0.0]), rtol=0, atol=0.01)
    assert int(freq[1]) == 0 and int(freq[4]) == 0
    # the boundaries by hand: cumulative 0.5, 0.5, 0.8, 1.0, 1.0; the first entry above u wins
    edges = torch.tensor([0.0, 0.4999, 0.5, 0.7999, 0.8, 0.9999, 1 - 2**-53], dtype=torch.float64)
    assert draw(probs[: len(edges)], edges).tolist() == [0, 0, 2, 2, 3, 3, 3]
    one_hot = torch.zeros(100, 7)
    one_hot[:, 4] = 1.0
    assert bool((draw(one_hot, torch.rand(100, dtype=torch.float64)) == 4).all())
    unnormalised = torch.tensor([[2.0, 6.0]]).expand(4, 2)  # u is scaled by the row's total: 0.25 of the mass is 0
    assert draw(unnormalised, torch.tensor([0.0, 0.24, 0.26, 0.99], dtype=torch.float64)).tolist() == [0, 0, 1, 1]


@torch.no_grad()
def test_on_a_gpu_the_decoder_reads_the_models_own_weights(monkeypatch):
    """Where the layers' own weights are read (a GPU), the decoder holds no copy of them: every product's weight is
    the parameter's storage. A LoRA layer (weight + adapter) and a dtype change (mixed precision) still pack."""
    monkeypatch.setattr(decoder_module, "READS_OWN_WEIGHTS", ("cpu",))
    model = model_for(LAYOUTS["llama-gqa-biases-tied"])
    packed = build_decoder(model, 16).weights
    attention = model.model.layers[0].self_attn
    qkv = packed.layers[0].qkv
    assert isinstance(qkv, decoder_module._Views)
    own = [attention.q_proj.weight, attention.k_proj.weight, attention.v_proj.weight]
    assert [w.untyped_storage().data_ptr() for w, _ in qkv.pairs] == [p.untyped_storage().data_ptr() for p in own]
    assert packed.head.pairs[0][0].untyped_storage().data_ptr() == model.lm_head.weight.untyped_storage().data_ptr()
    from rlhf.models.precision import compute_in_bf16

    mixed = build_decoder(compute_in_bf16(model_for(LAYOUTS["llama"]), torch.device("cpu")), 16).weights
    assert isinstance(mixed.layers[0].qkv, decoder_module._Product)  # bfloat16 products over float32 weights: a copy


class _FakeGraphs:
    """What `StaticDecode` asks of ``torch.cuda`` to capture its step, on the CPU: the capture runs the step once (a
    real one only records it, and the step's writes are undone either way), a replay runs it again. A replay checks
    what a real one relies on: every buffer the step writes is still the tensor, at the address, that was captured."""

    def __init__(self, decode):
        self.decode, self.captured, self.replays = decode, None, 0

    def install(self, monkeypatch):
        class Stream:
            def wait_stream(self, other):
                pass

        monkeypatch.setattr(torch.cuda, "Stream", Stream)
        monkeypatch.setattr(torch.cuda, "current_stream", lambda: Stream())
        monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
        fake = self

        class Graph:
            def replay(self):
                assert [t.data_ptr() for t in fake.decode._state()] == fake.captured
                fake.replays += 1
                fake.decode.step()

        @contextlib.contextmanager
        def graph(g):
            yield
            self.captured = [t.data_ptr() for t in self.decode._state()]

        monkeypatch.setattr(torch.cuda, "CUDAGraph", Graph)
        monkeypatch.setattr(torch.cuda, "graph", graph)


@pytest.mark.parametrize("every", [1, 5])
def test_the_captured_loop_undoes_its_warm_up_and_replays_on_the_captured_buffers(monkeypatch, every):
    from rlhf.rollout.engine import StaticDecode, lean_decoder, rollout_uniforms

    model = model_for(LAYOUTS["llama-gqa-biases-tied"])
    ids, mask = left_padded([0, 2, 4, 1], length=6)
    params = SamplingParams(max_new_tokens=12, temperature=0.9, top_k=20)
    eager, eager_logprobs = sample(model, ids, mask, params, [7], 0, RowGenerators.of(range(4)))
    decoder = lean_decoder(model, ids.shape[1] + params.max_new_tokens, len(ids), "lean")
    with torch.inference_mode():
        uniforms = rollout_uniforms(RowGenerators.of(range(4)), len(ids), params.max_new_tokens, ids.device)
        decode = StaticDecode(decoder, decoder.prefill(ids, mask), uniforms, torch.tensor([7]), params, 0)
        fake = _FakeGraphs(decode)
        fake.install(monkeypatch)
        tokens, logprobs = decode.run(every, capture=True)
    kept = int((tokens != 0).any(0).nonzero().max()) + 1  # what sample() cuts after the last stop
    assert torch.equal(tokens[:, :kept], eager)
    torch.testing.assert_close(logprobs[:, :kept], eager_logprobs, rtol=0, atol=1e-5)  # as the static loop's test
    assert fake.replays == tokens.shape[1] - (tokens.shape[1] == params.max_new_tokens)  # the last draw is not replayed
