"""The static decode engine (agent/engine/decode.py) against the transformers forward ("hf" engine), on CPU in fp32.

What a GPU adds (bf16 copies, CUDA graphs) is not run here; the bucketed mode below runs the graphs' row and
window bookkeeping eagerly, so only the capture and replay themselves are left to a GPU session.
"""


import pytest
import torch
from transformers import AutoModelForCausalLM, GPT2Config, LlamaConfig, Qwen2Config

import fedagent_flwr.agent.engine.decode as decode
import fedagent_flwr.agent.engine.sampling as sampling
from fedagent_flwr.agent.engine.decode import StaticDecoder, UnsupportedModel
from fedagent_flwr.agent.engine.placement import Machine, place
from fedagent_flwr.agent.play.rollout import stop_token_ids
from fedagent_flwr.agent.engine.sampling import fast_sample_batch, hf_sample_batch, sample_batch
from placed import rollout_config

VOCAB = 96


def _model(kind: str):
    """A small random model; weights of std 0.2 (not 0.02) so that greedy choices are not near-ties."""
    torch.manual_seed(0)
    common = dict(vocab_size=VOCAB, hidden_size=48, intermediate_size=96, num_hidden_layers=3, num_attention_heads=6,
                  num_key_value_heads=2, max_position_embeddings=256, initializer_range=0.2)
    if kind == "qwen2":  # GQA (3 query heads per KV head), q/k/v biases, tied head, Qwen's rope theta
        config = Qwen2Config(**common, tie_word_embeddings=True, rope_theta=1e6, rms_norm_eps=1e-6)
    else:  # Llama with every bias and an untied head, a different eps
        config = LlamaConfig(**common, tie_word_embeddings=False, attention_bias=True, mlp_bias=True, rms_norm_eps=1e-5)
    model = AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():  # transformers initialises biases to zero: give them values so that they count
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.2)
    return model


def _prompts():
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, VOCAB, (n,), generator=g).tolist() for n in (7, 19, 4, 19, 12, 26)]
    prompts[3] = list(prompts[1])  # a repeated prompt is prefilled once and must still give two rows
    return prompts


def _grouped_prompts():
    """A rollout batch's shape: one system text, two tasks with three and two episodes each (their histories of
    different lengths), an episode alone on its task, a repeated prompt and one that shares nothing. Prefilled as
    the two tasks' prefixes, then every prompt's rest (the two without a group whole)."""
    g = torch.Generator().manual_seed(4)

    def tokens(n):
        return torch.randint(3, VOCAB, (n,), generator=g).tolist()

    system, task_a, task_b = tokens(9), tokens(11), tokens(6)
    prompts = [system + task_a + tokens(n) for n in (5, 13, 1)] + [system + task_b + tokens(n) for n in (8, 3)]
    prompts += [system + tokens(3), list(prompts[1]), tokens(4)]
    return prompts


PROMPT_SETS = {"random": _prompts, "grouped": _grouped_prompts}


def _stops_that_end_rows_early(model, prompts, cap):
    """Two ids the greedy rows emit part-way (found with the hf engine, no stops): rows end at different steps."""
    free = hf_sample_batch(model, prompts, 0, [], cap, 0.0)
    return [free[0][2], free[4][5]]


def _decoders(model):
    return [StaticDecoder(model), StaticDecoder(model, bucketed=True)]


@pytest.mark.parametrize("kind", ["qwen2", "llama"])
@pytest.mark.parametrize("prompt_set", PROMPT_SETS)
def test_greedy_tokens_equal_the_hf_engine_with_padding_stops_and_repeats(kind, prompt_set, monkeypatch):
    model, prompts, cap = _model(kind), PROMPT_SETS[prompt_set](), 16
    stops = [1] + _stops_that_end_rows_early(model, prompts, cap)
    want = hf_sample_batch(model, prompts, 0, stops, cap, 0.0)
    lengths = [len(r) for r in want]
    assert min(lengths) < cap and max(lengths) == cap and len(set(lengths)) >= 3  # rows end at different steps
    for decoder in _decoders(model):
        assert fast_sample_batch(model, prompts, 0, stops, cap, 0.0, decoder=decoder) == want
    monkeypatch.setattr(decode, "PREFILL_TOKENS", 30)  # one distinct prompt per prefill chunk
    assert fast_sample_batch(model, prompts, 0, stops, cap, 0.0, decoder=StaticDecoder(model)) == want
    assert sample_batch(model, prompts, 0, stops, cap, 0.0, engine="static") == want


