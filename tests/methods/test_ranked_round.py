"""A client's round on N ranks (methods/ranked_round.py, agent/fsdp/launch.py): gloo on this CPU."""

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.numpy import save_file

import rank_workers
from fedagent_flwr.agent.fsdp.launch import FOLDER_PREFIX, RankFailed, RankPool, run_ranks
from fedagent_flwr.agent.fsdp.tensor_files import mapped
from fedagent_flwr.agent.models.loading import load_agent
from fedagent_flwr.agent.training.lora import adapter_to_arrays, attached_lora
from fedagent_flwr.agent.training.weights import model_to_arrays
from fedagent_flwr.config import RunConfig
from fedagent_flwr.methods.local_round import local_round
from fedagent_flwr.methods.ranked_round import client_ranks, end_client_ranks, train_on_ranks
from fedagent_flwr.methods.tasks import learner_tasks
from strategies.transfer import array_view

pytestmark = pytest.mark.ranks  # rank processes on gloo: .ci/run runs them apart from the default suite

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


def test_ranks_that_fail_holding_a_lora_adapter_fail_the_client_at_once():
    """A failed rank ends at once, not through the interpreter's shutdown, where closing its held adapter block hung
    (PEFT's unload starts a thread a shutting-down interpreter never starts): the client hears the error, not its
    deadline."""
    started = time.monotonic()
    with pytest.raises(RankFailed, match="fails holding an adapter"):
        run_ranks(2, "gloo", rank_workers.fail_holding_lora, {}, timeout_s=60)
    assert time.monotonic() - started < 60


def test_kept_ranks_answer_every_round_from_the_processes_they_started_in():
    """The pool's ranks are started once: each round is answered by the same processes, which keep what their target
    left in them; a rank that fails ends the pool, and its rank and reason are named."""
    with RankPool(2, "gloo", timeout_s=120) as pool:
        answers = [pool.run(rank_workers.count_rounds, {"x": np.zeros(2, np.float32) + r}, 3) for r in range(2)]
        assert [info["rounds"] for _, info in answers] == [1.0, 2.0]  # both ranks remembered round 1 in round 2
        assert answers[0][1]["pid"] == answers[1][1]["pid"] and answers[1][0]["x"].tolist() == [2.0, 2.0]
        processes = list(pool.processes)
        with pytest.raises(RankFailed, match="rank 1 of the client's 2 failed: ValueError: rank 1 fails at round 3"):
            pool.run(rank_workers.count_rounds, {"x": np.zeros(2, np.float32)}, 3)
        assert not pool.alive and all(p.exitcode is not None for p in processes)
        with pytest.raises(RankFailed, match="rank 1 fails at round 3"):  # ended: it says why, and starts nothing
            pool.run(rank_workers.count_rounds, {"x": np.zeros(2, np.float32)}, 3)
    assert not pool.folder.exists()


def test_ranks_give_back_what_they_free_when_the_run_config_says_so():
    """engine.ranks-return-memory = true: each rank maps its large blocks on their own (launch.return_freed_memory), so that a
    CPU rank's memory is what its tensors hold, as the plan counts it; false (the default) leaves glibc's moving
    threshold, which keeps freed blocks resident."""
    for value in (True, False):
        cfg = RunConfig.from_run_config({"engine.ranks-per-client": 2, "engine.ranks-return-memory": value, "engine.rank-timeout-s": 120})
        try:
            _, held = client_ranks(cfg).run(rank_workers.freed_blocks_held, {})
        finally:
            end_client_ranks()
        assert (held["held_mib"] < 10) if value else (held["held_mib"] > 60), (value, held)


