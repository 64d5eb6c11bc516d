"""The method registry: run-config `strategy` (and `baseline`) -> the code of one seed system.

The apps look the method up here and never compare strategy names themselves; the allowed names
and what each supports are defined once, in fedagent_flwr/config/strategy_traits.py (STRATEGIES).
"""

from __future__ import annotations

from fedagent_flwr.config import RunConfig
from fedagent_flwr.config.strategy_traits import STRATEGIES
from fedagent_flwr.methods.base import Method
from fedagent_flwr.methods.baselines import Baseline
from fedagent_flwr.methods.fedagent import FedAgent
from fedagent_flwr.methods.fedrl.method import PAvgMethod, QAvgMethod
from fedagent_flwr.methods.fedse import FedSE

METHODS: dict[str, type[Method]] = {
    "fedagent-avg": FedAgent,
    "fedse-lora": FedSE,
    "qavg": QAvgMethod,
    "pavg": PAvgMethod,
}
if set(METHODS) != set(STRATEGIES):  # a name added to one place but not the other
    raise ImportError(f"config.strategy_traits.STRATEGIES {sorted(STRATEGIES)} and METHODS {sorted(METHODS)} disagree")


def method_for(cfg: RunConfig) -> Method:
    """The method a validated run config asks for (a Table 1 baseline replaces FedAgent's averaging)."""
    if cfg.baseline.name != "none":
        return Baseline(cfg)
    return METHODS[cfg.strategy](cfg)


__all__ = ["METHODS", "Method", "method_for"]