def test_greedy_tokens_equal_the_hf_engine_on_the_test_suites_tiny_model(tiny_lm, maze_tokenizer):
    stop, pad = stop_token_ids(maze_tokenizer), maze_tokenizer.pad_token_id
    texts = ["Reach the goal", "move up move down move left", "The goal is at position 8, 6. Your current position",
             "move up move down move left"]
    prompts = [maze_tokenizer(t)["input_ids"] for t in texts]
    with torch.no_grad():  # the second prompt's first greedy token stops its row at once
        first = tiny_lm(torch.tensor([prompts[1]])).logits[0, -1].argmax().item()
    want = hf_sample_batch(tiny_lm, prompts, pad, stop + [first], 12, 0.0)
    assert want[1] == [first] and max(len(r) for r in want) == 12
    for decoder in _decoders(tiny_lm):
        assert fast_sample_batch(tiny_lm, prompts, pad, stop + [first], 12, 0.0, decoder=decoder) == want


def _hf_logprobs(model, sequence):
    with torch.no_grad():
        return model(torch.tensor([sequence])).logits[0].log_softmax(-1)


@pytest.mark.parametrize("kind", ["qwen2", "llama"])
@pytest.mark.parametrize("bucketed", [False, True])
@pytest.mark.parametrize("prompt_set", PROMPT_SETS)
def test_every_steps_log_probs_match_the_hf_forward_within_1e_4(kind, bucketed, prompt_set):
    """Teacher-forced: feed fixed tokens, drop rows part-way, compare each live row's next-token log-probs with
    the transformers forward over that row's unpadded prompt + tokens so far. The grouped prompts are prefilled in
    two passes (their groups' prefixes, then the rest on top of them), the random ones whole."""
    model, prompts = _model(kind), PROMPT_SETS[prompt_set]()
    decoder = StaticDecoder(model, bucketed=bucketed)
    steps = 10
    fed = torch.randint(3, VOCAB, (len(prompts), steps), generator=torch.Generator().manual_seed(2))
    # causal: the forward over prompt + all fed tokens gives every step's next-token log-probs at once
    want = [_hf_logprobs(model, p + fed[i].tolist())[len(p) - 1:] for i, p in enumerate(prompts)]
    rows = list(range(len(prompts)))
    logits = decoder.start(prompts, 0, steps + 1)
    assert len(decoder.last_plan.prefixes) == {"random": 0, "grouped": 2}[prompt_set]
    worst = 0.0
    for t in range(steps + 1):
        for j, row in enumerate(rows):
            worst = max(worst, (logits[j].log_softmax(-1) - want[row][t]).abs().max().item())
        if t == steps:
            break
        # rows finish. Bucketed (powers of two): 6 -> 5 live rows ride along in the bucket of 8, masked;
        # 5 -> 3 compacts the cache to a bucket of 4, 3 -> 2 to one of 2. Eager: every drop compacts.
        drops = {3: (0,), 6: (1, 3), 8: (2,)}
        if t in drops:
            keep = [j for j in range(len(rows)) if j not in drops[t]]
            decoder.keep(torch.tensor(keep))
            rows = [rows[j] for j in keep]
        logits = decoder.step(fed[rows, t])
    assert worst < 1e-4, worst


def _fed_log_probs(decoder, prompts, fed, drops):
    """Each step's log-probs [live rows, V] with tokens `fed` teacher-forced and rows dropped at the steps `drops`
    names (positions in the live rows)."""
    rows, out = list(range(len(prompts))), []
    logits = decoder.start(prompts, 0, fed.shape[1] + 1)
    for t in range(fed.shape[1] + 1):
        out.append(logits.float().log_softmax(-1))
        if t == fed.shape[1]:
            break
        if t in drops:
            keep = [j for j in range(len(rows)) if j not in drops[t]]
            decoder.keep(torch.tensor(keep, device=decoder.device))
            rows = [rows[j] for j in keep]
        logits = decoder.step(fed[rows, t].to(decoder.device))
    return out


