"""A FedAgent client's local round, with no Flower in sight: tau epochs of GRPO from the weights the server sent, on
the client's partition. One process runs `local_round`; each of a client's N ranks runs `train_sent` on its model
sharded and kept between rounds (methods/ranked_round.py), and all ranks return the same full weights.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

import numpy as np
import torch
from flwr.app import ArrayRecord

from envs import Task, make_env
from fedagent_flwr.agent.models.loading import Agent, load_frozen_base
from fedagent_flwr.agent.play.seeding import seed_everything
from fedagent_flwr.agent.play.progress import ProgressLines
from fedagent_flwr.agent.training.grpo import GRPOTrainer
from fedagent_flwr.agent.fsdp.tensor_files import Streamed
from fedagent_flwr.agent.training.lora import adapter_weights, arrays_to_adapter, attached_lora
from fedagent_flwr.agent.training.weights import arrays_to_model, model_weights, streamed_record
from fedagent_flwr.config import RunConfig
from fedagent_flwr.agent.engine.placement import Placement
from fedagent_flwr.methods.library_configs import rollout_config
from fedagent_flwr.methods.placement import process_placement


def train_locally(agent: Agent, cfg: RunConfig, tasks: Sequence[Task], server_round: int, partition_id: int,
                  model: torch.nn.Module | None = None, optimizer: dict[str, np.ndarray] | None = None,
                  base_model: torch.nn.Module | None = None, placement: Placement | None = None) -> dict[str, float]:
    """tau epochs of GRPO from the weights currently in `model` (default `agent.model`; a LoRA-wrapped
    base trains its adapter only); returns round metrics. With `optimizer` (a dict, empty in the first round)
    AdamW continues from the state in it, and the state it ends in is written back. `base_model`: the frozen base
    weights a full fine-tuning's KL term anchors to with grpo.kl-reference='base'. `placement`: this client's
    (default: process_placement's, over `tasks` with `model`)."""
    if not tasks:
        raise ValueError(f"client {partition_id} has no training tasks")
    started = time.time()
    rng = seed_everything(cfg.seed, server_round, partition_id)
    model = model if model is not None else agent.model
    placement = placement or process_placement(cfg, agent, tasks, model=model)
    trainer = GRPOTrainer(model, agent.tokenizer, cfg.grpo, rollout_config(cfg, placement=placement), engine=cfg.engine,
                          placement=placement, base_model=base_model)
    if optimizer:
        trainer.load_optimizer_arrays(optimizer)
    env_factory = lambda: make_env(cfg.env, cfg.rollout.max_steps)
    epochs = [trainer.train_epoch(env_factory, tasks, rng, ProgressLines(f"client {partition_id} rollout, round {server_round}"))
              for _ in range(cfg.grpo.local_epochs)]
    if optimizer is not None:
        optimizer.clear()
        optimizer.update(trainer.optimizer_arrays())
    # Rates are averaged over epochs, counts summed.
    summed = {"episodes", "tokens", "generated_tokens", "optimizer_steps", "train_samples", "rollout_seconds"}
    metrics = {}
    for key in sorted({k for e in epochs for k in e}):
        values = [e[key] for e in epochs if key in e]  # a category may be absent from an epoch
        metrics[key] = float(sum(values)) if key in summed else float(np.mean(values))
    metrics["seconds"] = time.time() - started
    return metrics


def local_round(cfg: RunConfig, agent: Agent, sent: ArrayRecord, tasks: Sequence[Task], server_round: int,
                partition_id: int, optimizer: dict[str, np.ndarray] | None = None) -> tuple[ArrayRecord, dict[str, float]]:
    """The weights the server sent (the full model, or a LoRA adapter on the base), trained by `train_locally` in this
    process; the trained weights in the same form, and the round's metrics."""
    if cfg.grpo.finetuning == "lora":
        with attached_lora(agent.model, cfg.lora, seed=cfg.seed) as peft_model:
            return train_sent(cfg, agent, peft_model, sent, tasks, server_round, partition_id, optimizer)
    placement = process_placement(cfg, agent, tasks)
    anchor = placement.kl_reference if cfg.grpo.beta > 0 else None  # round-start: the trainer keeps its own copy
    base = load_frozen_base(cfg.model, cfg.env, cfg.device) if anchor == "base" else None
    return train_sent(cfg, agent, agent.model, sent, tasks, server_round, partition_id, optimizer, base, placement)


def train_sent(cfg: RunConfig, agent: Agent, model: torch.nn.Module, sent: ArrayRecord | Mapping[str, np.ndarray],
               tasks: Sequence[Task], server_round: int, partition_id: int, optimizer: dict[str, np.ndarray] | None = None,
               base: torch.nn.Module | None = None, placement: Placement | None = None) -> tuple[ArrayRecord, dict[str, float]]:
    """The sent weights loaded into `model` (into its adapter where it is a LoRA-wrapped base; a model sharded over
    ranks takes each rank's part), trained by `train_locally`, and read back in the same form (gathered whole; on ranks,
    kept by rank 0 alone)."""
    metrics = train_in_place(cfg, agent, model, sent, tasks, server_round, partition_id, optimizer, base, placement)
    return streamed_record(trained_weights(cfg, model)), metrics


def train_in_place(cfg: RunConfig, agent: Agent, model: torch.nn.Module, sent: ArrayRecord | Mapping[str, np.ndarray],
                   tasks: Sequence[Task], server_round: int, partition_id: int, optimizer: dict[str, np.ndarray] | None = None,
                   base: torch.nn.Module | None = None, placement: Placement | None = None) -> dict[str, float]:
    """train_sent's round, its trained weights left in `model` (a client's ranks stream them: trained_weights)."""
    arrays_to_adapter(model, sent) if cfg.grpo.finetuning == "lora" else arrays_to_model(model, sent)
    return train_locally(agent, cfg, tasks, server_round, partition_id, model=model, optimizer=optimizer,
                         base_model=base, placement=placement)


def trained_weights(cfg: RunConfig, model: torch.nn.Module) -> Streamed:
    """What a round's reply carries of `model`, the adapter alone with LoRA, gathered a tensor at a time."""
    return adapter_weights(model) if cfg.grpo.finetuning == "lora" else model_weights(model)
