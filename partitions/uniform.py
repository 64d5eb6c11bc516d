"""Uniform partition with overlap: FedAgentGym's Table 1 setting.

Each client draws its tasks uniformly without replacement from the whole pool,
independently of the other clients, so two clients may share tasks (the paper's
100 clients x 100 tasks from one pool).
"""

from __future__ import annotations

import numpy as np
from datasets import Dataset

from .base import TaskPartitioner, client_rng


def uniform_overlap(num_tasks: int, num_partitions: int, partition_size: int, seed: int) -> list[np.ndarray]:
    """Sorted task indices of each client: `partition_size` distinct tasks, overlap across clients."""
    if num_tasks <= 0:
        raise ValueError(f"the task pool is empty (num_tasks={num_tasks})")
    if num_partitions <= 0:
        raise ValueError(f"num_partitions must be positive, got {num_partitions}")
    if not 0 < partition_size <= num_tasks:
        raise ValueError(
            f"partition_size must be in [1, {num_tasks}] (the pool's size), got {partition_size}"
        )
    return [
        np.sort(client_rng(seed, k).choice(num_tasks, size=partition_size, replace=False))
        for k in range(num_partitions)
    ]


class UniformPartitioner(TaskPartitioner):
    def __init__(self, num_partitions: int, partition_size: int, seed: int = 42) -> None:
        super().__init__(num_partitions)
        self.partition_size = partition_size
        self.seed = seed

    def assign(self, dataset: Dataset) -> list[np.ndarray]:
        return uniform_overlap(len(dataset), self.num_partitions, self.partition_size, self.seed)


def uniform_windows(num_tasks: int, num_partitions: int, partition_size: int, seed: int) -> list[np.ndarray]:
    """The FedAgent reference's uniform split (verl-agent's partition_strategy.uniform_partition over a task list its
    environments reshuffle with the run's seed): the pool in an order drawn from `seed`, cut into K contiguous
    windows of N // K tasks (more than `partition_size` where the pool is large, as in the reference); a window
    smaller than `partition_size` grows to it, half to each side where there is room, the rest to the side that has it. Clients overlap only where windows had to grow (the paper's 100 x 100
    tasks from a pool of about 3,500 ALFWorld games do not)."""
    if num_tasks <= 0:
        raise ValueError(f"the task pool is empty (num_tasks={num_tasks})")
    if num_partitions <= 0:
        raise ValueError(f"num_partitions must be positive, got {num_partitions}")
    if not 0 < partition_size <= num_tasks:
        raise ValueError(f"partition_size must be in [1, {num_tasks}] (the pool's size), got {partition_size}")
    order = np.random.default_rng(seed).permutation(num_tasks)
    base = num_tasks // num_partitions
    windows = []
    for k in range(num_partitions):
        start, end = k * base, (k + 1) * base
        missing = partition_size - base
        if missing > 0:  # the reference's growth: half to the left where there is room, then whatever fits
            left = min(missing // 2, start)
            right = min(missing - left, num_tasks - end)
            left += min(missing - left - right, start - left)
            start, end = start - left, end + right
        windows.append(np.sort(order[start:end]))
    return windows


class UniformWindowsPartitioner(UniformPartitioner):
    def assign(self, dataset: Dataset) -> list[np.ndarray]:
        return uniform_windows(len(dataset), self.num_partitions, self.partition_size, self.seed)
