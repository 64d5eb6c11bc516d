"""Fed-SE: LoRA aggregation, the strategy's messages, the client's buffer and round, byte accounting."""

import json
import math
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MessageType, Metadata, MetricRecord, RecordDict

from envs import make_env
from fedagent_flwr.agent.engine.precision import base_dtype
from fedagent_flwr.agent.models.loading import Agent
from fedagent_flwr.config import FedSESection, LoRASection, RunConfig
from fedagent_flwr.agent.training.experience import SEED_ROUND, ExperienceBuffer
from fedagent_flwr.agent.training.lora import adapter_num_parameters, adapter_to_arrays, attached_lora, save_adapter
from fedagent_flwr.agent.play.rollout import RolloutConfig, StepRecord, Trajectory
from fedagent_flwr.agent.self_evolution import keep_trajectories, self_evolution_round, valid_steps_only
from strategies import FedAgentAvg, FedSELoRA
from strategies.communication import payload_bytes, wire_bytes
from strategies.fedse_lora import aggregate_adapters, clients_for_fraction, mean_of_products, refactorise
from placed import rollout_config

ROOT = Path(__file__).resolve().parents[2]
KEY_A = "base_model.model.layers.0.q_proj.lora_A.weight"
KEY_B = "base_model.model.layers.0.q_proj.lora_B.weight"


def _adapter(a, b):
    return {KEY_A: np.asarray(a, dtype=np.float32), KEY_B: np.asarray(b, dtype=np.float32)}


# ----- aggregation (pure functions) ---------------------------------------------------------------
def test_mean_is_the_unweighted_average_of_a_and_b():
    x = _adapter([[1.0, 2.0, 3.0]], [[1.0], [0.0]])
    y = _adapter([[3.0, 0.0, 1.0]], [[3.0], [2.0]])
    out, metrics = aggregate_adapters([x, y], "mean")
    np.testing.assert_allclose(out[KEY_A], [[2.0, 1.0, 2.0]])
    np.testing.assert_allclose(out[KEY_B], [[2.0], [1.0]])
    assert out[KEY_A].dtype == np.float32
    # mean(B) mean(A) = [[4,2,4],[2,1,2]] vs mean(BA) = ([[1,2,3],[0,0,0]] + [[9,0,3],[6,0,2]]) / 2
    exact = np.array([[5.0, 1.0, 3.0], [3.0, 0.0, 1.0]])
    expected = np.linalg.norm(np.array([[4.0, 2.0, 4.0], [2.0, 1.0, 2.0]]) - exact) / np.linalg.norm(exact)
    assert metrics["agg/factor-mean-rel-error"] == pytest.approx(expected)
    assert "agg/svd-rank-r-rel-error" not in metrics


def test_weighted_average_uses_successes_and_falls_back_to_uniform():
    x = _adapter([[1.0, 1.0]], [[0.0]])
    y = _adapter([[5.0, 9.0]], [[4.0]])
    out, _ = aggregate_adapters([x, y], "weighted", successes=[3, 1])
    np.testing.assert_allclose(out[KEY_A], [[2.0, 3.0]])  # 0.75 x + 0.25 y
    np.testing.assert_allclose(out[KEY_B], [[1.0]])
    uniform, _ = aggregate_adapters([x, y], "weighted", successes=[0, 0])
    np.testing.assert_allclose(uniform[KEY_A], [[3.0, 5.0]])
    with pytest.raises(ValueError, match="successes"):
        aggregate_adapters([x, y], "weighted")
    with pytest.raises(ValueError, match="non-negative"):
        aggregate_adapters([x, y], "weighted", successes=[-1, 2])


def test_exact_aggregation_is_the_mean_of_products_at_rank_kr_and_reports_rank_r_error():
    rng = np.random.default_rng(0)
    out_dim, in_dim, r, k = 12, 10, 2, 3
    a0, b0 = rng.normal(size=(r, in_dim)), rng.normal(size=(out_dim, r))
    # Adapters that drifted far from a shared start (perturbation 1.0, as in the issue).
    adapters = [_adapter(a0 + rng.normal(size=a0.shape), b0 + rng.normal(size=b0.shape)) for _ in range(k)]
    a_list = [x[KEY_A] for x in adapters]
    b_list = [x[KEY_B] for x in adapters]
    w = np.full(k, 1 / k)
    target = np.mean([b.astype(np.float64) @ a.astype(np.float64) for a, b in zip(a_list, b_list)], axis=0)
    # At rank K r the stacked factorisation is exact.
    new_a, new_b, err_full = refactorise(a_list, b_list, w, rank=k * r)
    np.testing.assert_allclose(new_b.astype(np.float64) @ new_a.astype(np.float64), target, atol=1e-4)
    assert err_full == pytest.approx(0.0, abs=1e-6)
    np.testing.assert_allclose(mean_of_products(a_list, b_list, w), target)
    # At rank r it is the best rank-r approximation (Eckart-Young) and the error is reported.
    out, metrics = aggregate_adapters(adapters, "exact")
    assert out[KEY_A].shape == (r, in_dim) and out[KEY_B].shape == (out_dim, r)
    approx = out[KEY_B].astype(np.float64) @ out[KEY_A].astype(np.float64)
    s = np.linalg.svd(target, compute_uv=False)
    best = np.sqrt(np.sum(s[r:] ** 2) / np.sum(s**2))
    assert metrics["agg/svd-rank-r-rel-error"] == pytest.approx(best, rel=1e-4)
    assert np.linalg.norm(approx - target) / np.linalg.norm(target) == pytest.approx(best, rel=1e-3)
    assert metrics["agg/svd-rank-r-rel-error"] > 0.05
    # Averaging the factors is worse than the truncated exact mean for drifted adapters.
    assert metrics["agg/factor-mean-rel-error"] > metrics["agg/svd-rank-r-rel-error"]
    np.testing.assert_allclose(np.linalg.norm(out[KEY_A], axis=1), 1.0, rtol=1e-5)  # A' = V_r^T: never all-zero


def test_exact_aggregation_from_zero_b_keeps_a_usable():
    a = np.random.default_rng(1).normal(size=(2, 6))
    out, metrics = aggregate_adapters([_adapter(a, np.zeros((4, 2))), _adapter(a, np.zeros((4, 2)))], "exact")
    assert np.abs(out[KEY_B]).max() == 0 and np.linalg.matrix_rank(out[KEY_A]) == 2
    assert metrics["agg/svd-rank-r-rel-error"] == 0.0


