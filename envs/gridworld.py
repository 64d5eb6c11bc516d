"""Gridworld: navigation in procedurally generated rooms, one new layout per task.

Every task is its own room: a rectangle of 5 to 8 by 5 to 8 free cells inside an outer wall, with a
random share of its cells turned into wall blocks, a start and a goal that a path joins. The agent
is told where the goal lies relative to itself ("The goal is 3 steps down and 2 steps to your
left.") and which neighbouring cells are walls, in the Maze environment's words, and moves one cell
at a time with the Maze's four moves and rewards; the expert follows a breadth-first shortest path
(envs/grid.py).

Why it exists (docs/results.md): in the Maze all tasks are start positions in one fixed layout, so
what a client learns from its starts is where to go from those cells, and held-out starts gain
little. Here no two tasks share a layout, so nothing about a held-out task can be memorised from
training tasks; what transfers is a skill (head for the goal, step around what blocks the way), the
kind of generalisation the FedAgent and Fed-SE papers measure on held-out tasks. The category is the
goal's direction from the start (north-east, north-west, south-east, south-west: start and goal
never share a row or a column), so the papers' preference partitions can give each client a skewed
share of directions and a client alone sees only part of the skill.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from .base import Task
from .grid import GridNavigationEnv, bfs_distances

DIRECTIONS = ("north-east", "north-west", "south-east", "south-west")
# Pool sizes and generator bounds; the test split is large enough that 16 samples per task give an
# evaluation of 768 episodes (one standard error at most 0.018).
TRAIN_TASKS, TEST_TASKS = 512, 48
ROOM_SIDES = (5, 8)  # free cells per side, inclusive
WALL_SHARE = (0.05, 0.2)  # share of the room's cells turned into wall blocks
DISTANCE = (3, 8)  # shortest-path moves from start to goal, inclusive


def generate_room(rng: np.random.Generator) -> tuple[np.ndarray, tuple[int, int], tuple[int, int], int]:
    """One layout with its start, goal and shortest distance, drawn until the bounds above hold."""
    while True:
        height, width = (int(rng.integers(ROOM_SIDES[0], ROOM_SIDES[1] + 1)) for _ in range(2))
        grid = np.ones((height + 2, width + 2), dtype=np.uint8)
        grid[1:-1, 1:-1] = (rng.random((height, width)) < rng.uniform(*WALL_SHARE)).astype(np.uint8)
        free = [tuple(int(v) for v in p) for p in np.argwhere(grid == 0)]
        if len(free) < 2:
            continue
        goal = free[int(rng.integers(len(free)))]
        dist = bfs_distances(grid, goal)
        starts = [p for p, d in dist.items()
                  if DISTANCE[0] <= d <= DISTANCE[1] and p[0] != goal[0] and p[1] != goal[1]]
        if starts:
            start = starts[int(rng.integers(len(starts)))]
            return grid, start, goal, dist[start]


def direction(start: tuple[int, int], goal: tuple[int, int]) -> str:
    return ("north" if goal[0] < start[0] else "south") + "-" + ("west" if goal[1] < start[1] else "east")


def _steps(n: int) -> str:
    return f"{n} step{'s' if n != 1 else ''}"


def describe_offset(position: tuple[int, int], goal: tuple[int, int]) -> str:
    """'The goal is 3 steps down and 2 steps to your left.' (rows grow downwards, columns rightwards)."""
    dr, dc = goal[0] - position[0], goal[1] - position[1]
    parts = []
    if dr:
        parts.append(f"{_steps(abs(dr))} {'down' if dr > 0 else 'up'}")
    if dc:
        parts.append(f"{_steps(abs(dc))} to your {'right' if dc > 0 else 'left'}")
    return f"The goal is {' and '.join(parts)}."


@lru_cache(maxsize=4)
def room_pool(seed: int) -> tuple[Task, ...]:
    """Both splits' tasks, generated once per process: a rollout makes an env per episode, and generating the
    560 rooms each time took three quarters of an evaluation's time."""
    tasks, seen = [], set()
    for split, count, stream in (("train", TRAIN_TASKS, 0), ("test", TEST_TASKS, 1)):
        rng = np.random.default_rng([seed, stream])  # the test rooms do not depend on the training pool's size
        for i in range(count):
            grid, start, goal, distance = generate_room(rng)
            while grid.tobytes() + bytes(grid.shape) in seen:  # small rooms with few walls can repeat: redraw
                grid, start, goal, distance = generate_room(rng)
            seen.add(grid.tobytes() + bytes(grid.shape))
            tasks.append(Task(
                id=f"gridworld-{split}-{i:03d}",
                category=direction(start, goal),
                split=split,
                data={"rows": ["".join("#" if v else "." for v in row) for row in grid],
                      "start": list(start), "goal": list(goal), "distance": distance},
            ))
    return tuple(tasks)


class GridworldEnv(GridNavigationEnv):
    name = "gridworld"
    intro = "You are an agent in a room with walls. You move one cell at a time."
    # The longest shortest path is 8 moves; 12 leaves room for a few detours.
    default_max_steps = 12

    def __init__(self, max_steps: int | None = None, seed: int = 0) -> None:
        super().__init__(max_steps)
        self._tasks = room_pool(seed)
        self.grid = np.ones((3, 3), dtype=np.uint8)
        self.position = self.goal = (1, 1)
        self.distances: dict[tuple[int, int], int] = {}

    def tasks(self) -> list[Task]:
        return list(self._tasks)

    def instruction(self) -> str:
        return "Reach the goal."

    def describe(self) -> str:
        return f"{describe_offset(self.position, self.goal)} {self.walls_around()}"

    def _reset(self, task: Task) -> str:
        rows = task.data["rows"]
        self.grid = np.array([[ch == "#" for ch in row] for row in rows], dtype=np.uint8)
        self.goal, self.position = tuple(task.data["goal"]), tuple(task.data["start"])
        self.distances = bfs_distances(self.grid, self.goal)
        if self.position not in self.distances or self.position == self.goal:
            raise ValueError(f"Gridworld task {task.id!r}: start {self.position} cannot reach goal {self.goal}")
        return self.describe()
