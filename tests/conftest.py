"""Shared fixtures: a tiny random causal LM and tokenizer (built in memory, no hub)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from envs import make_env
from fedagent_flwr.agent.play.prompts import build_prompt, expert_completion
from fedagent_flwr.agent.models.tiny_model import train_tokenizer


def pytest_addoption(parser):
    parser.addoption("--auto-device-as-cuda", action="store_true",
                     help="resolve device='auto' in run configs as a machine with a GPU does, while models stay where "
                          "each test puts them: finds tests whose results depend on the machine having a GPU")


def pytest_configure(config):
    # On a GPU machine device='auto' resolves precision='auto' to bf16-mixed, even for a test that builds its model
    # on the CPU; a test comparing numbers at fp32 tolerances must then say device='cpu'. This option shows which do
    # not, on a machine without a GPU (subprocesses resolve as the machine does).
    if config.getoption("--auto-device-as-cuda"):
        import fedagent_flwr.agent.engine.placement as placement

        placement.this_machine = lambda: placement.Machine(cuda=True)  # models still load where the hardware allows


# Folders whose tests run under their own marker: the benchmark scripts' tests (`pytest -m benchmarks`) and the docs'
# numbers regenerated from their records (`pytest -m records`). .ci/run runs both after the default suite, which
# leaves them out to stay within minutes.
MARKED_FOLDERS = {Path(__file__).resolve().parent / "benchmarks": pytest.mark.benchmarks,
                  Path(__file__).resolve().parent / "records": pytest.mark.records}


@pytest.hookimpl(tryfirst=True)  # before -m deselects
def pytest_collection_modifyitems(config, items):
    for item in items:
        parents = Path(str(item.fspath)).resolve().parents
        for folder, mark in MARKED_FOLDERS.items():
            if folder in parents:
                item.add_marker(mark)


@pytest.fixture(scope="session")
def maze_tokenizer():
    return build_maze_tokenizer()


def build_maze_tokenizer():
    """A small tokenizer trained on Maze's prompts and expert answers (also built by spawned test processes)."""
    env = make_env("maze")
    texts = []
    for task in env.tasks():
        obs, _ = env.reset(task)
        texts.append(build_prompt(env, obs, [], 2))
        texts.append(expert_completion(env.expert_action()))
    return train_tokenizer(texts, vocab_size=400)


@pytest.fixture()
def tiny_lm(maze_tokenizer):
    torch.manual_seed(0)
    config = AutoConfig.for_model(
        "qwen2", vocab_size=len(maze_tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512, tie_word_embeddings=True,
        pad_token_id=maze_tokenizer.pad_token_id, eos_token_id=maze_tokenizer.eos_token_id, bos_token_id=None,
    )
    return AutoModelForCausalLM.from_config(config).eval()


@pytest.fixture()
def run_identity(monkeypatch):
    """Messages created outside a running ServerApp or ClientApp need a run, node and task id."""
    from flwr.supercore.task_identity import TaskIdentity

    monkeypatch.setattr(TaskIdentity, "_run_id", 1)
    monkeypatch.setattr(TaskIdentity, "_node_id", 0)
    monkeypatch.setattr(TaskIdentity, "_task_id", 0)


def planned(cfg, shape, context_tokens: int, rows: int, role: str = "client"):
    """`role`'s memory plan for `cfg` placed on this machine (no memory budget), at `rows` rollout rows."""
    from fedagent_flwr.methods.memory import memory_plan
    from fedagent_flwr.methods.placement import place_run

    return memory_plan(cfg, shape, context_tokens, place_run(cfg, role), rows, role)


def both_plans(cfg, shape, context_tokens: int):
    """(client, server) plans as a run's start-up makes them, each role's rows in its memory key."""
    from fedagent_flwr.methods.memory import memory_plans
    from fedagent_flwr.methods.placement import memory_key_placements

    return memory_plans(cfg, shape, context_tokens, *memory_key_placements(cfg, shape, context_tokens))


@pytest.fixture(autouse=True)
def _cpu_precision_unmeasured(request, monkeypatch):
    """precision='auto' on a CPU follows this processor's measured matmul rates (agent/engine/cpu_rates.py). In-process
    tests see nothing measured (auto = fp32, as before the probe), so what they compute does not depend on the
    processor they run on; tests marked `cpu_probe` measure for real, and tests/agent/test_cpu_precision.py mocks the
    probe. Spawned processes (simulations, ranks) measure as a run does."""
    if "cpu_probe" not in request.keywords:
        from fedagent_flwr.methods import placement

        monkeypatch.setattr(placement, "run_cpu_rates", lambda cfg, shape=None: None)
        monkeypatch.setattr(placement, "model_rates", lambda model, env: None)
