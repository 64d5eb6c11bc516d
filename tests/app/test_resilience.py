"""Failure tolerance (fault injection) and checkpoint/resume of the server.

The two real simulations are slow (minutes on 2 shared cores): python -m pytest -q -m slow tests/test_resilience.py
"""

import json
import os
import time

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MessageType, Metadata, MetricRecord, RecordDict

from fedagent_flwr.config import RunConfig
from fedagent_flwr.config.fault_plan import FaultPlan
from fedagent_flwr.faults import InjectedFault, corrupt_reply, train_with_faults
from fedagent_flwr.runs.resume import ResumedStrategy, load_state, restore, save_state
from strategies import FedAgentAvg
from simulate import simulate
from strategies.fedagent_avg import check_reply

def _record(seed=0):
    rng = np.random.default_rng(seed)
    return ArrayRecord({"w": Array(rng.standard_normal((3, 4)).astype(np.float32)),
                        "b": Array(rng.standard_normal(4).astype(np.float32)),
                        "n": Array(np.arange(5, dtype=np.int64))})


# ----- fault injection ---------------------------------------------------------------------------
def test_fault_plans_parse_and_pick_kinds_by_round():
    plan = FaultPlan.parse("raise+malformed+nan:partition=1")
    assert [plan.fault_for(0, r, 1) for r in (1, 2, 3, 4)] == ["raise", "malformed", "nan", "raise"]
    assert plan.fault_for(0, 1, 0) is None
    assert FaultPlan.parse("") is None
    for bad in ("raise", "explode:partition=0", "raise:partition=-1", "raise:prob=2", "raise:node=1", "raise:prob=x"):
        with pytest.raises(ValueError, match="resilience.fault-injection="):
            FaultPlan.parse(bad)


def test_probabilistic_faults_hit_at_the_given_rate_and_repeat_by_seed():
    plan = FaultPlan.parse("timeout:prob=0.3")
    hits = [plan.fault_for(7, r, k) is not None for r in range(1, 201) for k in range(10)]
    assert abs(np.mean(hits) - 0.3) < 0.03  # 2,000 draws: standard error about 0.01
    again = [plan.fault_for(7, r, k) is not None for r in range(1, 201) for k in range(10)]
    other_seed = [plan.fault_for(8, r, k) is not None for r in range(1, 201) for k in range(10)]
    assert hits == again and hits != other_seed


def test_corrupted_replies_are_rejected_by_the_server_check(run_identity):
    good = _record()
    for kind, reason in (("malformed", "keys differ"), ("nan", "NaN")):
        bad = corrupt_reply(kind, good)
        reply = Message(RecordDict({"arrays": bad}), dst_node_id=0, message_type=MessageType.TRAIN)
        with pytest.raises(ValueError, match=reason):
            check_reply(reply, good)
    assert np.array_equal(corrupt_reply("nan", good)["n"].numpy(), good["n"].numpy())  # integers cannot be NaN
    assert corrupt_reply(None, good) is good


def _train_message(server_round, partition_id):
    content = RecordDict({"arrays": _record(), "config": ConfigRecord({"server-round": server_round, "partition-id": partition_id})})
    return Message(content, dst_node_id=0, message_type=MessageType.TRAIN)


def test_the_client_wrapper_raises_or_corrupts_only_the_chosen_partition(run_identity):
    calls = []

    def handler(msg, context):
        calls.append(int(msg.content.config_records["config"]["server-round"]))
        return Message(RecordDict({"arrays": _record(), "metrics": MetricRecord({"x": 1.0})}), reply_to=msg)

    plan = FaultPlan.parse("raise+nan:partition=0")

    def wrapped(msg, context):
        return train_with_faults(handler, msg, context, plan, seed=0, round_timeout=60.0)

    def context(pid):
        return Context(run_id=1, node_id=1, node_config={"partition-id": pid, "num-partitions": 2}, state=RecordDict(),
                       run_config={})

    with pytest.raises(InjectedFault):
        wrapped(_train_message(1, 0), context(0))
    assert calls == []  # raised before any training
    reply = wrapped(_train_message(2, 0), context(0))
    assert np.isnan(reply.content.array_records["arrays"]["w"].numpy()).all()
    assert reply.content.metric_records["metrics"]["x"] == 1.0
    clean = wrapped(_train_message(1, 1), context(1))
    np.testing.assert_array_equal(clean.content.array_records["arrays"]["w"].numpy(), _record()["w"].numpy())
    assert calls == [2, 1]


