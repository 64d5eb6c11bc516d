"""ALFWorld (text) on the real alfworld + textworld[pddl] engine, offline; alfworld is imported only when an env is built."""

from .env import INSTALL_HINT, AlfWorldEnv
from .task_types import ALFWORLD_SPLITS, TASK_TYPES

__all__ = ["AlfWorldEnv", "ALFWORLD_SPLITS", "INSTALL_HINT", "TASK_TYPES"]
