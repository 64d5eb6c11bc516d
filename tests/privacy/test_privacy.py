"""No raw interaction data leaves a client: asserted on every client reply, for every registered strategy.

The real ServerApp logic (`run_federation`, handshake, strategy, evaluation) runs
in process against a grid that hands each message to the real ClientApp with
its own node context and records the reply. A strategy added to
strategies.STRATEGIES is picked up by the parametrisation; it needs a small
run config in SMALL_CONFIGS, and the test fails until it has one.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, Message, MessageType, MetricRecord, RecordDict
from loopback_grid import LoopbackGrid

from fedagent_flwr.config import RunConfig
from fedagent_flwr.config.strategy_traits import STRATEGIES
from fedagent_flwr.privacy.reply_filter import (
    CLIENT_FAILED,
    REPLY_BLOCKED,
    allowed_metric,
    reply_filter,
)

# One round, the smallest settings each strategy accepts.
_LLM = {"num-server-rounds": 1, "clients-per-round": 2, "grpo.tasks-per-epoch": 1, "grpo.num-generations": 2, "eval.tasks": 1,
        "eval.samples-per-task": 1, "partition.tasks-per-client": 2}
SMALL_CONFIGS = {
    "fedagent-avg": _LLM,
    "fedse-lora": _LLM | {"strategy": "fedse-lora", "fedse.max-steps": 1, "fedse.explore-samples": 1, "fedse.seed-demos": 1},
    "qavg": {"strategy": "qavg", "env": "random-mdp", "num-server-rounds": 2, "fedrl.local-updates": 2},
    "pavg": {"strategy": "pavg", "env": "random-mdp", "num-server-rounds": 2, "fedrl.local-updates": 2},
}
NUM_NODES = 3
HANDSHAKE_KEYS = {"partition-id", "num-partitions", "fingerprint"}


def assert_numeric_metrics(record: MetricRecord) -> None:
    for key, value in record.items():
        values = value if isinstance(value, list) else [value]
        assert all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values), (key, value)


def assert_reply_is_weights_and_numbers(sent: Message, reply: Message, env: str | None = None) -> None:
    assert not reply.has_error(), reply.error.reason
    content = reply.content
    if sent.metadata.message_type == MessageType.QUERY:  # the handshake: who am I, which base weights
        assert not content.array_records and not content.metric_records
        assert list(content.config_records) == ["info"]
        info = content.config_records["info"]
        assert set(info.keys()) == HANDSHAKE_KEYS
        assert isinstance(info["partition-id"], int) and isinstance(info["num-partitions"], int)
        assert re.fullmatch(r"[0-9a-f]{64}", info["fingerprint"]), info["fingerprint"]  # a SHA-256, not data
        return
    assert sent.metadata.message_type == MessageType.TRAIN
    assert not content.config_records, f"a train reply carries config records {list(content.config_records)}"
    for record in content.metric_records.values():
        assert_numeric_metrics(record)
        env = env or str(sent.content.config_records.get("config", {}).get("env", RunConfig.env))
        unknown = [k for k in record.keys() if not allowed_metric(k, env)]
        assert not unknown, f"metric keys outside the allow-list: {unknown}"
    # Arrays: exactly the tensors the server sent (same names, shapes, numeric dtypes) - room for
    # weights, none for token ids of trajectories or encoded text.
    assert list(content.array_records) == ["arrays"]
    got = content.array_records["arrays"]
    want = sent.content.array_records["arrays"]
    assert list(got.keys()) == list(want.keys())
    for key in want.keys():
        a, b = got[key].numpy(), want[key].numpy()
        assert a.shape == b.shape and a.dtype == b.dtype and a.dtype.kind in "fiu", (key, a.shape, a.dtype)


@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
def test_clients_send_only_weights_and_numeric_metrics(strategy, tmp_path, run_identity, monkeypatch):
    from fedagent_flwr.agent.models.loading import load_agent
    from fedagent_flwr.federation import run_federation

    assert strategy in SMALL_CONFIGS, f"add a small run config for strategy {strategy!r} to SMALL_CONFIGS"
    torch.set_num_threads(1)
    overrides = SMALL_CONFIGS[strategy] | {"output-dir": str(tmp_path / "runs"), "run-name": "privacy",
                                           "num-clients": NUM_NODES}
    if "fedse.buffer-dir" in RunConfig().to_run_config():
        overrides["fedse.buffer-dir"] = str(tmp_path / "buffers")
    run_config = RunConfig().to_run_config() | overrides
    cfg = RunConfig.from_run_config(run_config)
    # The filter drops metric keys outside its allow-list without a word: every key our own clients compute must be
    # on it, or the metric never reaches the server (train/informative_groups once went missing that way)
    from fedagent_flwr.privacy import reply_filter as filter_module

    dropped: list[str] = []
    real_allowed = filter_module.allowed_metric

    def recording_allowed(key, env):
        ok = real_allowed(key, env)
        if not ok:
            dropped.append(key)
        return ok

    monkeypatch.setattr(filter_module, "allowed_metric", recording_allowed)
    grid = LoopbackGrid(run_config, NUM_NODES)
    try:
        run_federation(grid, cfg)
    finally:
        load_agent.cache_clear()  # server and clients shared one cached model here; later tests get a fresh one

    kinds = [sent.metadata.message_type for sent, _ in grid.exchanges]
    assert kinds.count(MessageType.QUERY) == NUM_NODES and MessageType.TRAIN in kinds
    for sent, reply in grid.exchanges:
        assert_reply_is_weights_and_numbers(sent, reply)
    assert not dropped, f"metric keys our own clients send that the reply filter drops: {sorted(set(dropped))}"


def test_the_check_catches_text_and_trajectories(run_identity):
    """The assertion above is not vacuous: a reply with a string or an extra tensor fails it."""
    from flwr.app import Array, ConfigRecord

    weights = ArrayRecord({"w": Array(np.zeros(3, dtype=np.float32))})
    sent = Message(RecordDict({"arrays": weights}), dst_node_id=1, message_type=MessageType.TRAIN)
    ok = Message(RecordDict({"arrays": weights, "metrics": MetricRecord({"success_rate": 0.5})}), reply_to=sent)
    assert_reply_is_weights_and_numbers(sent, ok)
    leaks = [
        RecordDict({"arrays": weights, "log": ConfigRecord({"trajectory": "go north; go east"})}),
        RecordDict({"arrays": ArrayRecord({"w": Array(np.zeros(3, dtype=np.float32)),
                                           "tokens": Array(np.arange(40, dtype=np.int64))})}),
        RecordDict({"arrays": weights, "episodes": ArrayRecord({"obs": Array(np.zeros(2, dtype=np.float32))})}),
    ]
    for content in leaks:
        with pytest.raises(AssertionError):
            assert_reply_is_weights_and_numbers(sent, Message(content, reply_to=sent))


# ----- the client's reply filter (privacy/reply_filter.py) ----------------------------------------------------
def _context(env="maze"):
    from flwr.app import Context

    return Context(run_id=1, node_id=1, node_config={"partition-id": 0, "num-partitions": 2}, state=RecordDict(),
                   run_config={"env": env})


def _train_msg():
    from flwr.app import Array

    weights = ArrayRecord({"w": Array(np.zeros(3, dtype=np.float32))})
    return Message(RecordDict({"arrays": weights}), dst_node_id=1, message_type=MessageType.TRAIN), weights


def test_the_filter_drops_metric_keys_that_could_carry_text_and_keeps_the_allowed_ones(run_identity):
    sent, weights = _train_msg()
    metrics = MetricRecord({"success_rate": 0.5, "success_rate/far": 0.25, "loss": 1.0,
                            "success_rate/You are at (2, 3); walls north": 1.0, "obs:go north": 0.0,
                            "success_rate/env/maze": 0.5, "success_rate/env/secret": 0.1})
    reply = reply_filter(sent, _context(), lambda m, c: Message(RecordDict({"arrays": weights, "metrics": metrics}), reply_to=m))
    assert not reply.has_error()
    assert sorted(reply.content.metric_records["metrics"].keys()) == ["loss", "success_rate", "success_rate/env/maze", "success_rate/far"]
    assert_reply_is_weights_and_numbers(sent, reply, env="maze")
    # categories are the run's env's own: wordle's are not maze's
    assert allowed_metric("success_rate/crowded", "wordle") and not allowed_metric("success_rate/crowded", "maze")
    from fedagent_flwr.agent.play.multi_env import (  # the per-environment keys of a multi-env run
        ENV_PREFIX,
        MEAN_KEY,
    )

    for key in (f"{ENV_PREFIX}wordle", "invalid_action_rate/env/maze", "episodes/env/maze", MEAN_KEY):
        assert allowed_metric(key, "maze,wordle"), key
    assert not allowed_metric(f"{ENV_PREFIX}webshop", "maze,wordle")


def test_the_filter_blocks_extra_arrays_records_and_handshake_fields(run_identity):
    from flwr.app import Array, ConfigRecord

    sent, weights = _train_msg()
    for content in (
        RecordDict({"arrays": ArrayRecord({"w": Array(np.zeros(3, dtype=np.float32)), "tokens": Array(np.arange(40))})}),
        RecordDict({"arrays": weights, "log": ConfigRecord({"trajectory": "go north; go east"})}),
        RecordDict({"arrays": weights, "episodes": ArrayRecord({"obs": Array(np.zeros(2, dtype=np.float32))})}),
        RecordDict({"arrays": ArrayRecord({"w": Array(np.zeros(4, dtype=np.float32))})}),
    ):
        reply = reply_filter(sent, _context(), lambda m, c, content=content: Message(content, reply_to=m))
        assert reply.has_error() and reply.error.code == REPLY_BLOCKED, content
    query = Message(RecordDict(), dst_node_id=1, message_type=MessageType.QUERY)
    info = {"partition-id": 0, "num-partitions": 2, "fingerprint": "a" * 64}
    ok = reply_filter(query, _context(), lambda m, c: Message(RecordDict({"info": ConfigRecord(info)}), reply_to=m))
    assert not ok.has_error()
    for bad in (info | {"host": "10.0.0.7"}, info | {"fingerprint": "the task text"}):
        reply = reply_filter(query, _context(), lambda m, c, bad=bad: Message(RecordDict({"info": ConfigRecord(bad)}), reply_to=m))
        assert reply.has_error() and reply.error.code == REPLY_BLOCKED


def test_a_failing_client_sends_an_error_code_and_the_class_name_only(run_identity, capsys):
    sent, _ = _train_msg()

    def crash(m, c):
        raise RuntimeError("cannot open /home/alice/tasks/maze-1-3.json (pid 4242, 10.0.0.7:9092): You are at (2, 3)")

    reply = reply_filter(sent, _context(), crash)
    assert reply.has_error() and reply.error.code == CLIENT_FAILED
    assert reply.error.reason == "client failed: RuntimeError"
    assert "/home/alice" in capsys.readouterr().err  # the details stay in the client's own log


def test_a_failing_clients_reply_reaches_the_server_summary_without_its_traceback(tmp_path, run_identity):
    from fedagent_flwr.agent.models.loading import load_agent
    from fedagent_flwr.federation import run_federation

    torch.set_num_threads(1)
    run_config = RunConfig().to_run_config() | SMALL_CONFIGS["fedagent-avg"] | {
        "output-dir": str(tmp_path / "runs"), "run-name": "fails", "num-clients": 2, "resilience.fault-injection": "raise:partition=0"}
    try:
        summary = run_federation(LoopbackGrid(run_config, 2), RunConfig.from_run_config(run_config))
    finally:
        load_agent.cache_clear()
    reasons = [r for rs in summary["failed_replies"].values() for r in rs]
    assert len(reasons) == 1 and reasons[0].endswith(": client error: client failed: InjectedFault"), reasons
