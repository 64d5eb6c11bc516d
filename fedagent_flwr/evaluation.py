"""Evaluation of a policy on a set of tasks: success overall, per task category and per environment."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Sequence

import torch

from envs import Task, TextEnv

from .multi_env import per_env_summary

from .rollout import LMPolicy, Policy, PromptEncoder, RolloutConfig, Trajectory, run_episodes


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


def evaluate(
    policy: Policy,
    env_factory: Callable[[], TextEnv],
    tasks: Sequence[Task],
    encoder: PromptEncoder,
    config: RolloutConfig,
    samples_per_task: int = 1,
    progress: bool | str = False,
) -> dict[str, float]:
    """Play every task `samples_per_task` times and summarize."""
    if samples_per_task <= 0:
        raise ValueError(f"samples_per_task must be positive, got {samples_per_task}")
    episodes = [t for t in tasks for _ in range(samples_per_task)]
    return summarize(run_episodes(policy, env_factory, episodes, encoder, config, progress=progress))


class GlobalEvaluator:
    """Evaluates the global model on the held-out tasks with a fixed seed per round.

    The same seed at every evaluation means differences between rounds come from
    the weights, not from the sampling noise of different random streams.
    """

    def __init__(self, model, tokenizer, env_factory: Callable[[], TextEnv], tasks: Sequence[Task],
                 config: RolloutConfig, samples_per_task: int, seed: int) -> None:
        if not tasks:
            raise ValueError("no held-out tasks to evaluate on")
        self.policy = LMPolicy(model, tokenizer, config)
        self.encoder = PromptEncoder(tokenizer)
        self.env_factory = env_factory
        self.tasks = list(tasks)
        self.config = config
        self.samples_per_task = samples_per_task
        self.seed = seed

    def evaluate(self, server_round: int) -> dict[str, float]:
        started = time.time()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed + 1_000_003)
            metrics = evaluate(self.policy, self.env_factory, self.tasks, self.encoder, self.config,
                               self.samples_per_task, progress=f"eval round {server_round}")
        metrics["seconds"] = time.time() - started
        return metrics


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m fedagent_flwr.evaluation`: a model's held-out play, as the server's evaluation does it."""
    import argparse
    import json

    from envs import answer_token_budget, make_env
    from envs.multi import per_env_spread

    from .action_matching import ACTION_MATCHING
    from .agent import load_agent

    p = argparse.ArgumentParser(prog="python -m fedagent_flwr.evaluation", description=main.__doc__)
    p.add_argument("--model", default="tiny", help="'tiny', a Hugging Face name or a local folder (e.g. a run's checkpoint)")
    p.add_argument("--env", default="maze")
    p.add_argument("--tasks", type=int, default=0, help="evenly spaced held-out tasks per environment; 0 = all")
    p.add_argument("--samples-per-task", type=int, default=1)
    p.add_argument("--temperature", type=float, default=1.0, help="0 = greedy")
    p.add_argument("--action-matching", choices=ACTION_MATCHING, default="exact")
    p.add_argument("--history-length", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    if args.tasks < 0 or args.samples_per_task < 1 or args.temperature < 0 or args.history_length < 0:
        p.error("--tasks must be >= 0, --samples-per-task >= 1, --temperature and --history-length >= 0")
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    agent = load_agent(args.model, args.env, "cpu")
    tasks = per_env_spread(make_env(args.env).tasks_of_split("test"), args.tasks)
    config = RolloutConfig(history_length=args.history_length, max_new_tokens=answer_token_budget(args.env),
                           temperature=args.temperature, action_matching=args.action_matching)
    metrics = evaluate(LMPolicy(agent.model, agent.tokenizer, config), lambda: make_env(args.env), tasks,
                       PromptEncoder(agent.tokenizer), config, args.samples_per_task)
    print(json.dumps({k: round(v, 4) for k, v in metrics.items()}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