def test_client_fraction():
    assert clients_for_fraction(5, 1.0) == 5 and clients_for_fraction(5, 0.4) == 2 and clients_for_fraction(5, 0.01) == 1
    with pytest.raises(ValueError):
        clients_for_fraction(5, 0.0)


# ----- the strategy's messages --------------------------------------------------------------------
def _reply(node, content):
    md = Metadata(run_id=1, message_id="", src_node_id=node, dst_node_id=0, reply_to_message_id="m",
                  group_id="1", created_at=time.time(), ttl=60.0, message_type=MessageType.TRAIN)
    return Message(metadata=md, content=content)


def _record(adapter):
    return ArrayRecord({k: Array(v) for k, v in adapter.items()})


def test_strategy_sends_to_all_clients_aggregates_and_counts_bytes(run_identity):
    nodes = {0: 11, 1: 12, 2: 13}
    strategy = FedSELoRA(node_of_partition=nodes, aggregation="weighted")
    assert isinstance(strategy, FedSELoRA) and strategy.clients_per_round == 3
    global_adapter = _adapter(np.zeros((2, 3)), np.zeros((4, 2)))
    msgs = list(strategy.configure_train(1, _record(global_adapter), ConfigRecord({"fingerprint": "f"}), grid=None))
    assert sorted(m.metadata.dst_node_id for m in msgs) == [11, 12, 13]
    # Every client learns the run key that names its buffer folder (restored on resume with the strategy).
    assert {m.content.config_records["config"]["fedse-run-key"] for m in msgs} == {strategy.run_key}
    assert FedSELoRA(nodes).run_key != strategy.run_key
    replies = [
        _reply(11, RecordDict({"arrays": _record(_adapter(np.ones((2, 3)), np.ones((4, 2)))),
                               "metrics": MetricRecord({"fedse/new-successes": 1.0})})),
        _reply(12, RecordDict({"arrays": _record(_adapter(np.full((2, 3), 5.0), np.full((4, 2), 5.0))),
                               "metrics": MetricRecord({"fedse/new-successes": 3.0})})),
        _reply(13, RecordDict({"arrays": _record({KEY_A: np.ones((2, 3), np.float32)})})),  # malformed: left out
    ]
    arrays, metrics = strategy.aggregate_train(1, replies)
    np.testing.assert_allclose(arrays[KEY_A].numpy(), 4.0)  # (1 x 1 + 3 x 5) / 4
    assert metrics["replies"] == 2 and metrics["failed-replies"] == 1
    per_client = (2 * 3 + 4 * 2) * 4  # parameters x float32
    assert metrics["comm/bytes-sent-per-client"] == per_client and metrics["comm/bytes-sent-round"] == 3 * per_client
    assert metrics["comm/bytes-received-per-client"] == per_client and metrics["comm/bytes-received-round"] == 2 * per_client
    assert "agg/factor-mean-rel-error" in metrics
    with pytest.raises(ValueError, match="LoRA"):
        list(strategy.configure_train(2, _record({"w": np.zeros(3, np.float32)}), ConfigRecord(), grid=None))
    with pytest.raises(ValueError, match="fedse.aggregation"):
        FedSELoRA(nodes, aggregation="median")


def test_fedagent_avg_reports_bytes_of_full_models(run_identity):
    strategy = FedAgentAvg({0: 1, 1: 2}, clients_per_round=2, seed=0)
    weights = ArrayRecord({"w": Array(np.zeros((5, 7), np.float32)), "b": Array(np.zeros(3, np.float64))})
    list(strategy.configure_train(1, weights, ConfigRecord(), grid=None))
    replies = [_reply(n, RecordDict({"arrays": weights})) for n in (1, 2)]
    _, metrics = strategy.aggregate_train(1, replies)
    assert metrics["comm/bytes-sent-per-client"] == 35 * 4 + 3 * 8
    assert metrics["comm/bytes-received-round"] == 2 * (35 * 4 + 3 * 8)
    assert metrics["comm/bytes-received-total"] == 2 * (35 * 4 + 3 * 8)
    assert wire_bytes(weights) > payload_bytes(weights)  # .npy headers on the wire


# ----- the client: LoRA plumbing, buffer, round ---------------------------------------------------
def _agent(model, tokenizer):
    return Agent(model=model, tokenizer=tokenizer, spec=None, device=torch.device("cpu"), base_fingerprint="fp")


def test_adapter_bytes_equal_parameter_count_times_dtype_size_and_peft_folder_loads(tiny_lm, maze_tokenizer, tmp_path):
    from peft import PeftModel

    base_keys = set(tiny_lm.state_dict())
    spec = LoRASection(r=4, lora_alpha=8.0, target_modules="q_proj,v_proj")
    with attached_lora(tiny_lm, spec, seed=3) as peft_model:
        arrays = adapter_to_arrays(peft_model)
        n = adapter_num_parameters(peft_model)
        # hidden 32, q: 32 -> 32, v: 32 -> 16 (one KV head of 16): A r x in, B out x r
        assert n == 4 * 32 + 32 * 4 + 4 * 32 + 16 * 4
        assert payload_bytes(arrays) == n * 4
        assert all("lora_" in k for k in arrays.keys())
        with torch.no_grad():
            for name, p in peft_model.named_parameters():
                if "lora_B" in name:
                    p.normal_()
        loaded_from = peft_model.peft_config["default"].base_model_name_or_path
        folder = save_adapter(peft_model, tmp_path / "adapter", maze_tokenizer, base_model="org/base")
        # the folder names the run's model as its base, not where this process loaded it from
        assert json.loads((folder / "adapter_config.json").read_text())["base_model_name_or_path"] == "org/base"
        assert peft_model.peft_config["default"].base_model_name_or_path == loaded_from
        x = torch.tensor([[3, 4, 5, 6]])
        expected = peft_model(input_ids=x).logits
    assert set(tiny_lm.state_dict()) == base_keys  # the base is plain again after the block
    assert all(p.requires_grad for p in tiny_lm.parameters())
    loaded = PeftModel.from_pretrained(tiny_lm, folder)
    torch.testing.assert_close(loaded(input_ids=x).logits, expected)
    loaded.unload()