@pytest.mark.parametrize("kind", ["qwen2", "llama"])
def test_compiled_token_steps_equal_the_eager_ones_and_a_new_decoder_compiles_nothing(kind):
    """rollout.kernels=compile: torch.compile fuses each layer half of the token step. Fed the same tokens, with rows
    dropping through the buckets, every step's log-probs equal the eager step's within 1e-5 (fp32); the greedy
    tokens equal the hf engine's; a second decoder of the same shape (a rollout builds one per call) reuses the
    compiled graphs."""
    from torch._dynamo.utils import counters

    model, prompts = _model(kind), _grouped_prompts()
    fed = torch.randint(3, VOCAB, (len(prompts), 8), generator=torch.Generator().manual_seed(2))
    drops = {2: (0,), 4: (1, 2, 3), 6: (0, 1)}  # 8 rows, then 7 riding along in the bucket of 8, then buckets of 4 and 2
    eager = _fed_log_probs(StaticDecoder(model, bucketed=True), prompts, fed, drops)
    graphs_before = counters["stats"]["unique_graphs"]
    compiled = _fed_log_probs(StaticDecoder(model, bucketed=True, kernels="compile"), prompts, fed, drops)
    assert counters["stats"]["unique_graphs"] > graphs_before  # the step ran compiled
    assert max((a - b).abs().max().item() for a, b in zip(eager, compiled)) < 1e-5
    graphs_before = counters["stats"]["unique_graphs"]
    want = hf_sample_batch(model, prompts, 0, [1], 12, 0.0)
    got = fast_sample_batch(model, prompts, 0, [1], 12, 0.0, decoder=StaticDecoder(model, bucketed=True, kernels="compile"))
    assert got == want and counters["stats"]["unique_graphs"] == graphs_before
    with pytest.raises(ValueError, match="rollout.kernels='inductor' is not allowed: expected eager | compile"):
        StaticDecoder(model, kernels="inductor")


def test_the_run_configs_decode_kernels_reach_the_rollouts_decoder(tiny_lm, maze_tokenizer):
    """rollout.kernels travels from the run config to the decoder a rollout keeps (one new token: no step to compile)."""
    from fedagent_flwr.agent.play.rollout import LMPolicy
    from fedagent_flwr.config import RunConfig

    for kernels in ("compile", "eager"):
        cfg = RunConfig.from_run_config({"rollout.name": "static", "rollout.kernels": kernels, "rollout.max-completion-length": 1})
        LMPolicy(tiny_lm, maze_tokenizer, rollout_config(cfg))._generate([maze_tokenizer("Reach the goal")["input_ids"]])
        assert decode._DECODERS[tiny_lm].kernels == kernels
    decode.release(tiny_lm)


def test_sampling_draws_the_same_tokens_as_the_hf_engine_for_a_seed():
    """The static loop hands pick_tokens the same rows in the same order at every step, so a seed gives the same
    draws (temperature, rollout.top-p and either token sampler included)."""
    model, prompts, cap = _model("qwen2"), _prompts(), 16
    stops = _stops_that_end_rows_early(model, prompts, cap)
    for temperature, top_p, sampler in ((1.0, 1.0, "multinomial"), (0.7, 0.9, "multinomial"), (0.7, 0.9, "inverse-cdf")):
        torch.manual_seed(3)
        want = hf_sample_batch(model, prompts, 0, stops, cap, temperature, top_p, sampler=sampler)
        torch.manual_seed(3)
        got = fast_sample_batch(model, prompts, 0, stops, cap, temperature, top_p, decoder=StaticDecoder(model),
                                sampler=sampler)
        assert got == want
    assert len({tuple(r) for r in want}) == len(want)  # really sampled: even the two rows of one prompt differ


def test_the_kept_decoder_follows_weight_updates():
    """decoder_for keeps one decoder per model; its weight copy is refreshed at every call."""
    model, prompts = _model("qwen2"), _prompts()
    before = sample_batch(model, prompts, 0, [], 8, 0.0, engine="static")
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.2)
    after = sample_batch(model, prompts, 0, [], 8, 0.0, engine="static")
    assert after == hf_sample_batch(model, prompts, 0, [], 8, 0.0) and after != before
    decode.release(model)
    assert model not in decode._DECODERS


