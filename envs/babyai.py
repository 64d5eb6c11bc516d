"""BabyAI: minigrid's grid-world levels, played through words.

The agent sees what minigrid's 7x7 egocentric view shows (walls hide what is behind
them), rendered as a few short sentences: the objects with their colours and their
offsets from the agent ("a red ball (2 ahead, 1 left)"), doors with their state,
the distance to the walls straight ahead and to the sides, and what the agent
carries. Actions are the seven minigrid actions in words. The level's mission is
the task. Reward on success is BabyAI's 1 - 0.9 * (steps / horizon), counted on
this environment's steps and horizon; otherwise 0. minigrid's `BabyAIBot` is the
expert, kept in step with the actions actually taken (advising mode) and rebuilt
from the current state when it lost track. Category: the level.
"""

from __future__ import annotations

import contextlib
import io
from typing import Any

import gymnasium as gym
import minigrid  # noqa: F401  (registers the BabyAI-* environments)
import numpy as np
from minigrid.core.constants import IDX_TO_COLOR, IDX_TO_OBJECT, STATE_TO_IDX
from minigrid.utils.baby_ai_bot import BabyAIBot

from .base import Task, TextEnv

# Easy single-room levels first, then a few that need several sub-goals (doors, keys, moving objects).
DEFAULT_LEVELS = (
    "GoToObj",
    "GoToLocal",
    "PickupLoc",
    "PickupDist",
    "GoToDoor",
    "OpenDoor",
    "PutNextLocal",
    "UnlockLocal",
)
# Word action -> minigrid action index (minigrid.core.actions.Actions).
ACTIONS = {"turn left": 0, "turn right": 1, "go forward": 2, "pick up": 3, "drop": 4, "toggle": 5, "done": 6}
ACTION_NAMES = {index: name for name, index in ACTIONS.items()}
IDX_TO_STATE = {index: name for name, index in STATE_TO_IDX.items()}
_SILENT_CELLS = {"unseen", "empty", "wall", "floor"}


def level_env_id(level: str) -> str:
    return f"BabyAI-{level}-v0"


def available_levels() -> list[str]:
    return sorted(
        env_id[len("BabyAI-") : -len("-v0")]
        for env_id in gym.registry
        if env_id.startswith("BabyAI-") and env_id.endswith("-v0")
    )


def _object_phrase(obj: str, color: str, state: int) -> str:
    if obj == "door":
        return f"a {IDX_TO_STATE[state]} {color} door"
    if obj in ("goal", "lava"):
        return f"a {obj} square"
    return f"a {color} {obj}"


def _offset_phrase(ahead: int, right: int) -> str:
    if ahead == 1 and right == 0:
        return "in front of you"
    parts = []
    if ahead:
        parts.append(f"{ahead} ahead")
    if right:
        parts.append(f"{abs(right)} {'right' if right > 0 else 'left'}")
    return ", ".join(parts)


def describe_view(image: np.ndarray, carrying: Any = None) -> str:
    """Text for minigrid's egocentric view `image` (agent at the bottom centre, facing up)."""
    size = image.shape[0]
    ax, ay = size // 2, size - 1
    seen = []
    for x in range(size):
        for y in range(size):
            if (x, y) == (ax, ay):
                continue  # the agent's own cell shows what it carries
            obj, color, state = (int(v) for v in image[x, y])
            name = IDX_TO_OBJECT[obj]
            if name in _SILENT_CELLS:
                continue
            ahead, right = ay - y, x - ax
            phrase = f"{_object_phrase(name, IDX_TO_COLOR[color], state)} ({_offset_phrase(ahead, right)})"
            seen.append((ahead + abs(right), ahead, right, phrase))
    phrases = [p for *_, p in sorted(seen)]
    if not phrases:
        sentences = ["You see no objects."]
    elif len(phrases) == 1:
        sentences = [f"You see {phrases[0]}."]
    else:
        sentences = [f"You see {', '.join(phrases[:-1])} and {phrases[-1]}."]

    walls = []
    for label, cells in (
        ("ahead", [(ax, ay - d) for d in range(1, ay + 1)]),
        ("left", [(ax - d, ay) for d in range(1, ax + 1)]),
        ("right", [(ax + d, ay) for d in range(1, size - ax)]),
    ):
        for distance, (x, y) in enumerate(cells, start=1):
            name = IDX_TO_OBJECT[int(image[x, y, 0])]
            if name == "wall":
                walls.append(f"{distance} {label}")
            if name != "empty":
                break  # the first thing that is not open floor hides what lies beyond
    if walls:
        sentences.append(f"Walls: {', '.join(walls)}.")
    if carrying is None:
        sentences.append("You carry nothing.")
    else:
        sentences.append(f"You carry a {carrying.color} {carrying.type}.")
    return " ".join(sentences)


