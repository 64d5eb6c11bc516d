"""bf16-mixed training moves every weight at the papers' learning rate; pure bf16 weights barely move.

Why bf16-mixed is the default on CUDA: a bf16 weight of size ~0.02 has a spacing of ~1e-4, and AdamW at
lr 1e-6 moves each weight by ~1e-6 a step, which rounds back to the same bf16 number. The pure-bf16 case
below is what the project did on CUDA before (bf16 weights, AdamW on them directly).
"""

import copy

import numpy as np
import pytest
import torch

from fedagent_flwr.agent.training.advantages import StepSample
from fedagent_flwr.agent.engine.placement import resolve_precision
from fedagent_flwr.agent.play.rollout import RolloutConfig
from fedagent_flwr.agent.training.sft import SupervisedConfig, supervised_finetune
from fedagent_flwr.config import RunConfig
from fedagent_flwr.methods.placement import place_run
from placed import grpo_trainer

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
    cfg = RunConfig.from_run_config({"grpo.learning-rate": 1e-6, "grpo.beta": 0.0, "grpo.mini-batch-size": 4,
                                     "grpo.ppo-micro-batch-size-per-gpu": 4, "device": "cpu", "precision": precision})
    trainer = grpo_trainer(model, tokenizer, cfg, RolloutConfig(history_length=0))
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
    from fedagent_flwr.agent.engine.precision import autocast

    ids = torch.tensor([_pairs(maze_tokenizer, 1)[0][0]])
    with autocast("bf16-mixed", torch.device("cpu")):
        logits = tiny_lm(input_ids=ids).logits
    assert logits.dtype == torch.bfloat16 and next(tiny_lm.parameters()).dtype == torch.float32


def test_precision_auto_is_mixed_on_cuda_and_fp32_on_cpu():
    assert resolve_precision("auto", on_cuda=True)[0] == "bf16-mixed"
    assert resolve_precision("auto", on_cuda=False)[0] == "fp32"  # nothing measured: fp32 (tests/agent/test_cpu_precision.py)
    assert resolve_precision("bf16-mixed", on_cuda=False)[0] == "bf16-mixed"  # allowed on CPU (tests, checks)
    assert place_run(RunConfig(device="cpu")).precision == "fp32"
    assert place_run(RunConfig(precision="bf16-mixed")).compute_precision == "bf16-mixed"  # what a Fed-SE round gets
    with pytest.raises(ValueError, match="precision='fp16'"):
        RunConfig(precision="fp16")


@pytest.mark.parametrize("lora", [False, True])
def test_gradient_checkpointing_gives_the_same_update(tiny_lm, maze_tokenizer, lora):
    """Recomputing activations in backward changes memory, not the result (full model and LoRA adapter)."""
    from fedagent_flwr.agent.training.lora import attached_lora
    from fedagent_flwr.config import LoRASection

    saved = {False: 0, True: 0}  # bytes autograd keeps for backward

    def pack(checkpointing):
        def hook(tensor):
            saved[checkpointing] += tensor.numel() * tensor.element_size()
            return tensor
        return hook

    def trained(checkpointing):
        model = copy.deepcopy(tiny_lm)
        cfg = RunConfig.from_run_config({"grpo.learning-rate": 1e-3, "grpo.beta": 0.1, "grpo.mini-batch-size": 4, "grpo.ppo-micro-batch-size-per-gpu": 2, "engine.gradient-checkpointing": checkpointing})
        samples = [StepSample(p, c, 1.0 if i % 2 else -1.0, 1.0) for i, (p, c) in enumerate(_pairs(maze_tokenizer, 8))]
        with torch.autograd.graph.saved_tensors_hooks(pack(checkpointing), lambda t: t):
            if not lora:
                grpo_trainer(model, maze_tokenizer, cfg, RolloutConfig(history_length=0)).update(samples, np.random.default_rng(0))
                return model.state_dict()
            with attached_lora(model, LoRASection(r=2), seed=1) as peft_model:
                grpo_trainer(peft_model, maze_tokenizer, cfg, RolloutConfig(history_length=0)).update(samples, np.random.default_rng(0))
                return {k: v.clone() for k, v in peft_model.state_dict().items() if "lora_" in k}

    plain, checkpointed = trained(False), trained(True)
    assert saved[True] < 0.8 * saved[False]  # the layers' activations were not kept: checkpointing was on
    assert plain.keys() == checkpointed.keys()
    for key in plain:
        torch.testing.assert_close(checkpointed[key], plain[key], rtol=1e-5, atol=1e-6)
    assert not tiny_lm.is_activation_checkpointing and not tiny_lm.training  # the model is left as it was