@pytest.mark.parametrize("bucketed", [False, True])
def test_a_kept_decoder_grows_its_cache_when_a_later_call_needs_more_rows_and_columns(bucketed, monkeypatch):
    """A rollout calls one kept decoder once per environment step with more history each time: a later call may need
    more rows or more key slots than the cache holds. The cache is then reallocated (the graphs dropped) and the
    samples stay the hf engine's. Cache steps of 16 columns and windows of 8 make a short test cross them."""
    monkeypatch.setattr(decode, "CAPACITY_STEP", 16)
    monkeypatch.setattr(decode, "WINDOW_STEP", 8)
    model, prompts = _model("llama"), _grouped_prompts()
    decoder = StaticDecoder(model, bucketed=bucketed)
    # widths 33, 33 and 42 tokens: 3 rows in 48 columns, then 8 rows, then 64 columns
    calls = [(prompts[:3], 4), (prompts, 6), ([p + p[:9] for p in prompts[:2]], 12)]
    seen = []
    for batch, cap in calls:
        want = hf_sample_batch(model, batch, 0, [], cap, 0.0)
        assert fast_sample_batch(model, batch, 0, [], cap, 0.0, decoder=decoder) == want
        seen.append(decoder.capacity)
    assert seen == [(4 if bucketed else 3, 48), (8, 48), (8, 64)]


def test_a_lora_model_is_decoded_with_its_adapter():
    from peft import LoraConfig, get_peft_model

    model, prompts = _model("qwen2"), _prompts()
    peft_model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"],
                                                  init_lora_weights=False)).eval()
    want = hf_sample_batch(peft_model, prompts, 0, [], 10, 0.0)
    with peft_model.disable_adapter():
        base = hf_sample_batch(peft_model, prompts, 0, [], 10, 0.0)
        assert fast_sample_batch(peft_model, prompts, 0, [], 10, 0.0, decoder=StaticDecoder(peft_model)) == base
    assert want != base  # the adapter changes the greedy tokens, so merging it is tested
    assert fast_sample_batch(peft_model, prompts, 0, [], 10, 0.0, decoder=StaticDecoder(peft_model)) == want


def test_a_kept_decoder_follows_its_models_adapter_switched_off_and_on():
    """A decoder refreshed while the adapter is switched off decodes the base, then the adapter again once it is back:
    its adapter buffers are dropped and made anew as the model's adapters come and go."""
    from peft import LoraConfig, get_peft_model

    model, prompts = _model("llama"), _prompts()
    peft_model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["k_proj", "o_proj", "gate_proj"],
                                                  init_lora_weights=False)).eval()
    decoder, want = StaticDecoder(peft_model), hf_sample_batch(peft_model, prompts, 0, [], 8, 0.0)
    with peft_model.disable_adapter():
        decoder.refresh(peft_model)
        assert decoder.layers[0]["qkv"][2] is None
        assert fast_sample_batch(peft_model, prompts, 0, [], 8, 0.0, decoder=decoder) \
            == hf_sample_batch(peft_model, prompts, 0, [], 8, 0.0) != want
    decoder.refresh(peft_model)
    assert fast_sample_batch(peft_model, prompts, 0, [], 8, 0.0, decoder=decoder) == want
    # another adapter of the same rank on other matrices: the buffers fit as they are, and the old blocks are cleared
    peft_model.add_adapter("other", LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "up_proj", "o_proj"],
                                               init_lora_weights=False))
    peft_model.set_adapter("other")
    decoder.refresh(peft_model)
    other = hf_sample_batch(peft_model, prompts, 0, [], 8, 0.0)
    assert fast_sample_batch(peft_model, prompts, 0, [], 8, 0.0, decoder=decoder) == other != want


