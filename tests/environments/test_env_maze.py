from collections import Counter

import pytest

from env_contract import BAD_ACTION_RUNS, check_bad_actions, play_expert
from envs import make_env
from envs.maze import GOAL, MazeEnv, shortest_distances


def task_at(env, r, c):
    return next(t for t in env.tasks() if t.data["start"] == [r, c])


def test_task_pool_covers_every_free_cell_with_both_splits():
    env = make_env("maze")
    tasks = env.tasks()
    assert len(tasks) == 25  # 26 free cells of the double-T maze minus the goal
    assert len({t.id for t in tasks}) == 25
    splits = Counter(t.split for t in tasks)
    assert splits["train"] == 16 and splits["test"] == 9
    assert {t.category for t in env.tasks_of_split("test")} == {"near", "mid", "far"}


def test_observation_is_lmrl_gym_text_with_digit_by_digit_numbers():
    env = make_env("maze")
    obs, info = env.reset(task_at(env, 1, 11))
    assert obs == (
        "The goal is at position 8, 6. Your current position is at position 1, 1 1. "
        "There are walls to your right, above you, below you."
    )
    assert info["admissible_actions"] == ["move up", "move down", "move left", "move right"]


def test_moves_walls_and_rewards():
    env = make_env("maze")
    env.reset(task_at(env, 5, 6))
    obs, reward, terminated, truncated, info = env.step("move up")  # wall above: stay, -1
    assert env.position == (5, 6) and reward == -1.0 and info["valid"] and not terminated
    obs, reward, *_ = env.step("Move  LEFT")  # normalised text is admissible
    assert env.position == (5, 5) and reward == -1.0
    obs, reward, terminated, truncated, info = env.step("jump")  # not a move: -4, nothing changes
    assert env.position == (5, 5) and reward == -4.0 and not info["valid"] and obs.startswith("Invalid action.")
    assert env.steps == 3
    env.step("move right")
    env.step("move down")
    env.step("move down")
    obs, reward, terminated, truncated, info = env.step("move down")
    assert env.position == GOAL and reward == 0.0 and terminated and info["won"] and not truncated


def test_truncation_at_max_steps():
    env = MazeEnv(max_steps=3)
    env.reset(task_at(env, 1, 1))
    results = [env.step("move up") for _ in range(3)]
    assert [r[3] for r in results] == [False, False, True]
    with pytest.raises(RuntimeError):
        env.step("move up")


def test_expert_wins_every_task_by_a_shortest_path():
    env = make_env("maze")
    dist = shortest_distances()
    for task in env.tasks():
        assert play_expert(env, task), task.id
        assert env.steps == dist[tuple(task.data["start"])]


# Near misses of the four moves; the shared stream adds noise and generic near misses.
_NEAR_MISSES = ["move", "up", "go up", "moveup", "move upward", "move up down", "north", "move 1", "1", "w"]


@pytest.mark.parametrize("n, seed", BAD_ACTION_RUNS)
def test_bad_actions_change_nothing_but_the_step_count(n, seed):
    env = make_env("maze")
    # LMRL-Gym's -4 for a text that is not a move; the agent's cell is the whole state.
    check_bad_actions(env, n, seed, lambda: env.position, -4.0, extras=_NEAR_MISSES, prefix="Invalid action.")
