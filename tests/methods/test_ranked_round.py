"""A client's round on N ranks (methods/ranked_round.py, agent/fsdp/launch.py): gloo on this CPU."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import rank_workers
from fedagent_flwr.agent.fsdp.launch import RankFailed, run_ranks
from fedagent_flwr.agent.models.loading import load_agent
from fedagent_flwr.agent.training.lora import adapter_to_arrays, attached_lora
from fedagent_flwr.agent.training.weights import model_to_arrays
from fedagent_flwr.config import RunConfig
from fedagent_flwr.methods.local_round import local_round
from fedagent_flwr.methods.ranked_round import train_on_ranks
from fedagent_flwr.methods.tasks import learner_tasks
from strategies.transfer import array_view

TESTS = Path(__file__).resolve().parents[1]


def _ended(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except FileNotFoundError:
        return True
    return state in ("Z", "X")  # a zombie has ended; only its parent's wait is missing


def _pids(pid_dir: Path) -> list[int]:
    return [int(p.read_text()) for p in sorted(pid_dir.glob("rank-*.pid"))]


def test_ranks_compute_together_and_rank_0_answers():
    out, info = run_ranks(2, "gloo", rank_workers.echo, {"x": np.arange(3, dtype=np.float32)}, 10.0)
    np.testing.assert_array_equal(out["y"], 10.0 * (2 * np.arange(3) + 1))  # (x + 0) + (x + 1), scaled
    assert info["world"] == 2 and info["pid"] != os.getpid()


@pytest.mark.parametrize("target, says", [
    (rank_workers.fail_on_rank_1, "rank 1 of the client's 2 failed: ValueError: rank 1 cannot read its shard"),
    (rank_workers.killed_on_rank_1, "rank 1 of the client's 2 died (signal SIGKILL)"),
], ids=["raises", "killed"])
def test_a_failed_rank_fails_the_client_and_leaves_no_rank_behind(target, says, tmp_path):
    with pytest.raises(RankFailed) as failed:
        run_ranks(2, "gloo", target, {}, str(tmp_path), timeout_s=120)
    assert str(failed.value).startswith(says)
    pids = _pids(tmp_path)
    assert len(pids) == 2 and all(_ended(pid) for pid in pids)  # rank 0, blocked in a barrier, was ended too


def test_ranks_end_when_their_client_is_killed(tmp_path):
    client = subprocess.Popen([sys.executable, "-c", (
        "import sys; sys.path.insert(0, sys.argv[1]); import rank_workers\n"
        "from fedagent_flwr.agent.fsdp.launch import run_ranks\n"
        "run_ranks(2, 'gloo', rank_workers.wait_forever, {}, sys.argv[2])"), str(TESTS), str(tmp_path)])
    try:
        deadline = time.monotonic() + 120
        while len(_pids(tmp_path)) < 2:
            assert time.monotonic() < deadline and client.poll() is None, "the ranks did not start"
            time.sleep(0.2)
        client.send_signal(signal.SIGKILL)  # no atexit hook, no finally: only the ranks' own watch ends them
        client.wait()
        deadline = time.monotonic() + 20
        while not all(_ended(pid) for pid in _pids(tmp_path)):
            assert time.monotonic() < deadline, "a rank outlived its client"
            time.sleep(0.2)
    finally:
        if client.poll() is None:
            client.kill()


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    """A 2-layer Qwen2-shaped model with tied embeddings (as SmolLM2's) saved as a model folder: every rank loads it."""
    model, tokenizer = rank_workers.tiny_model(lora=False, tied=True)
    folder = tmp_path_factory.mktemp("tiny-qwen2")
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


# full fine-tuning in the default run (tied weights gathered, the round-start KL anchor sharded); LoRA's passes on
# ranks are checked in the default run by tests/agent/test_ranks.py, its whole round under -m slow (about 30 s)
@pytest.mark.parametrize("finetuning", [pytest.param("lora", marks=pytest.mark.slow), "full"])
def test_a_clients_round_on_two_ranks_trains_what_one_process_trains(finetuning, tiny_folder):
    # Closest-action matching turns the random model's text into moves, so some episodes win and GRPO has groups to
    # learn from; the KL term anchors to the round's start (the full model's copy is sharded like the model).
    cfg = RunConfig.from_run_config({
        "env": "maze", "model": tiny_folder, "device": "cpu", "finetuning": finetuning, "ranks-per-client": 2,
        "tasks-per-epoch": 3, "group-size": 4, "max-steps": 6, "max-new-tokens": 8, "action-matching": "closest",
        "invalid-penalty": 0.0, "learning-rate": 1e-2, "minibatch-size": 4, "micro-batch-size": 2, "kl-beta": 0.01,
        "kl-reference": "round-start", "scale-rewards": "batch"})
    agent = load_agent(cfg.model, cfg.env, cfg.device)
    if finetuning == "lora":
        with attached_lora(agent.model, cfg.lora_spec(), seed=cfg.seed) as peft_model:
            sent = adapter_to_arrays(peft_model)
    else:
        sent = model_to_arrays(agent.model)
    tasks = learner_tasks(cfg, 0, 2)
    alone, on_ranks = {}, {}
    one, one_metrics = local_round(cfg, agent, sent, tasks, 1, 0, alone)
    two, two_metrics = train_on_ranks(cfg, sent, tasks, 1, 0, on_ranks)
    # every key of the reply in the order sent (the reply filter refuses any other) and every shape whole (not rank
    # 0's shard); both moved from what was sent
    assert list(two.keys()) == list(one.keys()) == list(sent.keys())
    assert [array_view(two[k]).shape for k in two.keys()] == [array_view(one[k]).shape for k in one.keys()]
    for trained in (one, two):
        assert max(float(np.abs(array_view(trained[k]) - array_view(sent[k])).max()) for k in sent.keys()) > 1e-3
    # the whole epoch's episodes were played and counted once; AdamW's state comes back whole, ready for next round
    assert two_metrics["episodes"] == one_metrics["episodes"] == 12
    assert two_metrics["optimizer_steps"] > 0
    assert sorted(on_ranks) == sorted(alone)
    assert all(np.asarray(on_ranks[k]).size == np.asarray(alone[k]).size for k in alone)


@pytest.mark.parametrize("ranks", [1, 2])
def test_ranks_on_nccl_run_a_clients_round(tiny_folder, ranks):
    """The launcher's CUDA path (rank r on the r-th visible card; NCCL for CUDA tensors, gloo for the CPU ones the
    ranks sum): one rank on a machine with one GPU, two where it has two (benchmarks/gpu_checks.sh, stage ranks, prints
    the skip reason where a machine has fewer)."""
    if torch.cuda.device_count() < ranks:
        pytest.skip(f"needs {ranks} CUDA device(s), {torch.cuda.device_count()} visible")
    cfg = RunConfig.from_run_config({
        "env": "maze", "model": tiny_folder, "device": "cuda", "finetuning": "lora", "tasks-per-epoch": 3,
        "group-size": 4, "max-steps": 6, "max-new-tokens": 8, "action-matching": "closest", "invalid-penalty": 0.0,
        "learning-rate": 1e-2, "minibatch-size": 4, "micro-batch-size": 2, "scale-rewards": "batch",
        "ranks-per-client": ranks})
    agent = load_agent(cfg.model, cfg.env, "cpu")
    with attached_lora(agent.model, cfg.lora_spec(), seed=cfg.seed) as peft_model:
        sent = adapter_to_arrays(peft_model)
    trained, metrics = train_on_ranks(cfg, sent, learner_tasks(cfg, 0, 2), 1, 0)
    assert list(trained.keys()) == list(sent.keys()) and metrics["episodes"] == 12
