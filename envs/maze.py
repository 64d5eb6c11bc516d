"""Maze: LMRL-Gym's fully observed double-T maze.

Facts carried over from LMRL-Gym (llm_rl_scripts/maze): the 10x13 double-T grid,
the goal at (8, 6), every other free cell as a start, and the fully observed
description ("The goal is at position 8, 6. Your current position is at position
1, 1 1. There are walls above you, below you.", numbers written digit by digit).
The moves, rewards and breadth-first expert are the grid environments' (envs/grid.py).
"""

from __future__ import annotations

import numpy as np

from .base import Task
from .grid import GridNavigationEnv, bfs_distances

# 1 = wall, 0 = free.
DOUBLE_T_MAZE = np.array(
    [
        [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1],
        [1, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 1],
        [1, 1, 1, 0, 1, 1, 1, 1, 1, 0, 1, 1, 1],
        [1, 1, 1, 0, 1, 1, 1, 1, 1, 0, 1, 1, 1],
        [1, 1, 1, 0, 1, 1, 1, 1, 1, 0, 1, 1, 1],
        [1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1],
        [1, 1, 1, 1, 1, 1, 0, 1, 1, 1, 1, 1, 1],
        [1, 1, 1, 1, 1, 1, 0, 1, 1, 1, 1, 1, 1],
        [1, 1, 1, 1, 1, 1, 0, 1, 1, 1, 1, 1, 1],
        [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1],
    ],
    dtype=np.uint8,
)
GOAL = (8, 6)


def _digits(n: int) -> str:
    # LMRL-Gym spells positions digit by digit: 11 -> "1 1".
    return " ".join(str(n))


def shortest_distances(maze: np.ndarray = DOUBLE_T_MAZE, goal: tuple[int, int] = GOAL) -> dict[tuple[int, int], int]:
    """BFS distance (in moves) from every free cell to the goal."""
    return bfs_distances(maze, goal)


def distance_category(distance: int) -> str:
    if distance <= 4:
        return "near"
    if distance <= 8:
        return "mid"
    return "far"


class MazeEnv(GridNavigationEnv):
    name = "maze"
    intro = "You are an agent in a maze. You move one cell at a time."
    # The longest shortest path is 12 moves; 20 leaves room for a few detours.
    default_max_steps = 20

    def __init__(self, max_steps: int | None = None, test_fraction: float = 1 / 3, split_seed: int = 0) -> None:
        super().__init__(max_steps)
        self.grid = DOUBLE_T_MAZE
        self.goal = GOAL
        self.distances = shortest_distances(self.grid, self.goal)
        self._tasks = self._build_tasks(test_fraction, split_seed)
        self.position = self.goal

    def _build_tasks(self, test_fraction: float, split_seed: int) -> list[Task]:
        if not 0.0 < test_fraction < 1.0:
            raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
        starts = sorted(p for p in self.distances if p != self.goal)
        # Hold out a fixed share of each distance category, so both splits span near to far.
        rng = np.random.default_rng(split_seed)
        split_of: dict[tuple[int, int], str] = {}
        for category in ("near", "mid", "far"):
            cells = [p for p in starts if distance_category(self.distances[p]) == category]
            order = rng.permutation(len(cells))
            n_test = max(1, round(test_fraction * len(cells)))
            for rank, idx in enumerate(order):
                split_of[cells[idx]] = "test" if rank < n_test else "train"
        return [
            Task(
                id=f"maze-{r}-{c}",
                category=distance_category(self.distances[(r, c)]),
                split=split_of[(r, c)],
                data={"start": [r, c], "distance": self.distances[(r, c)]},
            )
            for r, c in starts
        ]

    def tasks(self) -> list[Task]:
        return list(self._tasks)

    def instruction(self) -> str:
        return f"Reach the goal at position {_digits(self.goal[0])}, {_digits(self.goal[1])}."

    def describe(self) -> str:
        r, c = self.position
        return (
            f"The goal is at position {_digits(self.goal[0])}, {_digits(self.goal[1])}. "
            f"Your current position is at position {_digits(r)}, {_digits(c)}. {self.walls_around()}"
        )

    def _reset(self, task: Task) -> str:
        start = tuple(task.data["start"])
        if start not in self.distances or start == self.goal:
            raise ValueError(f"Maze task {task.id!r}: start {start} is not a free non-goal cell")
        self.position = start
        return self.describe()