# ----- checkpoint / resume -----------------------------------------------------------------------
def _reply(node, arrays):
    md = Metadata(run_id=1, message_id="", src_node_id=node, dst_node_id=0, reply_to_message_id="m", group_id="1",
                  created_at=time.time(), ttl=60.0, message_type=MessageType.TRAIN)
    return Message(metadata=md, content=RecordDict({"arrays": arrays, "metrics": MetricRecord({"success_rate": 0.5})}))


def _play(strategy, rounds, arrays):
    """Configure and aggregate `rounds`; each client returns the global arrays shifted by its partition-id."""
    for r in rounds:
        msgs = list(strategy.configure_train(r, arrays, ConfigRecord(), grid=None))
        replies = []
        for m in msgs:
            pid = m.content.config_records["config"]["partition-id"]
            shifted = ArrayRecord({k: Array(arrays[k].numpy() + np.asarray(pid + r, dtype=arrays[k].numpy().dtype))
                                   for k in arrays.keys()})
            replies.append(_reply(m.metadata.dst_node_id, shifted))
        arrays, _ = strategy.aggregate_train(r, replies)
    return arrays


def test_state_round_trip_gives_the_same_arrays_sampling_and_metrics(tmp_path, run_identity):
    config = RunConfig(run_name="x").to_run_config()
    nodes = {k: 100 + k for k in range(5)}
    full = FedAgentAvg(nodes, clients_per_round=2, seed=11)
    want = _play(full, range(1, 7), _record())

    first = FedAgentAvg(nodes, clients_per_round=2, seed=11)
    mid = _play(first, range(1, 4), _record())
    np.random.seed(5)
    rows = [{"round": 3, "train/replies": 2.0}]
    save_state(tmp_path, config, 3, mid, first, rows, {0: {"success_rate": 0.25}})
    expected_draw = np.random.random()

    np.random.seed(999)  # the restarted process has other RNG states and other node ids
    second = FedAgentAvg({k: 900 + k for k in range(5)}, clients_per_round=2, seed=11)
    state = load_state(tmp_path, config | {"num-server-rounds": 20, "resume": True})
    restore(state, second)
    assert np.random.random() == expected_draw
    assert state.server_round == 3 and state.rows == rows and state.history == {0: {"success_rate": 0.25}}
    assert second.node_of_partition[0] == 900  # this run's node ids, not the saved ones
    got = _play(second, range(4, 7), state.arrays)
    for key in want.keys():
        assert want[key].numpy().tobytes() == got[key].numpy().tobytes()
    assert second.sampled == full.sampled and set(second.sampled) == set(range(1, 7))
    assert dict(second.train_metrics[6]) == dict(full.train_metrics[6])


def test_resume_refuses_a_changed_config_and_a_missing_state(tmp_path, run_identity):
    config = RunConfig(run_name="x").to_run_config()
    with pytest.raises(ValueError, match="holds no saved state"):
        load_state(tmp_path, config)
    save_state(tmp_path, config, 1, _record(), FedAgentAvg({0: 1}, clients_per_round=1), [], {})
    with pytest.raises(ValueError, match="grpo.learning-rate: saved 5e-05 vs now 0.1"):
        load_state(tmp_path, config | {"grpo.learning-rate": 0.1})
    # a key the code gained after the save is fine at its default, an error otherwise
    older = {k: v for k, v in config.items() if k != "grpo.beta"}
    save_state(tmp_path, older, 1, _record(), FedAgentAvg({0: 1}, clients_per_round=1), [], {})
    assert load_state(tmp_path, config).server_round == 1
    with pytest.raises(ValueError, match="grpo.beta: saved None vs now 0.5"):
        load_state(tmp_path, config | {"grpo.beta": 0.5})


def _save(run_dir, config, server_round):
    save_state(run_dir, config, server_round, _record(server_round), FedAgentAvg({0: 1}, clients_per_round=1), [], {})


