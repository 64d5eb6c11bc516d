import time

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Error, Message, MessageType, Metadata, MetricRecord, RecordDict

from strategies import FedAgentAvg, average_arrays, sample_clients


def test_sampling_is_without_replacement_and_reproducible_by_seed():
    draws = [sample_clients(np.random.default_rng(7), 10, 4) for _ in range(2)]
    assert draws[0] == draws[1]
    assert len(set(draws[0])) == 4 and all(0 <= k < 10 for k in draws[0])
    other = sample_clients(np.random.default_rng(8), 10, 4)
    assert other != draws[0]
    assert sorted(sample_clients(np.random.default_rng(0), 5, 5)) == [0, 1, 2, 3, 4]
    with pytest.raises(ValueError):
        sample_clients(np.random.default_rng(0), 3, 4)


def test_sampling_is_uniform_over_clients():
    rng = np.random.default_rng(0)
    counts = np.zeros(10)
    for _ in range(5000):
        counts[sample_clients(rng, 10, 2)] += 1
    # each client is picked with probability M/K = 0.2 per round
    np.testing.assert_allclose(counts / 5000, 0.2, atol=0.02)


def _record(**arrays):
    return ArrayRecord({k: Array(np.asarray(v)) for k, v in arrays.items()})


def test_average_is_the_unweighted_elementwise_mean():
    a = _record(w=np.array([[1.0, 2.0], [3.0, 4.0]], dtype=np.float32), b=np.array([1.0], dtype=np.float32))
    b = _record(w=np.array([[3.0, 6.0], [5.0, 0.0]], dtype=np.float32), b=np.array([2.0], dtype=np.float32))
    c = _record(w=np.array([[2.0, 1.0], [1.0, 2.0]], dtype=np.float32), b=np.array([6.0], dtype=np.float32))
    avg = average_arrays([a, b, c])
    np.testing.assert_allclose(avg["w"].numpy(), [[2.0, 3.0], [3.0, 2.0]])
    np.testing.assert_allclose(avg["b"].numpy(), [3.0])
    assert avg["w"].numpy().dtype == np.float32
    with pytest.raises(ValueError, match="shapes"):
        average_arrays([a, _record(w=np.zeros((3, 2), dtype=np.float32), b=np.zeros(1, dtype=np.float32))])


def _reply(node, content=None, error=None):
    md = Metadata(run_id=1, message_id="", src_node_id=node, dst_node_id=0, reply_to_message_id="m",
                  group_id="1", created_at=time.time(), ttl=60.0, message_type=MessageType.TRAIN)
    return Message(metadata=md, content=content, error=error)


def test_configure_train_addresses_sampled_partitions_by_node(run_identity):
    nodes = {0: 101, 1: 102, 2: 103, 3: 104}
    strategy = FedAgentAvg(nodes, clients_per_round=2, seed=3)
    msgs = list(strategy.configure_train(1, _record(w=np.zeros(2)), ConfigRecord({"fingerprint": "abc"}), grid=None))
    expected = sample_clients(np.random.default_rng(3), 4, 2)
    assert [m.metadata.dst_node_id for m in msgs] == [nodes[p] for p in expected]
    assert [m.content.config_records["config"]["partition-id"] for m in msgs] == expected
    assert all(m.content.config_records["config"]["fingerprint"] == "abc" for m in msgs)
    assert strategy.sampled[1] == expected


def test_failed_and_malformed_replies_are_left_out_of_the_average(run_identity):
    strategy = FedAgentAvg({0: 1, 1: 2, 2: 3}, clients_per_round=3, seed=0, min_replies=1)
    global_arrays = _record(w=np.zeros(2, dtype=np.float32))
    list(strategy.configure_train(1, global_arrays, ConfigRecord(), grid=None))
    good = _reply(1, RecordDict({"arrays": _record(w=np.array([2.0, 4.0], dtype=np.float32)),
                                 "metrics": MetricRecord({"success_rate": 0.5})}))
    failed = _reply(2, error=Error(code=0, reason="client crashed"))
    malformed = _reply(3, RecordDict({"arrays": _record(w=np.array([np.nan, 1.0], dtype=np.float32))}))
    arrays, metrics = strategy.aggregate_train(1, [good, failed, malformed])
    np.testing.assert_allclose(arrays["w"].numpy(), [2.0, 4.0])
    assert metrics["replies"] == 1 and metrics["failed-replies"] == 2 and metrics["success_rate"] == 0.5
    assert any("client crashed" in f for f in strategy.failures[1])


