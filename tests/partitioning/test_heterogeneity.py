"""Heterogeneity wiring: partition run-config keys, success labels, and the Table 1 baselines' task assignment."""

from __future__ import annotations

import json
import math
import time

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MessageType, Metadata, RecordDict

from envs import make_env
from fedagent_flwr.methods.tasks import all_partitions, baseline_learner, learner_tasks, union_of
from fedagent_flwr.config import RunConfig
from fedagent_flwr.runs.preflight import preflight
from fedagent_flwr.agent.play.rollout import ExpertPolicy, LMPolicy, PromptEncoder, RolloutConfig
from fedagent_flwr.experiments.success_labels import label_tasks
from fedagent_flwr.atomic import write_json_atomic
from partitions.labels import load_labels
from partitions import coverage_partition, hardness_partition, preference_partition, task_table
from strategies.single_learner import SingleLearner

POOL = make_env("maze").tasks_of_split("train")  # 16 start positions in 3 distance categories
IDS = [t.id for t in POOL]


def cfg(**overrides) -> RunConfig:
    return RunConfig.from_run_config(RunConfig().to_run_config() | {"env": "maze"} | overrides)


def ids_of(partitions):
    return [[t.id for t in p] for p in partitions]


def write_labels(path, solved: set[str], env: str = "maze"):
    write_json_atomic(path, {"env": env, "labels": {i: i in solved for i in IDS}})
    return str(path)


# ------------------------------------------------------------------ run-config -> partition


def test_preference_keys_reach_algorithm_2():
    c = cfg(**{"partition.scheme": "preference"}, **{"partition.tasks-per-client": 6, "partition.preference-omega": 0.9, "partition.preference-mix": "dirichlet", "seed": 3})
    got = ids_of(all_partitions(c, 5))
    want = preference_partition(task_table(POOL)["category"], 5, 6, 0.9, 3, "dirichlet")
    assert got == [[IDS[i] for i in rows] for rows in want]
    assert all(len(p) == 6 and len(set(p)) == 6 for p in got)


def test_coverage_keys_reach_algorithm_3():
    keys = {"partition.coverage-xi": 1.0, "partition.coverage-r": 1.5, "partition.coverage-l-min": 2, "partition.coverage-l-avg": 6.0, "partition.coverage-l-max": 12}
    got = ids_of(all_partitions(cfg(**{"partition.scheme": "coverage"}, **keys), 4))
    want = coverage_partition(16, 4, 1.0, 0, r=1.5, size_min=2, size_avg=6.0, size_max=12)
    assert got == [[IDS[i] for i in rows] for rows in want]
    sizes = [len(p) for p in got]
    assert sum(sizes) == math.floor(1.5 * 16) and min(sizes) >= 2 and max(sizes) <= 12


def test_infeasible_coverage_stops_the_run_with_the_keys_named():
    # The reference defaults (sizes 100..1000) cannot be cut from Maze's 16 training tasks.
    with pytest.raises(ValueError, match=r"partition.scheme='coverage' cannot split the 16 training tasks of env='maze' among K=4.*infeasible"):
        all_partitions(cfg(**{"partition.scheme": "coverage"}), 4)


def test_hardness_reads_success_labels(tmp_path):
    solved = set(IDS[::2])  # 8 of 16 solved
    c = cfg(**{"partition.scheme": "hardness"}, **{"partition.success-labels": write_labels(tmp_path / "l.json", solved),
                                      "partition.tasks-per-client": 8, "partition.hardness-xi": 1.0, "seed": 4})
    got = ids_of(all_partitions(c, 4))
    want = hardness_partition(np.array([i in solved for i in IDS]), 4, 8, 1.0, 4)
    assert got == [[IDS[i] for i in rows] for rows in want]
    counts = [sum(i in solved for i in p) for p in got]
    assert all(len(p) == 8 for p in got) and np.mean(counts) == 4  # L/2 successful on average