def _traj(task_id, won, n_steps=2):
    task = make_env("maze").tasks()[0]
    t = Trajectory(task=task, won=won)
    t.task = type(task)(id=task_id, category=task.category, split=task.split, data=task.data)
    t.steps = [StepRecord([1, 2, i], [7, 8], "x", "up", 0.0, True) for i in range(n_steps)]
    return t


def test_filter_keeps_only_successes_and_all_keeps_everything():
    trajs = [_traj("a", True), _traj("b", False), _traj("c", True)]
    assert [t.task.id for t in keep_trajectories(trajs, "successes")] == ["a", "c"]
    assert len(keep_trajectories(trajs, "all")) == 3


def test_valid_steps_only_drops_rejected_steps_and_empty_trajectories():
    t = _traj("a", True, 3)
    t.steps[1].valid = False
    empty = _traj("b", True, 1)
    empty.steps[0].valid = False
    out = valid_steps_only([t, empty])
    assert [x.task.id for x in out] == ["a"] and [s.prompt_ids[-1] for s in out[0].steps] == [0, 2]
    assert len(t.steps) == 3  # the input is not modified
    with pytest.raises(ValueError, match="fedse.steps"):
        FedSESection(steps="some")


def test_buffer_accumulates_survives_a_restart_and_without_history_clears_old_entries(tmp_path):
    buf = ExperienceBuffer(tmp_path, "fp")
    assert buf.seed([_traj("d0", True), _traj("d1", True)]) == 2
    buf.add_round(1, [_traj("r1", True)])
    buf.add_round(2, [_traj("r2a", True), _traj("r2b", True)])
    assert [e.task_id for e in buf.entries] == ["d0", "d1", "r1", "r2a", "r2b"]
    # A new object (as after a ClientApp restart) reads the same entries.
    again = ExperienceBuffer(tmp_path, "fp")
    assert [(e.task_id, e.round) for e in again.entries] == [(e.task_id, e.round) for e in buf.entries]
    assert again.samples() == buf.samples() and len(again.samples()) == 10
    assert again.seed([_traj("x", True)]) == 0  # D^0 is seeded once
    # Replaying round 2 replaces its entries instead of duplicating them.
    again.add_round(2, [_traj("r2c", True)])
    assert [e.task_id for e in again.entries] == ["d0", "d1", "r1", "r2c"]
    # w/o history: D^0 plus this round only.
    again.add_round(3, [_traj("r3", True)], keep_history=False)
    assert [(e.task_id, e.round) for e in again.entries] == [("d0", SEED_ROUND), ("d1", SEED_ROUND), ("r3", 3)]
    with pytest.raises(ValueError, match="another base model"):
        ExperienceBuffer(tmp_path, "other-fingerprint")


def test_buffer_survives_a_new_process(tmp_path):
    buf = ExperienceBuffer(tmp_path, "fp")
    buf.seed([_traj("d0", True, 3)])
    buf.add_round(1, [_traj("r1", True, 4)])
    code = ("import sys, json; from fedagent_flwr.agent.training.experience import ExperienceBuffer; "
            "b = ExperienceBuffer(sys.argv[1], 'fp'); print(json.dumps([len(b), len(b.samples())]))")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], cwd=ROOT, capture_output=True, text=True, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [2, 7]


def test_self_evolution_round_grows_the_buffer_and_returns_only_the_adapter(tiny_lm, maze_tokenizer, tmp_path):
    agent = _agent(tiny_lm, maze_tokenizer)
    env_factory = lambda: make_env("maze", 4)  # noqa: E731  (a short horizon keeps the random model's episodes short)
    tasks = [t for t in make_env("maze").tasks_of_split("train") if t.category == "near"][:3]
    rollout = RolloutConfig(history_length=0, max_new_tokens=8, batch_size=16)
    fedse = FedSESection(explore_samples=2, keep="all", seed_demos=3, max_steps=2, sft_batch_size=4, learning_rate=1e-2)
    lora = LoRASection(r=2, lora_alpha=4.0)
    buffer = ExperienceBuffer(tmp_path / "p0", "fp")
    base = {k: v.clone() for k, v in tiny_lm.state_dict().items()}
    torch.manual_seed(0)
    adapter, metrics = self_evolution_round(agent, fedse, lora, rollout, env_factory, tasks, 1, buffer, None)
    # The seed set is the expert's 3 demonstrations; keep=all adds all 6 explored episodes.
    assert metrics["fedse/seeded-demos"] == 3 and metrics["fedse/buffer-seed-trajectories"] == 3
    assert metrics["fedse/buffer-trajectories"] == 3 + 6 and metrics["episodes"] == 6
    assert all("lora_" in k for k in adapter.keys()) and len(list(adapter.keys())) > 0
    assert all(isinstance(v, float) for v in metrics.values())
    assert 0 < metrics["rollout_seconds"] < metrics["seconds"]  # exploring is part of the round, the fine-tuning the rest
    b_norm = sum(float(np.abs(adapter[k].numpy()).sum()) for k in adapter.keys() if "lora_B" in k)
    assert b_norm > 0  # fine-tuning moved B away from its zero start
    # The base model's weights are untouched and it is a plain model again.
    assert all(torch.equal(base[k], v) for k, v in tiny_lm.state_dict().items())
    # Round 2 starts from round 1's adapter and the buffer keeps growing.
    adapter2, metrics2 = self_evolution_round(agent, fedse, lora, rollout, env_factory, tasks, 2, buffer, adapter)
    assert "fedse/seeded-demos" not in metrics2 and metrics2["fedse/buffer-trajectories"] == 3 + 6 + 6
    assert ExperienceBuffer(tmp_path / "p0", "fp").stats()["buffer-trajectories"] == 15