class BabyAIEnv(TextEnv):
    name = "babyai"
    intro = (
        "You are an agent in a grid world of rooms. You see the cells in front of you and can turn, "
        "go forward, pick up, drop and toggle (open doors)."
    )
    # The bot needs at most about 30 steps on the default levels (PutNextLocal, UnlockLocal).
    default_max_steps = 40
    agentgym_reading = "line"  # AgentGym's BabyAI client (agent/play/prompts.py AGENTGYM_READINGS)

    def __init__(
        self,
        max_steps: int | None = None,
        levels: list[str] | tuple[str, ...] | None = None,
        seeds_per_level: int = 100,
        test_fraction: float = 0.2,
        split_seed: int = 0,
    ) -> None:
        super().__init__(max_steps)
        self.levels = tuple(DEFAULT_LEVELS if levels is None else levels)
        if not self.levels:
            raise ValueError("levels must name at least one BabyAI level")
        known = set(available_levels())
        unknown = [lv for lv in self.levels if lv not in known]
        if unknown:
            raise ValueError(f"unknown BabyAI level(s) {unknown}; available: {', '.join(sorted(known))}")
        if len(set(self.levels)) != len(self.levels):
            raise ValueError(f"levels must not repeat, got {list(self.levels)}")
        if seeds_per_level < 2:
            raise ValueError(f"seeds_per_level must be >= 2 (one test and one train seed), got {seeds_per_level}")
        self._tasks = self._build_tasks(seeds_per_level, test_fraction, split_seed)
        self._envs: dict[str, Any] = {}  # one minigrid env per level, made on first use
        self.env: Any = None
        self.mission = ""
        self.failed = False
        self._obs: dict[str, Any] = {}
        self._bot: BabyAIBot | None = None
        self._taken: list[int] = []  # minigrid actions applied since the bot last planned
        self._suggestion: int | None = None

    def _build_tasks(self, seeds_per_level: int, test_fraction: float, split_seed: int) -> list[Task]:
        if not 0.0 < test_fraction < 1.0:
            raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
        rng = np.random.default_rng(split_seed)
        n_test = max(1, round(test_fraction * seeds_per_level))
        tasks = []
        for level in self.levels:
            test_seeds = set(rng.permutation(seeds_per_level)[:n_test].tolist())
            tasks.extend(
                Task(
                    id=f"babyai-{level}-{seed}",
                    category=level,
                    split="test" if seed in test_seeds else "train",
                    data={"level": level, "seed": seed},
                )
                for seed in range(seeds_per_level)
            )
        return tasks

    def tasks(self) -> list[Task]:
        return list(self._tasks)

    def instruction(self) -> str:
        return f"Your mission: {self.mission}."

    def admissible_actions(self) -> list[str]:
        # After a failed mission nothing can help, so every action is refused until the horizon.
        return [] if self.failed else list(ACTIONS)

    def describe(self) -> str:
        return describe_view(self._obs["image"], self.env.carrying)

    # ----- episode ---------------------------------------------------------------------
    def _level_env(self, level: str) -> Any:
        if level not in self._envs:
            self._envs[level] = gym.make(level_env_id(level)).unwrapped
        return self._envs[level]

    def _reset(self, task: Task) -> str:
        level, seed = task.data.get("level"), task.data.get("seed")
        if level not in self.levels:
            raise ValueError(f"BabyAI task {task.id!r}: level {level!r} is not one of {list(self.levels)}")
        if not isinstance(seed, int):
            raise ValueError(f"BabyAI task {task.id!r}: seed must be an int, got {seed!r}")
        self.env = self._level_env(level)
        # The level generator prints its rejection sampling ("Sampling rejected: ...").
        with contextlib.redirect_stdout(io.StringIO()):
            self._obs, _ = self.env.reset(seed=seed)
        self.mission = self._obs["mission"]
        self.failed = False
        self._bot = None
        self._taken = []
        self._suggestion = None
        return self.describe()

    def _signature(self) -> tuple:
        env = self.env
        front = env.grid.get(*env.front_pos)
        carried = None if env.carrying is None else (env.carrying.type, env.carrying.color)
        return (tuple(env.agent_pos), env.agent_dir, carried, None if front is None else front.encode())

    def _step(self, action: str) -> tuple[str, float]:
        before = self._signature()
        index = ACTIONS[action]
        self._obs, reward, terminated, _, _ = self.env.step(index)
        self._taken.append(index)
        if terminated and reward > 0:
            self.won = True
            return "Mission complete.", 1.0 - 0.9 * (self.steps / self.max_steps)
        if terminated:
            self.failed = True
            return "The mission has failed.", 0.0
        prefix = "Nothing happens. " if self._signature() == before else ""
        return prefix + self.describe(), 0.0

    def _invalid(self, action: str) -> tuple[str, float]:
        if self.failed:
            return "The mission has failed; no action can help now.", 0.0
        return f"Invalid action. Use one of: {', '.join(ACTIONS)}. {self.describe()}", 0.0

    # ----- expert ------------------------------------------------------------------------
    def expert_action(self) -> str:
        if self.failed:
            return "done"
        if self._bot is not None and not self._taken and self._suggestion is not None:
            return ACTION_NAMES[self._suggestion]  # nothing happened since the bot's last plan
        try:
            if self._bot is not None and len(self._taken) == 1:
                suggestion = self._bot.replan(self._taken[0])
            else:
                suggestion = self._fresh_bot_plan()
        except Exception:  # noqa: BLE001  (the bot asserts on states it did not expect)
            suggestion = self._fresh_bot_plan()
        self._taken = []
        self._suggestion = int(suggestion)
        return ACTION_NAMES[self._suggestion]

    def _fresh_bot_plan(self) -> int:
        """A new bot that starts from the current state (its map of seen cells starts empty)."""
        try:
            self._bot = BabyAIBot(self.env)
            return int(self._bot.replan())
        except Exception:  # noqa: BLE001  (e.g. the target was destroyed by opening a box)
            self._bot = None
            return ACTIONS["done"]