def test_bf16_base_resolves_autocasts_and_loads_in_bf16(tiny_lm, maze_tokenizer):
    from fedagent_flwr.agent.engine.precision import autocast, base_dtype, compute_precision

    assert resolve_precision("bf16-base", on_cuda=False)[0] == resolve_precision("bf16-base", on_cuda=True)[0] == "bf16-base"
    assert base_dtype("bf16-base") == torch.bfloat16
    assert base_dtype("bf16-mixed") == base_dtype("fp32") == base_dtype("auto") == torch.float32
    assert compute_precision("bf16-base") == "bf16-mixed" and compute_precision("fp32") == "fp32"
    ids = torch.tensor([_pairs(maze_tokenizer, 1)[0][0]])
    with autocast("bf16-base", torch.device("cpu")):
        assert tiny_lm(input_ids=ids).logits.dtype == torch.bfloat16


def _lora_trainer(model, tokenizer, precision, learning_rate=1e-6):
    cfg = RunConfig.from_run_config({"grpo.learning-rate": learning_rate, "grpo.beta": 0.01, "grpo.kl-reference": "base",
                                     "grpo.mini-batch-size": 4, "grpo.ppo-micro-batch-size-per-gpu": 2,
                                     "grpo.finetuning": "lora", "device": "cpu", "precision": precision})
    return grpo_trainer(model, tokenizer, cfg, RolloutConfig(history_length=0))


def test_bf16_base_lora_trains_an_fp32_adapter_at_lr_1e_6_and_never_moves_the_bf16_base(tiny_lm, maze_tokenizer):
    """The base is held in bf16 and stays bit-identical; the adapter and AdamW's moments are fp32, so the adapter
    moves at lr 1e-6 (a bf16 A of size ~0.1 would round such steps away); the forward runs under bf16 autocast."""
    from fedagent_flwr.agent.training.lora import attached_lora
    from fedagent_flwr.config import LoRASection

    base = copy.deepcopy(tiny_lm).to(torch.bfloat16)  # what load_agent(..., torch.bfloat16) holds
    base_before = {k: v.clone() for k, v in base.state_dict().items()}
    seen = []

    def record(module, inputs, output):  # on the adapter's A: its weight, and the dtype its matmul ran in
        seen.append((base_weight.dtype, module.weight.dtype, output.dtype, torch.is_autocast_enabled("cpu")))

    with attached_lora(base, LoRASection(r=2), seed=1) as peft_model:
        adapter_before = {k: v.clone() for k, v in peft_model.state_dict().items() if "lora_" in k}
        q_proj = peft_model.get_base_model().model.layers[0].self_attn.q_proj
        base_weight = q_proj.base_layer.weight
        hook = q_proj.lora_A["default"].register_forward_hook(record)
        trainer = _lora_trainer(peft_model, maze_tokenizer, "bf16-base")
        samples = [StepSample(p, c, 1.0 if i % 2 else -1.0, 1.0) for i, (p, c) in enumerate(_pairs(maze_tokenizer, 4 * STEPS))]
        stats = trainer.update(samples, np.random.default_rng(0))
        hook.remove()
        adapter_after = {k: v.clone() for k, v in peft_model.state_dict().items() if "lora_" in k}
        moments = [v for state in trainer.optimizer.state.values() for k, v in state.items() if k != "step"]
    assert stats["optimizer_steps"] == STEPS and stats["kl"] > 0
    assert seen and set(seen) == {(torch.bfloat16, torch.float32, torch.bfloat16, True)}
    assert moments and all(m.dtype == torch.float32 for m in moments)
    assert all(v.dtype == torch.float32 for v in adapter_after.values())
    for key, value in base.state_dict().items():  # the base after the adapter is unloaded: every bit as before
        assert value.dtype == torch.bfloat16 and torch.equal(value, base_before[key]), key
    for key in adapter_before:  # A and B of every targeted layer moved (B from 0; A once B was no longer 0)
        changed = float((adapter_after[key] != adapter_before[key]).float().mean())
        assert changed > 0.9, (key, changed)


