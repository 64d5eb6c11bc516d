"""HardnessPartition: FedAgentGym's hardness heterogeneity (Algorithm 4).

Tasks carry a success label (did a reference checkpoint solve it). Every client
holds exactly `partition_size` (L) tasks; how many of them are successful ones
is spread across clients by CoveragePartition run over the successful tasks with
dispersion `xi` (the paper's xi'): large xi gives every client about the same
success share, xi = 1 gives clients of very different difficulty. Each client is
then filled up to L with unsuccessful tasks drawn uniformly without replacement.

Parameters beyond the paper's, from the public reference code: the successful
count of a client lies in [success_min, success_max] = [0, L] centred at L / 2,
and by default r = K success_avg / |S|, so the mean successful count is exactly
success_avg. Pass r to fix the overlap of successful tasks instead.

Labels are an input (`success` column of the task table); computing them from a
checkpoint is not this module's job. One generator seeded with `seed` draws
everything, as in the reference code.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from datasets import Dataset

from .base import TaskPartitioner
from .coverage import check_coverage_params, coverage_sizes, place_replicas, total_assignments
from .params import check_int


def _resolved_bounds(partition_size: int, success_min: int, success_avg: float | None, success_max: int | None):
    success_max = partition_size if success_max is None else success_max
    success_avg = (success_min + success_max) / 2 if success_avg is None else success_avg
    return success_min, success_avg, success_max


def check_hardness_params(
    num_partitions: int,
    partition_size: int,
    xi: float,
    r: float | None,
    success_min: int,
    success_avg: float | None,
    success_max: int | None,
) -> None:
    """Reject bad parameters before any table is seen."""
    check_int("partition_size", partition_size, 1)
    low, avg, high = _resolved_bounds(partition_size, success_min, success_avg, success_max)
    check_coverage_params(num_partitions, xi, 1.0 if r is None else r, low, avg, high)
    if high > partition_size:
        raise ValueError(f"success_max must be <= partition_size ({partition_size}), got {high}")


def hardness_partition(
    success: Sequence[bool],
    num_partitions: int,
    partition_size: int,
    xi: float,
    seed: int,
    r: float | None = None,
    success_min: int = 0,
    success_avg: float | None = None,
    success_max: int | None = None,
) -> list[np.ndarray]:
    """Sorted row indices of each client: L distinct tasks, a Beta-spread number of them successful."""
    check_hardness_params(num_partitions, partition_size, xi, r, success_min, success_avg, success_max)
    labels = np.asarray(success)
    if labels.ndim != 1 or labels.dtype != bool:
        raise ValueError(f"success labels must be a 1-D boolean sequence, got dtype {labels.dtype}")
    solved, unsolved = np.flatnonzero(labels), np.flatnonzero(~labels)
    low, avg, high = _resolved_bounds(partition_size, success_min, success_avg, success_max)
    if len(solved) == 0:
        raise ValueError("no task is labelled successful; HardnessPartition needs successful tasks to spread")
    if len(unsolved) < partition_size - low:
        raise ValueError(
            f"a client with success_min={low} successful tasks needs {partition_size - low} unsuccessful ones "
            f"to reach partition_size={partition_size}, but only {len(unsolved)} tasks are unsuccessful"
        )
    if r is None:
        r = num_partitions * avg / len(solved)
    total = total_assignments(len(solved), r)
    cap = min(high, len(solved))
    if not num_partitions * low <= total <= num_partitions * cap:
        raise ValueError(
            f"infeasible hardness partition: floor(r |S|) = floor({r:g} * {len(solved)}) = {total} successful "
            f"assignments must lie in [K success_min, K min(success_max, |S|)] = "
            f"[{num_partitions * low}, {num_partitions * cap}] for K = {num_partitions} clients"
        )
    rng = np.random.default_rng(seed)
    counts = coverage_sizes(num_partitions, total, xi, low, avg, high, rng, cap=cap)
    clients = []
    for members in place_replicas(len(solved), counts, r, rng):
        fill = rng.choice(unsolved, size=partition_size - len(members), replace=False)
        clients.append(np.sort(np.concatenate([solved[members], fill])))
    return clients


class HardnessPartition(TaskPartitioner):
    """Algorithm 4 over the `success` (bool) column of the task table."""

    def __init__(
        self,
        num_partitions: int,
        partition_size: int,
        xi: float,
        seed: int = 42,
        r: float | None = None,
        success_min: int = 0,
        success_avg: float | None = None,
        success_max: int | None = None,
    ) -> None:
        super().__init__(num_partitions)
        check_hardness_params(num_partitions, partition_size, xi, r, success_min, success_avg, success_max)
        self.partition_size, self.xi, self.seed, self.r = partition_size, xi, seed, r
        self.success_min, self.success_avg, self.success_max = success_min, success_avg, success_max

    def assign(self, dataset: Dataset) -> list[np.ndarray]:
        if "success" not in dataset.column_names:
            raise ValueError(
                f"HardnessPartition needs a boolean 'success' column (a reference checkpoint's outcome per task); "
                f"the table has {dataset.column_names}"
            )
        return hardness_partition(
            np.asarray(list(dataset["success"])),
            self.num_partitions,
            self.partition_size,
            self.xi,
            self.seed,
            self.r,
            self.success_min,
            self.success_avg,
            self.success_max,
        )
