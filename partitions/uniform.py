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