def test_a_kill_between_the_renames_leaves_the_previous_state_usable(tmp_path, run_identity):
    config = RunConfig(run_name="x").to_run_config()
    _save(tmp_path, config, 1)
    _save(tmp_path, config, 2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state", "state.previous"]  # no temporary folders left
    assert load_state(tmp_path, config).server_round == 2
    # what a kill after the first rename of the next save leaves: state.previous only (round 2)
    import shutil
    shutil.rmtree(tmp_path / "state.previous")
    os.replace(tmp_path / "state", tmp_path / "state.previous")
    state = load_state(tmp_path, config)
    assert state.server_round == 2 and state.arrays["w"].numpy().tobytes() == _record(2)["w"].numpy().tobytes()
    _save(tmp_path, config, 3)
    assert load_state(tmp_path, config).server_round == 3


@pytest.mark.parametrize("damage", ["truncate", "flip", "delete", "manifest"])
@pytest.mark.parametrize("name", ["arrays.safetensors", "server.json", "config.json"])
def test_a_damaged_state_file_falls_back_to_the_previous_round_and_says_which(tmp_path, run_identity, capsys, damage, name):
    config = RunConfig(run_name="x").to_run_config()
    _save(tmp_path, config, 1)
    _save(tmp_path, config, 2)
    path = tmp_path / "state" / name
    data = path.read_bytes()
    if damage == "truncate":
        path.write_bytes(data[: len(data) // 2])
    elif damage == "flip":  # same size, one byte changed
        path.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    elif damage == "delete":
        path.unlink()
    else:
        (tmp_path / "state" / "manifest.json").write_text("{")
    state = load_state(tmp_path, config)
    assert state.server_round == 1 and state.arrays["w"].numpy().tobytes() == _record(1)["w"].numpy().tobytes()
    said = capsys.readouterr().out
    culprit = "manifest.json" if damage == "manifest" else name
    assert culprit in said and "state.previous" in said and "(round 1)" in said, said


def test_with_both_generations_damaged_the_resume_is_refused_naming_both_files(tmp_path, run_identity):
    config = RunConfig(run_name="x").to_run_config()
    _save(tmp_path, config, 1)
    _save(tmp_path, config, 2)
    (tmp_path / "state" / "server.json").write_text("{}")
    (tmp_path / "state.previous" / "arrays.safetensors").write_bytes(b"")
    with pytest.raises(ValueError, match=r"no saved state .* is usable: .*state/server.json is damaged.*state.previous/arrays.safetensors"):
        load_state(tmp_path, config)


def test_the_state_holds_no_pickle_and_an_old_pickled_state_is_refused_clearly(tmp_path, run_identity):
    config = RunConfig(run_name="x").to_run_config()
    _save(tmp_path, config, 1)
    assert sorted(p.name for p in (tmp_path / "state").iterdir()) == ["arrays.safetensors", "config.json", "manifest.json", "server.json"]
    json.loads((tmp_path / "state" / "server.json").read_text())  # plain JSON
    old = tmp_path / "old"
    (old / "state").mkdir(parents=True)
    (old / "state" / "server.pkl").write_bytes(b"\x80\x05N.")
    with pytest.raises(ValueError, match="server.pkl was written by an older fedagent-flwr"):
        load_state(old, config)


def test_state_of_an_unknown_kind_is_refused_when_written_not_when_read(tmp_path, run_identity):
    from fedagent_flwr.runs.state_codec import decode, encode

    strategy = FedAgentAvg({0: 1}, clients_per_round=1)
    strategy.extra = object()
    with pytest.raises(TypeError, match="extra holds a object"):
        save_state(tmp_path, RunConfig(run_name="x").to_run_config(), 1, _record(), strategy, [], {})
    assert not (tmp_path / "state").exists() and not list(tmp_path.iterdir())  # nothing half-written is left
    value = {1: [np.float32(0.5), (2, "a")], "x": float("nan"), "g": np.random.default_rng(3), "b": b"\x00\xff"}
    back = decode(json.loads(json.dumps(encode(value))))
    assert back[1] == [0.5, (2, "a")] and np.isnan(back["x"]) and back["b"] == b"\x00\xff"
    assert back["g"].random() == np.random.default_rng(3).random()


def test_a_resumed_strategy_sees_the_true_round_numbers(run_identity):
    inner = FedAgentAvg({0: 1, 1: 2, 2: 3}, clients_per_round=2, seed=0)
    shifted = ResumedStrategy(inner, offset=4)
    list(shifted.configure_train(1, _record(), ConfigRecord(), grid=None))
    assert list(inner.sampled) == [5]
    msgs = list(inner.configure_train(6, _record(), ConfigRecord(), grid=None))
    assert all(m.content.config_records["config"]["server-round"] == 6 for m in msgs)


# ----- real simulations ------------------------------------------------------------------------------
def _simulate(tmp_path, out, run_name, *extra):
    return simulate(tmp_path, out, run_name, "--num-clients", "3", "--clients-per-round", "2", "--eval.tasks", "1", *extra)


@pytest.mark.slow
def test_a_run_with_one_failing_client_per_round_completes_every_round(tmp_path):
    out = tmp_path / "runs"
    # K = M = 2: partition 0 is sampled, and fails, in every round; each round a different way.
    proc, log = _simulate(tmp_path, out, "faults", "--num-clients", "2", "--num-server-rounds", "3",
                          "--resilience.fault-injection", "raise+malformed+nan:partition=0")
    summary_path = out / "faults" / "summary.json"
    assert summary_path.exists(), log
    summary = json.loads(summary_path.read_text())
    failed = summary["failed_replies"]
    assert sorted(failed) == ["1", "2", "3"] and all(len(f) == 1 for f in failed.values())
    assert "InjectedFault" in failed["1"][0] or "on purpose" in failed["1"][0]
    # the malformed reply is stopped by the client's own reply filter; the NaN one by the server's check
    assert "reply blocked" in failed["2"][0] and "NaN" in failed["3"][0]
    rows = [json.loads(line) for line in (out / "faults" / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == [0, 1, 2, 3]
    assert all(r["train/replies"] == 1.0 and r["train/failed-replies"] == 1.0 for r in rows[1:])
    state = load_state(out / "faults", json.loads((out / "faults" / "state" / "config.json").read_text()))
    assert state.server_round == 3 and all(np.isfinite(state.arrays[k].numpy()).all() for k in state.arrays.keys())


@pytest.mark.slow
def test_a_client_that_times_out_is_left_out_and_the_round_completes(tmp_path):
    out = tmp_path / "runs"
    # K = M = 2: partition 0 sleeps past the round timeout (20 s); partition 1 answers. One round only:
    # in simulation the sleeping client holds one of the 2 Ray worker slots, so a second round's other
    # client could queue behind it and time out too (docs/deployment.md, "Failure tolerance").
    proc, log = _simulate(tmp_path, out, "timeouts", "--num-clients", "2", "--num-server-rounds", "1",
                          "--federation.round-timeout", "20", "--resilience.fault-injection", "timeout:partition=0")
    assert proc.returncode == 0, log
    summary = json.loads((out / "timeouts" / "summary.json").read_text())
    assert summary["failed_replies"] == {"1": ["1 client(s) did not reply in time"]}
    rows = [json.loads(line) for line in (out / "timeouts" / "metrics.jsonl").read_text().splitlines()]
    assert rows[1]["train/replies"] == 1.0 and rows[1]["train/failed-replies"] == 1.0


# Fed-SE: the clients' experience buffers (on disk, keyed by the strategy's run key) must carry over too.
FEDSE = ("--strategy", "fedse-lora", "--fedse.max-steps", "2", "--fedse.explore-samples", "1", "--fedse.seed-demos", "1")


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["fedagent-avg", "fedse-lora"])
def test_resume_after_a_stop_gives_bit_identical_weights_and_client_sequence(tmp_path, strategy):
    out = tmp_path / "runs"
    extra = (FEDSE + ("--fedse.buffer-dir", str(tmp_path / "buffers"))) if strategy == "fedse-lora" else ()
    proc, log = _simulate(tmp_path, out, "full", "--num-server-rounds", "3", *extra)
    assert (out / "full" / "summary.json").exists(), log
    proc, log = _simulate(tmp_path, out, "part", "--num-server-rounds", "1", *extra)  # stops after round 1
    assert (out / "part" / "summary.json").exists(), log
    proc, log = _simulate(tmp_path, out, "part", "--num-server-rounds", "3", "--resume", "true", *extra)
    assert "resuming" in proc.stdout and (out / "part" / "summary.json").exists(), log

    full, part = (load_state(out / r, json.loads((out / r / "state" / "config.json").read_text())) for r in ("full", "part"))
    assert full.server_round == part.server_round == 3
    for key in full.arrays.keys():
        assert full.arrays[key].numpy().tobytes() == part.arrays[key].numpy().tobytes(), key
    a = json.loads((out / "full" / "summary.json").read_text())
    b = json.loads((out / "part" / "summary.json").read_text())
    assert a["sampled_clients"] == b["sampled_clients"] and sorted(a["sampled_clients"]) == ["1", "2", "3"]
    rows = [json.loads(line) for line in (out / "part" / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == [0, 1, 2, 3]
    # the resumed rounds trained something: the weights moved between round 1 and round 3
    from safetensors.numpy import load_file

    one, three = (load_file(next((out / "part" / "checkpoints" / f"round-000{r}").glob("*.safetensors"))) for r in (1, 3))
    assert any(not np.array_equal(one[k], three[k]) for k in one)
