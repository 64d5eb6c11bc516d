"""engine.param-dtype = 'bf16': GRPO's passes compute on a bf16 working copy over fp32 master weights."""

import copy

import numpy as np
import pytest
import torch

from fedagent_flwr.agent.training.advantages import StepSample
from fedagent_flwr.agent.engine.master_weights import Bf16WorkingCopy, bf16_view
from fedagent_flwr.agent.play.rollout import RolloutConfig
from fedagent_flwr.config import RunConfig
from conftest import planned
from fedagent_flwr.methods.placement import place_run
from placed import grpo_trainer


def _samples(tokenizer, n: int) -> list[StepSample]:
    rng = np.random.default_rng(0)
    vocab = len(tokenizer)
    return [StepSample(rng.integers(3, vocab, size=int(rng.integers(6, 16))).tolist(), rng.integers(3, vocab, size=6).tolist(),
                       1.0 if i % 2 else -1.0, 1.0) for i in range(n)]


def _trainer(model, tokenizer, param_dtype: str, learning_rate: float = 1e-3, kl_beta: float = 0.0, minibatch: int = 4):
    cfg = RunConfig.from_run_config({"device": "cpu", "precision": "bf16-mixed", "engine.param-dtype": param_dtype, "grpo.learning-rate": learning_rate, "grpo.beta": kl_beta, "grpo.kl-reference": "round-start", "grpo.mini-batch-size": minibatch, "grpo.ppo-micro-batch-size-per-gpu": 2})
    return grpo_trainer(model, tokenizer, cfg, RolloutConfig(history_length=0))


def test_gradients_accumulate_in_fp32_and_the_masters_are_what_the_optimizer_steps():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    params = list(model.parameters())
    masters = [p.data for p in params]
    inputs = [torch.randn(5, 8), torch.randn(3, 8)]
    # the reference: each micro-batch's gradient on a bf16 model, summed in fp32
    bf16_model = copy.deepcopy(model).to(torch.bfloat16)
    expected = [torch.zeros_like(p, dtype=torch.float32) for p in params]
    for x in inputs:
        bf16_model.zero_grad()
        bf16_model(x.bfloat16()).square().sum().backward()
        for e, p in zip(expected, bf16_model.parameters()):
            e += p.grad.float()

    with Bf16WorkingCopy(model) as working:
        assert all(p.dtype == torch.bfloat16 for p in params)  # the passes compute in bf16
        for x in inputs:
            model(x.bfloat16()).square().sum().backward()
            assert all(p.grad is None for p in params)  # each bf16 gradient went into the fp32 sum and was freed
        working.master_view()
        for p, m, e in zip(params, masters, expected):
            assert p.data_ptr() == m.data_ptr() and p.grad.dtype == torch.float32
            torch.testing.assert_close(p.grad, e, rtol=0, atol=0)  # exactly the fp32 sum of the bf16 gradients
        with torch.no_grad():
            for p in params:  # an optimizer step on the masters, smaller than bf16 can hold
                p.add_(1e-6)
        working.refresh()
        for p, m in zip(params, masters):
            assert p.dtype == torch.bfloat16 and p.grad is None
            torch.testing.assert_close(p.data, m.to(torch.bfloat16), rtol=0, atol=0)
    for p, m in zip(params, masters):  # the fp32 masters are back, with the step bf16 could not hold
        assert p.data_ptr() == m.data_ptr() and p.dtype == torch.float32
        assert not p._post_accumulate_grad_hooks
    assert params == list(model.parameters())  # the same Parameter objects: AdamW's state stays keyed to them


def test_a_bf16_working_copy_update_trains_as_autocast_does_and_moves_every_master_weight(tiny_lm, maze_tokenizer):
    before = {k: v.clone() for k, v in tiny_lm.state_dict().items()}
    moved = {}
    for param_dtype in ("fp32", "bf16"):
        model = copy.deepcopy(tiny_lm)
        stats = _trainer(model, maze_tokenizer, param_dtype).update(_samples(maze_tokenizer, 8), np.random.default_rng(0))
        assert stats["optimizer_steps"] == 2
        assert all(p.dtype == torch.float32 for p in model.parameters())  # left with its fp32 weights
        moved[param_dtype] = torch.cat([(model.state_dict()[k] - v).flatten() for k, v in before.items()])
    a, b = moved["fp32"], moved["bf16"]
    # Adam's first steps are about lr x the gradient's sign: the two agree on almost every weight's direction
    assert torch.nn.functional.cosine_similarity(a, b, dim=0) > 0.9
    assert ((a.sign() == b.sign()) | (a == 0)).float().mean() > 0.9

    # at lr 1e-6 the bf16 working copy cannot move, the fp32 masters do: every weight
    model = copy.deepcopy(tiny_lm)
    trainer = _trainer(model, maze_tokenizer, "bf16", learning_rate=1e-6)
    for _ in range(3):
        trainer.update(_samples(maze_tokenizer, 4), np.random.default_rng(0))
    changed = torch.cat([(model.state_dict()[k] != v).flatten() for k, v in before.items()]).float().mean()
    assert changed > 0.99


