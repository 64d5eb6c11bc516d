"""grpo.ppo-max-token-len-per-gpu and grpo.log-prob-max-token-len-per-gpu: GRPO's passes cut by padded tokens (rows x the longest row)
instead of by rows."""

import copy

import numpy as np
import pytest
import torch
from transformers import AutoConfig

from fedagent_flwr.agent.training import grpo
from fedagent_flwr.agent.training.advantages import StepSample
from fedagent_flwr.agent.engine.micro_batches import micro_batches
from fedagent_flwr.agent.engine.memory import (
    ACTIVATIONS_ROW,
    NO_GRAD_ROW,
    ModelShape,
    client_plan,
    layer_activations,
    update_activation_bytes,
)
from fedagent_flwr.agent.play.rollout import RolloutConfig
from fedagent_flwr.config import RunConfig
from conftest import planned
from fedagent_flwr.methods.memory import plan_layer_activations
from fedagent_flwr.methods.placement import place_run
from placed import grpo_trainer


def test_micro_batches_hold_as_many_consecutive_samples_as_the_padded_budget_allows():
    lengths = [10, 9, 8, 8, 7, 30, 2, 2, 2]  # each sample's prompt and completion tokens
    # Within 32 padded tokens (rows x longest) the fewest passes are 4: [10, 9, 8] = 30 (adding 8 makes 40),
    # [8, 7] = 16 (adding 30 makes 90), 30 alone (longer than the budget), [2, 2, 2] = 6. Evened out, the 4 passes
    # are those of the smallest budget that needs no more, 24: [10, 9] = 20, [8, 8, 7] = 24, [30], [2, 2, 2]
    assert micro_batches(range(9), lengths, size=2, tokens=32) == [[0, 1], [2, 3, 4], [5], [6, 7, 8]]
    # a minibatch that needs two passes gets two halves, not a full pass and a remnant
    assert micro_batches(range(10), [10] * 10, size=2, tokens=90) == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]
    # the order given is kept (the trainer sorts by length first when asked), and every sample is in one pass
    order = [8, 5, 0, 6, 1]
    cut = micro_batches(order, lengths, size=2, tokens=32)
    assert [i for m in cut for i in m] == order
    assert all(len(m) == 1 or len(m) * max(lengths[i] for i in m) <= 32 for m in cut)
    # 0 = cut by rows, as before
    assert micro_batches(range(9), lengths, size=4) == [[0, 1, 2, 3], [4, 5, 6, 7], [8]]
    assert micro_batches(range(9), lengths, size=4, tokens=0) == micro_batches(range(9), lengths, size=4)


def test_an_update_cut_by_tokens_runs_fewer_fuller_passes_and_trains_as_one_cut_by_rows(tiny_lm, maze_tokenizer, monkeypatch):
    """The loss of a minibatch is one weighted token mean however it is cut, so passes cut by a token budget give the
    statistics and weights of passes cut by rows; each pass stays within the budget (a longer sample alone)."""
    rng = np.random.default_rng(11)
    vocab = tiny_lm.config.vocab_size
    samples = [StepSample(rng.integers(3, vocab, size=int(rng.integers(3, 40))).tolist(),
                          rng.integers(3, vocab, size=int(rng.integers(1, 12))).tolist(),
                          float(rng.normal()), float(rng.uniform(0.2, 1.0))) for _ in range(16)]
    # device="cpu" as the model is: on a GPU machine auto would run the comparison in bf16
    base = RunConfig.from_run_config({"grpo.learning-rate": 1e-3, "grpo.beta": 0.05, "grpo.mini-batch-size": 8, "grpo.ppo-micro-batch-size-per-gpu": 2, "device": "cpu", "grpo.group-by-length": True})
    real = grpo.completion_logprobs

    def run(tokens, logprob_tokens):
        shapes = {True: [], False: []}  # the update's passes (with gradients), the no-grad log-prob passes'

        def recording(model, batch, *args, **kwargs):
            shapes[torch.is_grad_enabled()].append(tuple(batch["input_ids"].shape))
            return real(model, batch, *args, **kwargs)

        monkeypatch.setattr(grpo, "completion_logprobs", recording)
        model = copy.deepcopy(tiny_lm)
        cfg = base.updated({"grpo.ppo-max-token-len-per-gpu": tokens, "grpo.log-prob-max-token-len-per-gpu": logprob_tokens})
        trainer = grpo_trainer(model, maze_tokenizer, cfg, RolloutConfig(history_length=0))
        stats = trainer.update(samples, np.random.default_rng(0))
        return stats, dict(model.named_parameters()), shapes[True], shapes[False]

    by_rows, rows_weights, rows_shapes, rows_no_grad = run(0, 0)
    by_tokens, tokens_weights, tokens_shapes, tokens_no_grad = run(96, 160)
    assert all(rows == 2 for rows, _ in rows_shapes + rows_no_grad) and len(rows_shapes) == 8 and len(rows_no_grad) == 16
    assert all(rows == 1 or rows * width <= 96 for rows, width in tokens_shapes), tokens_shapes
    assert len(tokens_shapes) < len(rows_shapes) and max(rows for rows, _ in tokens_shapes) > 2, tokens_shapes
    assert sum(rows for rows, _ in tokens_shapes) == 16  # every sample trained once
    # the no-grad passes (old policy, KL reference: 16 samples each) by their own budget
    assert all(rows == 1 or rows * width <= 160 for rows, width in tokens_no_grad), tokens_no_grad
    assert len(tokens_no_grad) < len(rows_no_grad) and sum(rows for rows, _ in tokens_no_grad) == 32, tokens_no_grad
    assert by_tokens["optimizer_steps"] == by_rows["optimizer_steps"] == 2 and by_rows["kl"] > 0
    for key in ("loss", "kl", "clip_frac", "grad_norm"):
        assert by_tokens[key] == pytest.approx(by_rows[key], rel=1e-5, abs=1e-8), key
    # AdamW divides by the gradient's size: near zero, rounding moves a weight by a fraction of a step (lr 1e-3); 1 % of
    # a step is the tolerance, as in test_grpo.py
    for name, weight in rows_weights.items():
        torch.testing.assert_close(tokens_weights[name], weight, rtol=0, atol=1e-5, msg=name)


