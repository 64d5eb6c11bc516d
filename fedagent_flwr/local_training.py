"""A client's local work in one round, with no Flower in sight (testable on its own).

The client plays only its own partition of the training split; its tasks and
trajectories never leave this function - only the updated weights and numeric
metrics do.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np
import torch

from envs import Task, answer_token_budget, make_env
from .agent import Agent
from .assignment import learner_tasks
from .config import RunConfig
from .grpo import GRPOConfig, GRPOTrainer
from .rollout import RolloutConfig


def rollout_config(cfg: RunConfig, evaluation: bool = False) -> RolloutConfig:
    return RolloutConfig(
        history_length=cfg.history_length,
        invalid_penalty=cfg.invalid_penalty,
        max_new_tokens=cfg.max_new_tokens or answer_token_budget(cfg.env),
        temperature=cfg.eval_temperature if evaluation else cfg.temperature,
        top_p=1.0 if evaluation else cfg.top_p,
        batch_size=cfg.rollout_batch_size,
        reward=cfg.reward,
        action_matching=cfg.action_matching,
    )


def grpo_config(cfg: RunConfig) -> GRPOConfig:
    return GRPOConfig(
        group_size=cfg.group_size,
        tasks_per_epoch=cfg.tasks_per_epoch,
        learning_rate=cfg.learning_rate,
        clip_eps=cfg.clip_eps,
        kl_beta=cfg.kl_beta,
        minibatch_size=cfg.minibatch_size,
        micro_batch_size=cfg.micro_batch_size,
        max_grad_norm=cfg.max_grad_norm,
        loss_aggregation=cfg.loss_aggregation,
    )


def client_tasks(cfg: RunConfig, partition_id: int, num_partitions: int) -> list[Task]:
    """The tasks this client trains on: its partition of the training split, or the union for baseline=centralized."""
    return learner_tasks(cfg, partition_id, num_partitions)


def seed_everything(*parts: int) -> np.random.Generator:
    """A generator for task sampling, and torch's global seed for rollout sampling, from one key."""
    seq = np.random.SeedSequence([abs(int(p)) for p in parts])
    torch.manual_seed(int(seq.generate_state(1)[0]))
    return np.random.default_rng(seq)


def train_locally(agent: Agent, cfg: RunConfig, tasks: Sequence[Task], server_round: int, partition_id: int) -> dict[str, float]:
    """tau epochs of GRPO from the weights currently in `agent.model`; returns round metrics."""
    if not tasks:
        raise ValueError(f"client {partition_id} has no training tasks")
    started = time.time()
    rng = seed_everything(cfg.seed, server_round, partition_id)
    trainer = GRPOTrainer(agent.model, agent.tokenizer, grpo_config(cfg), rollout_config(cfg))
    env_factory = lambda: make_env(cfg.env, cfg.max_steps)  # noqa: E731
    epochs = [trainer.train_epoch(env_factory, tasks, rng) for _ in range(cfg.local_epochs)]
    # Rates are averaged over epochs, counts summed.
    summed = {"episodes", "tokens", "generated_tokens", "optimizer_steps", "train_samples", "rollout_seconds"}
    metrics = {}
    for key in sorted({k for e in epochs for k in e}):
        values = [e[key] for e in epochs if key in e]  # a category may be absent from an epoch
        metrics[key] = float(sum(values)) if key in summed else float(np.mean(values))
    metrics["seconds"] = time.time() - started
    return metrics
