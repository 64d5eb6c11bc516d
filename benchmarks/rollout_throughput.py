#!/usr/bin/env python
"""Rollout engine throughput: all episodes batched vs one episode at a time.

Same model, same tasks, same sampling settings, measured side by side in one run:
the batched engine advances every live episode with one generate call per step;
the baseline plays each episode alone (one generate call per step of that
episode, KV cache on in both). Reports environment steps per second and the ratio.

    python benchmarks/rollout_throughput.py --model tiny:maze --episodes 64 --threads 2
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from envs import make_env
from fedagent_flwr.agent.loading import load_agent
from fedagent_flwr.config import RunConfig

from fedagent_flwr.agent.rollout import LMPolicy, PromptEncoder, run_episodes


def measure(fn) -> tuple[float, list]:
    started = time.perf_counter()
    trajectories = fn()
    return time.perf_counter() - started, trajectories


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny:maze")
    parser.add_argument("--env", default="maze")
    parser.add_argument("--episodes", type=int, default=64, help="episodes per mode")
    parser.add_argument("--max-steps", type=int, default=0, help="episode horizon; 0 = env default")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--device", default="auto")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print one JSON line instead of text")
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    agent = load_agent(args.model, args.env, args.device)
    env = make_env(args.env, args.max_steps)
    pool = env.tasks()
    tasks = [pool[i % len(pool)] for i in range(args.episodes)]
    # The default run's prompt and generation settings, all episodes in one generate call.
    run_cfg = RunConfig.from_run_config({"temperature": args.temperature, "rollout-batch-size": max(1, args.episodes)})
    cfg = run_cfg.rollout_config()
    encoder = PromptEncoder(agent.tokenizer)
    policy = LMPolicy(agent.model, agent.tokenizer, cfg)
    factory = lambda: make_env(args.env, args.max_steps)  # noqa: E731

    run_episodes(policy, factory, tasks[:2], encoder, cfg)  # warm-up (allocator, kernels)
    torch.manual_seed(args.seed)
    t_batched, batched = measure(lambda: run_episodes(policy, factory, tasks, encoder, cfg))
    torch.manual_seed(args.seed)
    t_single, single = measure(lambda: [run_episodes(policy, factory, [t], encoder, cfg)[0] for t in tasks])

    steps_b = sum(len(t.steps) for t in batched)
    steps_s = sum(len(t.steps) for t in single)
    result = {
        "model": args.model,
        "device": str(agent.device),
        "threads": args.threads,
        "episodes": args.episodes,
        "batched_env_steps": steps_b,
        "batched_seconds": round(t_batched, 2),
        "batched_steps_per_s": round(steps_b / t_batched, 1),
        "sequential_env_steps": steps_s,
        "sequential_seconds": round(t_single, 2),
        "sequential_steps_per_s": round(steps_s / t_single, 1),
        "speedup": round((steps_b / t_batched) / (steps_s / t_single), 2),
        "batched_success": sum(t.won for t in batched) / len(batched),
        "sequential_success": sum(t.won for t in single) / len(single),
    }
    if args.json:
        print(json.dumps(result))
    else:
        for k, v in result.items():
            print(f"{k:>24}: {v}")


if __name__ == "__main__":
    main()
