"""Several environments behind one TextEnv: the env spec 'babyai,webshop,textcraft,maze,wordle'.

Fed-SE (§5.1) trains one agent population over five heterogeneous environments.
`MultiEnv` makes such a spec usable wherever a single env name is: its task pool
is the union of the environments' pools, and an instance routes each episode to
an instance of the task's own environment, so the batched rollout engine keeps
calling `env_factory()` once per episode and needs no change.

Each combined task carries its environment in its identity: id `<env>/<task id>`
and category `<env>/<category>` (so ids stay unique and per-category metrics stay
apart across environments); `data` holds the environment name and the original
task, which is what the inner environment is reset with.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .base import SPLITS, Task, TextEnv
from .registry import available_envs, env_class

ENV_KEY = "env"
TASK_KEY = "task"


def env_names(spec: str) -> list[str]:
    """The environment names of a spec, in order; raises ValueError naming a bad entry."""
    names = [part.strip() for part in str(spec).split(",")]
    known = available_envs()
    for name in names:
        if not name:
            raise ValueError(f"env spec {spec!r} has an empty name; write names separated by commas, e.g. 'babyai,maze'")
        if name not in known:
            raise ValueError(f"env spec {spec!r}: unknown environment {name!r}; available: {', '.join(known)}")
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"env spec {spec!r} names {', '.join(duplicates)} more than once; each environment may appear once")
    return names


def normalize_spec(spec: str) -> str:
    """A checked spec without spaces ('babyai, maze' -> 'babyai,maze'): one spelling per env list."""
    return ",".join(env_names(spec))


def is_multi_spec(spec: str) -> bool:
    return "," in str(spec)


def combine_task(env: str, task: Task) -> Task:
    return Task(id=f"{env}/{task.id}", category=f"{env}/{task.category}", split=task.split,
                data={ENV_KEY: env, TASK_KEY: task})


def task_env(task: Task) -> str | None:
    """The environment of a combined task; None for a task of a single environment's pool."""
    inner = task.data.get(TASK_KEY)
    return task.data.get(ENV_KEY) if isinstance(inner, Task) else None


def per_env_numbers(text: str) -> dict[str, int]:
    """A per-environment setting written "babyai=20,webshop=10" as {name: number}; raises ValueError naming the bad
    entry. Each name must be registered and appear once; each number an integer >= 1."""
    out: dict[str, int] = {}
    for part in str(text).split(","):
        name, _, number = (x.strip() for x in part.partition("="))
        if name not in available_envs() or name in out or not number.isdigit() or int(number) < 1:
            raise ValueError(f"entry {part.strip()!r} of {text!r}: expected name=number, a registered environment named "
                             f"once and an integer >= 1, e.g. 'babyai=20,webshop=10'")
        out[name] = int(number)
    return out


def for_env(setting: int | str | None, name: str | None) -> int:
    """An environment's value of a setting that is either one number for every environment or per-environment text
    ("babyai=20,webshop=10"): the number, the named entry, or 0 (the environment's default) where it is not named."""
    if isinstance(setting, str):
        return per_env_numbers(setting).get(name or "", 0)
    return int(setting or 0)


def per_env_problem(value: int | str, spec: str, most: Callable[[str], int] | None = None) -> str | None:
    """What `value` (one number for every environment, or "babyai=20,webshop=10") breaks for the environments of
    `spec`: malformed, naming an environment `spec` does not list, or above most(name); None where it is good, and
    for a number where `spec` is no list of text environments (the env key reports a bad one)."""
    try:
        names = env_names(spec)
        numbers = per_env_numbers(value) if isinstance(value, str) else {}
    except ValueError as err:
        return f"an integer, or name=integer >= 1 for the envs of env, comma-separated ({err})" if isinstance(value, str) else None
    if unlisted := sorted(set(numbers) - set(names)):
        return f"entries for the envs of env={spec!r} only (not {', '.join(unlisted)})"
    if most and any(for_env(value, n) > most(n) for n in names):
        return "0 (all), or per env at most its size (" + ", ".join(f"{n} {most(n)}" for n in names) + ")"
    return None


def _only_name(setting: int | str) -> str | None:
    """The one environment a per-environment setting names (a single environment's pool carries no names)."""
    names = list(per_env_numbers(setting)) if isinstance(setting, str) else []
    return names[0] if len(names) == 1 else None


def _rows_by_env(tasks: Sequence[Task]) -> dict[str | None, list[int]]:
    """Pool positions of each environment's tasks, environments in order of first appearance."""
    groups: dict[str | None, list[int]] = {}
    for i, t in enumerate(tasks):
        groups.setdefault(task_env(t), []).append(i)
    return groups