def test_the_ranks_deadlines_are_the_rounds_and_torchs_own_unless_the_run_config_shortens_a_collectives():
    """A round on the ranks may take federation.round-timeout (the server waits that long); each collective keeps torch's own
    limit (NCCL 10 minutes, gloo 30) unless engine.rank-timeout-s sets a shorter one; NCCL's group is bound to the rank's GPU."""
    import datetime

    from fedagent_flwr.agent.fsdp.launch import group_options

    assert group_options(1, "gloo", None) == {}  # torch's own timeout, no device
    assert group_options(1, "gloo", 120.0) == {"timeout": datetime.timedelta(seconds=120)}
    assert group_options(1, "cpu:gloo,cuda:nccl", None) == {"device_id": torch.device("cuda", 1)}
    assert RunConfig().engine.rank_timeout_s == 0  # the default keeps torch's limits
    with pytest.raises(ValueError, match="engine.rank-timeout-s=30.0 is not allowed"):
        RunConfig.from_run_config({"engine.rank-timeout-s": 30.0})
    try:
        pool = client_ranks(RunConfig.from_run_config({"engine.ranks-per-client": 2, "federation.round-timeout": 600.0}))
        assert (pool.timeout_s, pool.collective_timeout_s) == (600.0, None)
        assert client_ranks(RunConfig.from_run_config({"engine.ranks-per-client": 2, "federation.round-timeout": 600.0})) is pool  # the same deadlines: kept
        shorter = client_ranks(RunConfig.from_run_config({"engine.ranks-per-client": 2, "federation.round-timeout": 600.0, "engine.rank-timeout-s": 90.0}))
        assert shorter is not pool and shorter.collective_timeout_s == 90.0
    finally:
        end_client_ranks()


def test_a_ranks_weights_are_mapped_from_the_file_not_copied(tmp_path):
    path = tmp_path / "in-1.safetensors"
    save_file({"w": np.arange(6, dtype=np.float32).reshape(2, 3)}, str(path))
    arrays = mapped(path)
    assert str(path) in Path("/proc/self/maps").read_text()  # the process reads the file's pages, no copy of them
    arrays["w"][0, 0] = 7.0  # a write stays in this process: the file, which every rank maps, is unchanged
    assert mapped(path)["w"].tolist() == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]] and arrays["w"][0, 0] == 7.0


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
        # rank 0 took the client's folder (the round's weights) with it
        assert not [f for f in Path(tempfile.gettempdir()).glob(FOLDER_PREFIX + "*")
                    if (f / "client.pid").exists() and (f / "client.pid").read_text() == str(client.pid)]
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


def _round_config(model: str, finetuning: str, **changes) -> RunConfig:
    """A client's round on 2 CPU ranks of the tiny model. Closest-action matching turns the random model's text into
    moves, so some episodes win and GRPO has groups to learn from; the KL term anchors to the round's start (the full
    model's copy is sharded like the model)."""
    return RunConfig.from_run_config({
        "env": "maze", "model": model, "device": "cpu", "grpo.finetuning": finetuning, "engine.ranks-per-client": 2,
        "grpo.tasks-per-epoch": 3, "grpo.num-generations": 4, "rollout.max-steps": 6, "rollout.max-completion-length": 8, "rollout.action-matching": "closest",
        "rollout.invalid-penalty": 0.0, "grpo.learning-rate": 1e-2, "grpo.mini-batch-size": 4, "grpo.ppo-micro-batch-size-per-gpu": 2, "grpo.beta": 0.01,
        "grpo.kl-reference": "round-start", "grpo.scale-rewards": "batch"} | changes)


def _start(cfg: RunConfig):
    """The agent and the weights a server would send in round 1: the LoRA adapter as attached, or the whole model."""
    agent = load_agent(cfg.model, cfg.env, cfg.device)
    if cfg.grpo.finetuning == "lora":
        with attached_lora(agent.model, cfg.lora, seed=cfg.seed) as peft_model:
            return agent, adapter_to_arrays(peft_model)
    return agent, model_to_arrays(agent.model)


# full fine-tuning in the default run (tied weights gathered, the round-start KL anchor sharded); LoRA's passes on
# ranks are checked in the default run by tests/agent/test_ranks.py, its whole round under -m slow (about 30 s)
@pytest.mark.parametrize("finetuning", [pytest.param("lora", marks=pytest.mark.slow), "full"])
def test_a_clients_round_on_two_ranks_trains_what_one_process_trains(finetuning, tiny_folder):
    cfg = _round_config(tiny_folder, finetuning)
    agent, sent = _start(cfg)
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


