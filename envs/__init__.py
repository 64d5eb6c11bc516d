"""Text environments behind one contract (`TextEnv`), looked up by name."""

from __future__ import annotations

import functools

from .base import SPLITS, Task, TextEnv, normalize_action
from .multi import MultiEnv, env_names, for_env, is_multi_spec, per_env_numbers, per_env_problem, task_env
from .registry import ENVIRONMENTS, available_envs, env_class


def answer_token_budget(spec: str) -> int:
    """Default rollout.max-completion-length for an env or a multi-env spec: the largest its envs need."""
    return max(env_class(name).default_max_new_tokens for name in env_names(spec))


def make_env(name: str, max_steps: int | str | None = None) -> TextEnv:
    """A fresh environment instance; `max_steps=None` (or 0) keeps the env's default horizon, and per-environment
    text ("babyai=20,webshop=10") sets the horizon of each environment it names (the others keep their default).

    A comma-separated spec such as 'babyai,maze' gives a MultiEnv (envs/multi.py):
    the union of those environments' task pools, each episode in its task's own env.
    """
    if is_multi_spec(name):
        return MultiEnv(name, max_steps=max_steps or None)
    return env_class(name)(max_steps=for_env(max_steps, name) or None)


@functools.cache
def split_size(name: str, split: str) -> int:
    """How many tasks the named env's `split` holds (an instance is built once to count them)."""
    return len(make_env(name).tasks_of_split(split))


__all__ = [
    "SPLITS", "Task", "TextEnv", "ENVIRONMENTS", "MultiEnv", "answer_token_budget", "available_envs", "env_class", "env_names", "is_multi_spec",
    "for_env", "make_env", "normalize_action", "per_env_numbers", "per_env_problem", "split_size", "task_env",
]
