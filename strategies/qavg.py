"""QAvg (Jin et al., Algorithm 1): average Q functions after E local Q-updates.

Tabular: the clients send Q tables ("params", shape (S, A)), each after E steps
Q <- (1 - eta_t) Q + eta_t T_k Q on its own kernel P_k; the global policy is
greedy in the averaged Q. Deep (DQNAvg): the same round with Q-network
weights, each client training E episodes of DQN; a personalised client keeps its
environment embedding to itself, so it never appears in a reply.
"""

from __future__ import annotations

from flwr.app import ArrayRecord, MetricRecord

from strategies.fedrl_avg import FedRLAvg, reject_private_arrays


class QAvg(FedRLAvg):
    """Averages Q tables (or Q-network weights) after E local updates; E = inf is the independent baseline."""

    algorithm = "qavg"

    def check_params(self, arrays: ArrayRecord, metrics: MetricRecord) -> None:
        reject_private_arrays(arrays)