def test_seed_data_read_from_files_seed_the_buffer_instead_of_the_experts(tiny_lm, maze_tokenizer, tmp_path):
    """fedse.seed-data: D_k^0 is the entries read (the experts play nothing), the steps left out are reported, and
    the reader is called only while the buffer is unseeded."""
    from fedagent_flwr.agent.training.experience import SEED_ROUND, StoredTrajectory

    agent = _agent(tiny_lm, maze_tokenizer)
    read = [StoredTrajectory("maze_0", SEED_ROUND, True, [([1, 2, 3], [4, 5])]), StoredTrajectory("maze_1", SEED_ROUND, True, [([1], [6])])]
    calls = []
    seed_data = lambda: (calls.append(1), (read, 3))[1]  # noqa: E731
    fedse = FedSESection(explore_samples=0, seed_demos=5, max_steps=1, sft_batch_size=2, learning_rate=1e-2)
    lora = LoRASection(r=2, lora_alpha=4.0)
    buffer = ExperienceBuffer(tmp_path / "p0", "fp")
    tasks = make_env("maze").tasks_of_split("train")[:2]
    _, metrics = self_evolution_round(agent, fedse, lora, RolloutConfig(history_length=0), lambda: make_env("maze"), tasks, 1,
                                      buffer, None, seed_data)
    assert metrics["fedse/seeded-demos"] == 2 and metrics["fedse/seed-steps-left-out"] == 3
    assert buffer.samples() == [([1, 2, 3], [4, 5]), ([1], [6])]
    _, metrics = self_evolution_round(agent, fedse, lora, RolloutConfig(history_length=0), lambda: make_env("maze"), tasks, 2,
                                      buffer, None, seed_data)
    assert calls == [1] and "fedse/seeded-demos" not in metrics


def _client_round(client_app, tiny_lm, cfg: dict, partition_id: int) -> tuple[ArrayRecord, Message]:
    """(the global adapter sent, the reply): the ClientApp's train handler called directly with a Flower Message and
    Context for round 1 of run key k1, one of 2 partitions."""
    from flwr.app import Context

    with attached_lora(tiny_lm, LoRASection(r=2, lora_alpha=16.0), seed=0) as pm:
        global_adapter = adapter_to_arrays(pm)
    msg = Message(RecordDict({"arrays": global_adapter,
                              "config": ConfigRecord({"partition-id": partition_id, "fingerprint": "fp", "server-round": 1,
                                                      "fedse-run-key": "k1"})}),
                  dst_node_id=5, message_type=MessageType.TRAIN)
    context = Context(run_id=77, node_id=5, node_config={"partition-id": partition_id, "num-partitions": 2},
                      state=RecordDict(), run_config=cfg)
    return global_adapter, client_app.train(msg, context)


def test_client_message_holds_only_adapter_tensors_and_numeric_metrics(tiny_lm, maze_tokenizer, tmp_path, monkeypatch, run_identity):
    """The ClientApp's train handler, called directly with a Flower Message and Context."""
    from fedagent_flwr import client_app

    agent = _agent(tiny_lm, maze_tokenizer)
    monkeypatch.setattr(client_app, "load_agent", lambda *a: agent)
    cfg = RunConfig().to_run_config() | {
        "strategy": "fedse-lora", "fedse.buffer-dir": str(tmp_path / "buffers"), "partition.tasks-per-client": 2, "lora.r": 2,
        "fedse.explore-samples": 1, "fedse.seed-demos": 2, "fedse.max-steps": 1, "rollout.max-completion-length": 8, "rollout.max-steps": 3,
    }
    global_adapter, reply = _client_round(client_app, tiny_lm, cfg, partition_id=1)
    content = reply.content
    assert list(content.array_records) == ["arrays"] and not content.config_records
    assert set(content.array_records["arrays"].keys()) == set(global_adapter.keys())
    assert all("lora_" in k for k in content.array_records["arrays"].keys())
    assert list(content.metric_records) == ["metrics"]
    assert all(isinstance(v, float) for v in content.metric_records["metrics"].values())
    assert (tmp_path / "buffers" / "run-k1" / "partition-1" / "buffer.json").exists()


def test_a_client_under_bf16_base_trains_an_fp32_adapter_over_its_bf16_base(tiny_lm, maze_tokenizer, tmp_path, monkeypatch,
                                                                             run_identity):
    """precision=bf16-base with fedse-lora: the client's base is bf16 (run_base_dtype, what load_agent loads) and stays
    untouched, the adapter it trains and sends is fp32 and moved, and its passes ran under bf16 autocast."""
    import copy

    from fedagent_flwr import client_app
    from fedagent_flwr.agent.training import sft

    cfg = RunConfig().to_run_config() | {
        "strategy": "fedse-lora", "precision": "bf16-base", "fedse.buffer-dir": str(tmp_path / "buffers"),
        "partition.tasks-per-client": 2, "lora.r": 2, "fedse.explore-samples": 1, "fedse.seed-demos": 2, "fedse.max-steps": 2,
        "fedse.learning-rate": 1e-2, "rollout.max-completion-length": 8, "rollout.max-steps": 3,
    }
    assert base_dtype(RunConfig.from_run_config(cfg).precision) == torch.bfloat16
    base = copy.deepcopy(tiny_lm).to(torch.bfloat16)
    before = {k: v.clone() for k, v in base.state_dict().items()}
    loaded_in = []
    monkeypatch.setattr(client_app, "load_agent", lambda *a: loaded_in.append(a[-1]) or _agent(base, maze_tokenizer))
    autocast_seen = []
    inner = sft.supervised_finetune
    monkeypatch.setattr("fedagent_flwr.agent.self_evolution.supervised_finetune",
                        lambda model, samples, tok, config: autocast_seen.append(config.precision) or inner(model, samples, tok, config))
    global_adapter, reply = _client_round(client_app, tiny_lm, cfg, partition_id=0)
    arrays = reply.content.array_records["arrays"]
    assert set(arrays.keys()) == set(global_adapter.keys())
    assert all(arrays[k].dtype == "float32" for k in arrays.keys())
    moved = sum(float(np.abs(arrays[k].numpy() - global_adapter[k].numpy()).sum()) for k in arrays.keys())
    assert loaded_in and set(loaded_in) == {torch.bfloat16}  # the client asked for its base in bf16
    assert moved > 0 and autocast_seen == ["bf16-mixed"]  # the SFT computed under bf16 autocast (TRL's bf16=True)
    assert all(v.dtype == torch.bfloat16 and torch.equal(before[k], v) for k, v in base.state_dict().items())


def test_config_rejects_bad_fedse_values():
    with pytest.raises(ValueError, match="fedse.aggregation"):
        RunConfig.from_run_config({"fedse.aggregation": "median"})
    with pytest.raises(ValueError, match="fedse.fraction-train"):
        RunConfig.from_run_config({"fedse.fraction-train": 1.5})
    with pytest.raises(ValueError, match="fedse.buffer-dir"):
        RunConfig.from_run_config({"fedse.buffer-dir": "relative/dir"})
    with pytest.raises(ValueError, match="fedse.seed-demos"):
        RunConfig.from_run_config({"strategy": "fedse-lora", "fedse.explore-samples": 0, "fedse.seed-demos": 0})


