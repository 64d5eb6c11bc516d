"""The TextEnv contract every environment implements.

A text environment is a gymnasium-style episodic environment whose observations
and actions are strings. It owns a pool of tasks (each with an id, a category and
a split) and a scripted expert used for behaviour cloning and sanity checks.

    obs, info = env.reset(task)
    obs, reward, terminated, truncated, info = env.step("move up")

`info` always carries `admissible_actions` (list of str), `won` (bool) and
`valid` (whether the last action was admissible). An inadmissible or malformed
action never raises: the state stays as it was, the step counts, and the
observation says the action was invalid.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar

SPLITS = ("train", "test")


@dataclass(frozen=True)
class Task:
    """One task of an environment's pool; `data` holds what the env needs to set it up."""

    id: str
    category: str
    split: str
    data: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        if self.split not in SPLITS:
            raise ValueError(f"Task {self.id!r}: split must be one of {SPLITS}, got {self.split!r}")


class TextEnv(ABC):
    """Base class of the text environments (see module docstring)."""

    #: registry name, as used by run-config `env`
    name: ClassVar[str] = ""
    #: one line that introduces the environment to the agent
    intro: ClassVar[str] = ""
    #: horizon used when the caller does not set one
    default_max_steps: ClassVar[int] = 20
    #: tokens an answer (<think>...</think><action>...</action>) may take when run-config
    #: rollout.max-completion-length is 0; long free-text actions (a WebShop search) need more
    default_max_new_tokens: ClassVar[int] = 32
    #: raised when what the agent is shown changes (instruction, observations), so that models
    #: behaviour-cloned on the old text (tiny models) are built again rather than reused
    prompt_revision: ClassVar[int] = 0
    #: rollout.answer-parsing=reference: characters of an answer without <action> tags that the reference's parser hands
    #: the environment, lowercased (verl-agent's projection.py: ALFWorld 30, WebShop 20; ALFWorld's elsewhere)
    reference_tail_chars: ClassVar[int] = 30
    #: rollout.prompt-template=reference: the admissible actions one per line (WebShop's template) or ALFWorld's layout
    reference_actions_per_line: ClassVar[bool] = False
    #: rollout.answer-parsing=agentgym: how AgentGym's client for this environment takes the action out of the answer
    #: (agent/play/prompts.py AGENTGYM_READINGS: line = BabyAI's and TextCraft's, last = WebShop's, first = the others')
    agentgym_reading: ClassVar[str] = "first"

    def __init__(self, max_steps: int | None = None) -> None:
        self.max_steps = int(max_steps or self.default_max_steps)
        if self.max_steps <= 0:
            raise ValueError(f"max_steps must be positive, got {max_steps}")
        self.task: Task | None = None
        self.steps = 0
        self.won = False

    # ----- the task pool -------------------------------------------------------------
    @abstractmethod
    def tasks(self) -> list[Task]:
        """The environment's full task pool (both splits), in a fixed order."""

    def tasks_of_split(self, split: str) -> list[Task]:
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        return [t for t in self.tasks() if t.split == split]

    # ----- episode --------------------------------------------------------------------
    @abstractmethod
    def instruction(self) -> str:
        """The current task's instruction, as shown to the agent."""

    @abstractmethod
    def admissible_actions(self) -> list[str]:
        """Actions accepted in the current state."""

    @abstractmethod
    def expert_action(self) -> str:
        """What the scripted expert does in the current state."""

    @abstractmethod
    def _reset(self, task: Task) -> str:
        """Set the episode up for `task`; return the first observation."""

    @abstractmethod
    def _step(self, action: str) -> tuple[str, float]:
        """Apply an admissible action; return (observation, reward) and set self.won."""

    @abstractmethod
    def _invalid(self, action: str) -> tuple[str, float]:
        """Observation and reward for an inadmissible action (the state must not change)."""

    def reset(self, task: Task) -> tuple[str, dict[str, Any]]:
        self.task = task
        self.steps = 0
        self.won = False
        obs = self._reset(task)
        return obs, self._info(valid=True)

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self.task is None:
            raise RuntimeError(f"{type(self).__name__}.step() called before reset()")
        if self.done:
            raise RuntimeError(f"{type(self).__name__}.step() called after the episode ended")
        self.steps += 1
        normalized = normalize_action(action)
        valid = self.is_admissible(normalized)
        obs, reward = self._step(normalized) if valid else self._invalid(action)
        terminated = self.is_terminal()
        truncated = not terminated and self.steps >= self.max_steps
        return obs, float(reward), terminated, truncated, self._info(valid=valid)

    def is_admissible(self, action: str) -> bool:
        """Whether a normalised action is accepted now (override for open-ended actions like search[...])."""
        return action in self.admissible_actions()

    def is_terminal(self) -> bool:
        """Whether the episode ended on its own: a win, or an env-specific end such as a purchase."""
        return self.won

    @property
    def done(self) -> bool:
        return self.is_terminal() or self.steps >= self.max_steps

    def _info(self, valid: bool) -> dict[str, Any]:
        return {
            "admissible_actions": [] if self.done else self.admissible_actions(),
            "won": self.won,
            "valid": valid,
            "steps": self.steps,
        }


def normalize_action(text: str) -> str:
    """Lower-case and collapse whitespace, so 'Move  Up' matches 'move up'."""
    return " ".join(str(text).lower().split())
