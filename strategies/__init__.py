"""Server strategies, one module per aggregation rule (as Flower's flwr/serverapp/strategy/).

Which strategy a run uses is decided by its method (fedagent_flwr/methods/), not here.
"""

from __future__ import annotations

from .fedagent_avg import FedAgentAvg, average_arrays, sample_clients
from .fedse_lora import FedSELoRA
from .pavg import PAvg
from .qavg import QAvg
from .single_learner import SingleLearner

__all__ = ["FedAgentAvg", "FedSELoRA", "PAvg", "QAvg", "SingleLearner", "average_arrays", "sample_clients"]