@pytest.mark.parametrize("perturbation, low, high", [(1.0, 0.25, 0.40), (0.1, 0.0, 0.01)])
def test_factor_mean_error_for_drifted_adapters_and_svd_is_never_worse(perturbation, low, high):
    """Shared start + drift: averaging A and B separately misses mean(B.A) by ~0.33 at drift 1.0 (K=4, r=8, 128x128).

    The rank-r SVD of the exact mean is the best rank-r approximation (Eckart-Young), and
    mean(B).mean(A) has rank <= r, so the exact mode's error can never exceed the factor mean's.
    """
    errors = []
    for seed in range(5):
        rng = np.random.default_rng(seed)
        a0, b0 = rng.normal(size=(8, 128)), rng.normal(size=(128, 8))
        adapters = [_adapter(a0 + perturbation * rng.normal(size=a0.shape), b0 + perturbation * rng.normal(size=b0.shape))
                    for _ in range(4)]
        _, metrics = aggregate_adapters(adapters, "exact")
        assert metrics["agg/svd-rank-r-rel-error"] <= metrics["agg/factor-mean-rel-error"] + 1e-6
        errors.append(metrics["agg/factor-mean-rel-error"])
    assert low < float(np.mean(errors)) < high


def test_the_sft_target_is_the_action_given_the_reasoning(maze_tokenizer):
    """Fed-SE's Eq. 7: the reasoning conditions, the action is scored. The split point is where `</think>` ends."""
    from fedagent_flwr.agent.play.prompts import expert_completion
    from fedagent_flwr.agent.self_evolution import action_given_reasoning

    prompt = [1, 2, 3]
    completion = maze_tokenizer(expert_completion("move up"), add_special_tokens=False)["input_ids"] + [maze_tokenizer.eos_token_id]
    context, target = action_given_reasoning(prompt, completion, maze_tokenizer)
    assert context + target == prompt + completion and context[:3] == prompt
    assert "</think>" in maze_tokenizer.decode(context) and "</think>" not in maze_tokenizer.decode(target)
    assert "move up</action>" in maze_tokenizer.decode(target)
    assert "<think>" not in maze_tokenizer.decode(target)
    # no reasoning block: the whole completion stays the target
    plain = maze_tokenizer("<action>move up</action>", add_special_tokens=False)["input_ids"]
    assert action_given_reasoning(prompt, plain, maze_tokenizer) == (prompt, plain)


def test_fedse_trains_on_the_whole_completion_by_default_and_on_the_action_given_the_reasoning_when_asked(
        monkeypatch, maze_tokenizer, tiny_lm, tmp_path):
    from fedagent_flwr.agent import self_evolution
    from fedagent_flwr.config import RunConfig

    assert RunConfig(strategy="fedse-lora").fedse.loss_tokens == "completion"
    with pytest.raises(ValueError, match="fedse.loss-tokens='reasoning'"):
        RunConfig.from_run_config({"strategy": "fedse-lora", "fedse.loss-tokens": "reasoning"})
    # the round hands the SFT the split samples only with loss_tokens="action"
    seen = {}
    monkeypatch.setattr(self_evolution, "supervised_finetune", lambda m, s, t, c: seen.update(samples=s) or [1.0])
    for mode in ("completion", "action"):
        agent = _agent(tiny_lm, maze_tokenizer)
        fedse = RunConfig.from_run_config({"fedse.explore-samples": 0, "fedse.seed-demos": 2, "fedse.max-steps": 1,
                                           "fedse.loss-tokens": mode}).fedse
        self_evolution_round(agent, fedse, LoRASection(), RolloutConfig(history_length=0), lambda: make_env("maze"),
                             make_env("maze").tasks_of_split("train")[:2], 1, ExperienceBuffer(tmp_path / mode))
        prompts = [p for p, _ in seen["samples"]]
        decoded = maze_tokenizer.decode(prompts[0][-6:])
        assert ("</think>" in decoded) == (mode == "action"), decoded


def test_fedse_fine_tunes_epochs_over_the_whole_buffer_under_the_schedule_the_run_config_names(maze_tokenizer, tiny_lm, tmp_path):
    """fedse.num-train-epochs and fedse.lr-scheduler-type reach TRL: with 2 epochs the round takes 2 x ceil(buffer steps / batch)
    optimizer steps whatever fedse.max-steps says, so the steps grow with the buffer (Fed-SE v2's 2 epochs a round)."""
    from fedagent_flwr.config import RunConfig

    run = RunConfig.from_run_config({"strategy": "fedse-lora", "fedse.num-train-epochs": 2, "fedse.lr-scheduler-type": "cosine", "fedse.max-steps": 50})
    with pytest.raises(ValueError, match="fedse.lr-scheduler-type='linear'"):
        RunConfig.from_run_config({"strategy": "fedse-lora", "fedse.lr-scheduler-type": "linear"})
    with pytest.raises(ValueError, match="fedse.num-train-epochs=-1"):
        RunConfig.from_run_config({"strategy": "fedse-lora", "fedse.num-train-epochs": -1})
    agent = _agent(tiny_lm, maze_tokenizer)
    fedse = replace(run.fedse, explore_samples=0, seed_demos=2, sft_batch_size=4)
    _, metrics = self_evolution_round(agent, fedse, LoRASection(r=2, lora_alpha=4.0), RolloutConfig(history_length=0), lambda: make_env("maze"),
                                      make_env("maze").tasks_of_split("train")[:2], 1, ExperienceBuffer(tmp_path / "b"))
    assert metrics["fedse/sft-steps"] == 2 * math.ceil(metrics["fedse/train-samples"] / 4) < 50


