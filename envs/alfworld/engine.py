"""One ALFWorld game played on textworld's PDDL engine, with ALFWorld's naming and experts.

The stack is the one ALFWorld's `AlfredTWEnv` builds (PddlEnv + AlfredDemangler),
assembled here directly: `AlfredTWEnv.init_env` hangs silently on an empty game list
and passes its expert type where the wrapped env belongs, so it is not used.

Experts:
- "planner": fast-downward's plan from the current state, on the task-relevant part of
  it (planner.py). The plan is kept while the agent follows it and recomputed when it
  deviates, so an expert-driven episode plans once. It knows where every object is.
- "handcoded": ALFWorld's `HandCodedTWAgent`, which searches receptacles like an agent
  that has to look. It tracks the episode itself, so it observes every step; it runs
  on its own random stream (swapped in around each call) so episodes are reproducible
  and Python's global `random` is left alone.
"""

from __future__ import annotations

import random
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import textworld
import textworld.envs.pddl.logic as pddl_logic
from textworld.envs.pddl import PddlEnv

from alfworld.agents.environment.alfred_tw_env import AlfredDemangler
from alfworld.agents.expert import HandCodedAgentFailed, HandCodedAgentTimeout, HandCodedTWAgent
from alfworld.info import ALFRED_PDDL_PATH, ALFRED_TWL2_PATH

from . import textworld_cache
from .planner import RelevantPlanner
from .task_types import TASK_TYPES

EXPERT_TYPES = ("planner", "handcoded")
GOAL_PLACEHOLDER = "UNKNOWN GOAL"  # where alfworld's grammar takes the task text (add_task_to_grammar)
with open(ALFRED_PDDL_PATH) as _f:
    ALFRED_DOMAIN = _f.read()
with open(ALFRED_TWL2_PATH) as _f:
    ALFRED_GRAMMAR = _f.read()
_GRAMMAR_HEAD, _GRAMMAR_TAIL = ALFRED_GRAMMAR.split(GOAL_PLACEHOLDER)


def split_task_from_grammar(grammar: str) -> tuple[str, str | None]:
    """(grammar with the goal placeholder, task text) when `grammar` is alfworld's own with a task filled in.

    Parsing the grammar takes most of a second, so games that differ only in their task
    text share one parsed copy and the text is put into the intro afterwards.
    """
    if (
        grammar.startswith(_GRAMMAR_HEAD)
        and grammar.endswith(_GRAMMAR_TAIL)
        and len(grammar) > len(_GRAMMAR_HEAD) + len(_GRAMMAR_TAIL)
    ):
        return ALFRED_GRAMMAR, grammar[len(_GRAMMAR_HEAD) : len(grammar) - len(_GRAMMAR_TAIL)]
    return grammar, None


class _SharedLogicPddlEnv(PddlEnv):
    """PddlEnv that parses each (domain, grammar) pair once per process."""

    _logics: dict[tuple[str, str], Any] = {}

    def load(self, data: Mapping[str, Any]) -> None:
        key = (data["pddl_domain"], data["grammar"])
        if key not in self._logics:
            self._logics[key] = pddl_logic.GameLogic(domain=key[0], grammar=key[1])
        self._game_file = None
        self._game_data = data
        self.walkthrough = data.get("walkthrough")
        self._logic = self._logics[key]
        self._pddl_state = pddl_logic.PddlState(self.downward_lib, data["pddl_problem"], self._logic)
        self._entity_infos = self._get_entity_infos()


