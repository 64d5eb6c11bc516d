"""GiGPO's step-level advantage (Feng et al. 2025, "Group-in-Group Policy Optimization for LLM Agent Training",
arXiv 2505.10978), as verl-agent computes it, for `grpo.adv-estimator = "gigpo"`.

GRPO gives every step of a trajectory the same, episode-level advantage. GiGPO adds a second, step-level one: within a
GRPO group (the G episodes of one task), the steps taken from the same environment state form a step group (their
"anchor state"), each step is scored by its discounted return from that state, and the return is normalised within its
step group. A step that led to a win sooner than the other steps from the same state gets credit the episode-level
advantage cannot give it. The two parts are added, the step part weighted by `step_weight`.

Read from verl-agent's `gigpo/core_gigpo.py` (commit d0b97244 of the vanzll/verl-agent fork, an upstream commit of
2025-10-15) and its example scripts; where the code and the paper differ, this follows the code:
- anchors match exactly (`build_step_group`: the observation text as a hashable key, no stripping or lowercasing);
- the return is R_t = r_t + gamma R_{t+1} over the trajectory's remaining steps (`compute_step_discounted_returns`),
  from the environment's per-step rewards, and a step's own rollout.invalid-action penalty is then taken off its return,
  undiscounted (`apply_invalid_action_penalty` on step rewards);
- normalisation (`step_norm_reward`): mean_norm = R - mean; mean_std_norm = (R - mean) / (std + 1e-6) with the
  unbiased standard deviation (torch.std, ddof 1); a step group of one step gets 0 (its mean is its own value);
- defaults of the scripts (examples/gigpo_trainer/run_alfworld.sh, run_webshop.sh): gamma 0.95, step weight 1.0;
  mode mean_std_norm for ALFWorld, mean_norm for WebShop (and the default yaml).
verl-agent's episode-level part is its GRPO advantage; here it is this project's GRPO advantage as the run config sets
it (penalty scope, grpo.scale-rewards), so `grpo.step-advantage-w = 0` is GRPO exactly.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fedagent_flwr.agent.play.rollout import Trajectory
from fedagent_flwr.config.choices import GIGPO_MODES

EPS = 1e-6  # verl-agent's epsilon under the standard deviation


def anchor(observation: str) -> str:
    """The key that says two steps start from the same state: the environment's observation text as the agent saw it,
    matched exactly (verl-agent matches anchor observations as they are)."""
    return observation


def step_rewards(trajectory: Trajectory, per_step: bool) -> np.ndarray:
    """The rewards a trajectory's steps earned: the environment's own per step (`per_step`, reward = env), or else the
    episode's reward (10 x won, or 10 x the task score) on its last step, where a sparse-reward environment such as
    verl-agent's ALFWorld gives it."""
    if per_step:
        return np.array([s.reward for s in trajectory.steps], dtype=np.float64)
    rewards = np.zeros(len(trajectory.steps))
    if len(rewards):
        rewards[-1] = trajectory.episode_reward
    return rewards


def discounted_returns(rewards: Sequence[float], gamma: float) -> np.ndarray:
    """R_t = r_t + gamma R_{t+1}, backwards from the last step."""
    out = np.zeros(len(rewards))
    running = 0.0
    for t in range(len(rewards) - 1, -1, -1):
        running = rewards[t] + gamma * running
        out[t] = running
    return out


def step_groups(trajectories: Sequence[Trajectory], group_ids: Sequence[int]) -> list[list[tuple[int, str]]]:
    """Each step's step group: (its trajectory's GRPO group, the anchor of the state it started from)."""
    return [[(g, anchor(s.observation)) for s in t.steps] for t, g in zip(trajectories, group_ids)]


def normalise_within(values: np.ndarray, keys: Sequence, mode: str, eps: float = EPS) -> np.ndarray:
    """Each value less the mean of the values with the same key, divided by their unbiased standard deviation (+ eps)
    with mode mean_std_norm; a key held by one value gives 0."""
    if mode not in GIGPO_MODES:
        raise ValueError(f"gigpo mode must be one of {GIGPO_MODES}, got {mode!r}")
    members: dict = {}
    for i, key in enumerate(keys):
        members.setdefault(key, []).append(i)
    out = np.zeros(len(values))
    for index in members.values():
        if len(index) < 2:
            continue
        v = values[index]
        centred = v - v.mean()
        out[index] = centred / (v.std(ddof=1) + eps) if mode == "mean_std_norm" else centred
    return out


def step_level_advantages(trajectories: Sequence[Trajectory], group_ids: Sequence[int], gamma: float, mode: str,
                          per_step_rewards: bool = False) -> list[np.ndarray]:
    """GiGPO's step-level advantage of every step, a list per trajectory: its discounted return (less its own invalid
    penalty) normalised within its step group."""
    returns = [discounted_returns(step_rewards(t, per_step_rewards), gamma) - np.array([s.penalty for s in t.steps])
               for t in trajectories]
    keys = [key for steps in step_groups(trajectories, group_ids) for key in steps]
    flat = normalise_within(np.concatenate(returns) if returns else np.zeros(0), keys, mode)
    ends = np.cumsum([len(t.steps) for t in trajectories])
    return np.split(flat, ends[:-1]) if len(trajectories) else []


def combine(episode_level: Sequence[np.ndarray], step_level: Sequence[np.ndarray], step_weight: float) -> list[np.ndarray]:
    """GiGPO's advantage: the episode-level part plus `step_weight` times the step-level part, step by step."""
    return [e + step_weight * s for e, s in zip(episode_level, step_level)]


def repeated_share(trajectories: Sequence[Trajectory], group_ids: Sequence[int]) -> float:
    """The share of steps whose anchor state another episode of the same GRPO group also started a step from: the
    steps the step-level advantage can compare at all (a step group of one gets 0)."""
    owners: dict = {}
    for i, steps in enumerate(step_groups(trajectories, group_ids)):
        for key in steps:
            owners.setdefault(key, set()).add(i)
    keys = [key for steps in step_groups(trajectories, group_ids) for key in steps]
    return sum(len(owners[k]) > 1 for k in keys) / max(1, len(keys))