def test_protocol_scores_each_local_client_on_its_own_environment(tmp_path, tiny_lm, maze_tokenizer, monkeypatch):
    """Fed-SE's Local column for environment k is client k's adapter on environment k; the mean of all K adapters
    on every environment (what was scored before) understates a method whose clients each master one env."""
    from envs.multi import task_env
    from fedagent_flwr.experiments import fedse_protocol as fp

    agent = Agent(model=tiny_lm, tokenizer=maze_tokenizer, spec=None, device=torch.device("cpu"), base_fingerprint="fp")
    monkeypatch.setattr(fp, "load_agent", lambda *a: agent)
    envs = ["maze", "wordle"]

    def round_(agent, fedse, lora, rollout, env_factory, tasks, r, buffer, start, **how):  # client p leaves adapter "client p" behind
        return ArrayRecord({"client": Array(np.array([float(task_env(tasks[0]) == "wordle")]))}), {}

    def evaluate(agent, cfg, adapter, r, only_env=None):  # client p masters its env, and fails the others
        owner = envs[int(adapter["client"].numpy()[0])] if "client" in adapter else None
        tasks = [e for e in envs if only_env in (None, e)]
        rates = {e: float(e == owner) for e in tasks}
        return {"success_rate": sum(rates.values()) / len(rates), "episodes": 4.0 * len(tasks), "mean_reward": 0.0,
                **{f"success_rate/env/{e}": v for e, v in rates.items()},
                "success_rate/mean_over_envs": sum(rates.values()) / len(rates)}

    monkeypatch.setattr(fp, "self_evolution_round", round_)
    monkeypatch.setattr(fp, "_evaluate", evaluate)
    cfg = RunConfig.from_run_config({"strategy": "fedse-lora", "env": "maze,wordle", "partition.scheme": "by-environment", "num-clients": 2, "partition.tasks-per-client": 2, "num-server-rounds": 1, "eval.test-freq": 1, "lora.r": 2})
    final = fp.run_method("local", cfg, tmp_path)[-1]
    assert final["eval/success_rate/env/maze"] == final["eval/success_rate/env/wordle"] == 1.0
    assert final["eval/success_rate"] == final["eval/success_rate/mean_over_envs"] == 1.0
    assert final["eval/episodes"] == 8.0  # each client played its own environment's tasks only


def test_protocol_reuses_a_finished_method_and_reruns_a_stopped_or_changed_one(tmp_path, tiny_lm, maze_tokenizer,
                                                                               monkeypatch):
    """An interrupted five-seed protocol takes hours on CPU: a method that finished with the same configuration is
    read back, not run again; one stopped before its last evaluation, or run with other keys, is run again."""
    from fedagent_flwr.experiments import fedse_protocol as fp

    agent = Agent(model=tiny_lm, tokenizer=maze_tokenizer, spec=None, device=torch.device("cpu"), base_fingerprint="fp")
    monkeypatch.setattr(fp, "load_agent", lambda *a: agent)
    calls = []
    monkeypatch.setattr(fp, "self_evolution_round", lambda agent, fedse, lora, rollout, env_factory, tasks, r, buffer, start, **how:
                        calls.append(r) or (start, {"fedse/new-successes": 1.0}))
    monkeypatch.setattr(fp, "_evaluate", lambda agent, cfg, adapter, r, only_env=None:
                        {"success_rate": 0.5, "episodes": 4.0, "mean_reward": 0.0})
    cfg = RunConfig.from_run_config({"strategy": "fedse-lora", "env": "maze", "num-clients": 2, "partition.tasks-per-client": 2, "num-server-rounds": 2, "eval.test-freq": 2, "lora.r": 2})
    first = fp.run_method("fed-se", cfg, tmp_path)
    assert len(calls) == 4  # 2 rounds x 2 clients
    assert fp.run_method("fed-se", cfg, tmp_path) == first and len(calls) == 4  # reused
    metrics = tmp_path / "fed-se" / "metrics.jsonl"
    metrics.write_text("".join(metrics.read_text().splitlines(keepends=True)[:2]))  # stopped after round 1
    assert len(fp.run_method("fed-se", cfg, tmp_path)) == 3 and len(calls) == 8
    assert len(metrics.read_text().splitlines()) == 3  # the stopped run's rows are replaced, not appended to
    fp.run_method("fed-se", RunConfig.from_run_config(cfg.to_run_config() | {"fedse.max-steps": 3}), tmp_path)
    assert len(calls) == 12  # another configuration in the same folder runs again


def test_protocol_over_seeds_gives_mean_and_error_per_environment_and_tests_the_papers_orderings(tmp_path):
    from fedagent_flwr.experiments.fedse_protocol import seeds_table

    def rows(overall, maze):  # round 0, then the final evaluation
        return [{"round": 0, "eval/success_rate": 0.1}, {"round": 4, "eval/success_rate": overall,
                                                         "eval/success_rate/env/maze": maze, "eval/success_rate/env/wordle": 0.0}]

    finals = {"fed-se": [0.5, 0.6, 0.7], "fedavg-static": [0.4, 0.4, 0.6], "no-filter": [0.6, 0.5, 0.8]}
    per_seed = {s: {m: rows(v[s], 2 * v[s]) for m, v in finals.items()} for s in (0, 1, 2)}
    result = seeds_table(tmp_path, per_seed, RunConfig.from_run_config({"env": "maze,wordle", "partition.scheme": "by-environment", "num-clients": 2}))
    assert result["methods"]["fed-se"]["overall"]["mean"] == pytest.approx(0.6)
    assert result["methods"]["fed-se"]["env/maze"]["mean"] == pytest.approx(1.2)
    assert list(result["methods"]["fed-se"]) == ["env/maze", "env/wordle", "overall"]
    # only methods that ran, and Fed-SE against the base model all of them start from (round 0)
    assert set(result["comparisons"]) == {"fed-se > base model (round 0)", "fed-se > fedavg-static", "fed-se > no-filter"}
    assert result["methods"]["base model (round 0)"]["overall"]["mean"] == pytest.approx(0.1)
    verdicts = "\n".join(result["verdict"])
    assert "fed-se above base model (round 0): holds (difference +50.0" in verdicts  # 0.4, 0.5, 0.6 above 0.1
    assert "fed-se above fedavg-static: not shown (difference +13.3" in verdicts  # 0.1, 0.2, 0.1: p = 0.074
    assert "fed-se above no-filter: not shown" in verdicts  # behind
    table = (tmp_path / "table.md").read_text()
    assert "| fed-se | 120.0 ± 11.5 | 0.0 ± 0.0 | 60.0 ± 5.8 |" in table
    assert "| base model (round 0) | - | - | 10.0 ± 0.0 |" in table  # round 0 was evaluated overall only


