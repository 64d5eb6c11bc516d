"""Central DP (fedagent_flwr/privacy/differential_privacy.py): clipping values, noise scale, failed replies, the client mod."""

import time

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MessageType, Metadata, MetricRecord, RecordDict
from flwr.supercore.differential_privacy import KEY_CLIPPING_NORM

from fedagent_flwr.config import RunConfig
from strategies import FedAgentAvg
from fedagent_flwr.privacy.differential_privacy import ClientSideDP, ServerSideDP, clip_when_asked, with_differential_privacy


def _arrays(w, b):
    return ArrayRecord({"w": Array(np.asarray(w, dtype=np.float32)), "b": Array(np.asarray(b, dtype=np.float32))})


def _reply(node, arrays=None, error=None):
    md = Metadata(run_id=1, message_id="", src_node_id=node, dst_node_id=0, reply_to_message_id="m", group_id="1",
                  created_at=time.time(), ttl=60.0, message_type=MessageType.TRAIN)
    if error is not None:
        from flwr.app import Error

        return Message(metadata=md, error=Error(code=0, reason=error))
    return Message(metadata=md, content=RecordDict({"arrays": arrays, "metrics": MetricRecord({"success_rate": 0.5})}))


def _round(wrapped, inner, global_arrays, reply_arrays, errors=()):
    msgs = list(wrapped.configure_train(1, global_arrays, ConfigRecord(), grid=None))
    replies = [_reply(m.metadata.dst_node_id, a) for m, a in zip(msgs, reply_arrays)]
    replies += [_reply(99, error=e) for e in errors]
    return msgs, wrapped.aggregate_train(1, replies)


def test_server_side_clipping_scales_each_update_to_the_norm_before_averaging(run_identity):
    inner = FedAgentAvg({0: 10, 1: 11}, clients_per_round=2, seed=0)
    dp = with_differential_privacy(inner, "server-side", noise_multiplier=0.0, clipping_norm=1.0, clients_per_round=2)
    assert isinstance(dp, ServerSideDP)
    zero = _arrays([0.0, 0.0], [0.0])
    # Update norms 5 (3,4,0) and 0.5 (0,0,0.5): the first is scaled to norm 1, the second kept.
    _, (agg, metrics) = _round(dp, inner, zero, [_arrays([3.0, 4.0], [0.0]), _arrays([0.0, 0.0], [0.5])])
    np.testing.assert_allclose(agg["w"].numpy(), [(0.6 + 0.0) / 2, (0.8 + 0.0) / 2], rtol=1e-6)
    np.testing.assert_allclose(agg["b"].numpy(), [0.25], rtol=1e-6)
    assert metrics["replies"] == 2.0 and inner.sampled[1]  # the inner strategy kept its bookkeeping


def test_noise_has_the_documented_standard_deviation(run_identity):
    inner = FedAgentAvg({0: 10, 1: 11, 2: 12, 3: 13}, clients_per_round=4, seed=0)
    dp = with_differential_privacy(inner, "server-side", noise_multiplier=2.0, clipping_norm=0.5, clients_per_round=4)
    zero = _arrays(np.zeros(20000), np.zeros(1))
    _, (agg, _) = _round(dp, inner, zero, [zero] * 4)
    std = agg["w"].numpy().std()
    assert abs(std - 2.0 * 0.5 / 4) < 0.01  # z * C / M = 0.25; 20,000 draws give about 0.0013 standard error


def test_a_failed_or_malformed_reply_is_left_out_and_the_round_still_aggregates(run_identity):
    inner = FedAgentAvg({0: 10, 1: 11, 2: 12}, clients_per_round=3, seed=0, min_replies=1)
    dp = with_differential_privacy(inner, "server-side", noise_multiplier=0.0, clipping_norm=10.0, clients_per_round=3)
    zero = _arrays([0.0, 0.0], [0.0])
    wrong_shape = ArrayRecord({"w": Array(np.zeros(3, dtype=np.float32)), "b": Array(np.zeros(1, dtype=np.float32))})
    msgs = list(dp.configure_train(1, zero, ConfigRecord(), grid=None))
    replies = [_reply(msgs[0].metadata.dst_node_id, _arrays([1.0, 1.0], [1.0])),
               _reply(msgs[1].metadata.dst_node_id, wrong_shape),
               _reply(msgs[2].metadata.dst_node_id, error="client crashed")]
    agg, metrics = dp.aggregate_train(1, replies)
    # Flower's wrapper alone would skip the round (any error reply) or fail on the shape.
    np.testing.assert_allclose(agg["w"].numpy(), [1.0, 1.0])
    assert metrics["replies"] == 1.0 and metrics["failed-replies"] == 2.0
    assert len(inner.failures[1]) == 2 and any("client crashed" in f for f in inner.failures[1])


