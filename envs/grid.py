"""What Maze and Gridworld share: a walled grid, the four moves, the walls around the agent in words, a
breadth-first expert and LMRL-Gym's maze rewards.

Facts carried over from LMRL-Gym (llm_rl_scripts/maze): the four moves, the order in which the neighbouring
walls are listed and their wording, and the rewards: 0 on reaching the goal, -1 for any other move (bumping
into a wall leaves the agent in place), -4 for a text that is not one of the moves.
"""

from __future__ import annotations

from abc import abstractmethod
from collections import deque

import numpy as np

from .base import TextEnv

MOVES = {"move up": (-1, 0), "move down": (1, 0), "move left": (0, -1), "move right": (0, 1)}
# Order in which LMRL-Gym lists the neighbouring walls.
WALL_DIRECTIONS = (("to your right", (0, 1)), ("to your left", (0, -1)), ("above you", (-1, 0)), ("below you", (1, 0)))

GOAL_REWARD, MOVE_REWARD, ILLEGAL_REWARD = 0.0, -1.0, -4.0


def bfs_distances(grid: np.ndarray, goal: tuple[int, int]) -> dict[tuple[int, int], int]:
    """Moves from every cell that can reach `goal` (grid: 1 = wall, 0 = free, walled all round)."""
    dist = {goal: 0}
    queue = deque([goal])
    while queue:
        r, c = queue.popleft()
        for dr, dc in MOVES.values():
            nxt = (r + dr, c + dc)
            if grid[nxt] == 0 and nxt not in dist:
                dist[nxt] = dist[(r, c)] + 1
                queue.append(nxt)
    return dist


def describe_walls(walls: list[str]) -> str:
    if not walls:
        return "There are no walls near you."
    if len(walls) == 1:
        return f"There is a wall {walls[0]}."
    return f"There are walls {', '.join(walls)}."


class GridNavigationEnv(TextEnv):
    """A TextEnv on a walled grid: subclasses set `grid`, `goal`, `position` and `distances` (bfs_distances to the
    goal) when an episode starts, and write `describe()`."""

    grid: np.ndarray
    goal: tuple[int, int]
    position: tuple[int, int]
    distances: dict[tuple[int, int], int]

    @abstractmethod
    def describe(self) -> str:
        """The observation at the agent's current cell."""

    def admissible_actions(self) -> list[str]:
        return list(MOVES)

    def walls_around(self) -> str:
        r, c = self.position
        return describe_walls([name for name, (dr, dc) in WALL_DIRECTIONS if self.grid[r + dr, c + dc] == 1])

    def expert_action(self) -> str:
        r, c = self.position
        return min((self.distances.get((r + dr, c + dc), 10**9), name) for name, (dr, dc) in MOVES.items())[1]

    def _step(self, action: str) -> tuple[str, float]:
        dr, dc = MOVES[action]
        nxt = (self.position[0] + dr, self.position[1] + dc)
        if self.grid[nxt] == 0:
            self.position = nxt
        if self.position == self.goal:
            self.won = True
            return "Success. You reached the goal.", GOAL_REWARD
        return self.describe(), MOVE_REWARD

    def _invalid(self, action: str) -> tuple[str, float]:
        return f"Invalid action. {self.describe()}", ILLEGAL_REWARD