@pytest.mark.parametrize("finetuning", ["lora", "full"])
def test_kept_ranks_train_a_later_round_as_new_ranks_do(finetuning, tiny_folder):
    """Round 2 on ranks kept from round 1 (their model sharded, trained and then loaded with the new weights: the
    adapter, or the full model and its round-start KL anchor) trains exactly what ranks started for round 2 train."""
    cfg = _round_config(tiny_folder, finetuning, **{"grpo.tasks-per-epoch": 2, "rollout.max-steps": 5, "grpo.beta": 1.0})
    _, sent = _start(cfg)
    tasks = learner_tasks(cfg, 0, 2)
    end_client_ranks()
    try:
        first, _ = train_on_ranks(cfg, sent, tasks, 1, 0)
        pids = [p.pid for p in client_ranks(cfg).processes]
        kept, kept_metrics = train_on_ranks(cfg, first, tasks, 2, 0)
        assert [p.pid for p in client_ranks(cfg).processes] == pids  # the same processes answered round 2
        anchor, held = client_ranks(cfg).run(rank_workers.held_state, {})
        assert held["grads"] == 0  # the update's gradients were dropped at the round's end
        assert held["kept"] == {"0": len(first.keys()), "1": 0}  # whole weights are built on rank 0 alone
        for k in anchor if finetuning == "full" else ():  # the KL anchor is round 2's start, not round 1's
            np.testing.assert_array_equal(anchor[k], array_view(first[k]), err_msg=k)
        assert (finetuning == "full") == bool(anchor)
        end_client_ranks()
        new, new_metrics = train_on_ranks(cfg, first, tasks, 2, 0)
        assert [p.pid for p in client_ranks(cfg).processes] != pids
    finally:
        end_client_ranks()
    assert max(float(np.abs(array_view(kept[k]) - array_view(first[k])).max()) for k in first.keys()) > 1e-3
    for k in first.keys():
        np.testing.assert_allclose(array_view(kept[k]), array_view(new[k]), rtol=0, atol=1e-6, err_msg=k)
    assert kept_metrics["episodes"] == new_metrics["episodes"] and kept_metrics["loss"] == pytest.approx(new_metrics["loss"])


@pytest.mark.parametrize("ranks", [1, 2])
def test_a_round_on_ranks_decodes_with_the_static_engine_as_with_hf(tiny_folder, ranks):
    """On ranks the static engine copies the weights into its buffers one FSDP unit gathered at a time, where the hf
    engine decodes with the model gathered whole (agent/training/grpo.py _decoding_weights). In fp32 on a CPU it draws
    the tokens the hf engine draws, so a round plays the same episodes and trains the same weights. One rank too: its
    model is sharded over a world of one, so its weights are DTensors the copy must gather (an H100 found this)."""
    cfg = _round_config(tiny_folder, "full", **{"grpo.tasks-per-epoch": 2, "rollout.name": "hf", "engine.ranks-per-client": ranks})
    _, sent = _start(cfg)
    tasks = learner_tasks(cfg, 0, 2)
    replies = {}
    try:
        for engine in ("hf", "static"):
            end_client_ranks()
            replies[engine] = train_on_ranks(cfg.updated({"rollout.name": engine}), sent, tasks, 1, 0)
    finally:
        end_client_ranks()
    (hf, hf_metrics), (static, static_metrics) = replies["hf"], replies["static"]
    for key in ("episodes", "tokens", "generated_tokens", "success_rate", "mean_reward"):
        assert static_metrics[key] == hf_metrics[key], key
    for k in sent.keys():
        np.testing.assert_allclose(array_view(static[k]), array_view(hf[k]), rtol=0, atol=1e-6, err_msg=k)


def test_a_client_on_ranks_keeps_no_model_of_its_own(tiny_folder):
    """Its process answers the handshake's fingerprint (every round's too) from a model it loaded once and dropped."""
    from fedagent_flwr.client_app import _agent_loader, fingerprint_agent

    cfg = RunConfig.from_run_config({"env": "maze", "model": tiny_folder, "device": "cpu", "engine.ranks-per-client": 2})
    load_agent.cache_clear()
    fingerprint_agent.cache_clear()
    agent = _agent_loader(cfg)()
    assert agent.model is None and load_agent.cache_info().currsize == 0 and _agent_loader(cfg)() is agent
    assert agent.base_fingerprint == load_agent(cfg.model, cfg.env, "cpu").base_fingerprint