def test_hardness_needs_a_labels_file_for_this_env(tmp_path):
    with pytest.raises(ValueError, match="partition.success-labels=''"):
        cfg(**{"partition.scheme": "hardness"})
    with pytest.raises(ValueError, match="an existing file"):
        preflight(cfg(**{"partition.scheme": "hardness"}, **{"partition.success-labels": str(tmp_path / "missing.json")}))
    other = write_labels(tmp_path / "w.json", set(), env="wordle")
    with pytest.raises(ValueError, match="labels env 'wordle'"):
        all_partitions(cfg(**{"partition.scheme": "hardness"}, **{"partition.success-labels": other}), 2)
    partial = tmp_path / "p.json"
    write_json_atomic(partial, {"env": "maze", "labels": {IDS[0]: True}})
    with pytest.raises(ValueError, match="no label for 15 task"):
        all_partitions(cfg(**{"partition.scheme": "hardness"}, **{"partition.success-labels": str(partial)}), 2)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"partition.scheme": "stripes"}, "partition.scheme='stripes'"),
        ({"partition.preference-omega": -0.1}, "partition.preference-omega"),
        ({"partition.preference-mix": "dirichlet", "partition.preference-omega": 1.0}, r"in \(0, 1\) with partition.preference-mix='dirichlet'"),
        ({"partition.preference-mix": "uniform"}, "gaussian | dirichlet"),
        ({"partition.coverage-xi": 0.0}, "partition.coverage-xi"),
        ({"partition.coverage-r": 0.0}, "partition.coverage-r"),
        ({"partition.coverage-l-min": 50, "partition.coverage-l-avg": 40.0}, "partition.coverage-l-min <= partition.coverage-l-avg"),
        ({"partition.hardness-xi": -1.0}, "partition.hardness-xi"),
        ({"baseline.name": "fedavg"}, "none | centralized | local"),
        ({"baseline.name": "local", "baseline.local-client": 4, "num-clients": 4}, r"baseline.local-client=4 .*< num-clients \(4\)"),
    ],
)
def test_bad_partition_and_baseline_keys_are_named(override, message):
    with pytest.raises(ValueError, match=message):
        cfg(**override)


def test_local_client_must_be_one_of_the_federation():
    with pytest.raises(ValueError, match="baseline.local-client=5 is not a partition-id of the K=3"):
        cfg(**{"baseline.name": "local"}, **{"baseline.local-client": 5}).check_federation(3)


# ------------------------------------------------------------------ baselines


def test_centralized_learner_owns_the_union_of_all_partitions():
    c = cfg(**{"baseline.name": "centralized"}, **{"partition.tasks-per-client": 4, "seed": 1})
    clients = all_partitions(c, 4)
    union = learner_tasks(c, 0, 4)
    assert {t.id for t in union} == {t.id for p in clients for t in p}
    assert len(union) == len({t.id for t in union}) > 4  # more than any one client, each task once
    assert union == union_of(clients) and baseline_learner(c) == 0
    with pytest.raises(ValueError, match="partition 0 only"):
        learner_tasks(c, 2, 4)


def test_local_learner_keeps_its_fedagent_partition():
    fed = cfg(**{"partition.tasks-per-client": 4, "seed": 1})
    local = cfg(**{"baseline.name": "local"}, **{"baseline.local-client": 2, "partition.tasks-per-client": 4, "seed": 1})
    assert learner_tasks(local, 2, 4) == learner_tasks(fed, 2, 4) == all_partitions(fed, 4)[2]
    assert baseline_learner(local) == 2 and baseline_learner(fed) is None
    with pytest.raises(ValueError, match="baseline.local-client=2 only"):
        learner_tasks(local, 0, 4)


