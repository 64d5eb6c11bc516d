"""SingleLearner: the Table 1 baselines (Centralized, Local(k)) as a Flower strategy.

One fixed partition-id trains every round and its weights become the global
model: FedAgentAvg with the sampling replaced by that learner and the average
taken over its single reply (the float64 mean of one model is the model). So a
baseline keeps FedAgent's rounds, local epochs, evaluation hook, checkpoints and
failure handling; which tasks the learner plays is decided on the client
(fedagent_flwr/methods/tasks.py: the union of all partitions for Centralized).
"""

from __future__ import annotations

from collections.abc import Mapping

from strategies.fedagent_avg import FedAgentAvg


class SingleLearner(FedAgentAvg):
    def __init__(self, node_of_partition: Mapping[int, int], learner: int, seed: int = 0, transfer_dtype: str = "fp32") -> None:
        super().__init__(node_of_partition, clients_per_round=1, seed=seed, min_replies=1, transfer_dtype=transfer_dtype)
        if not 0 <= learner < self.num_clients:
            raise ValueError(f"the learner's partition-id must be in [0, {self.num_clients}), got {learner}")
        self.learner = learner

    def select_clients(self, server_round: int) -> list[int]:
        return [self.learner]