def test_client_side_mode_sends_the_norm_and_the_mod_clips_only_when_asked(run_identity):
    inner = FedAgentAvg({0: 10}, clients_per_round=1, seed=0)
    dp = with_differential_privacy(inner, "client-side", noise_multiplier=0.0, clipping_norm=1.0, clients_per_round=1)
    assert isinstance(dp, ClientSideDP)
    global_arrays = _arrays([0.0, 0.0], [0.0])
    (msg,) = dp.configure_train(1, global_arrays, ConfigRecord(), grid=None)
    assert msg.content.config_records["config"][KEY_CLIPPING_NORM] == 1.0

    def train(m, ctx):  # a client whose update has norm 10
        return Message(RecordDict({"arrays": _arrays([6.0, 8.0], [0.0]), "metrics": MetricRecord({"x": 1.0})}), reply_to=m)

    ctx = Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config={})
    clipped = clip_when_asked(msg, ctx, train)
    np.testing.assert_allclose(clipped.content.array_records["arrays"]["w"].numpy(), [0.6, 0.8], rtol=1e-6)

    plain = Message(RecordDict({"arrays": global_arrays, "config": ConfigRecord({"server-round": 1})}),
                    dst_node_id=0, message_type=MessageType.TRAIN)
    untouched = clip_when_asked(plain, ctx, train)
    np.testing.assert_array_equal(untouched.content.array_records["arrays"]["w"].numpy(), [6.0, 8.0])


def test_dp_is_refused_where_it_does_not_apply():
    with pytest.raises(ValueError, match="privacy.dp-mode='server-side' is not allowed"):
        RunConfig.from_run_config({"strategy": "qavg", "env": "random-mdp", "privacy.dp-mode": "server-side"})
    with pytest.raises(ValueError, match="privacy.noise-multiplier=-1.0"):
        RunConfig.from_run_config({"privacy.dp-mode": "client-side", "privacy.noise-multiplier": -1.0})
    with pytest.raises(ValueError, match="unknown privacy.dp-mode"):
        with_differential_privacy(FedAgentAvg({0: 1}, 1), "local", 1.0, 1.0, 1)
    assert with_differential_privacy(inner := FedAgentAvg({0: 1}, 1), "off", 1.0, 1.0, 1) is inner


@pytest.mark.parametrize("strategy,mode", [("fedagent-avg", "client-side"), ("fedse-lora", "server-side")])
def test_a_run_with_dp_clips_every_update_and_still_sends_only_numbers(strategy, mode, tmp_path, run_identity):
    """The real ServerApp and ClientApp (with its mods) in one process (tests/loopback_grid.py)."""
    import torch

    from fedagent_flwr.agent.models.loading import load_agent
    from fedagent_flwr.federation import run_federation
    from loopback_grid import LoopbackGrid
    from fedagent_flwr.privacy.differential_privacy import update_norm
    from test_privacy import NUM_NODES, SMALL_CONFIGS, assert_reply_is_weights_and_numbers

    torch.set_num_threads(1)
    norm = 1e-4  # far below any real update: every client's update must come out clipped
    run_config = RunConfig().to_run_config() | SMALL_CONFIGS[strategy] | {
        "output-dir": str(tmp_path / "runs"), "run-name": "dp", "num-clients": NUM_NODES,
        "fedse.buffer-dir": str(tmp_path / "buffers"), "privacy.dp-mode": mode, "privacy.clipping-norm": norm,
        "privacy.noise-multiplier": 0.0, "num-server-rounds": 2, "grpo.num-generations": 4, "grpo.tasks-per-epoch": 2}
    grid = LoopbackGrid(run_config, NUM_NODES)
    try:
        summary = run_federation(grid, RunConfig.from_run_config(run_config))
    finally:
        load_agent.cache_clear()
    assert summary["failed_replies"] == {}
    trains = [(sent, reply) for sent, reply in grid.exchanges if sent.metadata.message_type == MessageType.TRAIN]
    assert trains
    for sent, reply in trains:
        assert_reply_is_weights_and_numbers(sent, reply)
        raw = reply.content.metric_records["metrics"].get("update_norm")
        clipped = update_norm(reply.content.array_records["arrays"], sent.content.array_records["arrays"])
        if mode == "client-side":  # clipped before the reply left the client (a tied GRPO round may send none)
            assert clipped <= min(norm * 1.001, raw + 1e-12)
    # Without noise the global model moves by the mean of clipped updates: at most the norm.
    first, second = (sent.content.array_records["arrays"] for sent, _ in (trains[0], trains[-1]))
    assert trains[-1][0].content.config_records["config"]["server-round"] == 2
    assert 0 < update_norm(second, first) <= norm * 1.001
