"""WebShop environment speed: catalog build time, resets per second, steps per second.

    python benchmarks/webshop_speed.py                 # synthetic catalog, 300 episodes per policy
    python benchmarks/webshop_speed.py --episodes 0    # every goal once (also reports expert success)
    WEBSHOP_DATA=/path/to/webshop/data python benchmarks/webshop_speed.py

Policies: "random" clicks uniformly among the listed clickables and, on the search
page, searches 1-4 words drawn from the instruction; "expert" follows
`expert_action()`, whose decision time is reported apart from the step time.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from envs.webshop import WebShopEnv  # noqa: E402
from envs.webshop.search import SearchEngine  # noqa: E402
from envs.webshop.synthetic import generate_catalog  # noqa: E402


def random_action(env: WebShopEnv, rng: random.Random) -> str:
    if env.session.page == "search":
        words = env.instruction().split(", and price")[0].split()
        return "search[" + " ".join(rng.sample(words, min(len(words), rng.randint(1, 4)))) + "]"
    return rng.choice(env.admissible_actions())


def run(env: WebShopEnv, tasks, policy: str, rng: random.Random) -> dict:
    reset_s = step_s = decide_s = 0.0
    steps = 0
    won = defaultdict(list)
    for task in tasks:
        t0 = time.perf_counter()
        env.reset(task)
        reset_s += time.perf_counter() - t0
        while not env.done:
            t0 = time.perf_counter()
            action = env.expert_action() if policy == "expert" else random_action(env, rng)
            t1 = time.perf_counter()
            env.step(action)
            t2 = time.perf_counter()
            decide_s += t1 - t0
            step_s += t2 - t1
            steps += 1
        won[task.split].append(env.won)
    out = {
        "policy": policy,
        "episodes": len(tasks),
        "resets_per_s": round(len(tasks) / reset_s, 1),
        "steps_per_s": round(steps / step_s, 1),
        "mean_episode_steps": round(steps / len(tasks), 2),
        "success": {s: f"{sum(v)}/{len(v)} = {sum(v) / len(v):.4f}" for s, v in sorted(won.items())},
    }
    if policy == "expert":
        out["expert_decisions_per_s"] = round(steps / decide_s, 1)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=300, help="episodes per policy; 0 = every goal once")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.episodes < 0:
        raise SystemExit(f"--episodes must be >= 0, got {args.episodes}")

    t0 = time.perf_counter()
    catalog = generate_catalog(seed=args.seed)
    t1 = time.perf_counter()
    SearchEngine(catalog.products)
    t2 = time.perf_counter()
    env = WebShopEnv(seed=args.seed)
    report = {
        "catalog": env.catalog.source,
        "products": len(env.catalog.products),
        "goals": len(env.catalog.goals),
        "synthetic_catalog_build_s": round(t1 - t0, 3),
        "search_index_build_s": round(t2 - t1, 3),
        "runs": [],
    }
    rng = random.Random(args.seed)
    tasks = env.tasks()
    if args.episodes:
        tasks = [tasks[i] for i in rng.sample(range(len(tasks)), min(args.episodes, len(tasks)))]
    for policy in ("random", "expert"):
        report["runs"].append(run(env, tasks, policy, rng))
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
