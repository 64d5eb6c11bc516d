"""Library configs and trainers of a run config for tests that build one outside a run: where a test passes no
placement, one is built here, on this machine with no model or memory plan (methods/placement.place_run). A run's
process builds its placement once and passes it on; methods/library_configs.py takes it and builds none of its own."""

from __future__ import annotations

from fedagent_flwr.agent.engine.passes import PassSwitches
from fedagent_flwr.agent.engine.placement import Placement
from fedagent_flwr.agent.training.grpo import GRPOTrainer
from fedagent_flwr.config import RunConfig
from fedagent_flwr.methods import library_configs
from fedagent_flwr.methods.placement import place_run


def rollout_config(cfg: RunConfig, evaluation: bool = False, placement: Placement | None = None):
    placement = placement or place_run(cfg, "server" if evaluation else "client")
    return library_configs.rollout_config(cfg, evaluation, placement=placement)


def grpo_trainer(model, tokenizer, cfg: RunConfig, rollout, placement: Placement | None = None, base_model=None,
                 **switches) -> GRPOTrainer:
    """GRPOTrainer on `cfg`'s grpo and engine sections; `switches`: PassSwitches' fields."""
    return GRPOTrainer(model, tokenizer, cfg.grpo, rollout, engine=cfg.engine, placement=placement or place_run(cfg),
                       base_model=base_model, switches=PassSwitches(**switches))

