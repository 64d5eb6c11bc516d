"""Secure aggregation (SecAgg+) with Flower's own protocol: `privacy.secure-aggregation = true`.

The server learns only the mean of the sampled clients' weights, never one client's.
Flower 1.41 implements SecAgg+ as a workflow of its legacy API
(`SecAggPlusWorkflow` inside `DefaultWorkflow`, driven through a `LegacyContext`
and a legacy `flwr.server.strategy.Strategy`), not for the message-API strategies
the rest of this app uses. This module is the bridge, both ways:

- server: `SecureFedAgentAvg` is a legacy strategy around a `FedAgentAvg`, so the
  partition-id sampling (and its seeded sequence), the failure bookkeeping and the
  evaluation/reporting callback are the same as in a plain run;
- client: `secure_aggregation_mod` runs Flower's `secaggplus_mod` on the protocol's
  messages, and `as_plain_train_message` / `as_fit_reply` translate the legacy
  fit message to the app's own train message and back. The legacy format has no
  array names, so the order of the global model's state dict names them.

Every client reports weight 1 (`num_examples`), so the protocol's weighted mean is
FedAgentAvg's unweighted mean. SecAgg+ works on integers: each weight is clipped to
[-secagg-clipping-range, privacy.secagg-clipping-range] and quantized to 2**22 levels, so the
mean differs from the exact one by at most about 2 x range / 2**22 (4e-6 at range 8).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np
from flwr.app import (
    Array,
    ArrayRecord,
    ConfigRecord,
    Context,
    Message,
    MessageType,
    MetricRecord,
)
from flwr.client.mod import secaggplus_mod
from flwr.common import (
    Code,
    FitIns,
    FitRes,
    Parameters,
    Status,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS
from flwr.compat.common import recorddict_compat as compat
from flwr.server import ServerConfig
from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.server.compat import LegacyContext
from flwr.server.strategy import Strategy as LegacyStrategy
from flwr.server.workflow import DefaultWorkflow, SecAggPlusWorkflow
from flwr.serverapp import Grid

from strategies.fedagent_avg import FedAgentAvg, merge_metrics

log = logging.getLogger(__name__)


# ----- server -------------------------------------------------------------------------------------
class SecureFedAgentAvg(LegacyStrategy):
    """FedAgentAvg's sampling and bookkeeping as a legacy strategy, for Flower's SecAgg+ workflow."""

    def __init__(self, inner: FedAgentAvg, initial_arrays: ArrayRecord, train_config: ConfigRecord,
                 evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None]) -> None:
        self.inner = inner
        self.template = initial_arrays  # names, shapes and dtypes of the global model, in order
        self.train_config = dict(train_config)
        self.evaluate_fn = evaluate_fn

    def __getattr__(self, name: str):  # the server reads sampled/failures/metrics of the inner strategy
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    def named(self, parameters: Parameters) -> ArrayRecord:
        return named_arrays(parameters_to_ndarrays(parameters), self.template)

    def initialize_parameters(self, client_manager: ClientManager) -> Parameters | None:
        return ndarrays_to_parameters([self.template[k].numpy() for k in self.template.keys()])

    def configure_fit(self, server_round: int, parameters: Parameters, client_manager: ClientManager) -> list[tuple[ClientProxy, FitIns]]:
        proxies = {proxy.node_id: proxy for proxy in client_manager.all().values()}
        chosen = self.inner.select_clients(server_round)
        self.inner.sampled[server_round] = chosen
        log.info("round %d: clients (partition-ids) %s (secure aggregation)", server_round, chosen)
        out = []
        for pid in chosen:
            config = self.train_config | {"server-round": server_round, "partition-id": pid}
            out.append((proxies[self.inner.node_of_partition[pid]], FitIns(parameters, config)))
        return out

    def aggregate_fit(self, server_round: int, results: list[tuple[ClientProxy, FitRes]], failures: list) -> tuple[Parameters | None, dict]:
        # The workflow hands every result the same (already averaged) parameters: no client's own weights.
        metrics = [MetricRecord({k: v for k, v in res.metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)})
                   for _, res in results]
        reasons = [f"{f}" for f in failures]
        missing = len(self.inner.sampled.get(server_round, [])) - len(results) - len(failures)
        if missing > 0:
            reasons.append(f"{missing} client(s) dropped out of the protocol")
        self.inner.failures[server_round] = reasons
        merged = merge_metrics(metrics, len(results), len(reasons))
        self.inner.train_metrics[server_round] = merged
        if len(results) < self.inner.min_replies or not results:
            log.warning("round %d: %d replies < federation.min-replies=%d; global model unchanged", server_round, len(results), self.inner.min_replies)
            return None, dict(merged)
        return results[0][1].parameters, dict(merged)

    def configure_evaluate(self, server_round: int, parameters: Parameters, client_manager: ClientManager) -> list:
        return []  # evaluation runs on the server (evaluate)

    def aggregate_evaluate(self, server_round: int, results: list, failures: list) -> tuple[float | None, dict]:
        return None, {}

    def evaluate(self, server_round: int, parameters: Parameters) -> tuple[float, dict] | None:
        metrics = self.evaluate_fn(server_round, self.named(parameters))
        return (0.0, dict(metrics)) if metrics else None


def named_arrays(ndarrays: list[np.ndarray], template: ArrayRecord) -> ArrayRecord:
    """Positional legacy arrays back into a named ArrayRecord shaped and typed like `template`."""
    keys = list(template.keys())
    if len(ndarrays) != len(keys):
        raise ValueError(f"got {len(ndarrays)} arrays, the model has {len(keys)}")
    out = ArrayRecord()
    for key, values in zip(keys, ndarrays):
        want = template[key].numpy()
        values = np.asarray(values).reshape(want.shape)
        if want.dtype.kind in "iub":
            values = np.rint(values)  # quantization noise on integer buffers
        out[key] = Array(np.ascontiguousarray(values.astype(want.dtype)))
    return out


def run_secure_rounds(grid: Grid, context: Context, strategy: SecureFedAgentAvg, num_rounds: int, timeout: float,
                      shares_fraction: float, threshold_fraction: float, clipping_range: float) -> None:
    """All rounds through Flower's DefaultWorkflow with SecAgg+ as its fit step."""
    legacy = LegacyContext(context, config=ServerConfig(num_rounds=num_rounds, round_timeout=timeout), strategy=strategy)
    workflow = DefaultWorkflow(fit_workflow=SecAggPlusWorkflow(
        num_shares=shares_fraction, reconstruction_threshold=threshold_fraction, clipping_range=clipping_range,
        # Weights are scaled by num_examples / max_weight before quantization; every client sends
        # weight 1, and Flower's default max_weight (1000) would cost three decimal digits.
        max_weight=1.0, timeout=timeout,
    ))
    workflow(grid, legacy)


