"""Round logic shared by QAvg and PAvg (Jin et al.): E local updates, then average, or E = inf.

Finite E: each round the server picks the clients (all of them, as in the
paper, or a seeded sample of M), fixes the round's E step sizes (the step-size
rule is driven by the objectives the clients reported in earlier rounds, as in
fedrl.tabular.run_federated), sends the global parameters, and averages the
parameters that come back, ordered by partition-id so the float sums match the
vectorised engine's.

E = inf (``local_steps=None``, the paper's independent baseline): clients never
receive a model after round 1. Each keeps its own parameters and step-size state
across rounds and runs ``independent_steps`` local updates per round; it returns
its parameters only so the server can score their average (the model the
baseline reports). Nothing the server computes flows back into training.

Sampling, messages, reply checks and metric merging are FedAgentAvg's: this class sets its keys on
the round's config and calls its parent, as Flower's own FedProx does.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid

from strategies.fedagent_avg import FedAgentAvg, average_arrays

log = logging.getLogger(__name__)

START_OBJECTIVE = "start-objective"  # the client's d0 . V of the parameters it was sent


def reject_private_arrays(arrays: ArrayRecord) -> None:
    """Raise on a reply carrying a private environment embedding (Per*Avg keeps it on the client) or a non-float array."""
    for key in arrays.keys():
        if "embedding" in key:
            raise ValueError(f"reply carries a private environment embedding ({key!r}); it must stay on the client")
        if not np.issubdtype(arrays[key].numpy().dtype, np.floating):
            raise ValueError(f"array {key!r} is not floating point")


class FedRLAvg(FedAgentAvg):
    """Parameter averaging after E local updates; subclasses name the algorithm the clients run."""

    algorithm = ""  # fedrl algorithm key the clients run, told to them in every message

    def __init__(
        self,
        node_of_partition: Mapping[int, int],
        local_steps: int | None,
        clients_per_round: int | None = None,
        seed: int = 0,
        min_replies: int = 1,
        step_size=None,
        gamma: float | None = None,
        independent_steps: int = 8,
    ) -> None:
        num_clients = len(node_of_partition)
        if local_steps is not None and (isinstance(local_steps, bool) or not isinstance(local_steps, int) or local_steps < 1):
            raise ValueError(f"local_steps (E) must be an integer >= 1, or None for E = inf, got {local_steps!r}")
        if local_steps is None and clients_per_round not in (None, num_clients):
            raise ValueError(f"with E = inf every client trains every round; clients_per_round must be None or {num_clients}, got {clients_per_round}")
        if not isinstance(independent_steps, int) or independent_steps < 1:
            raise ValueError(f"independent_steps must be an integer >= 1, got {independent_steps!r}")
        if step_size is not None and gamma is None:
            raise ValueError("a step-size rule needs the discount gamma")
        self.sample_all = clients_per_round is None
        super().__init__(node_of_partition, num_clients if self.sample_all else clients_per_round, seed, min(min_replies, num_clients))
        self.local_steps = local_steps
        self.step_size = step_size
        self.gamma = gamma
        self.independent_steps = independent_steps
        self.partition_of_node = {n: p for p, n in self.node_of_partition.items()}
        self.reported: list[float] = []  # mean start objective per round (drives the stall-decay rule)
        self.step_sizes: dict[int, list[float]] = {}  # round -> the E step sizes sent
        self._state = step_size.initial_state(()) if step_size is not None else None
        self._template: ArrayRecord | None = None  # keys and shapes of the model, for E = inf reply checks

    # ----- training ------------------------------------------------------------------------
    def select_clients(self, server_round: int) -> list[int]:
        """All clients (the paper), in partition order, or a seeded sample of M."""
        return list(range(self.num_clients)) if self.sample_all else super().select_clients(server_round)

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid) -> Iterable[Message]:
        if self._template is None:
            self._template = arrays
        independent = self.local_steps is None
        steps = self.independent_steps if independent else self.local_steps
        config = ConfigRecord(dict(config))
        config["algorithm"] = self.algorithm
        config["local-steps"] = steps
        config["first-step"] = (server_round - 1) * steps  # global local-step index t of the first update
        config["independent"] = independent
        if self.step_size is not None and not independent:
            self._state = self.step_size.next_state(self._state, self.reported)
            etas = [float(x) for x in self.step_size.step_sizes(self._state, (server_round - 1) * steps, steps, self.gamma, steps)]
            self.step_sizes[server_round] = etas
            config["step-sizes"] = etas
        log.info("round %d: %s", server_round, f"E = inf, {steps} local updates" if independent else f"E = {steps}")
        # E = inf: only round 1 carries the (common) initial model; later rounds carry none
        outgoing = ArrayRecord() if independent and server_round > 1 else arrays
        messages = super().configure_train(server_round, outgoing, config, grid)
        if independent:
            self._global = self._template  # replies are checked against the model's keys and shapes
        return messages

    def aggregate_train(self, server_round: int, replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        # partition-id order: the same summation order as fedrl's engine, whatever order replies arrive in
        replies = sorted(replies, key=lambda r: self.partition_of_node.get(r.metadata.src_node_id, self.num_clients))
        good, _, merged = self.collect_replies(server_round, replies)
        if START_OBJECTIVE in merged and self.local_steps is not None:
            self.reported.append(float(merged[START_OBJECTIVE]))  # mean over the clients that replied
        if not self.enough_replies(server_round, good):
            return None, merged
        return average_arrays(good), merged

    def summary(self) -> None:
        E = "inf" if self.local_steps is None else self.local_steps
        who = "all" if self.sample_all else f"{self.clients_per_round} sampled"
        log.info("%s: K=%d clients (%s per round), E=%s", type(self).__name__, self.num_clients, who, E)
