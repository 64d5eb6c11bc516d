"""bf16-mixed training moves every weight at the papers' learning rate; pure bf16 weights barely move.

Why bf16-mixed is the default on CUDA: a bf16 weight of size ~0.02 has a spacing of ~1e-4, and AdamW at
lr 1e-6 moves each weight by ~1e-6 a step, which rounds back to the same bf16 number. The pure-bf16 case
below is what the project did on CUDA before (bf16 weights, AdamW on them directly).
"""

import copy
from dataclasses import replace

import numpy as np
import pytest
import torch

from fedagent_flwr.agent.grpo import GRPOTrainer, StepSample
from fedagent_flwr.agent.precision import resolve_precision
from fedagent_flwr.agent.rollout import RolloutConfig
from fedagent_flwr.agent.sft import SupervisedConfig, supervised_finetune
from fedagent_flwr.config import RunConfig

STEPS = 10


def _layer_weights(model) -> dict[str, torch.Tensor]:
    """The transformer layers' matrices (every one of them gets a gradient from any sample)."""
    return {k: v.detach().float().clone() for k, v in model.state_dict().items() if ".layers." in k and v.ndim == 2}


def _moved_fraction(before: dict[str, torch.Tensor], model) -> float:
    after = _layer_weights(model)
    moved = sum(int((after[k] != before[k]).sum()) for k in before)
    return moved / sum(v.numel() for v in before.values())


def _pairs(tokenizer, n: int, seed: int = 0) -> list[tuple[list[int], list[int]]]:
    rng = np.random.default_rng(seed)
    vocab = len(tokenizer)
    return [(rng.integers(3, vocab, size=12).tolist(), rng.integers(3, vocab, size=6).tolist()) for _ in range(n)]


def _grpo_moved(model, tokenizer, precision: str) -> float:
    cfg = replace(RunConfig(learning_rate=1e-6, kl_beta=0.0, minibatch_size=4, micro_batch_size=4).grpo_config(),
                  precision=precision)
    trainer = GRPOTrainer(model, tokenizer, cfg, RolloutConfig(history_length=0))
    samples = [StepSample(p, c, 1.0 if i % 2 else -1.0, 1.0) for i, (p, c) in enumerate(_pairs(tokenizer, 4 * STEPS))]
    before = _layer_weights(model)
    stats = trainer.update(samples, np.random.default_rng(0))
    assert stats["optimizer_steps"] == STEPS
    return _moved_fraction(before, model)


def test_bf16_mixed_grpo_moves_the_weights_at_lr_1e_6_and_pure_bf16_does_not(tiny_lm, maze_tokenizer):
    mixed = _grpo_moved(copy.deepcopy(tiny_lm), maze_tokenizer, "bf16-mixed")
    pure = _grpo_moved(copy.deepcopy(tiny_lm).to(torch.bfloat16), maze_tokenizer, "fp32")  # bf16 weights, no autocast
    assert mixed > 0.99, mixed
    assert pure < 0.05, pure


def test_bf16_mixed_sft_moves_the_weights_at_lr_1e_6_and_pure_bf16_does_not(tiny_lm, maze_tokenizer):
    def moved(model, precision):
        before = _layer_weights(model)
        supervised_finetune(model, _pairs(maze_tokenizer, 16), maze_tokenizer,
                            SupervisedConfig(steps=STEPS, batch_size=4, learning_rate=1e-6, precision=precision))
        return _moved_fraction(before, model)

    assert moved(copy.deepcopy(tiny_lm), "bf16-mixed") > 0.99
    assert moved(copy.deepcopy(tiny_lm).to(torch.bfloat16), "fp32") < 0.05


def test_bf16_mixed_forward_runs_in_bf16_over_fp32_weights(tiny_lm, maze_tokenizer):
    """Autocast really is on: the logits of a forward pass come out in bf16 while the weights stay fp32."""
    from fedagent_flwr.agent.precision import autocast

    ids = torch.tensor([_pairs(maze_tokenizer, 1)[0][0]])
    with autocast("bf16-mixed", torch.device("cpu")):
        logits = tiny_lm(input_ids=ids).logits
    assert logits.dtype == torch.bfloat16 and next(tiny_lm.parameters()).dtype == torch.float32


def test_precision_auto_is_mixed_on_cuda_and_fp32_on_cpu():
    assert resolve_precision("auto", on_cuda=True) == "bf16-mixed"
    assert resolve_precision("auto", on_cuda=False) == "fp32"
    assert resolve_precision("bf16-mixed", on_cuda=False) == "bf16-mixed"  # allowed on CPU (tests, checks)
    assert RunConfig(device="cpu").grpo_config().precision == "fp32"
    assert RunConfig(precision="bf16-mixed").self_evolution_config().precision == "bf16-mixed"
    with pytest.raises(ValueError, match="precision='fp16'"):
        RunConfig(precision="fp16")


@pytest.mark.parametrize("lora", [False, True])
def test_gradient_checkpointing_gives_the_same_update(tiny_lm, maze_tokenizer, lora):
    """Recomputing activations in backward changes memory, not the result (full model and LoRA adapter)."""
    from fedagent_flwr.agent.lora import LoRASpec, attached_lora

    saved = {False: 0, True: 0}  # bytes autograd keeps for backward

    def pack(checkpointing):
        def hook(tensor):
            saved[checkpointing] += tensor.numel() * tensor.element_size()
            return tensor
        return hook

    def trained(checkpointing):
        model = copy.deepcopy(tiny_lm)
        cfg = RunConfig(learning_rate=1e-3, kl_beta=0.1, minibatch_size=4, micro_batch_size=2,
                        gradient_checkpointing=checkpointing).grpo_config()
        samples = [StepSample(p, c, 1.0 if i % 2 else -1.0, 1.0) for i, (p, c) in enumerate(_pairs(maze_tokenizer, 8))]
        with torch.autograd.graph.saved_tensors_hooks(pack(checkpointing), lambda t: t):
            if not lora:
                GRPOTrainer(model, maze_tokenizer, cfg, RolloutConfig(history_length=0)).update(samples, np.random.default_rng(0))
                return model.state_dict()
            with attached_lora(model, LoRASpec(rank=2), seed=1) as peft_model:
                GRPOTrainer(peft_model, maze_tokenizer, cfg, RolloutConfig(history_length=0)).update(samples, np.random.default_rng(0))
                return {k: v.clone() for k, v in peft_model.state_dict().items() if "lora_" in k}

    plain, checkpointed = trained(False), trained(True)
    assert saved[True] < 0.8 * saved[False]  # the layers' activations were not kept: checkpointing was on
    assert plain.keys() == checkpointed.keys()
    for key in plain:
        torch.testing.assert_close(checkpointed[key], plain[key], rtol=1e-5, atol=1e-6)
    assert not tiny_lm.is_activation_checkpointing and not tiny_lm.training  # the model is left as it was
