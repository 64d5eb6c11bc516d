"""Success labels of a task pool: did a checkpoint solve each task? (input of HardnessPartition)

    python -m fedagent_flwr.experiments.success_labels --env maze --model tiny --out labels.json
    python -m fedagent_flwr.experiments.success_labels --env maze --model runs/x/checkpoints/round-0008 --samples 4 --out labels.json

Every task of the split is played `--samples` times with the batched rollout
engine (the same prompts, parsing and horizon as training); a task is labelled
successful when its success rate reaches `--threshold` (default 0.5: with one
sample, "it won"). The JSON file holds the labels (task id -> true/false), the
per-task success rates and how they were made, and is written atomically.
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from pathlib import Path

import torch

from envs import Task, answer_token_budget, available_envs, make_env
from fedagent_flwr.agent.engine.placement import place
from fedagent_flwr.agent.models.loading import load_agent
from fedagent_flwr.agent.play.rollout import (
    LMPolicy,
    Policy,
    PromptEncoder,
    RolloutConfig,
    run_episodes,
)
from fedagent_flwr.atomic import write_json_atomic

SPLITS = ("train", "test", "all")


def label_tasks(policy: Policy, encoder: PromptEncoder, env_name: str, tasks: list[Task], config: RolloutConfig,
                samples: int, threshold: float, seed: int, max_steps: int = 0) -> tuple[dict[str, bool], dict[str, float]]:
    """(labels, success rates) of every task, from `samples` episodes each under one fixed torch seed."""
    if samples < 1:
        raise ValueError(f"samples must be an integer >= 1, got {samples}")
    if not 0 < threshold <= 1:
        raise ValueError(f"threshold must be in (0, 1], got {threshold}")
    if not tasks:
        raise ValueError(f"env {env_name!r} has no tasks to label")
    episodes = [t for t in tasks for _ in range(samples)]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        trajectories = run_episodes(policy, lambda: make_env(env_name, max_steps), episodes, encoder, config,
                                    progress="success labels")
    wins: dict[str, list[bool]] = defaultdict(list)
    for traj in trajectories:
        wins[traj.task.id].append(bool(traj.won))
    rates = {t.id: sum(wins[t.id]) / len(wins[t.id]) for t in tasks}
    return {i: r >= threshold for i, r in rates.items()}, rates


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--env", required=True, help="registered env: " + ", ".join(available_envs()))
    p.add_argument("--model", default="tiny", help="HF name, local checkpoint folder, or tiny / tiny:<env> (default tiny)")
    p.add_argument("--out", required=True, help="JSON file to write")
    p.add_argument("--split", default="train", choices=SPLITS, help="tasks to label (default train: the pool clients share)")
    p.add_argument("--samples", type=int, default=1, help="episodes per task (default 1)")
    p.add_argument("--threshold", type=float, default=0.5, help="success rate at or above which a task counts as solved (default 0.5)")
    p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature; 0 = greedy (default 1.0)")
    p.add_argument("--max-steps", type=int, default=0, help="episode horizon; 0 = the env's default")
    p.add_argument("--history-length", type=int, default=0, help="past steps in the prompt, as in training (default 0)")
    p.add_argument("--max-new-tokens", type=int, default=0, help="tokens per agent step; 0 = the env's answer budget, as in training (default 0)")
    p.add_argument("--batch-size", type=int, default=64, help="episodes per generate call (default 64)")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda[:N]")
    p.add_argument("--seed", type=int, default=0)
    return p


def main(argv: list[str] | None = None) -> dict:
    args = build_parser().parse_args(argv)
    if args.env not in available_envs():
        raise SystemExit(f"--env {args.env!r} is not registered; available: {', '.join(available_envs())}")
    for name, ok, allowed in (("--samples", args.samples >= 1, "an integer >= 1"),
                              ("--threshold", 0 < args.threshold <= 1, "in (0, 1]"),
                              ("--temperature", args.temperature >= 0, ">= 0"),
                              ("--max-steps", args.max_steps >= 0, ">= 0"),
                              ("--max-new-tokens", args.max_new_tokens >= 0, ">= 0"),
                              ("--batch-size", args.batch_size >= 1, ">= 1")):
        if not ok:
            raise SystemExit(f"{name}={getattr(args, name[2:].replace('-', '_'))!r} is not allowed: expected {allowed}")
    env = make_env(args.env, args.max_steps)
    tasks = env.tasks() if args.split == "all" else env.tasks_of_split(args.split)
    agent = load_agent(args.model, args.env, args.device)
    max_new_tokens = args.max_new_tokens or answer_token_budget(args.env)
    engine = place(device=args.device, model=agent.model).decode_engine  # this process's one placement: its engine
    config = RolloutConfig(history_length=args.history_length, invalid_penalty=0.0, max_new_tokens=max_new_tokens,
                           temperature=args.temperature, top_p=1.0, batch_size=args.batch_size, reward="success",
                           decode_engine=engine)
    labels, rates = label_tasks(LMPolicy(agent.model, agent.tokenizer, config), PromptEncoder(agent.tokenizer), args.env,
                                tasks, config, args.samples, args.threshold, args.seed, args.max_steps)
    payload = {
        "env": args.env, "model": args.model, "model_source": agent.spec.source, "fingerprint": agent.base_fingerprint,
        "split": args.split, "samples_per_task": args.samples, "threshold": args.threshold,
        "temperature": args.temperature, "seed": args.seed, "num_tasks": len(tasks),
        "num_successful": sum(labels.values()), "labels": labels, "success_rate": rates,
    }
    out = Path(args.out).expanduser().resolve()
    write_json_atomic(out, payload)
    print(f"[partition.success-labels] {payload['num_successful']}/{len(tasks)} tasks solved -> {out}", flush=True)
    return payload


if __name__ == "__main__":
    main()
