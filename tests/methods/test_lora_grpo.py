"""fedagent-avg with grpo.finetuning=lora: GRPO trains a LoRA adapter on the frozen base, and only the adapter travels."""

import numpy as np
import pytest
import torch
from flwr.app import MessageType
from peft import get_peft_model_state_dict

from fedagent_flwr.agent.engine.precision import base_dtype
from fedagent_flwr.agent.training.advantages import StepSample
from fedagent_flwr.agent.training.lora import attached_lora
from fedagent_flwr.config import LoRASection
from fedagent_flwr.agent.play.rollout import RolloutConfig
from fedagent_flwr.config import RunConfig
from strategies.communication import payload_bytes
from placed import grpo_trainer


def _samples(tokenizer, n=8):
    rng = np.random.default_rng(1)
    return [StepSample(rng.integers(3, len(tokenizer), 10).tolist(), rng.integers(3, len(tokenizer), 5).tolist(),
                       1.0 if i % 2 else -1.0, 1.0) for i in range(n)]


@pytest.mark.parametrize("reference", ["round-start", "base"])
def test_grpo_on_a_lora_model_moves_only_the_adapter(tiny_lm, maze_tokenizer, reference):
    base = {k: v.clone() for k, v in tiny_lm.state_dict().items()}
    cfg = RunConfig.from_run_config({"grpo.finetuning": "lora", "grpo.kl-reference": reference, "grpo.learning-rate": 1e-2, "grpo.beta": 0.1, "grpo.mini-batch-size": 4, "grpo.ppo-micro-batch-size-per-gpu": 4})
    with attached_lora(tiny_lm, LoRASection(r=2, target_modules="q_proj,v_proj")) as peft_model:
        for p in peft_model.parameters():  # B = 0 at the start: give the adapter a value so both references differ from it
            if p.requires_grad:
                p.data.normal_(0, 0.05)
        trainer = grpo_trainer(peft_model, maze_tokenizer, cfg, RolloutConfig(history_length=0))
        assert trainer.reference is None  # no second copy of the model
        before = {k: v.clone() for k, v in get_peft_model_state_dict(peft_model).items()}
        stats = trainer.update(_samples(maze_tokenizer), np.random.default_rng(0))
        after = get_peft_model_state_dict(peft_model)
        assert stats["optimizer_steps"] == 2 and stats["kl"] > 0
        assert all(not torch.equal(before[k], after[k]) for k in before)  # every adapter tensor trained
        if reference == "round-start":  # the anchor was swapped in to score, then the trained adapter put back
            assert not torch.equal(trainer.reference_adapter[next(iter(before))], after[next(iter(before))])
    for k, v in tiny_lm.state_dict().items():
        assert torch.equal(v, base[k]), k  # the base model never moved


def test_a_lora_fedagent_run_sends_only_the_adapter(tmp_path, run_identity):
    from fedagent_flwr.agent.models.loading import load_agent
    from fedagent_flwr.federation import run_federation
    from loopback_grid import LoopbackGrid

    torch.set_num_threads(1)
    run_config = RunConfig().to_run_config() | {
        "grpo.finetuning": "lora", "grpo.kl-reference": "base", "lora.r": 4, "num-server-rounds": 1, "clients-per-round": 2,
        "grpo.tasks-per-epoch": 1, "grpo.num-generations": 2, "eval.tasks": 2, "eval.samples-per-task": 2, "num-clients": 2,
        "output-dir": str(tmp_path), "run-name": "lora",
    }
    grid = LoopbackGrid(run_config, 2)
    try:
        summary = run_federation(grid, RunConfig.from_run_config(run_config))
        model = load_agent("tiny", "maze", "auto").model
        assert not any("lora_" in k for k in model.state_dict())  # the server's base is plain again
        with attached_lora(model, RunConfig.from_run_config({"lora.r": 4}).lora) as peft_model:
            adapter = sum(v.numel() for v in get_peft_model_state_dict(peft_model).values())
    finally:
        load_agent.cache_clear()
    trains = [(s, r) for s, r in grid.exchanges if s.metadata.message_type == MessageType.TRAIN]
    assert len(trains) == 2 and summary["failed_replies"] == {}
    for sent, reply in trains:
        for message in (sent, reply):
            arrays = message.content.array_records["arrays"]
            assert all(".lora_A." in k or ".lora_B." in k for k in arrays.keys())
            assert payload_bytes(arrays) == 4 * adapter
    assert 0.0 <= summary["final_success_rate"] <= 1.0
    assert (tmp_path / "lora" / "checkpoints" / "round-0001" / "adapter_config.json").exists()  # a PEFT folder
    # The run's final evaluation replays from its folder: the adapter loaded onto the base as the server held it
    from fedagent_flwr.experiments.evaluate import replay_run

    try:
        replayed, _ = replay_run(tmp_path / "lora")
    finally:
        load_agent.cache_clear()
    assert {k: replayed[k] for k in summary["final"] if k != "seconds"} == {k: v for k, v in summary["final"].items() if k != "seconds"}


def test_lora_finetuning_is_refused_where_it_does_not_apply():
    for bad, key in (({"strategy": "fedse-lora"}, "finetuning"), ({"privacy.secure-aggregation": True, "clients-per-round": 2}, "finetuning")):
        with pytest.raises(ValueError, match=f"{key}='lora'"):
            RunConfig.from_run_config(RunConfig().to_run_config() | {"grpo.finetuning": "lora"} | bad)
    # a bf16 base cannot take AdamW's steps at small learning rates: only an adapter trains over it
    with pytest.raises(ValueError, match="precision='bf16-base' is not allowed"):
        RunConfig(precision="bf16-base")
    assert base_dtype(RunConfig.from_run_config({"precision": "bf16-base", "grpo.finetuning": "lora"}).precision) == torch.bfloat16
