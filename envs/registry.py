"""The one registry of single text environments: name -> TextEnv class."""

from __future__ import annotations

from .alfworld import AlfWorldEnv  # imports alfworld only when an env is constructed
from .babyai import BabyAIEnv
from .base import TextEnv
from .gridworld import GridworldEnv
from .maze import MazeEnv
from .textcraft import TextCraftEnv
from .webshop import WebShopEnv
from .wordle import WordleEnv

ENVIRONMENTS: dict[str, type[TextEnv]] = {
    MazeEnv.name: MazeEnv,
    GridworldEnv.name: GridworldEnv,
    BabyAIEnv.name: BabyAIEnv,
    TextCraftEnv.name: TextCraftEnv,
    WordleEnv.name: WordleEnv,
    WebShopEnv.name: WebShopEnv,
    AlfWorldEnv.name: AlfWorldEnv,
}


def available_envs() -> list[str]:
    return sorted(ENVIRONMENTS)


def env_class(name: str) -> type[TextEnv]:
    try:
        return ENVIRONMENTS[name]
    except KeyError:
        raise ValueError(f"unknown env {name!r}; available: {', '.join(available_envs())}") from None
