"""From played episodes to training samples: GRPO's group-relative advantages, and every agent step a sample carrying
its trajectory's advantage (GiGPO's step-level part is agent/training/gigpo.py)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from fedagent_flwr.agent.play.rollout import Trajectory
from fedagent_flwr.config.choices import LOSS_AGGREGATIONS, PENALTY_SCOPES, SCALE_REWARDS, UNIFORM_GROUPS


ADV_EPS = 1e-6  # added to a standard deviation before dividing by it (TRL's and verl's epsilon alike)


def group_advantages(rewards: Sequence[float], group_ids: Sequence[int], eps: float = 1e-6,
                     scale: str = "group", ddof: int = 0) -> np.ndarray:
    """GRPO advantages: each reward less its group's mean, divided as `scale` says (SCALE_REWARDS): by the group's
    standard deviation, by that of all `rewards`, or not at all; `ddof` 1 takes the unbiased deviations (verl's).

    A group whose rewards are all equal carries no learning signal: its advantages are 0.
    """
    if scale not in SCALE_REWARDS:
        raise ValueError(f"scale_rewards must be one of {SCALE_REWARDS}, got {scale!r}")
    rewards = np.asarray(rewards, dtype=np.float64)
    group_ids = np.asarray(group_ids)
    adv = np.zeros_like(rewards)
    batch_std = rewards.std(ddof=ddof) if len(rewards) > ddof else 0.0
    for g in np.unique(group_ids):
        idx = group_ids == g
        r = rewards[idx]
        std = r.std(ddof=ddof) if len(r) > ddof else 0.0
        if std < eps:
            continue  # equal rewards: advantage 0
        divisor = {"group": std + eps, "batch": batch_std + eps, "none": 1.0}[scale]
        adv[idx] = (r - r.mean()) / divisor
    return adv


@dataclass
class StepSample:
    prompt_ids: list[int]
    completion_ids: list[int]
    advantage: float
    weight: float = 1.0  # per-token weight in the loss (see grpo.loss-aggregation)
    old_logprobs: list[float] | None = None  # the completion tokens' log-probs as the rollout sampled them, if known

    @property
    def length(self) -> int:
        """Its tokens through the model: the prompt's and the completion's (what a pass pads a row to)."""
        return len(self.prompt_ids) + len(self.completion_ids)


def step_advantages(trajectories: Sequence[Trajectory], group_ids: Sequence[int], eps: float,
                    penalty_scope: str = "trajectory", scale: str = "group", ddof: int = 0) -> list[np.ndarray]:
    """Each trajectory's steps' advantages.

    "trajectory": one advantage per trajectory (its penalised reward normalised over the group's trajectories),
    shared by all its steps. "step": every step is a row scoring the episode's reward less its own penalty,
    normalised over all the rows of its group (RolloutConfig.penalty_scope): a group is then informative when only
    the steps' validity differs, and a long trajectory weighs more in the group's mean and deviation.
    """
    if penalty_scope not in PENALTY_SCOPES:
        raise ValueError(f"penalty scope must be one of {PENALTY_SCOPES}, got {penalty_scope!r}")
    if penalty_scope == "trajectory":
        adv = group_advantages([t.reward for t in trajectories], group_ids, eps, scale, ddof)
        return [np.full(len(t.steps), a) for t, a in zip(trajectories, adv)]
    scores = [t.episode_reward - s.penalty for t in trajectories for s in t.steps]
    rows = [g for t, g in zip(trajectories, group_ids) for _ in t.steps]
    adv = group_advantages(scores, rows, eps, scale, ddof)
    ends = np.cumsum([len(t.steps) for t in trajectories])
    return np.split(adv, ends[:-1]) if len(trajectories) else []


def trajectories_to_samples(
    trajectories: Sequence[Trajectory], group_ids: Sequence[int], eps: float, aggregation: str = "trajectory-mean",
    uniform_groups: str = "drop", penalty_scope: str = "trajectory", scale: str = "group",
    advantages: Sequence[np.ndarray] | None = None,
) -> list[StepSample]:
    """Every agent step becomes a sample carrying its advantage: `advantages` (one array per trajectory, e.g. GiGPO's),
    or else GRPO's (step_advantages with `penalty_scope` and `scale`).

    With uniform_groups="drop", zero-advantage steps are left out: their policy-gradient term is zero and skipping
    them saves the passes, but their KL term is lost with them (grpo.uniform-groups).
    """
    if aggregation not in LOSS_AGGREGATIONS:
        raise ValueError(f"loss aggregation must be one of {LOSS_AGGREGATIONS}, got {aggregation!r}")
    if uniform_groups not in UNIFORM_GROUPS:
        raise ValueError(f"uniform groups must be one of {UNIFORM_GROUPS}, got {uniform_groups!r}")
    samples = []
    if advantages is None:
        advantages = step_advantages(trajectories, group_ids, eps, penalty_scope, scale)
    for t, advs in zip(trajectories, advantages):
        tokens = sum(len(s.completion_ids) for s in t.steps)
        weight = 1.0 / max(1, tokens) if aggregation == "trajectory-mean" else 1.0
        samples.extend(StepSample(s.prompt_ids, s.completion_ids, float(a), weight, s.logprobs) for s, a in zip(t.steps, advs)
                       if s.completion_ids and not (a == 0.0 and uniform_groups == "drop"))
    return samples


def informative_share(trajectories: Sequence[Trajectory], group_ids: Sequence[int], penalised: bool = True) -> float:
    """Share of groups whose trajectories' rewards differ (a group of equal rewards has advantage 0 everywhere).

    penalised=False compares the episodes' rewards before the rollout.invalid-action penalty: the groups whose outcomes
    differ. The gap between the two shares is the groups that only the penalty makes informative; under the
    trajectory penalty scope, group normalisation gives those the same size of advantage as a won/lost split.
    """
    rewards: dict[int, set[float]] = {}
    for t, g in zip(trajectories, group_ids):
        rewards.setdefault(g, set()).add(round(t.reward if penalised else t.episode_reward, 9))
    return sum(len(r) > 1 for r in rewards.values()) / max(1, len(rewards))