def test_the_aggregate_does_not_depend_on_the_order_replies_arrive_in(run_identity):
    # float32 values whose float64 sum depends on the order: 1e16 + 1 - 1e16 loses the 1.
    values = {0: 1e16, 1: 1.0, 2: -1e16}
    results = set()
    for arrival in ([0, 1, 2], [2, 0, 1], [1, 2, 0]):
        strategy = FedAgentAvg({0: 10, 1: 11, 2: 12}, clients_per_round=3, seed=0)
        list(strategy.configure_train(1, _record(w=np.zeros(1, dtype=np.float32)), ConfigRecord(), grid=None))
        replies = [_reply(10 + p, RecordDict({"arrays": _record(w=np.array([values[p]], dtype=np.float32))})) for p in arrival]
        arrays, _ = strategy.aggregate_train(1, replies)
        results.add(arrays["w"].numpy().tobytes())
    assert len(results) == 1


def test_too_few_replies_keep_the_global_model(run_identity):
    strategy = FedAgentAvg({0: 1, 1: 2}, clients_per_round=2, seed=0, min_replies=2)
    list(strategy.configure_train(1, _record(w=np.zeros(1, dtype=np.float32)), ConfigRecord(), grid=None))
    good = _reply(1, RecordDict({"arrays": _record(w=np.ones(1, dtype=np.float32))}))
    arrays, metrics = strategy.aggregate_train(1, [good])
    assert arrays is None and metrics["replies"] == 1 and metrics["failed-replies"] == 1


def test_strategy_bad_arguments():
    with pytest.raises(ValueError, match="clients_per_round"):
        FedAgentAvg({0: 1, 1: 2}, clients_per_round=3)
    with pytest.raises(ValueError, match="partition-ids"):
        FedAgentAvg({0: 1, 2: 2}, clients_per_round=1)


def test_reference_sampling_draws_the_references_clients_whatever_the_run_seed():
    """round_orchestrator.py: random.seed(42 + round - 1); random.sample(range(K), M). Values for K = 100, M = 2
    from Python's random (its sample has been stable since Python 3.2)."""
    from strategies.fedagent_avg import reference_clients

    assert [reference_clients(r, 100, 2) for r in (1, 2, 3)] == [[81, 14], [4, 36], [52, 66]]
    nodes = {k: 100 + k for k in range(100)}
    for seed in (0, 1):
        strategy = FedAgentAvg(nodes, clients_per_round=2, seed=seed, client_sampling="reference")
        assert [strategy.select_clients(r) for r in (1, 2, 3)] == [[81, 14], [4, 36], [52, 66]]
    assert FedAgentAvg(nodes, clients_per_round=2, seed=0).select_clients(1) != [81, 14]  # run-seed stays the default
    with pytest.raises(ValueError, match="client_sampling"):
        FedAgentAvg(nodes, clients_per_round=2, client_sampling="python")


def test_round_metrics_are_the_clients_mean_and_a_largest_value_their_largest():
    """A round's training metrics average over the replying clients, except a `_max` key (the rollout gap's largest
    token), whose mean over clients would understate the largest any client saw."""
    from flwr.app import MetricRecord

    from strategies.fedagent_avg import merge_metrics

    merged = merge_metrics([MetricRecord({"kl": 0.1, "rollout_logprob_gap_max": 0.02}),
                            MetricRecord({"kl": 0.3, "rollout_logprob_gap_max": 0.08})], replies=2, failures=0)
    assert merged["kl"] == pytest.approx(0.2) and merged["rollout_logprob_gap_max"] == pytest.approx(0.08)
    assert (merged["replies"], merged["failed-replies"]) == (2.0, 0.0)
