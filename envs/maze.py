"""Maze: LMRL-Gym's fully observed double-T maze.

Facts carried over from LMRL-Gym (llm_rl_scripts/maze): the 10x13 double-T grid,
the goal at (8, 6), every other free cell as a start, the four moves, the fully
observed description ("The goal is at position 8, 6. Your current position is at
position 1, 1 1. There are walls above you, below you.", numbers written digit by
digit), and the standard reward: 0 on reaching the goal, -1 for any other move
(bumping into a wall leaves the agent in place), -4 for a text that is not one
of the moves. The expert follows a breadth-first shortest path.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from .base import Task, TextEnv

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
MOVES = {"move up": (-1, 0), "move down": (1, 0), "move left": (0, -1), "move right": (0, 1)}
# Order in which LMRL-Gym lists the neighbouring walls.
WALL_DIRECTIONS = (("to your right", (0, 1)), ("to your left", (0, -1)), ("above you", (-1, 0)), ("below you", (1, 0)))

GOAL_REWARD, MOVE_REWARD, ILLEGAL_REWARD = 0.0, -1.0, -4.0


def _digits(n: int) -> str:
    # LMRL-Gym spells positions digit by digit: 11 -> "1 1".
    return " ".join(str(n))


def describe_walls(walls: list[str]) -> str:
    if not walls:
        return "There are no walls near you."
    if len(walls) == 1:
        return f"There is a wall {walls[0]}."
    return f"There are walls {', '.join(walls)}."


def shortest_distances(maze: np.ndarray = DOUBLE_T_MAZE, goal: tuple[int, int] = GOAL) -> dict[tuple[int, int], int]:
    """BFS distance (in moves) from every free cell to the goal."""
    dist = {goal: 0}
    queue = deque([goal])
    while queue:
        r, c = queue.popleft()
        for dr, dc in MOVES.values():
            nxt = (r + dr, c + dc)
            if maze[nxt] == 0 and nxt not in dist:
                dist[nxt] = dist[(r, c)] + 1
                queue.append(nxt)
    return dist


def distance_category(distance: int) -> str:
    if distance <= 4:
        return "near"
    if distance <= 8:
        return "mid"
    return "far"


class MazeEnv(TextEnv):
    name = "maze"
    intro = "You are an agent in a maze. You move one cell at a time."
    # The longest shortest path is 12 moves; 20 leaves room for a few detours.
    default_max_steps = 20

    def __init__(self, max_steps: int | None = None, test_fraction: float = 1 / 3, split_seed: int = 0) -> None:
        super().__init__(max_steps)
        self.maze = DOUBLE_T_MAZE
        self.goal = GOAL
        self.distances = shortest_distances(self.maze, self.goal)
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

    def admissible_actions(self) -> list[str]:
        return list(MOVES)

    def describe(self) -> str:
        r, c = self.position
        walls = [name for name, (dr, dc) in WALL_DIRECTIONS if self.maze[r + dr, c + dc] == 1]
        return (
            f"The goal is at position {_digits(self.goal[0])}, {_digits(self.goal[1])}. "
            f"Your current position is at position {_digits(r)}, {_digits(c)}. {describe_walls(walls)}"
        )

    def expert_action(self) -> str:
        r, c = self.position
        best = min(
            (self.distances.get((r + dr, c + dc), 10**9), name) for name, (dr, dc) in MOVES.items()
        )
        return best[1]

    def _reset(self, task: Task) -> str:
        start = tuple(task.data["start"])
        if start not in self.distances or start == self.goal:
            raise ValueError(f"Maze task {task.id!r}: start {start} is not a free non-goal cell")
        self.position = start
        return self.describe()

    def _step(self, action: str) -> tuple[str, float]:
        dr, dc = MOVES[action]
        nxt = (self.position[0] + dr, self.position[1] + dc)
        if self.maze[nxt] == 0:
            self.position = nxt
        if self.position == self.goal:
            self.won = True
            return "Success. You reached the goal.", GOAL_REWARD
        return self.describe(), MOVE_REWARD

    def _invalid(self, action: str) -> tuple[str, float]:
        return f"Invalid action. {self.describe()}", ILLEGAL_REWARD