def test_the_old_policy_and_the_kl_reference_compute_on_bf16_weights_too(tiny_lm, maze_tokenizer):
    """At a step too small for bf16 to hold, the working copy never changes: the policy, its old log-probs and the
    round-start reference must then agree exactly (KL 0, nothing clipped). A reference scored on the fp32 weights
    under autocast would differ by rounding, and the KL term would pull towards it."""
    trainer = _trainer(tiny_lm, maze_tokenizer, "bf16", learning_rate=1e-9, kl_beta=0.1, minibatch=2)
    stats = trainer.update(_samples(maze_tokenizer, 8), np.random.default_rng(0))
    assert stats["optimizer_steps"] == 4  # several minibatches: the old policy's pass ran apart
    assert stats["kl"] == 0.0 and stats["clip_frac"] == 0.0
    # the round-start reference is held in bf16, as it computes (half its memory; the plan counts P x 2)
    assert all(p.dtype == torch.bfloat16 for p in trainer.reference.parameters())


def test_the_plan_holds_the_round_start_reference_in_bf16_with_a_working_copy():
    from fedagent_flwr.agent.engine.memory import ModelShape, shape_config

    shape = ModelShape.of(shape_config("qwen2.5-0.5b"))
    rows = {dtype: planned(RunConfig.from_run_config({"device": "cpu", "precision": "bf16-mixed", "engine.param-dtype": dtype, "grpo.beta": 0.01, "grpo.kl-reference": "round-start"}), shape, 512, 8).as_dict()["KL reference"]
            for dtype in ("fp32", "bf16")}
    assert rows == {"fp32": 4 * shape.parameters, "bf16": 2 * shape.parameters}


def test_bf16_view_leaves_a_frozen_model_as_it_was(tiny_lm):
    weights = {k: v.clone() for k, v in tiny_lm.state_dict().items()}
    with bf16_view(tiny_lm):
        assert tiny_lm.model.embed_tokens.weight.dtype == torch.bfloat16
    for k, v in tiny_lm.state_dict().items():
        assert v.dtype == torch.float32 and torch.equal(v, weights[k])


def test_param_dtype_bf16_is_refused_where_it_does_not_apply(tiny_lm, maze_tokenizer):
    assert RunConfig.from_run_config({"device": "cpu", "precision": "bf16-mixed", "engine.param-dtype": "bf16"}).engine.param_dtype == "bf16"
    for bad, says in [({"precision": "fp32"}, "precision resolves to 'fp32'"),
                      ({"precision": "bf16-mixed", "grpo.finetuning": "lora"}, "grpo.finetuning='lora'"),
                      ({"precision": "bf16-mixed", "strategy": "fedse-lora"}, "strategy='fedse-lora'")]:
        with pytest.raises(ValueError, match=f"engine.param-dtype='bf16'.*{says}"):
            RunConfig.from_run_config({"device": "cpu", "engine.param-dtype": "bf16", **bad})
    with pytest.raises(ValueError, match="engine.param-dtype='bf8'"):
        RunConfig.from_run_config({"engine.param-dtype": "bf8"})


