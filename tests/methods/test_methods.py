"""The method registry: every allowed strategy has a method, and a run config picks the right one."""

import pytest

from fedagent_flwr.config import STRATEGIES, RunConfig
from fedagent_flwr.methods import METHODS, method_for
from fedagent_flwr.methods.baselines import Baseline
from fedagent_flwr.methods.fedagent import FedAgent
from fedagent_flwr.methods.fedrl.method import PAvgMethod, QAvgMethod
from fedagent_flwr.methods.fedse import FedSE


def test_every_allowed_strategy_has_a_method_and_no_other():
    assert set(METHODS) == set(STRATEGIES)


@pytest.mark.parametrize("overrides, method", [
    ({}, FedAgent),
    ({"baseline": "centralized"}, Baseline),
    ({"baseline": "local", "local_client": 1}, Baseline),
    ({"strategy": "fedse-lora"}, FedSE),
    ({"strategy": "qavg", "env": "random-mdp"}, QAvgMethod),
    ({"strategy": "pavg", "env": "windy-cliffs"}, PAvgMethod),
])
def test_a_run_config_picks_its_method(overrides, method):
    assert type(method_for(RunConfig(**overrides))) is method


def test_validation_reads_traits_not_names():
    """A strategy without the `baselines` trait refuses a baseline, whatever it is called."""
    with pytest.raises(ValueError, match="baseline='local'"):
        RunConfig.from_run_config(RunConfig().to_run_config() | {"strategy": "fedse-lora", "baseline": "local"})
    with pytest.raises(ValueError, match="resume"):
        RunConfig.from_run_config(RunConfig().to_run_config() | {"strategy": "qavg", "env": "random-mdp", "resume": True, "run-name": "x"})


def test_server_device_puts_the_servers_model_apart_from_the_clients():
    """device='cuda' for the clients with server-device='cpu': the ServerApp loads and evaluates on the CPU (this
    machine has no GPU, so a server that followed `device` would fail to load), in fp32, and its memory plan
    counts no bf16 autocast copies while the clients' (bf16-mixed on CUDA) does."""
    method = method_for(RunConfig(device="cuda", server_device="cpu", eval_tasks=2))
    method.prepare()
    try:
        assert method.agent.device.type == "cpu"
        assert method.evaluator.precision == "fp32"
        client, server = (plan.as_dict() for plan in method.memory)
        assert client["autocast bf16 weight copies"] > 0 and server["autocast bf16 weight copies"] == 0
    finally:
        method.close()
    with pytest.raises(ValueError, match="server-device"):
        RunConfig(server_device="gpu")


@pytest.mark.parametrize("model, allowed", [
    ("/nowhere/model.gguf", "a GGUF file that exists"),
    ("shape:qwen9", "shape:<name> with name one of qwen2.5-0.5b"),
])
def test_a_model_that_cannot_be_had_is_refused_before_any_work(model, allowed):
    with pytest.raises(ValueError, match=f"model='{model}' is not allowed: expected {allowed}"):
        RunConfig(model=model)