# ----- client -------------------------------------------------------------------------------------
def is_secure_fit(msg: Message) -> bool:
    return msg.metadata.message_type == MessageType.TRAIN and RECORD_KEY_CONFIGS in msg.content.config_records


def secure_aggregation_mod(msg: Message, context: Context, call_next) -> Message:
    """ClientApp mod: Flower's `secaggplus_mod` on SecAgg+ protocol messages, the rest untouched."""
    if is_secure_fit(msg):
        return secaggplus_mod(msg, context, call_next)
    return call_next(msg, context)


def as_plain_train_message(msg: Message, template: ArrayRecord) -> None:
    """Adds the app's own `arrays` and `config` records to a legacy fit message (in place)."""
    fitins = compat.recorddict_to_fitins(msg.content, keep_input=True)
    msg.content["arrays"] = named_arrays(parameters_to_ndarrays(fitins.parameters), template)
    msg.content["config"] = ConfigRecord(dict(fitins.config))


def as_fit_reply(reply: Message) -> Message:
    """The app's train reply re-expressed as a legacy FitRes with weight 1 (so the mean is unweighted)."""
    if reply.has_error():
        return reply
    arrays = reply.content.array_records["arrays"]
    metrics = dict(reply.content.metric_records.get("metrics", MetricRecord()))
    fitres = FitRes(status=Status(Code.OK, "ok"), num_examples=1, metrics=metrics,
                    parameters=ndarrays_to_parameters([arrays[k].numpy() for k in arrays.keys()]))
    reply.content = compat.fitres_to_recorddict(fitres, keep_input=True)
    return reply

