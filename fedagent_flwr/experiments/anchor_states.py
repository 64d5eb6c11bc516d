"""`python -m fedagent_flwr.experiments.anchor_states`: how often GiGPO's anchor states repeat within a GRPO group.

GiGPO's step-level advantage (agent/training/gigpo.py) compares the steps of a group that start from the same state,
matched by the observation text. A step whose state no other episode of its group met gets no step-level part, so the
share of steps whose state repeats says how much GiGPO can add on an environment. This command plays groups of
`--group-size` episodes on `--tasks` training tasks with a model, sampled as a training rollout does, and prints that
share and the most common anchors:

    python -m fedagent_flwr.experiments.anchor_states --env gridworld --model tiny:gridworld --tasks 8 --group-size 8
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from collections.abc import Sequence

import numpy as np
import torch

from envs import answer_token_budget, make_env
from fedagent_flwr.agent.engine.placement import place
from fedagent_flwr.agent.engine.precision import autocast
from fedagent_flwr.agent.models.loading import load_agent
from fedagent_flwr.agent.play.rollout import LMPolicy, PromptEncoder, RolloutConfig, run_episodes
from fedagent_flwr.agent.training.gigpo import anchor, repeated_share


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m fedagent_flwr.experiments.anchor_states", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--env", default="gridworld")
    p.add_argument("--model", default="tiny", help="a run-config model value (tiny = tiny:<env>)")
    p.add_argument("--tasks", type=int, default=8, help="training tasks, one group each (default 8)")
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--history-length", type=int, default=0)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="auto")
    p.add_argument("--out", help="also write the numbers as JSON to this file")
    args = p.parse_args(argv)
    if args.tasks < 1 or args.group_size < 2:
        p.error("--tasks must be >= 1 and --group-size >= 2")
    torch.manual_seed(args.seed)
    agent = load_agent(args.model, args.env, args.device)
    placement = place(device=args.device, model=agent.model)  # as a run's client resolves it here
    env = make_env(args.env)
    pool = env.tasks_of_split("train")
    chosen = [pool[i] for i in np.random.default_rng(args.seed).choice(len(pool), size=args.tasks, replace=False)]
    episodes = [t for t in chosen for _ in range(args.group_size)]
    group_ids = [i for i in range(len(chosen)) for _ in range(args.group_size)]
    rollout = RolloutConfig(history_length=args.history_length, max_new_tokens=answer_token_budget(args.env),
                            temperature=args.temperature, decode_engine=placement.decode_engine)
    with autocast(placement.compute_precision, agent.device):
        trajectories = run_episodes(LMPolicy(agent.model, agent.tokenizer, rollout), lambda: make_env(args.env),
                                    episodes, PromptEncoder(agent.tokenizer), rollout)
    steps = sum(len(t.steps) for t in trajectories)
    share = repeated_share(trajectories, group_ids)
    common = Counter(anchor(s.observation) for t in trajectories for s in t.steps).most_common(3)
    result = {"env": args.env, "model": args.model, "groups": args.tasks, "group_size": args.group_size,
              "steps": steps, "repeated_share": share, "repeated_steps": round(share * steps),
              "success_rate": float(np.mean([t.won for t in trajectories])), "common_anchors": common}
    print(f"{args.env} ({args.model}): {result['repeated_steps']} of {steps} steps ({100 * share:.1f}%) started from a "
          f"state another episode of their group also met; success {result['success_rate']:.3f}")
    for text, count in common:
        print(f"  {count:4d} x {' '.join(text.split())[:140]!r}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
