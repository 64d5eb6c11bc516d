"""ALFWorld environment speed (resets/s, steps/s) and expert success per task type.

    python benchmarks/alfworld_speed.py                      # 20 random + 20 expert episodes
    python benchmarks/alfworld_speed.py --eval               # + the expert on every valid_seen/valid_unseen game
    python benchmarks/alfworld_speed.py --eval --expert handcoded --episodes 0

Reported: pool construction (fresh generation into an empty cache, then a cached
load), resets per second for a game's first reset (PDDL translation included) and
for a repeated reset of the same game, steps per second under a random policy
(uniform over the admissible commands) and under the expert (whose decision time is
reported apart). With --eval, the expert plays every test task and the success rate
per subset (seen/unseen) and task type is printed.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from envs.alfworld import AlfWorldEnv  # noqa: E402


def play(env: AlfWorldEnv, tasks, policy: str, rng: random.Random) -> dict:
    first_reset_s = repeat_reset_s = step_s = decide_s = 0.0
    steps = 0
    won = defaultdict(lambda: [0, 0])
    for task in tasks:
        t0 = time.perf_counter()
        env.reset(task)
        t1 = time.perf_counter()
        env.reset(task)  # the same game again: translation and grammar are cached now
        t2 = time.perf_counter()
        first_reset_s += t1 - t0
        repeat_reset_s += t2 - t1
        while not env.done:
            t0 = time.perf_counter()
            action = env.expert_action() if policy == "expert" else rng.choice(env.admissible_actions())
            t1 = time.perf_counter()
            env.step(action)
            step_s += time.perf_counter() - t1
            decide_s += t1 - t0
            steps += 1
        key = f"{task.data['subset']}/{task.category}"
        won[key][0] += env.won
        won[key][1] += 1
    out = {
        "policy": policy,
        "episodes": len(tasks),
        "first_resets_per_s": round(len(tasks) / first_reset_s, 2),
        "repeat_resets_per_s": round(len(tasks) / repeat_reset_s, 2),
        "steps_per_s": round(steps / step_s, 1),
        "mean_episode_steps": round(steps / len(tasks), 2),
        "success": {k: f"{w}/{n} = {w / n:.3f}" for k, (w, n) in sorted(won.items())},
    }
    if policy == "expert":
        out["expert_decisions_per_s"] = round(steps / decide_s, 1)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=20, help="episodes per policy for the speed figures")
    parser.add_argument("--expert", default="planner", choices=("planner", "handcoded"))
    parser.add_argument("--eval", action="store_true", help="expert on every valid_seen / valid_unseen task")
    parser.add_argument("--games-per-type", type=int, default=24, help="generated games per task type and split")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.episodes < 0 or args.games_per_type < 1:
        raise SystemExit("--episodes must be >= 0 and --games-per-type >= 1")

    kwargs = dict(train_games_per_type=args.games_per_type, valid_games_per_type=args.games_per_type,
                  seed=args.seed, expert=args.expert, source="generated")
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        n_tasks = len(AlfWorldEnv(cache_dir=tmp, **kwargs).tasks())
        t1 = time.perf_counter()
        env = AlfWorldEnv(cache_dir=tmp, **kwargs)
        env.tasks()  # the cached load
        t2 = time.perf_counter()
    report = {"tasks": n_tasks, "pool_generate_s": round(t1 - t0, 2), "pool_cached_load_s": round(t2 - t1, 2)}

    rng = random.Random(args.seed)
    train = env.tasks_of_split("train")
    if args.episodes:
        for policy in ("random", "expert"):
            chosen = rng.sample(train, min(args.episodes, len(train)))
            report[policy] = play(env, chosen, policy, rng)
    if args.eval:
        report["expert_eval"] = play(env, env.tasks_of_split("test"), "expert", rng)
    env.close()
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