def per_env_spread(tasks: Sequence[Task], n: int | str) -> list[Task]:
    """`n` evenly spaced tasks of every environment, in pool order; n = 0 keeps all. `n` may be per environment
    ("webshop=200,babyai=90": for_env), an environment not named keeping all its tasks.

    Used for `eval.tasks`: a cap never leaves an environment out, and since pools are
    ordered by category (ALFWorld lists all its pick-and-place games first), evenly
    spaced picks keep every category that the first `n` would miss.
    """
    if not n:
        return list(tasks)
    keep = set()
    for env, rows in _rows_by_env(tasks).items():
        n_env = for_env(n, env if env is not None else _only_name(n))
        if n_env <= 0 or len(rows) <= n_env:
            keep.update(rows)
        else:
            keep.update(rows[(j * len(rows)) // n_env] for j in range(n_env))
    return [t for i, t in enumerate(tasks) if i in keep]


def per_env_sample(tasks: Sequence[Task], n: int, seed: int) -> list[Task]:
    """A seeded sample of at most `n` tasks of every environment, in pool order; n = 0 keeps all."""
    if n <= 0:
        return list(tasks)
    rng = np.random.default_rng(seed)
    keep = set()
    for rows in _rows_by_env(tasks).values():
        keep.update(rows if len(rows) <= n else rng.choice(rows, size=n, replace=False).tolist())
    return [t for i, t in enumerate(tasks) if i in keep]


class MultiEnv(TextEnv):
    """The union of several environments; each episode runs in its task's own environment.

    Everything an episode touches (observation, admissible actions, expert, the
    intro line of the prompt, optional hooks such as `action_hint`) comes from the
    environment the last `reset` routed to. Inner environments are built on first
    use, so an instance made for one episode builds only that episode's environment.
    """

    name = "multi"  # not registered: built by make_env for a comma-separated spec

    def __init__(self, spec: str | Sequence[str], max_steps: int | str | None = None) -> None:
        """max_steps: one horizon for every environment, or per environment ("babyai=20,webshop=10": for_env)."""
        # No super().__init__: task, steps, won and max_steps are the routed env's (properties below).
        self.names = tuple(env_names(spec if isinstance(spec, str) else ",".join(spec)))
        self._max_steps = max_steps or None
        self._envs: dict[str, TextEnv] = {}
        self._active: TextEnv | None = None
        self._task: Task | None = None
        self._pool: list[Task] | None = None

    @property
    def spec(self) -> str:
        return ",".join(self.names)

    def env(self, name: str) -> TextEnv:
        """This instance's environment `name` (built on first use)."""
        if name not in self.names:
            raise ValueError(f"environment {name!r} is not part of the spec {self.spec!r}")
        if name not in self._envs:
            self._envs[name] = env_class(name)(max_steps=for_env(self._max_steps, name) or None)
        return self._envs[name]

    # ----- the task pool ---------------------------------------------------------------
    def tasks(self) -> list[Task]:
        if self._pool is None:
            self._pool = [combine_task(name, t) for name in self.names for t in self.env(name).tasks()]
        return list(self._pool)

    def tasks_of_split(self, split: str) -> list[Task]:
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        return [t for t in self.tasks() if t.split == split]

    # ----- routing ------------------------------------------------------------------------
    def _routed(self) -> TextEnv:
        if self._active is None:
            raise RuntimeError("MultiEnv: no episode yet; call reset(task) first")
        return self._active

    def reset(self, task: Task) -> tuple[str, dict[str, Any]]:
        name = task_env(task)
        if name is None:
            raise ValueError(f"task {task.id!r} names no environment; MultiEnv plays tasks from its own tasks() pool")
        self._active = self.env(name)
        self._task = task
        return self._active.reset(task.data[TASK_KEY])

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        return self._routed().step(action)

    @property
    def intro(self) -> str:  # type: ignore[override]  # a ClassVar on single envs
        return self._routed().intro

    @property
    def task(self) -> Task | None:  # the combined task, as handed to reset
        return self._task

    @property
    def steps(self) -> int:
        return self._routed().steps

    @property
    def won(self) -> bool:
        return self._routed().won

    @property
    def max_steps(self) -> int:
        return self._routed().max_steps

    @property
    def done(self) -> bool:
        return self._routed().done

    def instruction(self) -> str:
        return self._routed().instruction()

    def admissible_actions(self) -> list[str]:
        return self._routed().admissible_actions()

    def expert_action(self) -> str:
        return self._routed().expert_action()

    def is_admissible(self, action: str) -> bool:
        return self._routed().is_admissible(action)

    def is_terminal(self) -> bool:
        return self._routed().is_terminal()

    # the routed env's, not TextEnv's defaults: class attributes of TextEnv, which __getattr__ never sees asked for
    reference_tail_chars = property(lambda self: self._routed().reference_tail_chars)
    reference_actions_per_line = property(lambda self: self._routed().reference_actions_per_line)
    agentgym_reading = property(lambda self: self._routed().agentgym_reading)

    def __getattr__(self, attr: str) -> Any:
        # Optional hooks of the routed env (e.g. Wordle's and WebShop's action_hint).
        # Only reached for names MultiEnv lacks; private names are never forwarded.
        active = self.__dict__.get("_active")
        if active is None or attr.startswith("_"):
            raise AttributeError(attr)
        return getattr(active, attr)

    # reset/step are routed whole, so the per-step hooks of TextEnv are never called here.
    def _reset(self, task: Task) -> str:
        raise NotImplementedError("MultiEnv routes whole episodes; see reset()")

    def _step(self, action: str) -> tuple[str, float]:
        raise NotImplementedError("MultiEnv routes whole episodes; see step()")

    def _invalid(self, action: str) -> tuple[str, float]:
        raise NotImplementedError("MultiEnv routes whole episodes; see step()")