def test_single_learner_trains_one_fixed_client_and_keeps_its_weights(run_identity):
    nodes = {0: 11, 1: 12, 2: 13}
    strategy = SingleLearner(nodes, learner=2, seed=0)
    start = ArrayRecord({"w": Array(np.zeros(3, dtype=np.float32))})
    for rnd in (1, 2, 3):
        msgs = list(strategy.configure_train(rnd, start, ConfigRecord({"fingerprint": "f"}), grid=None))
        assert [m.metadata.dst_node_id for m in msgs] == [13]
        assert msgs[0].content.config_records["config"]["partition-id"] == 2
    local = np.array([0.1, -2.5, 3.0], dtype=np.float32)
    md = Metadata(run_id=1, message_id="", src_node_id=13, dst_node_id=0, reply_to_message_id="m", group_id="3",
                  created_at=time.time(), ttl=60.0, message_type=MessageType.TRAIN)
    reply = Message(metadata=md, content=RecordDict({"arrays": ArrayRecord({"w": Array(local)})}))
    arrays, metrics = strategy.aggregate_train(3, [reply])
    assert np.array_equal(arrays["w"].numpy(), local) and metrics["replies"] == 1
    assert strategy.sampled == {1: [2], 2: [2], 3: [2]}
    with pytest.raises(ValueError, match="learner's partition-id"):
        SingleLearner(nodes, learner=3)


# ------------------------------------------------------------------ success labels


def test_expert_solves_every_task_and_a_random_model_none(maze_tokenizer, tiny_lm):
    config = RolloutConfig(history_length=0, max_new_tokens=8, batch_size=64)
    tasks = POOL[:5]
    labels, rates = label_tasks(ExpertPolicy(maze_tokenizer), PromptEncoder(maze_tokenizer), "maze", tasks, config, 2, 0.5, 0)
    assert labels == {t.id: True for t in tasks} and set(rates.values()) == {1.0}
    config = RolloutConfig(history_length=0, max_new_tokens=8, batch_size=64)
    labels, rates = label_tasks(LMPolicy(tiny_lm, maze_tokenizer, config), PromptEncoder(maze_tokenizer), "maze",
                                tasks, config, 1, 0.5, 0, max_steps=3)
    assert labels == {t.id: False for t in tasks} and set(rates.values()) == {0.0}  # a random LM never reaches the goal


def test_label_thresholds_and_bad_arguments(maze_tokenizer):
    config = RolloutConfig(history_length=0, max_new_tokens=8)
    policy, enc = ExpertPolicy(maze_tokenizer), PromptEncoder(maze_tokenizer)
    with pytest.raises(ValueError, match="samples"):
        label_tasks(policy, enc, "maze", POOL[:1], config, 0, 0.5, 0)
    with pytest.raises(ValueError, match="threshold"):
        label_tasks(policy, enc, "maze", POOL[:1], config, 1, 0.0, 0)


@pytest.mark.slow  # loads (or first builds) the cached tiny:maze model and plays 64 episodes
def test_success_label_command_on_the_tiny_maze_model(tmp_path):
    from fedagent_flwr.experiments.success_labels import main

    out = tmp_path / "labels.json"
    payload = main(["--env", "maze", "--model", "tiny", "--out", str(out), "--samples", "2", "--seed", "3"])
    data = json.loads(out.read_text())
    assert data == json.loads(json.dumps(payload, sort_keys=True))
    assert set(data["labels"]) == set(IDS) and data["num_tasks"] == 16
    assert all(data["labels"][i] == (data["success_rate"][i] >= 0.5) for i in IDS)
    assert set(data["success_rate"].values()) <= {0.0, 0.5, 1.0}
    assert data["num_successful"] == sum(data["labels"].values())
    assert load_labels(out, "maze", POOL) == [data["labels"][i] for i in IDS]
    assert not list(tmp_path.glob(".*tmp"))  # the temporary file was renamed, not left behind
    again = main(["--env", "maze", "--model", "tiny", "--out", str(tmp_path / "b.json"), "--samples", "2", "--seed", "3"])
    assert again["labels"] == payload["labels"]  # same seed, same labels
