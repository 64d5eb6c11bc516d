"""BabyAI text environment: task pool, view text, rewards, expert, robustness to bad actions."""

from __future__ import annotations

import random
from collections import Counter

import numpy as np
import pytest
from minigrid.core.constants import COLOR_TO_IDX, OBJECT_TO_IDX, STATE_TO_IDX
from minigrid.core.world_object import Ball, Key

from env_contract import BAD_ACTION_RUNS, check_bad_actions, expert_success
from envs import make_env
from envs.babyai import DEFAULT_LEVELS, BabyAIEnv, describe_view


@pytest.fixture(scope="module")
def env() -> BabyAIEnv:
    return make_env("babyai")


def _state(env: BabyAIEnv) -> tuple:
    e = env.env
    carried = None if e.carrying is None else e.carrying.encode()
    return (tuple(e.agent_pos), e.agent_dir, carried, e.grid.encode().tobytes(), e.step_count)


def test_pool_is_deterministic_unique_and_split_per_level(env):
    other = BabyAIEnv()
    assert [(t.id, t.category, t.split, t.data) for t in env.tasks()] == [
        (t.id, t.category, t.split, t.data) for t in other.tasks()
    ]
    ids = [t.id for t in env.tasks()]
    assert len(ids) == len(set(ids)) == 100 * len(DEFAULT_LEVELS)
    counts = Counter((t.category, t.split) for t in env.tasks())
    for level in DEFAULT_LEVELS:
        assert counts[(level, "test")] == 20 and counts[(level, "train")] == 80
    assert env.tasks()[0].data == {"level": DEFAULT_LEVELS[0], "seed": 0}


def test_bad_configuration_is_refused():
    with pytest.raises(ValueError, match="NoSuchLevel"):
        BabyAIEnv(levels=["GoToLocal", "NoSuchLevel"])
    with pytest.raises(ValueError, match="seeds_per_level"):
        BabyAIEnv(seeds_per_level=1)
    with pytest.raises(ValueError, match="test_fraction"):
        BabyAIEnv(test_fraction=1.0)
    with pytest.raises(ValueError, match="repeat"):
        BabyAIEnv(levels=["GoToLocal", "GoToLocal"])


def test_same_task_gives_the_same_episode(env):
    task = env.tasks()[123]
    first = env.reset(task)[0], env.instruction()
    env.reset(env.tasks()[5])
    assert (env.reset(task)[0], env.instruction()) == first


def _view(cells: dict[tuple[int, int], tuple[str, str, str]]) -> np.ndarray:
    image = np.zeros((7, 7, 3), dtype=np.uint8)
    image[:, :, 0] = OBJECT_TO_IDX["empty"]
    for (x, y), (obj, color, state) in cells.items():
        image[x, y] = (OBJECT_TO_IDX[obj], COLOR_TO_IDX[color], STATE_TO_IDX[state])
    return image


def test_view_text_on_a_hand_made_view():
    # Agent at (3, 6) facing up (y decreasing).
    image = _view(
        {
            (2, 4): ("ball", "red", "open"),
            (3, 5): ("key", "green", "open"),
            (3, 2): ("door", "yellow", "locked"),
            (5, 6): ("box", "blue", "open"),
            (4, 6): ("empty", "red", "open"),
            (6, 6): ("wall", "grey", "open"),
            (1, 6): ("wall", "grey", "open"),
            (0, 0): ("unseen", "red", "open"),
        }
    )
    assert describe_view(image, Key("purple")) == (
        "You see a green key (in front of you), a blue box (2 right), a red ball (2 ahead, 1 left) "
        "and a locked yellow door (4 ahead). Walls: 2 left. You carry a purple key."
    )
    empty = _view({(3, 3): ("wall", "grey", "open")})
    assert describe_view(empty) == "You see no objects. Walls: 3 ahead. You carry nothing."


def test_pick_up_and_drop_through_words(env):
    env.reset(env.tasks()[0])
    e = env.env
    e.grid.set(*e.front_pos, Ball("purple"))
    e.grid.set(*(e.front_pos + e.dir_vec), None)  # keep the drop from landing next to the mission object
    obs, reward, terminated, truncated, info = env.step("Pick  UP")
    assert info["valid"] and reward == 0.0 and not terminated
    assert obs.endswith("You carry a purple ball.")
    assert e.grid.get(*e.front_pos) is None
    obs, *_ = env.step("pick up")  # hands full: nothing changes
    assert obs.startswith("Nothing happens.")
    obs, *_ = env.step("drop")
    assert "a purple ball (in front of you)" in obs and obs.endswith("You carry nothing.")


@pytest.mark.parametrize("level", DEFAULT_LEVELS)
def test_expert_solves_train_and_test_tasks_with_babyai_reward(env, level):
    for split in ("train", "test"):
        tasks = [t for t in env.tasks_of_split(split) if t.category == level][:3]
        for task in tasks:
            env.reset(task)
            reward = terminated = None
            while not env.done:
                obs, reward, terminated, truncated, info = env.step(env.expert_action())
                assert info["valid"]
                assert info["won"] == terminated
            assert env.won and terminated and obs == "Mission complete."
            assert reward == pytest.approx(1.0 - 0.9 * env.steps / env.max_steps)
            assert info["admissible_actions"] == []


def test_expert_query_is_repeatable_and_leaves_the_state_alone(env):
    env.reset(env.tasks_of_split("test")[7])
    before = _state(env)
    assert env.expert_action() == env.expert_action()
    assert _state(env) == before


def test_expert_recovers_after_random_actions(env):
    rng = random.Random(0)
    tasks = env.tasks()[::20]
    wins = 0
    for task in tasks:
        env.reset(task)
        for _ in range(rng.randint(1, 8)):
            if rng.random() < 0.5:
                env.expert_action()  # the bot then sees a different action taken
            env.step(rng.choice(env.admissible_actions()))
            if env.done:
                break
        while not env.done:
            env.step(env.expert_action())
        wins += env.won
    assert wins >= 0.9 * len(tasks)


def test_generator_chatter_is_silenced(env, capfd):
    for task in env.tasks()[::25]:
        env.reset(task)
    assert capfd.readouterr().out == ""


def test_reward_and_won_only_on_success(env):
    env.reset(env.tasks()[0])
    obs, reward, terminated, truncated, info = env.step("turn left")
    assert reward == 0.0 and not info["won"] and not terminated


# Near misses of BabyAI's own words; the shared stream adds noise and generic near misses.
_NEAR_MISSES = ["turn", "left", "forward", "go forward!", "turnleft", "pick-up", "move up", "0", "6"]


@pytest.mark.parametrize("n, seed", BAD_ACTION_RUNS)
def test_bad_actions_change_nothing_but_the_step_count(env, n, seed):
    check_bad_actions(env, n, seed, lambda: _state(env), 0.0, extras=_NEAR_MISSES, prefix="Invalid action.")


@pytest.mark.slow
def test_expert_success_on_every_task(env):
    for split in ("train", "test"):
        wins, n = expert_success(env, env.tasks_of_split(split))
        assert wins >= 0.95 * n, (split, wins, n)