def test_protocol_over_seeds_tests_valid_steps_against_fed_se_fedavg_static_and_the_base(tmp_path):
    """The table over seeds tests fed-se-valid-steps against Fed-SE, FedAvg-static and the base model, each ordering
    with a paired test over the seeds, and says "holds" only where that test does."""
    from fedagent_flwr.experiments.fedse_protocol import seeds_table

    finals = {"fed-se": [0.20, 0.25, 0.22], "fedavg-static": [0.22, 0.24, 0.20], "fed-se-valid-steps": [0.25, 0.28, 0.26]}
    per_seed = {s: {m: [{"round": 0, "eval/success_rate": 0.24}, {"round": 4, "eval/success_rate": v[s]}]
                    for m, v in finals.items()} for s in (0, 1, 2)}
    result = seeds_table(tmp_path, per_seed, RunConfig(env="maze"))
    assert {"fed-se-valid-steps > fed-se", "fed-se-valid-steps > fedavg-static",
            "fed-se-valid-steps > base model (round 0)"} <= set(result["comparisons"])
    assert result["comparisons"]["fed-se-valid-steps > fed-se"]["mean"] == pytest.approx(0.04)
    verdicts = "\n".join(result["verdict"])
    assert "fed-se-valid-steps above fedavg-static: holds (difference +4.3" in verdicts  # 0.03, 0.04, 0.06
    assert "fed-se-valid-steps above base model (round 0): not shown" in verdicts


def test_protocol_refuses_one_seed_beside_the_folders_of_several(tmp_path, capsys):
    """One seed writes into --out itself: beside seed-<s>/ folders it would mix with them (two such processes
    overwrite each other's methods), so the protocol stops first and names the folder to use."""
    from fedagent_flwr.experiments.fedse_protocol import main

    (tmp_path / "seed-0" / "fed-se").mkdir(parents=True)
    with pytest.raises(SystemExit):
        main(["--out", str(tmp_path), "--seeds", "2", "--methods", "fed-se", "--ranks", ""])
    err = capsys.readouterr().err
    assert "--seeds 2" in err and str(tmp_path / "seed-2") in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["seed-0"]  # nothing started


def test_protocol_evaluates_the_base_model_once_per_seed(tmp_path, tiny_lm, maze_tokenizer, monkeypatch):
    """Every method starts from B = 0, so their round-0 evaluations are the same numbers: a seed evaluates it once
    and the other methods record it (it took 45 s of each method's 3-5 min in the five-environment preset).
    A rank-sweep run changes the adapter's shape, so it evaluates its own start."""
    from fedagent_flwr.experiments import fedse_protocol as fp

    agent = Agent(model=tiny_lm, tokenizer=maze_tokenizer, spec=None, device=torch.device("cpu"), base_fingerprint="fp")
    monkeypatch.setattr(fp, "load_agent", lambda *a: agent)
    monkeypatch.setattr(fp, "self_evolution_round", lambda agent, fedse, lora, rollout, env_factory, tasks, r, buffer, start, **how:
                        (start, {"fedse/new-successes": 1.0}))
    evaluated = []

    def evaluate(agent, cfg, adapter, r, only_env=None):
        evaluated.append(r)
        return {"success_rate": 0.25 + 0.5 * (r > 0), "episodes": 4.0, "mean_reward": 0.0}

    monkeypatch.setattr(fp, "_evaluate", evaluate)
    base = RunConfig.from_run_config({"strategy": "fedse-lora", "env": "maze", "num-clients": 2, "partition.tasks-per-client": 2, "num-server-rounds": 1, "eval.test-freq": 1, "lora.r": 2})
    results = fp.run_seed(tmp_path, base, ["fed-se", "fedavg-static", "no-filter"], ranks=[4])
    assert evaluated.count(0) == 2  # fed-se's start, and rank 4's; not fedavg-static's or no-filter's
    for method in ("fedavg-static", "no-filter"):
        start = results[method][0]
        assert start["eval/success_rate"] == 0.25 and start["eval_reused"] == 1
        assert json.loads((tmp_path / method / "metrics.jsonl").read_text().splitlines()[0])["eval/success_rate"] == 0.25
    assert "eval_reused" not in results["fed-se"][0]
    assert json.loads((tmp_path / "table.json").read_text())  # the tables are written from the shared start


def test_one_seed_orderings_say_not_shown_within_the_evaluations_noise():
    """One seed's table once called any higher mean "holds": 28.5 % against 24.4 % on 270 episodes each is 1.1
    standard errors apart, noise; the same gap on 2,700 episodes is not."""
    from fedagent_flwr.experiments.fedse_protocol import one_seed_verdict

    assert one_seed_verdict(0.285, 0.244, 270) == "not shown"
    assert one_seed_verdict(0.285, 0.244, 2700) == "holds"
    assert one_seed_verdict(0.244, 0.285, 2700) == "not shown"  # the other way round


def _preset(name: str) -> RunConfig:
    from fedagent_flwr.simulation import read_run_config_file

    preset = read_run_config_file(str(Path(__file__).resolve().parents[2] / "configs" / name))
    return RunConfig.from_run_config(RunConfig().to_run_config() | preset)


@pytest.mark.parametrize("name", ["fedse-paper.toml", "fedse-paper-v1.toml"])
def test_both_fedse_paper_presets_hold_what_both_versions_state(name):
    """One client per environment of the five, all of them every round, 20 rounds, LoRA rank 8, unweighted
    averaging, a cumulative buffer of successes, greedy evaluation as AgentGym's (docs/presets.md)."""
    cfg = _preset(name)
    assert cfg.strategy == "fedse-lora"
    assert cfg.env.split(",") == ["babyai", "webshop", "textcraft", "maze", "wordle"] and cfg.partition.scheme == "by-environment"
    assert (cfg.num_clients, cfg.fedse.fraction_train, cfg.num_server_rounds, cfg.lora.r) == (5, 1.0, 20, 8)
    assert (cfg.fedse.aggregation, cfg.fedse.keep, cfg.fedse.history, cfg.fedse.steps) == ("mean", "successes", "cumulative", "all")
    assert rollout_config(cfg, evaluation=True).temperature == 0.0  # greedy, as AgentGym evaluates


