"""FedAgent's Table 1 baselines: Centralized and Local(k), as methods (run-config `baseline`).

One learner trains every round and its weights become the global model (strategies/single_learner.py),
so a baseline keeps FedAgent's rounds, local epochs, evaluation, checkpoints and failure handling.
Which tasks the learner plays is decided on the client (methods/tasks.py): the union of all K
partitions for Centralized, partition baseline.local-client's own for Local(k).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from flwr.app import Context
from flwr.serverapp.strategy import Strategy

from fedagent_flwr.methods.fedagent import OPTIMIZER_STATE, FedAgent
from fedagent_flwr.methods.tasks import baseline_learner
from strategies.single_learner import SingleLearner


class Baseline(FedAgent):
    """FedAgent's client work and evaluation; the strategy trains one fixed learner per round."""

    def make_strategy(self, node_of_partition: Mapping[int, int]) -> Strategy:
        return SingleLearner(node_of_partition, learner=baseline_learner(self.cfg), seed=self.cfg.seed,
                             transfer_dtype=self.cfg.federation.transfer_dtype)

    def carried_optimizer(self, context: Context) -> dict[str, np.ndarray] | None:
        """One learner trains on through the rounds, so with baseline.optimizer='keep' its AdamW moments carry
        over (Flower keeps the node's context.state between rounds); 'reset' starts each round afresh."""
        if self.cfg.baseline.optimizer != "keep":
            return None
        kept = context.state.array_records.get(OPTIMIZER_STATE)
        return {k: kept[k].numpy() for k in kept} if kept is not None else {}