class AlfredGame:
    """Holds one fast-downward instance; `load` a game, then `reset` / `step` it."""

    def __init__(self, expert_type: str = "planner") -> None:
        if expert_type not in EXPERT_TYPES:
            raise ValueError(f"expert_type must be one of {EXPERT_TYPES}, got {expert_type!r}")
        self.expert_type = expert_type
        textworld_cache.install()
        infos = textworld.EnvInfos(admissible_commands=True, won=True, facts=expert_type == "handcoded")
        # PddlEnv loads a private copy of libdownward, so several games can live in one process.
        self._env = AlfredDemangler(_SharedLogicPddlEnv(infos), shuffle=False)
        self._game: Mapping[str, Any] | None = None
        self._game_id: str | None = None
        self._task_text: str | None = None
        self._expert_seed = 0
        self._task_params: dict[str, Any] | None = None
        self.state = None
        self._plan: list[str] = []
        self._handcoded: HandCodedTWAgent | None = None
        self._handcoded_rng = random.Random(0)
        self._handcoded_next = "look"
        self._planner = RelevantPlanner() if expert_type == "planner" else None

    # ----- lifecycle ------------------------------------------------------------------
    @property
    def game_id(self) -> str | None:
        return self._game_id

    def load(self, game: Mapping[str, Any], task_params: Mapping[str, Any], game_id: str) -> None:
        """`game` = {pddl_domain, grammar, pddl_problem}, ALFWorld's game.tw-pddl; `task_params` =
        {task_type, pddl_params} as in traj_data.json."""
        missing = {"pddl_domain", "grammar", "pddl_problem"} - set(game)
        if missing:
            raise ValueError(f"ALFWorld game {game_id!r} lacks {sorted(missing)}")
        if task_params.get("task_type") not in TASK_TYPES or "pddl_params" not in task_params:
            raise ValueError(f"ALFWorld game {game_id!r}: task_params need a task_type of {TASK_TYPES} and pddl_params")
        self._game_id = None
        grammar, self._task_text = split_task_from_grammar(game["grammar"])
        with _translating():
            self._env.load({**game, "grammar": grammar})
        self._game, self._task_params, self._game_id = game, task_params, game_id
        self.state = None

    def set_expert_seed(self, seed: int) -> None:
        """Seed of the hand-coded expert's random choices, applied at each reset."""
        self._expert_seed = int(seed)

    def reset(self) -> str:
        if self._game is None:
            raise RuntimeError("AlfredGame.reset() called before load()")
        with _translating():
            self.state = self._env.reset()
        if self._task_text is not None:
            self.state.feedback = self.state.feedback.replace(GOAL_PLACEHOLDER, self._task_text, 1)
        self._plan = []
        if self.expert_type == "handcoded":
            self._handcoded_rng = random.Random(self._expert_seed)
            self._handcoded = HandCodedTWAgent(max_steps=200)
            self._handcoded.task_params = self._handcoded_params()
            self._handcoded.policy = self._handcoded.get_task_policy(self._handcoded.task_params)(
                self._handcoded.task_params, max_steps=200
            )
            self._handcoded.observe(self.state.feedback)
            self._handcoded_next = "look"  # what ALFWorld's own expert wrapper answers before the first move
        return self.state.feedback

    def step(self, command: str) -> tuple[str, bool]:
        """Apply an admissible command; returns (feedback, won)."""
        self.state, _, _ = self._env.step(command)
        if self._plan and self._plan[0] == command:
            self._plan.pop(0)
        else:
            self._plan = []
        if self.expert_type == "handcoded":
            # The package's expert proposes "move X to Y" but tracks its inventory on "put":
            # show it the placement under the name it tracks, or it never lets go of the object.
            tracked = "put " + command[len("move ") :] if command.startswith("move ") else command
            self._handcoded_next = self._handcoded_act(tracked)
        return self.state.feedback, bool(self.state.won)

    def close(self) -> None:
        self._env.close()
        if self._planner is not None:
            self._planner.close()
            self._planner = None

    # ----- state ----------------------------------------------------------------------
    @property
    def admissible_commands(self) -> list[str]:
        return list(self.state.admissible_commands) if self.state is not None else []

    @property
    def won(self) -> bool:
        return bool(self.state is not None and self.state.won)

    def facts(self) -> list[str]:
        """The full symbolic state, sorted (for checks that a state did not change)."""
        pddl_state = self._env.unwrapped._pddl_state
        return sorted(str(f) for f in pddl_state.facts)

    # ----- experts --------------------------------------------------------------------
    def expert_action(self) -> str:
        if self.state is None:
            raise RuntimeError("AlfredGame.expert_action() called before reset()")
        if self.expert_type == "handcoded":
            return self._handcoded_next
        if not self._plan and not self.won:
            unwrapped = self._env.unwrapped
            self._plan = self._planner.plan(
                unwrapped._pddl_state,
                unwrapped._entity_infos,
                self._game["pddl_domain"],
                self._game["pddl_problem"],
                self._task_params,
            )
        return self._plan[0] if self._plan else "look"

    def _handcoded_params(self) -> dict[str, Any]:
        import alfworld.gen.constants as constants

        params = {**self._task_params["pddl_params"], "task_type": self._task_params["task_type"]}
        # as HandCodedAgent.reset does after reading traj_data.json
        return {k: (v.lower() if v in constants.OBJECTS else v) for k, v in params.items()}

    def _handcoded_act(self, last_command: str) -> str:
        saved = random.getstate()
        random.setstate(self._handcoded_rng.getstate())
        try:
            action = self._handcoded.act(self.state, 0, self.state.won, last_command)
        except (HandCodedAgentTimeout, HandCodedAgentFailed):
            action = "look"
        finally:
            self._handcoded_rng.setstate(random.getstate())
            random.setstate(saved)
        return action if action in self.state.admissible_commands else "look"


@contextmanager
def _translating() -> Iterator[None]:
    """Around textworld calls that may translate PDDL: no translation for `replan` (this
    engine plans with RelevantPlanner), and sys.argv put back (the translator overwrites it)."""
    argv = list(sys.argv)
    try:
        with textworld_cache.without_replan_translation():
            yield
    finally:
        sys.argv = argv
