"""The run configuration, at the bottom of the package: every run-config key declared once (its type, default, help
and what it allows), in dotted sections, with the checks that need nothing but the values themselves.

It imports no torch and no other module of the project (tests/app/test_layers.py), so every layer may import it and
parsing a config is quick. What a config needs of the machine it runs on (installed packages, files and folders,
registered environments, loadable models, split sizes) is checked once at start-up by runs/preflight.py; what each
`auto` becomes, by the placement (agent/engine/placement.py, methods/placement.py).
"""

from fedagent_flwr.config.renames import RENAMED, current_keys
from fedagent_flwr.config.run_config import (
    SECTIONS, BaselineSection, ConfigError, EngineSection, EvalSection, FederationSection, FedRLSection, FedSESection,
    GRPOSection, LoRASection, PartitionSection, PrivacySection, ResilienceSection, RolloutSection, RunConfig, Section,
    invalid,
)

__all__ = [
    "RENAMED", "SECTIONS", "BaselineSection", "ConfigError", "EngineSection", "EvalSection", "FedRLSection",
    "FedSESection", "FederationSection", "GRPOSection", "LoRASection", "PartitionSection", "PrivacySection",
    "ResilienceSection", "RolloutSection", "RunConfig", "Section", "current_keys", "invalid",
]