def test_a_bf16_decoder_keeps_an_adapter_delta_that_a_merged_copy_would_round_away():
    """In bf16 a weight of 0.1875 moves in steps of 2^-10: an adapter adding 3e-4 to every element of q_proj (a LoRA
    after a few small steps is mostly such deltas) leaves a merged bf16 copy unchanged, bit for bit. Kept apart, as
    PEFT's forward applies it, it still moves q: here the base's q is 0 (alternating signs over an input of equal
    entries) and the adapter's share is 48 x 3e-4 / sqrt(48)."""
    from peft import LoraConfig, get_peft_model

    model = _model("qwen2").to(torch.bfloat16)  # precision bf16-base: the frozen base in bf16
    attn = model.model.layers[0].self_attn
    hidden, rank, delta = attn.q_proj.in_features, 4, 3e-4
    with torch.no_grad():
        signs = torch.ones(hidden)
        signs[1::2] = -1
        attn.q_proj.weight.copy_(0.1875 * signs.expand_as(attn.q_proj.weight))
        attn.q_proj.bias.zero_()
    peft_model = get_peft_model(model, LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=["q_proj"])).eval()
    lora = peft_model.base_model.model.model.layers[0].self_attn.q_proj
    with torch.no_grad():  # B' A = delta everywhere: A's rows all ones, B' (B x scaling 2) delta / rank everywhere
        lora.lora_A["default"].weight.fill_(1.0)
        lora.lora_B["default"].weight.fill_(delta / rank / 2)
    x = torch.full((1, hidden), hidden ** -0.5, dtype=torch.bfloat16)
    q_out = lora.out_features

    def q_of(decoder):
        return decode._linear(x, *decoder.layers[0]["qkv"])[0, :q_out].float()

    merged = (attn.q_proj.base_layer.weight.float() + delta).to(torch.bfloat16)
    assert torch.equal(merged, attn.q_proj.base_layer.weight)  # what a merged copy would hold: the base itself
    kept = q_of(StaticDecoder(peft_model, torch.bfloat16))
    with peft_model.disable_adapter():
        assert torch.equal(q_of(StaticDecoder(peft_model, torch.bfloat16)), torch.zeros(q_out))
    assert torch.allclose(kept, torch.full((q_out,), delta * hidden ** 0.5), rtol=0.02)


def _gpt2():
    return AutoModelForCausalLM.from_config(GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=1, n_head=2)).eval()


def test_unsupported_models_are_refused_by_name_and_auto_falls_back():
    gpt2 = _gpt2()
    with pytest.raises(UnsupportedModel, match="GPT2LMHeadModel is not supported"):
        sample_batch(gpt2, _prompts(), 0, [], 4, 0.0, engine="static")
    scaled = AutoModelForCausalLM.from_config(Qwen2Config(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}))
    with pytest.raises(UnsupportedModel, match="rope scaling 'linear'"):
        StaticDecoder(scaled)
    with pytest.raises(ValueError, match="decode engine"):
        sample_batch(gpt2, _prompts(), 0, [], 4, 0.0, engine="vllm")
    with pytest.raises(ValueError, match="decode engine"):  # the placement resolves auto; the sampler takes no auto
        sample_batch(gpt2, _prompts(), 0, [], 4, 0.0, engine="auto")
    # "auto" on a GPU tries the static engine; the placement, given the model, falls back to the hf loop and says why
    placed = place(device="cuda", machine=Machine(cuda=True), decode_engine="auto", model=gpt2)
    assert placed.decode_engine == "hf" and "GPT2LMHeadModel is not supported" in placed.engine_note
    with pytest.raises(UnsupportedModel):  # asked for by name, it is refused
        place(device="cuda", machine=Machine(cuda=True), decode_engine="static", model=gpt2)


def test_auto_on_cpu_is_the_hf_loop(monkeypatch):
    """The default CPU job's numbers must not move: "auto" never enters the static engine on a CPU."""
    def refuse(*args, **kwargs):
        raise AssertionError("the static engine ran on a CPU under engine='auto'")

    monkeypatch.setattr(sampling, "fast_sample_batch", refuse)
    model, prompts = _model("qwen2"), _prompts()
    engine = place(device="cpu", decode_engine="auto", model=model).decode_engine
    torch.manual_seed(4)
    got = sample_batch(model, prompts, 0, [], 6, 1.0, engine=engine)
    torch.manual_seed(4)
    assert got == hf_sample_batch(model, prompts, 0, [], 6, 1.0)


# ----- on a GPU: the CUDA graphs themselves (skipped on a CPU; run them in a GPU session with
#       `python -m pytest -q tests/agent/test_decode.py -k cuda`)
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@needs_cuda
@pytest.mark.parametrize("kind", ["qwen2", "llama"])
@pytest.mark.parametrize("prompt_set", PROMPT_SETS)
def test_cuda_graphs_give_the_hf_engines_greedy_tokens_in_fp32(kind, prompt_set):
    """Replayed graphs (rows riding along in their bucket, then compacted) against the transformers loop, on the GPU,
    in fp32 with TF32 off, so that only the graphs' bookkeeping could make them differ."""
    model, prompts, cap = _model(kind).cuda(), PROMPT_SETS[prompt_set](), 16
    stops = [1] + _stops_that_end_rows_early(model, prompts, cap)
    want = hf_sample_batch(model, prompts, 0, stops, cap, 0.0)
    assert len({len(r) for r in want}) >= 3
    decoder = StaticDecoder(model)
    assert decoder.graphs_on
    for _ in range(2):  # the second call replays the graphs captured by the first
        assert fast_sample_batch(model, prompts, 0, stops, cap, 0.0, decoder=decoder) == want
    assert decoder.graphs


