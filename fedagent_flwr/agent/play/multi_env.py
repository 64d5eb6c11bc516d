"""Per-environment results of a multi-environment run (Fed-SE Table 1's column layout).

Metrics stay flat and numeric so they fit a Flower MetricRecord and a CSV row:
`success_rate/env/<name>` and `invalid_action_rate/env/<name>` per environment,
and `success_rate/mean_over_envs`, the unweighted mean of the per-environment
rates. The pooled `success_rate` over all episodes weighs each environment by
its number of evaluated episodes; that pooled figure is what Fed-SE's Table 1
calls "Average" (its rows match the AgentGym test-set sizes BabyAI 90, WebShop
200, TextCraft 100, Maze 25, Wordle 25, e.g. Fed-SE 0.661, FedAvg 0.557), and
the two coincide when every environment has the same number of episodes.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence

from envs import task_env

ENV_PREFIX = "success_rate/env/"
MEAN_KEY = "success_rate/mean_over_envs"


def per_env_summary(trajectories: Sequence) -> dict[str, float]:
    """Per-environment success and rollout.invalid-action rates; {} when no trajectory comes from a multi-env pool."""
    groups: dict[str, list] = defaultdict(list)
    for t in trajectories:
        env = task_env(t.task)
        if env is not None:
            groups[env].append(t)
    out: dict[str, float] = {}
    for env, group in sorted(groups.items()):
        out[f"{ENV_PREFIX}{env}"] = sum(t.won for t in group) / len(group)
        steps = sum(len(t.steps) for t in group)
        out[f"invalid_action_rate/env/{env}"] = sum(t.num_invalid for t in group) / max(1, steps)
        out[f"episodes/env/{env}"] = float(len(group))
    if groups:
        out[MEAN_KEY] = sum(out[f"{ENV_PREFIX}{e}"] for e in groups) / len(groups)
    return out


def env_success(metrics: Mapping[str, float], prefix: str = "") -> dict[str, float]:
    """{env: success rate} read back from flat metrics (keys optionally prefixed, e.g. 'eval/')."""
    head = prefix + ENV_PREFIX
    return {k[len(head):]: float(v) for k, v in metrics.items() if k.startswith(head)}


def environment_table(initial: Mapping[str, float], final: Mapping[str, float], order: Sequence[str]) -> dict:
    """summary.json's per-environment block: success before round 1 and after the last round."""
    first, last = env_success(initial), env_success(final)
    return {
        "environments": list(order),
        "initial_success_rate_per_env": {e: first[e] for e in order if e in first},
        "final_success_rate_per_env": {e: last[e] for e in order if e in last},
        "initial_mean_over_envs": initial.get(MEAN_KEY),
        "final_mean_over_envs": final.get(MEAN_KEY),
    }


def format_row(metrics: Mapping[str, float], order: Sequence[str]) -> str:
    """One Table 1 row: 'babyai 0.42 | webshop 0.10 | ... | mean 0.25 | pooled 0.27'."""
    rates = env_success(metrics)
    cells = [f"{e} {rates[e]:.3f}" for e in order if e in rates]
    cells.append(f"mean {metrics.get(MEAN_KEY, float('nan')):.3f}")
    cells.append(f"pooled {metrics.get('success_rate', float('nan')):.3f}")
    return " | ".join(cells)