def test_param_dtype_auto_takes_the_working_copy_where_it_applies_and_fp32_elsewhere():
    """auto = bf16 where a working copy applies (a GRPO strategy, full fine-tuning, precision resolving to bf16-mixed),
    fp32 elsewhere, so one preset runs on a GPU with the copy and on a CPU without; the trainer and the plan get the
    resolved value."""
    from fedagent_flwr.agent.engine.memory import ModelShape, shape_config

    def resolved(**kw):
        cfg = RunConfig.from_run_config({"engine.param-dtype": "auto", **kw})
        return place_run(cfg).param_dtype  # what the trainer's passes and the plan take

    assert resolved(device="cuda") == "bf16"
    assert resolved(device="cpu", precision="bf16-mixed") == "bf16"
    assert resolved(device="cpu") == "fp32"  # precision auto resolves to fp32 on a CPU
    assert resolved(device="cuda", precision="fp32") == "fp32"
    assert resolved(device="cuda", **{"grpo.finetuning": "lora"}) == "fp32"
    assert place_run(RunConfig.from_run_config({"engine.param-dtype": "auto", "device": "cuda", "strategy": "fedse-lora"})).param_dtype == "fp32"
    assert place_run(RunConfig()).param_dtype == "fp32"  # the default stays fp32
    shape = ModelShape.of(shape_config("qwen2.5-0.5b"))
    plans = {dtype: planned(RunConfig.from_run_config({"device": "cuda", "engine.param-dtype": dtype, "grpo.beta": 0.01, "grpo.kl-reference": "round-start"}),
                            shape, 512, 8).as_dict()["KL reference"] for dtype in ("auto", "bf16", "fp32")}
    assert plans["auto"] == plans["bf16"] == plans["fp32"] / 2
    with pytest.raises(ValueError, match=r"engine.param-dtype='bf8' is not allowed: expected fp32 \| bf16 \| auto"):
        RunConfig.from_run_config({"engine.param-dtype": "bf8"})


def test_the_paper_preset_takes_the_working_copy_on_a_gpu_and_fp32_on_a_cpu():
    """Its own test: the preset's ALFWorld checks need the alfworld package, which a lent GPU machine lacks."""
    pytest.importorskip("alfworld")
    from pathlib import Path

    from fedagent_flwr.simulation import read_run_config_file

    preset = read_run_config_file(str(Path(__file__).resolve().parents[2] / "configs" / "fedagent-paper.toml"))
    assert preset["engine.param-dtype"] == "auto"
    assert place_run(RunConfig.from_run_config(preset | {"device": "cpu"})).param_dtype == "fp32"
    assert place_run(RunConfig.from_run_config(preset | {"device": "cuda"})).param_dtype == "bf16"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_the_masters_take_fused_adamw_steps_and_all_move(tiny_lm, maze_tokenizer):
    model = copy.deepcopy(tiny_lm).cuda()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    cfg = RunConfig.from_run_config({"device": "cuda", "precision": "bf16-mixed", "engine.param-dtype": "bf16", "grpo.learning-rate": 1e-6, "grpo.beta": 0.1, "grpo.kl-reference": "round-start", "grpo.mini-batch-size": 2, "grpo.ppo-micro-batch-size-per-gpu": 2})
    trainer = grpo_trainer(model, maze_tokenizer, cfg, RolloutConfig(history_length=0))
    assert trainer.optimizer.defaults["fused"]  # the fused kernel steps the fp32 masters with their fp32 gradients
    for _ in range(3):
        stats = trainer.update(_samples(maze_tokenizer, 4), np.random.default_rng(0))
    # bf16 holds a step of 1e-6 only in weights under about 1e-4 in size, so the working copy barely moves from the
    # reference (the H100 measured 6.5e-8; it is not exactly 0 there)
    assert 0.0 <= stats["kl"] < 1e-6
    assert all(p.dtype == torch.float32 and p.is_cuda for p in model.parameters())
    changed = torch.cat([(model.state_dict()[k] != v).flatten() for k, v in before.items()]).float().mean()
    assert changed > 0.99


def test_the_working_copy_and_gradient_checkpointing_give_the_same_update(tiny_lm, maze_tokenizer):
    """A checkpointed layer's gradients reach the fp32 sum through the same hook: recomputing changes memory only."""
    results = []
    for checkpointing in (False, True):
        model = copy.deepcopy(tiny_lm)
        cfg = RunConfig.from_run_config({"device": "cpu", "precision": "bf16-mixed", "engine.param-dtype": "bf16", "grpo.learning-rate": 1e-3, "grpo.beta": 0.0, "grpo.mini-batch-size": 4, "grpo.ppo-micro-batch-size-per-gpu": 2, "engine.gradient-checkpointing": checkpointing})
        grpo_trainer(model, maze_tokenizer, cfg, RolloutConfig(history_length=0)).update(
            _samples(maze_tokenizer, 8), np.random.default_rng(0))
        results.append(model.state_dict())
    for key, value in results[0].items():
        torch.testing.assert_close(results[1][key], value, rtol=0, atol=0)