def test_the_memory_plan_counts_a_pass_of_the_token_budget_or_of_one_whole_context():
    config = AutoConfig.for_model("qwen2", hidden_size=8, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                                  intermediate_size=16, vocab_size=32, tie_word_embeddings=True)
    shape = ModelShape.of(config)

    def plan(**kw):
        return client_plan(shape, finetuning="full", lora_rank=2, lora_targets=("q_proj",), precision="bf16-mixed",
                           kl_beta=0.01, kl_reference="round-start", micro_batch_size=3, rollout_batch_size=5,
                           context_tokens=10, **({"logprob_micro_batch_size": 1} | kw)).as_dict()

    per = layer_activations(shape, "bf16-mixed")  # client_plan's param_dtype: fp32 weights
    assert plan(micro_batch_tokens=0) == plan()  # 0 = 3 rows x 10 tokens, as before
    assert plan(micro_batch_tokens=50)[ACTIVATIONS_ROW] == update_activation_bytes(shape, 50, 0, per)
    assert plan(micro_batch_tokens=50)["training logits"] == 3 * 50 * 32 * 4
    # a budget under the context still lets one whole row through, alone
    assert plan(micro_batch_tokens=4)[ACTIVATIONS_ROW] == update_activation_bytes(shape, 10, 0, per)
    assert plan(micro_batch_tokens=50, gradient_checkpointing=True)[ACTIVATIONS_ROW] == update_activation_bytes(shape, 50, 2, per)
    # a chunk of the update (3 x 16 positions), and the trained head's gradients summed over chunks (2 x vocab x hidden)
    assert plan(micro_batch_tokens=50, logprob_chunk_tokens=16)["training logits"] == 3 * 16 * 32 * 4 + 2 * 32 * 8 * 4
    # the no-grad passes by their own budget: a pass of 200 tokens (320 bytes a token at its peak here,
    # test_memory.py) holds more than the update's logits and 2 layers of 30 tokens
    update = 3 * 30 * 32 * 4 + update_activation_bytes(shape, 30, 0, per)
    assert plan(logprob_micro_batch_tokens=200)[NO_GRAD_ROW] == 200 * 320 - update
    assert plan(logprob_micro_batch_tokens=200)["training logits"] == 3 * 30 * 32 * 4
    assert plan(logprob_micro_batch_tokens=4) == plan(logprob_micro_batch_size=1)  # one whole row at least, alone
    # the run-config keys reach the plan
    cfg = RunConfig.from_run_config({"grpo.ppo-micro-batch-size-per-gpu": 3, "grpo.ppo-max-token-len-per-gpu": 50, "grpo.log-prob-micro-batch-size-per-gpu": 1, "precision": "bf16-mixed"})
    per = plan_layer_activations(cfg, shape, place_run(cfg))
    assert per == layer_activations(shape, "bf16-mixed")
    assert planned(cfg, shape, 10, 5).as_dict()[ACTIVATIONS_ROW] == update_activation_bytes(shape, 50, 0, per)
    cfg = cfg.updated({"grpo.ppo-max-token-len-per-gpu": 0, "grpo.log-prob-max-token-len-per-gpu": 200})
    assert planned(cfg, shape, 10, 5).as_dict()[NO_GRAD_ROW] == 200 * 320 - update


@pytest.mark.parametrize("overrides, allowed", [
    ({"grpo.ppo-max-token-len-per-gpu": -1}, "expected an integer >= 0 (0 = grpo.ppo-micro-batch-size-per-gpu)"),
    ({"grpo.ppo-max-token-len-per-gpu": 4096, "strategy": "fedse-lora"}, "expected 0 unless the strategy trains with GRPO"),
    ({"grpo.log-prob-max-token-len-per-gpu": -5}, "expected an integer >= 0 (0 = grpo.log-prob-micro-batch-size-per-gpu)"),
    ({"grpo.log-prob-max-token-len-per-gpu": 4096, "strategy": "fedse-lora"}, "expected 0 unless the strategy trains with GRPO"),
])
def test_a_bad_token_budget_is_refused_before_work_starts(overrides, allowed):
    key = next(iter(overrides))
    with pytest.raises(ValueError, match=f"{key}={overrides[key]} is not allowed") as err:
        RunConfig.from_run_config(overrides)
    assert allowed in str(err.value)
