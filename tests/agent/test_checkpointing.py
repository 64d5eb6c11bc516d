"""engine.gradient-checkpointing = 'auto': each micro-batch checkpoints only the leading layers its memory needs."""

from dataclasses import replace
import copy

import numpy as np
import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from fedagent_flwr.agent.engine.checkpointing import activation_checkpointing
from fedagent_flwr.agent.training.advantages import StepSample
from fedagent_flwr.agent.engine.memory import (
    ACTIVATIONS_ROW,
    GB,
    ModelShape,
    client_plan,
    layer_activation_bytes,
    layer_activations,
    layers_to_checkpoint,
    update_activation_bytes,
)
from fedagent_flwr.agent.play.rollout import RolloutConfig
from fedagent_flwr.config import RunConfig
from fedagent_flwr.simulation import parse_overrides
from conftest import planned
from fedagent_flwr.methods.placement import place_run
from placed import grpo_trainer

LAYERS = 4


@pytest.fixture()
def deep_lm(maze_tokenizer):
    """conftest's tiny model with 4 layers, so that 'some of the layers' means something."""
    torch.manual_seed(0)
    config = AutoConfig.for_model(
        "qwen2", vocab_size=len(maze_tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=LAYERS,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512, tie_word_embeddings=True,
        pad_token_id=maze_tokenizer.pad_token_id, eos_token_id=maze_tokenizer.eos_token_id, bos_token_id=None,
    )
    return AutoModelForCausalLM.from_config(config).eval()


def _small_shape() -> ModelShape:
    return ModelShape.of(AutoConfig.for_model("qwen2", hidden_size=8, num_hidden_layers=3, num_attention_heads=2,
                                              num_key_value_heads=1, intermediate_size=16, vocab_size=32))


def test_the_activation_estimate_by_hand_and_the_fewest_layers_that_fit():
    shape = _small_shape()
    per_token = layer_activations(shape, "bf16-mixed")  # fp32 weights under bf16 autocast
    # H 8, 2 heads of 4 (2 x 4 = 8 wide), 1 KV head, I 16; c = 2 (bf16 compute), r = 4 (fp32 residual stream):
    # SDPA's q, k, v and output (2 x 8 + 2 x 4) x 2 + fp32 log-sum-exp 2 x 4; the MLP's 4 x 16 x 2; two norms with
    # fp32 input and rsqrt 2 x (4 x 8 + 4), fp32 normalized 2 x 4 x 8, and q, k, v, gate and up's own bf16 casts 5 x 2 x 8
    assert per_token.full == (2 * 8 + 2 * 4) * 2 + 2 * 4 + 4 * 16 * 2 + 2 * (4 * 8 + 4) + 2 * 4 * 8 + 5 * 2 * 8 == 400
    assert per_token.kept == 8 * 4  # a checkpointed layer's fp32 input
    full, kept = 10 * per_token.full, 10 * per_token.kept  # over 10 positions
    assert layer_activation_bytes(shape, 10, per_token) == full
    assert update_activation_bytes(shape, 10, 0, per_token) == 3 * full
    assert update_activation_bytes(shape, 10, 1, per_token) == kept + 2 * full
    assert update_activation_bytes(shape, 10, 2, per_token) == 2 * kept + full
    # every layer: their inputs plus one layer's set recomputed at a time, as the plan with checkpointing counts it
    assert update_activation_bytes(shape, 10, 3, per_token) == 3 * kept + full
    planned = client_plan(shape, finetuning="full", lora_rank=2, lora_targets=("q_proj",), precision="bf16-mixed",
                          kl_beta=0.0, kl_reference="round-start", micro_batch_size=2, rollout_batch_size=1,
                          context_tokens=5, gradient_checkpointing=True).as_dict()[ACTIVATIONS_ROW]
    assert planned == update_activation_bytes(shape, 10, 3, per_token)
    # the fewest layers: exactly at a bound, one byte under it, plenty of room, too little for anything
    assert layers_to_checkpoint(shape, 10, 3 * full, per_token) == 0
    assert layers_to_checkpoint(shape, 10, 3 * full - 1, per_token) == 1
    assert layers_to_checkpoint(shape, 10, 2 * kept + full, per_token) == 2
    assert layers_to_checkpoint(shape, 10, 2 * kept + full - 1, per_token) == 3
    assert layers_to_checkpoint(shape, 10, 1, per_token) == 3 and layers_to_checkpoint(shape, 10, 10 * GB, per_token) == 0
    # longer micro-batches need more of the layers in the same room
    room = 2 * full
    assert [layers_to_checkpoint(shape, t, room, per_token) for t in (5, 10, 20)] == [0, 2, 3]


def _samples(tokenizer, n: int) -> list[StepSample]:
    """Prompts of very different lengths, so that length-grouped micro-batches differ in width."""
    rng = np.random.default_rng(0)
    vocab = len(tokenizer)
    lengths = [4, 6, 8, 10, 40, 44, 48, 52][:n]
    return [StepSample(rng.integers(3, vocab, size=p).tolist(), rng.integers(3, vocab, size=6).tolist(),
                       1.0 if i % 2 else -1.0, 1.0) for i, p in enumerate(lengths)]


def _update(model, tokenizer, checkpointing, room=None, client_gb=0.0):
    cfg = RunConfig.from_run_config({"device": "cpu", "grpo.learning-rate": 1e-3, "grpo.beta": 0.1, "grpo.mini-batch-size": 8, "grpo.ppo-micro-batch-size-per-gpu": 2, "grpo.group-by-length": True, "engine.gradient-checkpointing": checkpointing, "engine.client-memory-gb": client_gb})
    samples = _samples(tokenizer, 8)
    placement = place_run(cfg)  # auto without a room resolves to every layer; with one, as place() leaves it: fitted
    if room is not None:
        placement = replace(placement, gradient_checkpointing="fitted", activation_room_bytes=room)
    trainer = grpo_trainer(model, tokenizer, cfg, RolloutConfig(history_length=0), placement=placement)
    stats = trainer.update(samples, np.random.default_rng(0))
    return stats, samples


def _recomputed_layers(model) -> tuple[list, list[list[int]], list[int]]:
    """Counters that record, per micro-batch (one forward of the model with grad), how often each layer ran its MLP:
    a checkpointed layer runs it again when backward recomputes it. The MLP's own forward is wrapped, not hooked:
    PyTorch's checkpoint runs no module hooks while it recomputes."""
    layers = list(model.model.layers)
    calls = [0] * len(layers)
    per_micro: list[list[int]] = []

    def on_model_forward(module, args, kwargs):
        if torch.is_grad_enabled():
            per_micro.append(calls.copy())  # snapshot before: the difference to the next is one micro-batch

    handles = [model.register_forward_pre_hook(on_model_forward, with_kwargs=True)]
    for i, layer in enumerate(layers):
        def counted(*args, i=i, inner=layer.mlp.forward, **kwargs):
            if torch.is_grad_enabled():
                calls[i] += 1
            return inner(*args, **kwargs)
        layer.mlp.forward = counted
    return handles, per_micro, calls


def test_auto_checkpoints_only_the_leading_layers_each_micro_batch_needs_and_updates_as_before(deep_lm, maze_tokenizer):
    shape = ModelShape.of(deep_lm.config)
    # fp32 on CPU: 4 bytes a value. The four length-grouped micro-batches of two are 58, 50, 16 and 12 tokens wide
    # (prompt + completion), so 116, 100, 32 and 24 positions. The room fits the short ones whole, not the long ones.
    per_token = layer_activations(shape, "fp32")
    room = update_activation_bytes(shape, 40, 0, per_token)
    expected = {tokens: layers_to_checkpoint(shape, tokens, room, per_token) for tokens in (116, 100, 32, 24)}
    assert expected[24] == expected[32] == 0 and 0 < expected[100] <= expected[116] < LAYERS

    plain = copy.deepcopy(deep_lm)
    everything = copy.deepcopy(deep_lm)
    handles, per_micro, calls = _recomputed_layers(deep_lm)
    stats, samples = _update(deep_lm, maze_tokenizer, "auto", room)
    for h in handles:
        h.remove()
    per_micro.append(calls.copy())
    widths = sorted((len(s.prompt_ids) + len(s.completion_ids) for s in samples), reverse=True)[::2]
    assert widths == [58, 50, 16, 12]
    seen = []
    for before, after, width in zip(per_micro, per_micro[1:], widths):
        ran = [a - b for a, b in zip(after, before)]
        k = expected[2 * width]
        assert ran == [2] * k + [1] * (LAYERS - k), (width, ran)  # the first k layers recomputed, the rest kept
        seen.append(k)
    assert len(seen) == 4 and seen[0] > 0 and seen[-1] == 0
    assert stats["checkpointed_layers"] == pytest.approx(np.mean(seen) / LAYERS)

    _update(plain, maze_tokenizer, False)
    _update(everything, maze_tokenizer, True)
    for key, value in plain.state_dict().items():  # what is recomputed changes memory, not the update
        torch.testing.assert_close(deep_lm.state_dict()[key], value, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(everything.state_dict()[key], value, rtol=1e-5, atol=1e-6)
    assert not deep_lm.is_activation_checkpointing and not deep_lm.training  # left as it was
    assert not any(layer.gradient_checkpointing for layer in deep_lm.model.layers)


def test_auto_without_a_known_room_checkpoints_every_layer(deep_lm, maze_tokenizer):
    handles, per_micro, calls = _recomputed_layers(deep_lm)
    stats, _ = _update(deep_lm, maze_tokenizer, "auto", None)
    for h in handles:
        h.remove()
    per_micro.append(calls.copy())
    for before, after in zip(per_micro, per_micro[1:]):
        assert [a - b for a, b in zip(after, before)] == [2] * LAYERS
    assert stats["checkpointed_layers"] == 1.0


def test_the_room_is_the_budget_less_the_rest_of_the_plan():
    shape = _small_shape()
    cfg = RunConfig.from_run_config({"device": "cpu", "engine.gradient-checkpointing": "auto", "grpo.ppo-micro-batch-size-per-gpu": 2})
    plan = planned(cfg, shape, 20, 4).as_dict()
    others = plan["total"] - plan[ACTIVATIONS_ROW]
    placed = lambda c, budget: place_run(c.updated({"rollout.generation-batch-size": 4}), shape=shape, context_tokens=20,  # noqa: E731
                                         budget_bytes=budget)
    auto = placed(cfg, 10 * GB)
    assert (auto.gradient_checkpointing, auto.activation_room_bytes) == ("fitted", 10 * GB - others)
    # the plan counts the worst case, every layer checkpointed, as with true
    assert plan == planned(RunConfig.from_run_config({"device": "cpu", "engine.gradient-checkpointing": True, "grpo.ppo-micro-batch-size-per-gpu": 2}), shape, 20, 4).as_dict()
    unknown = placed(cfg, None)  # no memory known: every layer
    assert (unknown.gradient_checkpointing, unknown.activation_room_bytes) == (True, None)
    every = placed(RunConfig.from_run_config({"device": "cpu", "engine.gradient-checkpointing": True}), 10 * GB)
    assert (every.gradient_checkpointing, every.activation_room_bytes) == (True, None)


def test_auto_is_a_value_of_the_key_and_other_words_are_refused():
    assert RunConfig.from_run_config({"engine.gradient-checkpointing": "auto"}).engine.gradient_checkpointing == "auto"
    assert RunConfig.from_run_config({"engine.gradient-checkpointing": True}).engine.gradient_checkpointing is True
    assert parse_overrides(["engine.gradient-checkpointing=auto"]) == {"engine.gradient-checkpointing": "auto"}
    assert parse_overrides(["engine.gradient-checkpointing=false"]) == {"engine.gradient-checkpointing": False}
    with pytest.raises(ValueError, match="engine.gradient-checkpointing='sometimes'.*expected bool or 'auto'"):
        RunConfig.from_run_config({"engine.gradient-checkpointing": "sometimes"})
    with pytest.raises(ValueError, match="engine.gradient-checkpointing takes true | false | auto"):
        parse_overrides(["engine.gradient-checkpointing=sometimes"])
    with pytest.raises(ValueError, match="grpo.group-by-length takes true | false"):
        parse_overrides(["grpo.group-by-length=ture"])  # a typo used to read as false
    with pytest.raises(ValueError, match="engine.gradient-checkpointing"):
        RunConfig.from_run_config({"engine.gradient-checkpointing": "sometimes"})
    with pytest.raises(ValueError, match="must be one of"):
        with activation_checkpointing(None, "sometimes", None, "fp32"):
            pass


def test_run_simulation_takes_auto_as_the_flag_value():
    from fedagent_flwr.simulation import build_parser

    parse = build_parser().parse_args
    assert getattr(parse(["--engine.gradient-checkpointing", "auto"]), "engine.gradient-checkpointing") == "auto"
    assert getattr(parse(["--engine.gradient-checkpointing", "true"]), "engine.gradient-checkpointing") is True
    with pytest.raises(SystemExit):
        parse(["--engine.gradient-checkpointing", "sometimes"])


def test_a_recomputed_layer_runs_its_attention_in_the_same_kernel_context_as_its_forward(deep_lm, maze_tokenizer,
                                                                                          monkeypatch):
    """On a GPU the passes exclude cuDNN's attention (agent/engine/attention.py). Backward recomputes a checkpointed layer's
    forward, so it must run in that context too: outside it SDPA picks another kernel, and torch's checkpoint stops
    on the saved tensors it did not expect (seen on an H100). On a CPU the context changes nothing, so here it is
    replaced by one that marks where it holds, and every attention call, recomputed ones included, must be marked."""
    import contextlib

    import fedagent_flwr.agent.engine.passes as passes_module
    import fedagent_flwr.agent.engine.tokens as tokens_module

    depth = []

    @contextlib.contextmanager
    def marked(device):
        depth.append(device)
        try:
            yield
        finally:
            depth.pop()

    monkeypatch.setattr(passes_module, "variable_shape_attention", marked)
    monkeypatch.setattr(tokens_module, "variable_shape_attention", marked)
    seen: list[bool] = []
    for layer in deep_lm.model.layers:
        def recorded(*args, inner=layer.self_attn.forward, **kwargs):
            if torch.is_grad_enabled():
                seen.append(bool(depth))
            return inner(*args, **kwargs)
        layer.self_attn.forward = recorded
    stats, samples = _update(deep_lm, maze_tokenizer, True)
    micro = len(samples) // 2
    assert stats["checkpointed_layers"] == 1.0
    assert len(seen) == 2 * LAYERS * micro  # each layer's forward, and its recompute in backward
    assert all(seen), seen


def test_auto_counts_what_the_trained_model_keeps_its_precision_working_copy_and_adapter(deep_lm):
    """The trainer's auto plans each pass with the count of what its own layers keep (memory.layer_activations): the
    precision's, the bf16 working copy's (a bf16 residual stream), a LoRA adapter's."""
    from fedagent_flwr.agent.training.lora import attached_lora
    from fedagent_flwr.config import LoRASection

    shape = ModelShape.of(deep_lm.config)
    for precision, param_dtype in (("fp32", "fp32"), ("bf16-mixed", "fp32"), ("bf16-mixed", "bf16")):
        with activation_checkpointing(deep_lm, "fitted", GB, precision, param_dtype) as ckpt:
            assert ckpt.per_token == layer_activations(shape, precision, param_dtype)
    assert layer_activations(shape, "bf16-mixed", "bf16") != layer_activations(shape, "bf16-mixed", "fp32")
    with attached_lora(deep_lm, LoRASection(r=4, target_modules="q_proj,down_proj")) as peft_model:
        with activation_checkpointing(peft_model, "fitted", GB, "bf16-mixed") as ckpt:
            assert ckpt.per_token == layer_activations(shape, "bf16-mixed", "fp32", ("down_proj", "q_proj"), 4)
    with activation_checkpointing(deep_lm, "fitted", None, "bf16-mixed") as ckpt:  # no room known: every layer, no count
        assert ckpt.per_token is None and ckpt.fit(100) == LAYERS