@pytest.mark.parametrize("finetuning", ["full", "lora"])  # full first: a full fine-tune with KL to the base, sharded
@pytest.mark.parametrize("ranks", [1, 2])
def test_ranks_on_nccl_run_a_clients_round(tiny_folder, ranks, finetuning):
    """The launcher's CUDA path (rank r on the r-th visible card; NCCL for CUDA tensors, gloo for the CPU ones the
    ranks sum): one rank on a machine with one GPU, two where it has two (benchmarks/gpu_checks.sh, stage ranks, prints
    the skip reason where a machine has fewer); a full fine-tune whose KL anchor is the base, and a LoRA round."""
    if torch.cuda.device_count() < ranks:
        pytest.skip(f"needs {ranks} CUDA device(s), {torch.cuda.device_count()} visible")
    cfg = RunConfig.from_run_config({
        "env": "maze", "model": tiny_folder, "device": "cuda", "grpo.finetuning": finetuning, "grpo.tasks-per-epoch": 3,
        "grpo.num-generations": 4, "rollout.max-steps": 6, "rollout.max-completion-length": 8, "rollout.action-matching": "closest", "rollout.invalid-penalty": 0.0,
        "grpo.learning-rate": 1e-2 if finetuning == "lora" else 1e-4, "grpo.mini-batch-size": 4,
        "grpo.ppo-micro-batch-size-per-gpu": 2, "grpo.scale-rewards": "batch", "grpo.beta": 0.01, "grpo.kl-reference": "base",
        "engine.ranks-per-client": ranks})
    agent = load_agent(cfg.model, cfg.env, "cpu")
    if finetuning == "lora":
        with attached_lora(agent.model, cfg.lora, seed=cfg.seed) as peft_model:
            sent = adapter_to_arrays(peft_model)
    else:
        sent = model_to_arrays(agent.model)
    trained, metrics = train_on_ranks(cfg, sent, learner_tasks(cfg, 0, 2), 1, 0)
    end_client_ranks()
    assert list(trained.keys()) == list(sent.keys()) and metrics["episodes"] == 12
    moved = [k for k in sent.keys() if not np.array_equal(array_view(trained[k]), array_view(sent[k]))]
    assert moved, "no weight moved in the round"


@pytest.mark.parametrize("ranks", [1, 2])
def test_cpu_collectives_on_the_mixed_nccl_group(ranks):
    """The ranks' group on CUDA is `cpu:gloo,cuda:nccl`: a CPU tensor's all_reduce and an all_gather_object (what
    Ranks.total and Ranks.gather run) go through gloo, a CUDA tensor's through NCCL, on one group."""
    if torch.cuda.device_count() < ranks:
        pytest.skip(f"needs {ranks} CUDA device(s), {torch.cuda.device_count()} visible")
    _, info = run_ranks(ranks, "cpu:gloo,cuda:nccl", rank_workers.mixed_collectives, {})
    assert info == {"cpu_sum": sum(r + 1.0 for r in range(ranks)), "cuda_sum": sum(r + 1.0 for r in range(ranks)),
                    "objects": [{"rank": r} for r in range(ranks)]}


def test_a_run_whose_ranks_would_idle_in_the_update_is_told_so():
    """The default job's micro-batch is its whole minibatch: on 2 ranks one pass a minibatch, rank 1 only spare ones."""
    from fedagent_flwr.methods.ranked_round import idle_ranks_note

    note = idle_ranks_note(RunConfig.from_run_config({"engine.ranks-per-client": 2}))
    assert note and "grpo.ppo-micro-batch-size-per-gpu=64 of grpo.mini-batch-size=64: 1 pass(es) a minibatch" in note
    assert "grpo.ppo-micro-batch-size-per-gpu=32 or less shares it" in note
    for shared in ({"engine.ranks-per-client": 2, "grpo.ppo-micro-batch-size-per-gpu": 32}, {"engine.ranks-per-client": 1},
                   {"engine.ranks-per-client": 4, "grpo.ppo-micro-batch-size-per-gpu": 16}, {"engine.ranks-per-client": 2, "grpo.ppo-max-token-len-per-gpu": 4096}):
        assert idle_ranks_note(RunConfig.from_run_config(shared)) is None, shared
