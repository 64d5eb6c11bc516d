"""Client partitions of an environment's task pool, as flwr-datasets Partitioners."""

from __future__ import annotations

import inspect

from .base import TaskPartitioner, client_rng, task_table
from .by_environment import ByEnvironmentPartitioner, by_environment
from .coverage import CoveragePartition, coverage_partition
from .hardness import HardnessPartition, hardness_partition
from .preference import PreferencePartition, preference_partition
from .uniform import UniformPartitioner, UniformWindowsPartitioner, uniform_overlap, uniform_windows

_CLASSES: dict[str, type[TaskPartitioner]] = {
    "uniform": UniformPartitioner,
    "uniform-windows": UniformWindowsPartitioner,
    "preference": PreferencePartition,
    "coverage": CoveragePartition,
    "hardness": HardnessPartition,
    "by-environment": ByEnvironmentPartitioner,
}
PARTITIONS = tuple(_CLASSES)


def partition_params(name: str) -> tuple[list[str], list[str]]:
    """(required, optional) parameter names of a partition, beyond num_partitions and seed."""
    if name not in _CLASSES:
        raise ValueError(f"unknown partition {name!r}; available: {', '.join(PARTITIONS)}")
    required, optional = [], []
    for param in list(inspect.signature(_CLASSES[name]).parameters.values()):
        if param.name in ("num_partitions", "seed"):
            continue
        (required if param.default is inspect.Parameter.empty else optional).append(param.name)
    return required, optional


def make_partitioner(name: str, num_partitions: int, seed: int, **params) -> TaskPartitioner:
    """The partitioner `name` with its own parameters by keyword, e.g. make_partitioner("uniform", 100, 42, partition_size=100)."""
    required, optional = partition_params(name)
    unknown = sorted(set(params) - set(required) - set(optional))
    missing = [p for p in required if p not in params]
    if unknown or missing:
        problems = []
        if missing:
            problems.append(f"missing {', '.join(missing)}")
        if unknown:
            problems.append(f"unknown {', '.join(unknown)}")
        raise ValueError(
            f"partition {name!r}: {'; '.join(problems)}. Required: {', '.join(required) or 'none'}; "
            f"optional: {', '.join(optional) or 'none'}"
        )
    return _CLASSES[name](num_partitions=num_partitions, seed=seed, **params)


__all__ = [
    "PARTITIONS",
    "ByEnvironmentPartitioner",
    "CoveragePartition",
    "HardnessPartition",
    "PreferencePartition",
    "TaskPartitioner",
    "UniformPartitioner",
    "UniformWindowsPartitioner",
    "by_environment",
    "client_rng",
    "coverage_partition",
    "hardness_partition",
    "make_partitioner",
    "partition_params",
    "preference_partition",
    "task_table",
    "uniform_overlap",
    "uniform_windows",
]
