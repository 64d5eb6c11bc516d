from collections import Counter

import numpy as np
import pytest
from env_contract import BAD_ACTION_RUNS, check_bad_actions, play_expert

from envs import make_env
from envs.grid import GOAL_REWARD, ILLEGAL_REWARD, MOVE_REWARD, bfs_distances
from envs.gridworld import (
    DIRECTIONS,
    DISTANCE,
    ROOM_SIDES,
    TEST_TASKS,
    TRAIN_TASKS,
    GridworldEnv,
    room_pool,
)


def grid_of(task):
    return np.array([[ch == "#" for ch in row] for row in task.data["rows"]], dtype=np.uint8)


def test_every_task_is_its_own_room_in_the_generator_bounds():
    tasks = make_env("gridworld").tasks()
    assert Counter(t.split for t in tasks) == {"train": TRAIN_TASKS, "test": TEST_TASKS}
    assert len({t.id for t in tasks}) == len(tasks)
    layouts = {tuple(t.data["rows"]) for t in tasks}
    assert len(layouts) == len(tasks)  # no layout repeats, so no held-out room was seen in training
    for task in tasks:
        grid = grid_of(task)
        assert grid[0].all() and grid[-1].all() and grid[:, 0].all() and grid[:, -1].all()  # walled all round
        assert ROOM_SIDES[0] <= grid.shape[0] - 2 <= ROOM_SIDES[1] and ROOM_SIDES[0] <= grid.shape[1] - 2 <= ROOM_SIDES[1]
        start, goal = tuple(task.data["start"]), tuple(task.data["goal"])
        assert start[0] != goal[0] and start[1] != goal[1]
        assert bfs_distances(grid, goal)[start] == task.data["distance"]
        assert DISTANCE[0] <= task.data["distance"] <= DISTANCE[1]
    for split in ("train", "test"):  # both splits span every direction the partitions skew
        assert {t.category for t in tasks if t.split == split} == set(DIRECTIONS)


def test_pool_depends_only_on_its_seed():
    assert [t.data for t in GridworldEnv(seed=0).tasks()] == [t.data for t in room_pool.__wrapped__(0)]
    assert [t.data["rows"] for t in GridworldEnv(seed=1).tasks()] != [t.data["rows"] for t in GridworldEnv(seed=0).tasks()]


def test_observation_gives_the_goal_relative_to_the_agent_and_the_walls_around_it():
    env = make_env("gridworld")
    task = next(t for t in env.tasks() if t.data["goal"][0] > t.data["start"][0] and t.data["goal"][1] < t.data["start"][1])
    obs, info = env.reset(task)
    (r, c), (gr, gc) = task.data["start"], task.data["goal"]
    down, left = gr - r, c - gc
    steps = lambda n: f"{n} step{'s' if n != 1 else ''}"
    assert obs.startswith(f"The goal is {steps(down)} down and {steps(left)} to your left. ")
    grid = grid_of(task)
    walls = {"to your right": grid[r, c + 1], "to your left": grid[r, c - 1], "above you": grid[r - 1, c], "below you": grid[r + 1, c]}
    wall_sentence = obs.split(". ", 1)[1]
    for name, wall in walls.items():
        assert (name in wall_sentence) == bool(wall), (name, obs)
    assert info["admissible_actions"] == ["move up", "move down", "move left", "move right"]


def test_moves_walls_rewards_and_truncation():
    env = GridworldEnv(max_steps=5)
    task = env.tasks()[0]
    env.reset(task)
    grid, start = grid_of(task), tuple(task.data["start"])
    blocked = next(((m, d) for m, d in {"move up": (-1, 0), "move down": (1, 0), "move left": (0, -1), "move right": (0, 1)}.items()
                    if grid[start[0] + d[0], start[1] + d[1]]), None)
    if blocked:  # a move into a wall leaves the agent where it was and costs a step
        _, reward, *_ = env.step(blocked[0])
        assert env.position == start and reward == MOVE_REWARD
    _, reward, _, _, info = env.step("fly")
    assert reward == ILLEGAL_REWARD and not info["valid"] and env.position == start
    while not env.done:
        env.step("move up" if env.position[0] > 1 else "move down")
    assert env.steps == 5


def test_expert_wins_every_task_by_a_shortest_path():
    env = make_env("gridworld")
    for task in env.tasks():
        assert play_expert(env, task), task.id
        assert env.steps == task.data["distance"]
    env.reset(env.tasks()[1])
    while not env.done:
        _, reward, terminated, _, _ = env.step(env.expert_action())
    assert terminated and reward == GOAL_REWARD


def test_a_random_policy_rarely_succeeds_so_held_out_success_measures_a_skill():
    env, rng = make_env("gridworld"), np.random.default_rng(0)
    wins = 0
    for task in env.tasks_of_split("test"):
        env.reset(task)
        while not env.done:
            env.step(str(rng.choice(env.admissible_actions())))
        wins += env.won
    assert wins / TEST_TASKS < 0.2


_NEAR_MISSES = ["move", "up", "go up", "moveup", "move upward", "move up down", "north", "move 1", "1", "w"]


@pytest.mark.parametrize("n, seed", BAD_ACTION_RUNS)
def test_bad_actions_change_nothing_but_the_step_count(n, seed):
    env = make_env("gridworld")
    check_bad_actions(env, n, seed, lambda: env.position, ILLEGAL_REWARD, extras=_NEAR_MISSES, expert_steps=3,
                      prefix="Invalid action.")
