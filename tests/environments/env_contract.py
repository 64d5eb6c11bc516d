"""Checks of the TextEnv contract (envs/base.py) shared by the environment test files.

The contract for bad input: an inadmissible or malformed action never raises, the
state stays as it was, the step still counts, and the observation says the action
was invalid. The helpers here send many such actions and check all of that; each
test file supplies what is particular to its environment (a state snapshot, the
rollout.invalid-action reward, a few hand-written near misses).
"""

from __future__ import annotations

import random
import string
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest

from envs import TextEnv, normalize_action

# Values an agent's parser could hand over in place of text, and degenerate texts.
NOT_TEXT: tuple[Any, ...] = (None, 42, 3.5, ["move up"])
DEGENERATE_TEXT: tuple[str, ...] = ("", " ", "\n\t", "x" * 10_000)
_CHATTER_BEFORE = ("please ", "i will ", "action: ", "my guess is ")
_CHATTER_AFTER = (" now", ".", " 2", " and then stop")

Maker = Callable[[random.Random], str]

#: (n, seed) for the bad-action tests: 1,000 actions by default, 10,000 in the slow run
BAD_ACTION_RUNS = [pytest.param(1_000, 1, id="1k"), pytest.param(10_000, 2, id="10k", marks=pytest.mark.slow)]


def bad_actions(
    rng: random.Random,
    vocabulary: Callable[[], Sequence[str]],
    extras: Sequence[Any] = (),
    makers: Sequence[Maker] = (),
) -> Iterator[Any]:
    """Endless stream of likely-bad actions: first NOT_TEXT, DEGENERATE_TEXT and `extras`,
    then random ones: printable noise, non-ASCII noise, near misses of a vocabulary entry
    (one character dropped, doubled or replaced), entries wrapped in chatter, and whatever
    the env-specific `makers` build.

    `vocabulary` is called for every random action, so it may follow the env's state.
    Some outputs may still be admissible; callers filter them out.
    """
    yield from NOT_TEXT
    yield from DEGENERATE_TEXT
    yield from extras
    while True:
        words = [w for w in vocabulary() if w]
        kind = rng.randrange(4 + len(makers))
        if kind >= 4:
            yield makers[kind - 4](rng)
        elif kind == 1:
            yield "".join(chr(rng.randint(0x80, 0x2FFF)) for _ in range(rng.randint(1, 12)))
        elif kind == 0 or not words:
            yield "".join(rng.choice(string.printable) for _ in range(rng.randint(1, 40)))
        elif kind == 2:
            w = rng.choice(words)
            i = rng.randrange(len(w))
            yield rng.choice([w[:i] + w[i + 1 :], w[:i] + w[i] + w[i:], w[:i] + rng.choice("xz!?7") + w[i + 1 :]])
        else:
            w = rng.choice(words)
            yield rng.choice([rng.choice(_CHATTER_BEFORE) + w, w + rng.choice(_CHATTER_AFTER), f"<action>{w}</action>"])


def assert_invalid_step(
    env: TextEnv,
    action: Any,
    snapshot: Callable[[], Any],
    invalid_reward: float,
    prefix: str = "Invalid action",
    max_obs_chars: int | None = None,
) -> tuple[str, float, bool, bool, dict[str, Any]]:
    """Step an inadmissible `action` and assert the bad-input contract; return the step's result."""
    before, steps = snapshot(), env.steps
    obs, reward, terminated, truncated, info = env.step(action)
    shown = repr(action)[:80]
    assert obs.startswith(prefix), (shown, obs[:200])
    assert max_obs_chars is None or len(obs) <= max_obs_chars, (shown, len(obs))
    assert reward == invalid_reward and not terminated, (shown, reward, terminated)
    assert not info["valid"] and not info["won"], shown
    assert snapshot() == before and env.steps == steps + 1, shown
    return obs, reward, terminated, truncated, info


def check_bad_actions(
    env: TextEnv,
    n: int,
    seed: int,
    snapshot: Callable[[], Any],
    invalid_reward: float,
    *,
    vocabulary: Callable[[], Sequence[str]] | None = None,
    extras: Sequence[Any] = (),
    makers: Sequence[Maker] = (),
    expert_steps: int = 0,
    prefix: str = "Invalid action",
    max_obs_chars: int | None = None,
) -> None:
    """Play random tasks, each after 0..`expert_steps` expert moves (so some states hold
    progress), and send inadmissible actions from `bad_actions` until `n` were checked
    with `assert_invalid_step`. `vocabulary` defaults to the env's admissible actions."""
    rng = random.Random(seed)
    actions = bad_actions(rng, vocabulary or env.admissible_actions, extras, makers)
    tasks = env.tasks()
    checked = 0
    while checked < n:
        env.reset(tasks[rng.randrange(len(tasks))])
        for _ in range(rng.randint(0, expert_steps)):
            if env.done:
                break
            env.step(env.expert_action())
        while not env.done and checked < n:
            action = next(actions)
            if env.is_admissible(normalize_action(action)):
                continue
            assert_invalid_step(env, action, snapshot, invalid_reward, prefix, max_obs_chars)
            checked += 1


def play_expert(env: TextEnv, task) -> bool:
    """Play `task` to the end with the scripted expert; return whether it was won."""
    env.reset(task)
    while not env.done:
        env.step(env.expert_action())
    return env.won


def expert_success(env: TextEnv, tasks: Sequence) -> tuple[int, int]:
    """(episodes the expert wins, episodes played) over `tasks`."""
    return sum(play_expert(env, task) for task in tasks), len(tasks)