def test_the_fedse_paper_preset_follows_the_second_versions_appendix():
    """arXiv 2512.08870v2, Sec. 3.1 and App. B: the reasoning and the action trained jointly; each step conditioned
    on its whole episode; all-linear LoRA r 8 alpha 16; AdamW 5e-5, cosine, no warm-up, 2 epochs over the client's
    data a round; turn limits BabyAI 20 and WebShop 10; test sets of 200 / 90 / 100 / 25 / 25 where ours are as
    large. The first version's reading stays in fedse-paper-v1.toml."""
    from envs.multi import per_env_spread, task_env

    cfg, v1 = _preset("fedse-paper.toml"), _preset("fedse-paper-v1.toml")
    assert cfg.model == "Qwen/Qwen2.5-7B-Instruct" and v1.model == "meta-llama/Llama-2-7b-chat-hf"
    assert cfg.fedse.loss_tokens == "completion" and v1.fedse.loss_tokens == "action"
    assert (cfg.lora.target_modules, cfg.lora.lora_alpha) == ("all-linear", 16.0)
    assert (cfg.fedse.learning_rate, cfg.fedse.lr_scheduler_type, cfg.fedse.num_train_epochs) == (5e-5, "cosine", 2)
    assert (v1.fedse.lr_scheduler_type, v1.fedse.num_train_epochs, v1.rollout.history_length) == ("constant", 0, 0)
    # AgentGym's answer form, read as AgentGym reads it (v2 runs AgentGym's environments); v1 keeps ours
    assert (cfg.rollout.prompt_template, cfg.rollout.answer_parsing) == ("agentgym", "agentgym")
    assert (v1.rollout.prompt_template, v1.rollout.answer_parsing) == ("compact", "strict")
    # AgentTraj's sizes as our experts' episodes (not its data); v1 keeps 8 a client
    assert cfg.fedse.seed_demos == "webshop=3930,babyai=810,textcraft=374,maze=215,wordle=955" and v1.fedse.seed_demos == 8
    env = make_env(cfg.env, cfg.rollout.max_steps)
    horizons = {name: env.env(name).max_steps for name in env.names}
    assert horizons["babyai"] == 20 and horizons["webshop"] == 10
    assert cfg.rollout.history_length >= max(horizons.values()) - 1  # every step sees its whole episode
    wanted = {"webshop": 200, "babyai": 90, "textcraft": 100, "maze": 25, "wordle": 25}
    pool = env.tasks_of_split("test")
    held_out = per_env_spread(pool, cfg.eval.tasks)
    counts = {name: sum(task_env(t) == name for t in held_out) for name in env.names}
    assert counts == {name: min(wanted[name], sum(task_env(t) == name for t in pool)) for name in env.names}
    # docs/presets.md's figures of them are written by experiments/fedse_figures.py, which reads the same
    from fedagent_flwr.experiments.fedse_figures import horizons_and_held_out
    assert horizons_and_held_out(cfg) == (horizons, counts)
    # the horizons and split sizes the preset's comment quotes (configs/ holds no generated parts) are these ones
    root = Path(__file__).resolve().parents[2]
    comment = " ".join(line.lstrip("# ") for line in (root / "configs" / "fedse-paper.toml").read_text().splitlines()
                       if line.startswith("#"))
    assert f"their own horizons: {horizons['textcraft']}, {horizons['maze']} and {horizons['wordle']} guesses" in comment
    assert f"TextCraft {counts['textcraft']} and Maze {counts['maze']} tasks (all played)" in comment




@pytest.mark.parametrize("name", ["fedse-paper.toml", "fedse-paper-v1.toml"])
def test_the_fedse_presets_memory_figures_are_the_plans_they_name(name, capsys):
    """The figures in each Fed-SE preset's memory comment are what memory_plan prints for it (read from the comment,
    so that editing either fails this): passes of 1 agent step at 2,048 and 4,096 tokens, and of 16 at 2,048."""
    import re

    from fedagent_flwr.experiments.memory_plan import main

    preset = Path(__file__).resolve().parents[2] / "configs" / name
    comment = " ".join(line.lstrip("# ") for line in preset.read_text().splitlines() if line.startswith("#"))
    quoted = re.search(r"is ([\d.]+) GiB at a 2,048-token context, against ([\d.]+) GiB with passes of 16 .*?, and "
                       r"([\d.]+) GiB", comment)
    assert quoted, comment

    def client_total(*extra: str) -> str:
        main(["--shape", "qwen2.5-7b", "--run-config", str(preset), *extra])
        return re.search(r"each client:.*?total\s+([\d.]+) GiB", capsys.readouterr().out, re.S).group(1)

    assert client_total() == quoted.group(1)
    assert client_total("--set", "fedse.sft-micro-batch-size=16") == quoted.group(2)
    assert client_total("--context-tokens", "4096") == quoted.group(3)


def test_seed_demonstrations_per_environment_are_played_on_each_environments_tasks(maze_tokenizer):
    """fedse.seed-demos per environment ("maze=5,wordle=3", as AgentTraj's sizes are given): that many expert episodes
    cycling over the client's tasks of each named environment, none of an environment not named; a single number
    keeps cycling over all the client's tasks; bad text is refused in one line naming the key."""
    from envs.multi import task_env
    from fedagent_flwr.agent.self_evolution import demonstration_tasks, expert_demonstrations

    env = make_env("maze,wordle,gridworld")
    tasks = env.tasks_of_split("train")[:2] + [t for t in env.tasks_of_split("train") if task_env(t) == "wordle"][:2]
    chosen = demonstration_tasks(tasks, "maze=5,wordle=3")
    assert [task_env(t) for t in chosen] == ["maze"] * 5 + ["wordle"] * 3
    assert [t.id for t in chosen[:5]] == [tasks[i % 2].id for i in range(5)] and task_env(tasks[0]) == "maze"
    assert demonstration_tasks(tasks, "gridworld=4") == [] and len(demonstration_tasks(tasks, 6)) == 6
    assert demonstration_tasks(tasks, 0) == [] and demonstration_tasks([], 3) == []
    agent = Agent(model=None, tokenizer=maze_tokenizer, spec=None, device=torch.device("cpu"), base_fingerprint="fp")
    won = expert_demonstrations(agent, lambda: make_env("maze,wordle,gridworld"), tasks, "maze=2,wordle=1",
                                RolloutConfig(history_length=0, max_new_tokens=8))
    assert sorted(task_env(t.task) for t in won) == ["maze", "maze", "wordle"]  # the expert wins each
    assert RunConfig.from_run_config({"strategy": "fedse-lora", "env": "maze,wordle", "num-clients": 2,
                                      "fedse.seed-demos": "maze=215,wordle=955"}).fedse.seed_demos == "maze=215,wordle=955"
    with pytest.raises(ValueError, match=r"fedse.seed-demos='webshop=3930' is not allowed: expected entries for the envs"):
        RunConfig.from_run_config({"strategy": "fedse-lora", "env": "maze,wordle", "fedse.seed-demos": "webshop=3930"})