@pytest.mark.parametrize("precision", ["bf16-base", "bf16-mixed"])
def test_the_adapter_takes_its_input_uncast_and_trains_to_the_same_bits_as_peft_casting_it(tiny_lm, maze_tokenizer,
                                                                                           precision):
    """lora.py keep_input_dtype: the adapter's A reads its input in the dtype it arrives in (bf16 under bf16-base,
    where PEFT would copy it to fp32 for autocast to copy back), and an update ends with the same adapter, bit for
    bit, as one where PEFT casts."""
    from fedagent_flwr.agent.training.lora import attached_lora
    from fedagent_flwr.config import LoRASection

    base = copy.deepcopy(tiny_lm).to(torch.bfloat16 if precision == "bf16-base" else torch.float32)
    samples = [StepSample(p, c, 1.0 if i % 2 else -1.0, 1.0) for i, (p, c) in enumerate(_pairs(maze_tokenizer, 8))]
    adapters, inputs = [], []
    for peft_casts in (False, True):
        with attached_lora(base, LoRASection(r=2, target_modules="all-linear"), seed=1) as peft_model:
            layer = peft_model.get_base_model().model.layers[0]
            for module in peft_model.modules():  # PEFT's default, which attached_lora turned off
                if peft_casts and hasattr(module, "cast_input_dtype_enabled"):
                    module.cast_input_dtype_enabled = True
            hook = layer.self_attn.q_proj.lora_A["default"].register_forward_pre_hook(
                lambda module, args: inputs.append((peft_casts, args[0].dtype)))
            _lora_trainer(peft_model, maze_tokenizer, precision, learning_rate=1e-3).update(samples, np.random.default_rng(0))
            hook.remove()
            adapters.append({k: v.clone() for k, v in peft_model.state_dict().items() if "lora_" in k})
    norm_output = torch.bfloat16 if precision == "bf16-base" else torch.float32
    assert set(inputs) == {(False, norm_output), (True, torch.float32)}
    assert adapters[0].keys() == adapters[1].keys()
    for key in adapters[0]:
        assert torch.equal(adapters[0][key], adapters[1][key]), key


def test_bf16_base_refuses_a_trained_bf16_model_and_an_fp32_base(tiny_lm, maze_tokenizer):
    from fedagent_flwr.agent.training.lora import attached_lora
    from fedagent_flwr.config import LoRASection

    with pytest.raises(ValueError, match="trains fp32 tensors only"):  # grpo.finetuning='full' on a bf16 model
        _lora_trainer(copy.deepcopy(tiny_lm).to(torch.bfloat16), maze_tokenizer, "bf16-base")
    with attached_lora(copy.deepcopy(tiny_lm), LoRASection(r=2)) as peft_model, pytest.raises(ValueError, match="base holds torch.float32"):
        _lora_trainer(peft_model, maze_tokenizer, "bf16-base")


def test_load_agent_holds_a_bf16_base_beside_the_fp32_one_without_converting_it(tiny_lm, maze_tokenizer, tmp_path, monkeypatch):
    """The base's dtype is part of load_agent's cache key: a bf16-base run gets its own bf16 copy, and the fp32
    agent another run of the process uses is left fp32; a dtype passed by keyword or position is one key."""
    from fedagent_flwr.agent.models.loading import load_agent

    monkeypatch.setenv("FEDAGENT_CACHE", str(tmp_path / "cache"))
    folder = tmp_path / "model"
    tiny_lm.save_pretrained(folder)
    maze_tokenizer.save_pretrained(folder)
    load_agent.cache_clear()
    try:
        fp32 = load_agent(str(folder), "maze", "cpu")
        bf16 = load_agent(str(folder), "maze", "cpu", torch.bfloat16)
        assert load_agent(str(folder), "maze", "cpu", base_dtype=torch.float32) is fp32
        assert load_agent(str(folder), "maze", "cpu", base_dtype=torch.bfloat16) is bf16
        assert load_agent.cache_info().currsize == 2
        assert {p.dtype for p in fp32.model.parameters()} == {torch.float32}
        assert {p.dtype for p in bf16.model.parameters()} == {torch.bfloat16}
        assert bf16.base_fingerprint != fp32.base_fingerprint  # the remembered fingerprint is per dtype too
        assert torch.equal(bf16.model.lm_head.weight, tiny_lm.lm_head.weight.to(torch.bfloat16))
    finally:
        load_agent.cache_clear()
