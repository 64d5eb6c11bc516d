"""SecAgg+ bridge (fedagent_flwr/privacy/secure_aggregation.py): sampling, translation both ways, and a real run.

The real runs are slow (two simulations): python -m pytest -q -m slow tests/test_secure_aggregation.py
"""

import glob

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.common import Code, FitIns, FitRes, Status, ndarrays_to_parameters, parameters_to_ndarrays
from flwr.compat.common import recorddict_compat as compat
from safetensors.numpy import load_file

from fedagent_flwr.config import RunConfig
from fedagent_flwr.privacy.secure_aggregation import SecureFedAgentAvg, as_fit_reply, as_plain_train_message, named_arrays
from simulate import simulate
from strategies import FedAgentAvg


def _template():
    return ArrayRecord({"w": Array(np.arange(6, dtype=np.float32).reshape(2, 3)), "n": Array(np.array([1, 2], dtype=np.int64))})


class _Proxy:
    def __init__(self, node_id):
        self.node_id = node_id


class _Manager:
    def __init__(self, node_ids):
        self.proxies = {str(n): _Proxy(n) for n in node_ids}

    def all(self):
        return self.proxies


def test_named_arrays_restores_names_shapes_and_dtypes_from_the_model():
    flat = [np.arange(6, dtype=np.float64) + 1e-7, np.array([1.0000003, 2.0])]
    got = named_arrays(flat, _template())
    assert list(got.keys()) == ["w", "n"]
    assert got["w"].numpy().shape == (2, 3) and got["w"].numpy().dtype == np.float32
    np.testing.assert_array_equal(got["n"].numpy(), [1, 2])  # quantization noise on an integer buffer is rounded off
    with pytest.raises(ValueError, match="got 1 arrays, the model has 2"):
        named_arrays(flat[:1], _template())


def test_the_secure_strategy_samples_the_same_partitions_as_fedagent_avg():
    nodes = {k: 100 + k for k in range(5)}
    plain = FedAgentAvg(nodes, clients_per_round=3, seed=7)
    want = [plain.select_clients(r) for r in range(1, 5)]

    secure = SecureFedAgentAvg(FedAgentAvg(nodes, clients_per_round=3, seed=7), _template(),
                               ConfigRecord({"fingerprint": "abc"}), evaluate_fn=lambda r, a: None)
    params = secure.initialize_parameters(None)
    for r in range(1, 5):
        pairs = secure.configure_fit(r, params, _Manager(nodes.values()))
        assert [cfg.config["partition-id"] for _, cfg in pairs] == want[r - 1]
        assert [proxy.node_id for proxy, _ in pairs] == [nodes[p] for p in want[r - 1]]
        assert all(cfg.config["server-round"] == r and cfg.config["fingerprint"] == "abc" for _, cfg in pairs)
    assert secure.sampled == dict(zip(range(1, 5), want))


def test_aggregate_fit_passes_the_protocols_mean_and_records_metrics_and_drop_outs():
    nodes = {k: 100 + k for k in range(3)}
    seen = []
    secure = SecureFedAgentAvg(FedAgentAvg(nodes, clients_per_round=3, seed=0, min_replies=2), _template(), ConfigRecord(),
                               evaluate_fn=lambda r, a: seen.append((r, a)) or MetricRecord({"success_rate": 0.5}))
    secure.configure_fit(1, secure.initialize_parameters(None), _Manager(nodes.values()))
    mean = ndarrays_to_parameters([np.full((2, 3), 0.5, dtype=np.float32), np.array([1, 2])])
    results = [(_Proxy(100 + k), FitRes(Status(Code.OK, ""), mean, 1, {"success_rate": s})) for k, s in ((0, 0.2), (1, 0.4))]
    params, metrics = secure.aggregate_fit(1, results, failures=[])
    assert params is mean and metrics["replies"] == 2.0 and abs(metrics["success_rate"] - 0.3) < 1e-12
    assert secure.failures[1] == ["1 client(s) dropped out of the protocol"]
    assert secure.aggregate_fit(1, results[:1], failures=[])[0] is None  # below federation.min-replies: model unchanged
    loss, evaluated = secure.evaluate(1, mean)
    assert evaluated == {"success_rate": 0.5} and list(seen[0][1].keys()) == ["w", "n"]


def test_a_legacy_fit_message_becomes_the_apps_train_message_and_its_reply_a_fit_reply(run_identity):
    fitins = FitIns(ndarrays_to_parameters([np.ones((2, 3), dtype=np.float32), np.array([1, 2])]),
                    {"server-round": 3, "partition-id": 1, "fingerprint": "abc"})
    msg = Message(compat.fitins_to_recorddict(fitins, keep_input=True), dst_node_id=0, message_type=MessageType.TRAIN)
    as_plain_train_message(msg, _template())
    assert msg.content.config_records["config"]["partition-id"] == 1
    np.testing.assert_array_equal(msg.content.array_records["arrays"]["w"].numpy(), np.ones((2, 3)))

    trained = ArrayRecord({"w": Array(np.full((2, 3), 2.0, dtype=np.float32)), "n": Array(np.array([1, 2]))})
    reply = as_fit_reply(Message(RecordDict({"arrays": trained, "metrics": MetricRecord({"success_rate": 0.25})}), reply_to=msg))
    fitres = compat.recorddict_to_fitres(reply.content, keep_input=True)
    assert fitres.num_examples == 1 and fitres.metrics == {"success_rate": 0.25}  # weight 1: an unweighted mean
    np.testing.assert_array_equal(parameters_to_ndarrays(fitres.parameters)[0], np.full((2, 3), 2.0))


def test_secure_aggregation_is_refused_where_it_does_not_apply():
    for extra, key in (({"clients-per-round": 1}, "clients-per-round"), ({"privacy.dp-mode": "server-side"}, "privacy.dp-mode"),
                       ({"strategy": "fedse-lora"}, "strategy"), ({"baseline.name": "centralized"}, "baseline.name")):
        with pytest.raises(ValueError, match=f"{key}=.*privacy.secure-aggregation=true"):
            RunConfig.from_run_config({"privacy.secure-aggregation": True} | extra)
    with pytest.raises(ValueError, match="privacy.secagg-threshold-fraction=0.0"):
        RunConfig.from_run_config({"privacy.secagg-threshold-fraction": 0.0})


@pytest.mark.slow
def test_a_real_secure_run_gives_the_plain_runs_mean_up_to_quantization(tmp_path):
    out = tmp_path / "runs"
    common = ("--num-clients", "3", "--clients-per-round", "3", "--num-server-rounds", "1", "--eval-tasks", "2")
    for name, extra in (("plain", ()), ("secure", ("--secure-aggregation", "true"))):
        proc, log = simulate(tmp_path, out, name, *common, *extra)
        assert proc.returncode == 0, log
    plain = load_file(glob.glob(str(out / "plain" / "checkpoints" / "round-0001" / "*.safetensors"))[0])
    secure = load_file(glob.glob(str(out / "secure" / "checkpoints" / "round-0001" / "*.safetensors"))[0])
    assert plain.keys() == secure.keys()
    # Same seeds, so the same three local models: SecAgg+ may differ only by its quantization,
    # at most 2 x 8 / 2**22 (about 4e-6) per weight; a wrong weighting or key order is far larger.
    worst = max(float(np.abs(plain[k] - secure[k]).max()) for k in plain)
    assert worst < 1e-5
    assert max(float(np.abs(plain[k]).max()) for k in plain) > 0.1