@needs_cuda
@pytest.mark.parametrize("prompt_set", PROMPT_SETS)
def test_cuda_graph_replay_equals_the_eager_static_step_in_bf16(prompt_set):
    """The rollout's setting: a bf16 weight copy. Graph replay and the eager step run the same kernels on the same
    numbers, so their log-probs agree to bf16 rounding at every step, with rows dropping part-way."""
    model, prompts = _model("qwen2").cuda(), PROMPT_SETS[prompt_set]()
    graphs, eager = StaticDecoder(model, torch.bfloat16), StaticDecoder(model, torch.bfloat16, cuda_graphs=False)
    steps = 10
    fed = torch.randint(3, VOCAB, (len(prompts), steps), generator=torch.Generator().manual_seed(2)).cuda()
    a, b = graphs.start(prompts, 0, steps + 1), eager.start(prompts, 0, steps + 1)
    rows, worst = list(range(len(prompts))), 0.0
    for t in range(steps + 1):
        worst = max(worst, (a.float().log_softmax(-1) - b.float().log_softmax(-1)).abs().max().item())
        if t == steps:
            break
        if t in (3, 6, 8):
            keep = [j for j in range(len(rows)) if j != (t % len(rows))]
            index = torch.tensor(keep, device="cuda")
            graphs.keep(index), eager.keep(index)
            rows = [rows[j] for j in keep]
        a, b = graphs.step(fed[rows, t]), eager.step(fed[rows, t])
    assert worst < 2e-2, worst


@needs_cuda
@pytest.mark.parametrize("kind", ["qwen2", "llama"])
def test_cuda_graphs_of_compiled_steps_give_the_hf_engines_greedy_tokens_in_fp32(kind):
    """rollout.kernels=compile on the GPU: the compiled halves (Triton kernels) are captured in the step's graphs. In
    fp32 with TF32 off the greedy tokens stay the transformers loop's, through the buckets and two calls."""
    model, prompts, cap = _model(kind).cuda(), _grouped_prompts(), 16
    stops = [1] + _stops_that_end_rows_early(model, prompts, cap)
    want = hf_sample_batch(model, prompts, 0, stops, cap, 0.0)
    decoder = StaticDecoder(model, kernels="compile")
    for _ in range(2):
        assert fast_sample_batch(model, prompts, 0, stops, cap, 0.0, decoder=decoder) == want
    assert decoder.graphs


@needs_cuda
def test_cuda_graphs_of_compiled_steps_equal_the_eager_static_step_in_bf16():
    """The rollout's setting with rollout.kernels=compile: graphs of the compiled step and the eager step of eager
    kernels, both in bf16, against the eager step in fp32, rows dropping through buckets of 8, 4 and 2. The fused
    kernels round in other places than eager ones (an H100 put the two bf16 steps 0.049 apart: benchmarks/results/
    2026-12-05-h100-80gb-hbm3/call-1/tests.log), so the bound is the eager bf16 step's own distance from fp32: the
    compiled step may lie at most 1.5 times as far from it. A wrong row or a dropped term would be orders farther."""
    model, prompts = _model("qwen2").cuda(), _grouped_prompts()
    fed = torch.randint(3, VOCAB, (len(prompts), 8), generator=torch.Generator().manual_seed(2))
    drops = {2: (0,), 4: (1, 2, 3), 6: (0, 1)}
    exact = _fed_log_probs(StaticDecoder(model, torch.float32, cuda_graphs=False), prompts, fed, drops)
    compiled = _fed_log_probs(StaticDecoder(model, torch.bfloat16, kernels="compile"), prompts, fed, drops)
    eager = _fed_log_probs(StaticDecoder(model, torch.bfloat16, cuda_graphs=False), prompts, fed, drops)

    def worst(got):
        return max((a - b).abs().max().item() for a, b in zip(got, exact))

    assert worst(compiled) <= 1.5 * worst(eager), (worst(compiled), worst(eager))
