"""The method registry: every allowed strategy has a method, and a run config picks the right one."""

import pytest

from fedagent_flwr.config import RunConfig
from fedagent_flwr.runs.preflight import preflight
from fedagent_flwr.config.strategy_traits import STRATEGIES
from fedagent_flwr.methods import METHODS, method_for
from fedagent_flwr.methods.baselines import Baseline
from fedagent_flwr.methods.fedagent import FedAgent
from fedagent_flwr.methods.fedrl.method import PAvgMethod, QAvgMethod
from fedagent_flwr.methods.fedse import FedSE


def test_every_allowed_strategy_has_a_method_and_no_other():
    assert set(METHODS) == set(STRATEGIES)


@pytest.mark.parametrize("overrides, method", [
    ({}, FedAgent),
    ({"baseline.name": "centralized"}, Baseline),
    ({"baseline.name": "local", "baseline.local-client": 1}, Baseline),
    ({"strategy": "fedse-lora"}, FedSE),
    ({"strategy": "qavg", "env": "random-mdp"}, QAvgMethod),
    ({"strategy": "pavg", "env": "windy-cliffs"}, PAvgMethod),
])
def test_a_run_config_picks_its_method(overrides, method):
    assert type(method_for(RunConfig.from_run_config(overrides))) is method


def test_validation_reads_traits_not_names():
    """A strategy without the `baselines` trait refuses a baseline, whatever it is called."""
    with pytest.raises(ValueError, match="baseline.name='local'"):
        RunConfig.from_run_config(RunConfig().to_run_config() | {"strategy": "fedse-lora", "baseline.name": "local"})
    with pytest.raises(ValueError, match="resume"):
        RunConfig.from_run_config(RunConfig().to_run_config() | {"strategy": "qavg", "env": "random-mdp", "resume": True, "run-name": "x"})


def test_server_device_puts_the_servers_model_apart_from_the_clients():
    """device='cuda' for the clients with engine.server-device='cpu': the ServerApp loads and evaluates on the CPU (this
    machine has no GPU, so a server that followed `device` would fail to load), in fp32, and its memory plan
    counts no bf16 autocast copies while the clients' (bf16-mixed on CUDA) does."""
    method = method_for(RunConfig.from_run_config({"device": "cuda", "engine.server-device": "cpu", "eval.tasks": 2}))
    method.prepare()
    try:
        assert method.agent.device.type == "cpu"
        assert method.evaluator.precision == "fp32"
        client, server = (plan.as_dict() for plan in method.memory)
        assert client["autocast bf16 weight copies"] > 0 and server["autocast bf16 weight copies"] == 0
    finally:
        method.close()
    with pytest.raises(ValueError, match="engine.server-device"):
        RunConfig.from_run_config({"engine.server-device": "gpu"})


@pytest.mark.parametrize("model, allowed", [
    ("/nowhere/model.gguf", "a GGUF file that exists"),
    ("shape:qwen9", "shape:<name> with name one of qwen2.5-0.5b"),
])
def test_a_model_that_cannot_be_had_is_refused_before_any_work(model, allowed):
    with pytest.raises(ValueError, match=f"model='{model}' is not allowed: expected {allowed}"):
        preflight(RunConfig(model=model))


@pytest.mark.parametrize("overrides, carried", [
    ({"baseline.name": "centralized"}, True),
    ({"baseline.name": "local", "baseline.optimizer": "reset"}, False),
    ({}, False),  # a FedAgent client starts each round from the broadcast model with a fresh optimizer
])
def test_a_baselines_learner_carries_its_optimizer_state_from_round_to_round_on_its_node(
        overrides, carried, tiny_lm, maze_tokenizer, run_identity, monkeypatch):
    import numpy as np
    import torch
    from flwr.app import ConfigRecord, Context, Message, MessageType, RecordDict

    from fedagent_flwr.agent.models.loading import Agent
    from fedagent_flwr.agent.models.pretrained import ModelSpec
    from fedagent_flwr.agent.training.weights import model_to_arrays
    from fedagent_flwr.methods import local_round

    seen, anchors = [], []

    def fake_round(agent, cfg, tasks, server_round, partition_id, model=None, optimizer=None, base_model=None,
                   placement=None):
        seen.append(None if optimizer is None else dict(optimizer))
        anchors.append(base_model)
        if optimizer is not None:  # what the trainer leaves behind: AdamW's state after this round's steps
            optimizer.clear()
            optimizer.update({"0/step": np.array(float(server_round))})
        return {"episodes": 1.0}

    monkeypatch.setattr(local_round, "train_locally", fake_round)
    monkeypatch.setattr(local_round, "load_frozen_base", lambda *args: "the base weights")
    method = method_for(RunConfig.from_run_config(overrides))
    agent = Agent(tiny_lm, maze_tokenizer, ModelSpec("test", built_here=True), torch.device("cpu"), "fp")
    context = Context(run_id=1, node_id=7, node_config={}, state=RecordDict(), run_config={})
    for server_round in (1, 2):
        msg = Message(RecordDict({"arrays": model_to_arrays(tiny_lm), "config": ConfigRecord({"server-round": server_round})}),
                      dst_node_id=7, message_type=MessageType.TRAIN)
        reply = method.train(msg, context, 0, 2, lambda: agent)
        assert "optimizer" not in reply.content.array_records  # the state stays on the client
    assert seen == ([{}, {"0/step": 1.0}] if carried else [None, None])
    # a baseline's one learner keeps the run's initial model as its KL anchor in every round (grpo.kl-reference=auto)
    assert anchors == (["the base weights"] * 2 if "baseline.name" in overrides else [None, None])
