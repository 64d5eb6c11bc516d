"""Evaluation of a policy on a set of tasks: success overall, per task category and per environment."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Sequence

import torch

from envs import Task, TextEnv
from fedagent_flwr.agent.play.multi_env import per_env_summary
from fedagent_flwr.agent.engine.precision import autocast, model_device
from fedagent_flwr.agent.play.progress import ProgressLines
from fedagent_flwr.agent.play.rollout import (
    LMPolicy,
    Policy,
    PromptEncoder,
    RolloutConfig,
    Trajectory,
    run_episodes,
)


def summarize(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """Success rate, mean reward, task score (where the env has one) and episode statistics, overall and per category.

    Keys are flat (`success_rate`, `success_rate/<category>`, ...) so they fit a
    Flower MetricRecord and a CSV row as they are.
    """
    if not trajectories:
        raise ValueError("summarize needs at least one trajectory")
    n = len(trajectories)
    out = {
        "success_rate": sum(t.won for t in trajectories) / n,
        "mean_reward": sum(t.reward for t in trajectories) / n,
        "mean_env_return": sum(t.env_return for t in trajectories) / n,
        "mean_steps": sum(len(t.steps) for t in trajectories) / n,
        "invalid_action_rate": sum(t.num_invalid for t in trajectories) / max(1, sum(len(t.steps) for t in trajectories)),
        "episodes": float(n),
    }
    by_category: dict[str, list[Trajectory]] = defaultdict(list)
    for t in trajectories:
        by_category[t.task.category].append(t)
    for category, group in sorted(by_category.items()):
        out[f"success_rate/{category}"] = sum(t.won for t in group) / len(group)
    scored = [t for t in trajectories if t.score is not None]
    if scored:  # environments with a task score of their own (WebShop): its mean, overall and per category
        out["mean_score"] = sum(t.score for t in scored) / len(scored)
        for category in sorted({t.task.category for t in scored}):
            group = [t.score for t in scored if t.task.category == category]
            out[f"mean_score/{category}"] = sum(group) / len(group)
    out.update(per_env_summary(trajectories))
    return out


def play(
    policy: Policy,
    env_factory: Callable[[], TextEnv],
    tasks: Sequence[Task],
    encoder: PromptEncoder,
    config: RolloutConfig,
    samples_per_task: int = 1,
    progress: bool | str | ProgressLines = False,
) -> list[Trajectory]:
    """The episodes of every task played `samples_per_task` times (kept, e.g. for transcripts)."""
    if samples_per_task <= 0:
        raise ValueError(f"samples_per_task must be positive, got {samples_per_task}")
    episodes = [t for t in tasks for _ in range(samples_per_task)]
    return run_episodes(policy, env_factory, episodes, encoder, config, progress=progress)


def evaluation_seed(run_seed: int) -> int:
    """The torch seed every held-out evaluation of a run with this seed starts from (apart from the training
    rollouts' streams); `python -m fedagent_flwr.evaluation --seed S` uses it too, so it replays a run's numbers."""
    return run_seed + 1_000_003


class GlobalEvaluator:
    """Evaluates the global model on the held-out tasks with a fixed seed per round.

    The same seed at every evaluation means differences between rounds come from
    the weights, not from the sampling noise of different random streams.
    """

    def __init__(self, model, tokenizer, env_factory: Callable[[], TextEnv], tasks: Sequence[Task],
                 config: RolloutConfig, samples_per_task: int, seed: int, precision: str = "fp32") -> None:
        if not tasks:
            raise ValueError("no held-out tasks to evaluate on")
        self.policy = LMPolicy(model, tokenizer, config)
        self.encoder = PromptEncoder(tokenizer)
        self.env_factory = env_factory
        self.tasks = list(tasks)
        self.config = config
        self.samples_per_task = samples_per_task
        self.seed = seed
        self.precision = precision  # resolved: fp32 or bf16-mixed (agent/engine/precision.py)
        self.device = model_device(model)
        self.last_trajectories: list[Trajectory] = []  # the latest evaluation's episodes (for transcripts)

    def evaluate(self, server_round: int) -> dict[str, float]:
        started = time.time()
        with torch.random.fork_rng(devices=[]), autocast(self.precision, self.device):
            torch.manual_seed(evaluation_seed(self.seed))
            # Progress lines, not a bar (a bar streamed through Flower's log stays half-drawn), and only past a minute
            self.last_trajectories = play(self.policy, self.env_factory, self.tasks, self.encoder, self.config,
                                          self.samples_per_task, progress=ProgressLines("held-out evaluation"))
        metrics = summarize(self.last_trajectories)
        metrics["seconds"] = time.time() - started
        return metrics
