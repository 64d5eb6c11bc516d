"""FedAgentAvg: FedAgent's server (Algorithm 1 of the FedAgent paper).

Each round the server samples M of the K clients uniformly without replacement,
broadcasts the global weights, and replaces them by the plain (unweighted) mean
of the returned local models: theta_{t+1} = (1/M) sum_k theta_{k,t,tau}.

Clients are identified by partition-id, not by Flower node id: node ids are
random per run, so sampling over sorted partition-ids with a seeded generator is
what makes the client sequence reproducible. A reply that failed (an error, a
timeout, missing or malformed arrays) is logged and left out; the round still
updates the model from the others as long as `min_replies` arrived.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
from flwr.app import (
    ArrayRecord,
    ConfigRecord,
    Message,
    MessageType,
    MetricRecord,
    RecordDict,
)
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from strategies.communication import CommunicationLedger, payload_bytes
from strategies.transfer import array_view, decode, encode, numpy_array
from fedagent_flwr.config.choices import CLIENT_SAMPLING, TRANSFER_DTYPES

log = logging.getLogger(__name__)


REFERENCE_SAMPLING_SEED = 42


def reference_clients(server_round: int, num_clients: int, clients_per_round: int) -> list[int]:
    """The partition-ids the reference trains in `server_round` (1-based) of K clients, M a round."""
    return random.Random(REFERENCE_SAMPLING_SEED + server_round - 1).sample(range(num_clients), clients_per_round)


def sample_clients(rng: np.random.Generator, num_clients: int, clients_per_round: int) -> list[int]:
    """M distinct partition-ids drawn uniformly from range(K), in draw order."""
    if not 0 < clients_per_round <= num_clients:
        raise ValueError(f"clients_per_round must be in [1, {num_clients}], got {clients_per_round}")
    return [int(k) for k in rng.choice(num_clients, size=clients_per_round, replace=False)]


def average_arrays(records: Sequence[ArrayRecord]) -> ArrayRecord:
    """Unweighted element-wise mean of ArrayRecords with identical keys, shapes and dtypes.

    Means are taken in float64 and cast back, so averaging bf16 or fp32 weights
    loses nothing beyond the final rounding.
    """
    if not records:
        raise ValueError("average_arrays needs at least one ArrayRecord")
    first = records[0]
    out = ArrayRecord()
    for key in first.keys():
        arrays = [array_view(r[key]) for r in records]
        ref = arrays[0]
        for a in arrays[1:]:
            if a.shape != ref.shape or a.dtype != ref.dtype:
                raise ValueError(f"array {key!r}: shapes/dtypes differ across replies ({ref.shape}/{ref.dtype} vs {a.shape}/{a.dtype})")
        if len(arrays) == 1 or ref.dtype.kind != "f":  # the mean of one reply is that reply; integers are not averaged
            out[key] = first[key]
            continue
        total = arrays[0].astype(np.float64)  # one float64 buffer per tensor, not a stack of every reply
        for a in arrays[1:]:
            total += a
        total /= len(arrays)
        out[key] = numpy_array(total.astype(ref.dtype))
    return out


def check_reply(reply: Message, expected: ArrayRecord, transfer_dtype: str = "fp32") -> ArrayRecord:
    """The reply's arrays (decoded from `transfer_dtype`) if they match the global model's keys and shapes; raises otherwise."""
    if reply.has_error():
        raise ValueError(f"client error: {reply.error.reason}")
    content = reply.content
    if "arrays" not in content.array_records:
        raise ValueError("reply carries no 'arrays' ArrayRecord")
    arrays = content.array_records["arrays"]
    if set(arrays.keys()) != set(expected.keys()):
        raise ValueError("reply's array keys differ from the global model's")
    arrays = decode(arrays, transfer_dtype, expected)
    for key in expected.keys():
        got, want = arrays[key], expected[key]
        if tuple(got.shape) != tuple(want.shape) or got.dtype != want.dtype:
            raise ValueError(f"array {key!r} has shape/dtype {got.shape}/{got.dtype}, expected {want.shape}/{want.dtype}")
        values = array_view(got)
        if values.dtype.kind == "f" and not np.isfinite(values).all():
            raise ValueError(f"array {key!r} holds NaN or inf")
    return arrays


class FedAgentAvg(Strategy):
    """Uniform client sampling by partition-id and unweighted model averaging."""

    def __init__(
        self,
        node_of_partition: Mapping[int, int],
        clients_per_round: int,
        seed: int = 0,
        min_replies: int = 1,
        transfer_dtype: str = "fp32",
        client_sampling: str = "run-seed",
    ) -> None:
        if client_sampling not in CLIENT_SAMPLING:
            raise ValueError(f"client_sampling must be one of {CLIENT_SAMPLING}, got {client_sampling!r}")
        self.client_sampling = client_sampling
        if transfer_dtype not in TRANSFER_DTYPES:
            raise ValueError(f"transfer_dtype must be one of {TRANSFER_DTYPES}, got {transfer_dtype!r}")
        self.transfer_dtype = transfer_dtype  # what weights travel in; the global model stays as it is
        self.node_of_partition = dict(node_of_partition)
        self.num_clients = len(self.node_of_partition)
        if sorted(self.node_of_partition) != list(range(self.num_clients)):
            raise ValueError(f"partition-ids must be 0..K-1, got {sorted(self.node_of_partition)}")
        if not 0 < clients_per_round <= self.num_clients:
            raise ValueError(f"clients_per_round must be in [1, {self.num_clients}], got {clients_per_round}")
        if not 0 < min_replies <= clients_per_round:
            raise ValueError(f"min_replies must be in [1, {clients_per_round}], got {min_replies}")
        self.clients_per_round = clients_per_round
        self.min_replies = min_replies
        self.rng = np.random.default_rng(seed)
        self.sampled: dict[int, list[int]] = {}  # round -> partition-ids
        self.failures: dict[int, list[str]] = {}  # round -> reasons
        self.train_metrics: dict[int, MetricRecord] = {}  # round -> aggregated client metrics
        self.client_metrics: dict[int, dict[int, dict[str, float]]] = {}  # round -> partition-id -> its own metrics
        self.comm = CommunicationLedger()  # bytes to and from clients, per round and in total
        self._global: ArrayRecord | None = None
        self._screened_out: dict[int, list[str]] = {}  # round -> failures found by screen_replies

    # ----- training ------------------------------------------------------------------------
    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid) -> Iterable[Message]:
        chosen = self.select_clients(server_round)
        self.sampled[server_round] = chosen
        self._global = arrays
        log.info("round %d: clients (partition-ids) %s", server_round, chosen)
        outgoing = encode(arrays, self.transfer_dtype)
        messages = []
        for pid in chosen:
            cfg = ConfigRecord(dict(config))
            cfg["server-round"] = server_round
            cfg["partition-id"] = pid
            content = RecordDict({"arrays": outgoing, "config": cfg})
            messages.append(Message(content=content, message_type=MessageType.TRAIN, dst_node_id=self.node_of_partition[pid]))
            self.comm.sent(server_round, outgoing)
        return messages

    def select_clients(self, server_round: int) -> list[int]:
        """Partition-ids trained this round; the Table 1 baselines (strategies/single_learner.py) fix them."""
        if self.client_sampling == "reference":
            return reference_clients(server_round, self.num_clients, self.clients_per_round)
        return sample_clients(self.rng, self.num_clients, self.clients_per_round)

    def aggregate_train(self, server_round: int, replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        good, _, merged = self.collect_replies(server_round, replies)
        if not self.enough_replies(server_round, good):
            return None, merged
        return average_arrays(good), merged

    def check_params(self, arrays: ArrayRecord, metrics: MetricRecord) -> None:
        """Strategy-specific check of a reply (raise ValueError to leave it out of the aggregate)."""

    def screen_replies(self, server_round: int, replies: Iterable[Message]) -> list[Message]:
        """The replies that pass `collect_replies`' checks; the others are recorded as that round's failures.

        For wrappers that must not see a bad reply (fedagent_flwr/privacy/differential_privacy.py).
        """
        kept, failures = [], []
        for reply in replies:
            try:
                self._checked(reply)
            except Exception as exc:  # a bad reply must not end the run
                failures.append(f"node {reply.metadata.src_node_id}: {exc}")
                continue
            kept.append(reply)
        self._screened_out[server_round] = failures
        return kept

    def _checked(self, reply: Message) -> tuple[ArrayRecord, MetricRecord]:
        arrays = check_reply(reply, self._global, self.transfer_dtype)
        m = reply.content.metric_records.get("metrics", MetricRecord())
        self.check_params(arrays, m)
        return arrays, m

    def collect_replies(self, server_round: int, replies: Iterable[Message]) -> tuple[list[ArrayRecord], list[MetricRecord], MetricRecord]:
        """The replies fit to aggregate, their metrics, and the round's merged metrics (also kept).

        A reply that failed, timed out, or does not fit the global model is logged
        and left out: one bad client must not end the run or lose the round.
        """
        good: list[ArrayRecord] = []
        metrics: list[MetricRecord] = []
        failures = self._screened_out.pop(server_round, [])  # left out earlier by screen_replies
        answered = len(failures)
        # Aggregate in partition-id order, not arrival order: a float sum over 3+ clients depends on
        # its order, and Flower delivers replies as they come (a resumed run would differ in the last bit).
        partition_of = {node: pid for pid, node in self.node_of_partition.items()}
        replies = sorted(replies, key=lambda r: partition_of.get(r.metadata.src_node_id, len(partition_of)))
        clients = self.client_metrics.setdefault(server_round, {})  # drift across clients shows here, not in the mean
        for reply in replies:
            try:
                arrays, m = self._checked(reply)
            except Exception as exc:  # a bad reply must not end the run
                failures.append(f"node {reply.metadata.src_node_id}: {exc}")
                continue
            good.append(arrays)
            metrics.append(m)
            self.comm.received(server_round, reply.content.array_records["arrays"])  # the bytes as they travelled
            own = {k: float(v) for k, v in m.items() if isinstance(v, (int, float))}
            own["comm/bytes-received"] = float(payload_bytes(reply.content.array_records["arrays"]))
            clients[partition_of.get(reply.metadata.src_node_id, -1)] = own
        missing = self.clients_per_round - len(replies) - answered
        if missing > 0:
            failures.append(f"{missing} client(s) did not reply in time")
        self.failures[server_round] = failures
        for f in failures:
            log.warning("round %d: left out of the aggregate: %s", server_round, f)
        merged = merge_metrics(metrics, len(good), len(failures))
        merged.update(self.comm.round_metrics(server_round))
        self.train_metrics[server_round] = merged
        return good, metrics, merged

    def enough_replies(self, server_round: int, good: Sequence[ArrayRecord]) -> bool:
        if len(good) >= self.min_replies:
            return True
        log.warning("round %d: %d good replies < federation.min-replies=%d; global model unchanged", server_round, len(good), self.min_replies)
        return False

    def last_train_metrics(self, server_round: int) -> dict[str, float] | None:
        record = self.train_metrics.get(server_round)
        return dict(record) if record is not None else None

    def client_train_metrics(self, server_round: int) -> dict[int, dict[str, float]]:
        """Each replying client's own metrics of `server_round` by partition-id (-1: a node outside the partition map),
        with the bytes its reply took; the replies left out of the aggregate are not among them."""
        return {pid: dict(m) for pid, m in sorted(self.client_metrics.get(server_round, {}).items())}

    # ----- evaluation happens on the server (evaluate_fn), not on clients ----------------------
    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid) -> Iterable[Message]:
        return []

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        return None

    def summary(self) -> None:
        log.info("FedAgentAvg: K=%d clients, M=%d per round, federation.min-replies=%d", self.num_clients, self.clients_per_round, self.min_replies)


def merge_metrics(metrics: Sequence[MetricRecord], replies: int, failures: int) -> MetricRecord:
    """Mean of each numeric metric over the clients that reported it (the largest for a key ending in `_max`, which
    names a largest value), plus reply counts."""
    out: dict[str, float] = {"replies": float(replies), "failed-replies": float(failures)}
    keys = sorted({k for m in metrics for k in m.keys()})
    for key in keys:
        values = [float(m[key]) for m in metrics if key in m and isinstance(m[key], (int, float))]
        if values:
            out[key] = max(values) if key.endswith("_max") else sum(values) / len(values)
    return MetricRecord(out)
