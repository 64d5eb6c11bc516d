"""GiGPO's step-level advantage on hand-made trajectories (agent/training/gigpo.py), checked against values worked out
by hand from verl-agent's rules."""

from __future__ import annotations

import numpy as np
import pytest

from envs import Task
from fedagent_flwr.agent.play.rollout import StepRecord, Trajectory
from fedagent_flwr.agent.training import gigpo


def trajectory(observations, won: bool, penalties=None, rewards=None) -> Trajectory:
    penalties = penalties or [0.0] * len(observations)
    rewards = rewards or [0.0] * len(observations)
    steps = [StepRecord([1], [2], "", "a", r, p == 0.0, observation=o, penalty=p)
             for o, p, r in zip(observations, penalties, rewards)]
    episode = 10.0 * won
    return Trajectory(Task("t", "room", "train"), steps, won=won, penalty=sum(penalties), reward=episode - sum(penalties),
                      episode_reward=episode)


def test_returns_are_discounted_backwards_from_the_last_step():
    assert gigpo.discounted_returns([0, 0, 10], 0.95) == pytest.approx([9.025, 9.5, 10.0])
    assert gigpo.discounted_returns([1, 1, 1], 1.0) == pytest.approx([3, 2, 1])
    assert len(gigpo.discounted_returns([], 0.9)) == 0


def test_steps_from_the_same_state_of_the_same_group_are_compared():
    """Two episodes of one task: both start in A and pass B; the winner then reaches the goal from C. gamma 0.5:
    returns winner [2.5, 5, 10], loser [0, 0, 0, 0]. Step groups (A): 2.5 vs 0, (B): 5 vs 0; C, D, E alone -> 0."""
    won = trajectory(["A", "B", "C"], True)
    lost = trajectory(["A", "B", "D", "E"], False)
    groups = gigpo.step_groups([won, lost], [0, 0])
    assert groups[0] == [(0, "A"), (0, "B"), (0, "C")]
    mean = gigpo.step_level_advantages([won, lost], [0, 0], gamma=0.5, mode="mean_norm")
    assert mean[0] == pytest.approx([1.25, 2.5, 0.0]) and mean[1] == pytest.approx([-1.25, -2.5, 0.0, 0.0])
    scaled = gigpo.step_level_advantages([won, lost], [0, 0], gamma=0.5, mode="mean_std_norm")
    # (2.5 - 1.25) / (std([2.5, 0], ddof=1) + 1e-6) = 1.25 / 1.7678 = 0.7071: the unbiased deviation, as torch.std
    assert scaled[0][0] == pytest.approx(1.25 / (np.std([2.5, 0.0], ddof=1) + 1e-6))
    assert scaled[0][1] == pytest.approx(scaled[0][0], rel=1e-5) and scaled[1][1] == pytest.approx(-scaled[0][1])


def test_the_same_state_in_another_group_is_another_step_group():
    """Two tasks whose rooms print the same first observation: their steps do not meet."""
    a, b = trajectory(["A", "X"], True), trajectory(["A", "Y"], False)
    alone = gigpo.step_level_advantages([a, b], [0, 1], gamma=0.9, mode="mean_norm")
    assert all(np.all(adv == 0.0) for adv in alone)
    assert gigpo.repeated_share([a, b], [0, 1]) == 0.0 and gigpo.repeated_share([a, b], [0, 0]) == 0.5


def test_a_steps_own_penalty_comes_off_its_return_undiscounted():
    """verl-agent takes the rollout.invalid-action penalty off the step that drew it, after discounting: the loser's invalid
    first step returns -0.1, its second step 0; the winner's 0.25 and 0.5 (gamma 0.5, reward 10 at step 3)."""
    won = trajectory(["A", "B", "C", "D"], True)
    lost = trajectory(["A", "B"], False, penalties=[0.1, 0.0])
    adv = gigpo.step_level_advantages([won, lost], [0, 0], gamma=0.5, mode="mean_norm")
    assert adv[1][0] == pytest.approx((-0.1 - 1.25) / 2)  # A: 1.25 (winner) vs -0.1
    assert adv[1][1] == pytest.approx((0.0 - 2.5) / 2)  # B: 2.5 vs 0, no penalty carried back


def test_per_step_environment_rewards_when_the_reward_is_the_envs_own():
    t = trajectory(["A", "B"], False, rewards=[-1.0, 5.0])
    assert gigpo.step_rewards(t, per_step=True) == pytest.approx([-1.0, 5.0])
    assert gigpo.step_rewards(t, per_step=False) == pytest.approx([0.0, 0.0])  # the episode's reward, 10 x won = 0
    assert gigpo.step_rewards(trajectory(["A", "B"], True), per_step=False) == pytest.approx([0.0, 10.0])


def test_the_step_part_is_added_with_its_weight_and_weight_zero_leaves_the_episode_part():
    episode = [np.array([0.5, 0.5]), np.array([-0.5])]
    step = [np.array([1.0, -2.0]), np.array([3.0])]
    assert [list(a) for a in gigpo.combine(episode, step, 1.0)] == [[1.5, -1.5], [2.5]]
    assert [list(a) for a in gigpo.combine(episode, step, 0.0)] == [[0.5, 0.5], [-0.5]]


def test_a_mode_it_does_not_know_is_refused():
    with pytest.raises(ValueError, match="gigpo mode"):
        gigpo.normalise_within(np.zeros(2), [0, 0], "std_norm")
