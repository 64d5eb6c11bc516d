"""Which tasks each learner trains on: the run's partition of the training split, and the baselines.

- FedAgent (baseline = none): client k trains on partition k of `partition`
  (uniform | preference | coverage | hardness | by-environment) with its
  run-config parameters.
- Centralized (baseline = centralized): one learner, partition 0's node, trains
  on the union of all K clients' partitions, so it sees every task the
  federation holds; it samples grpo.tasks-per-epoch tasks per epoch from it, like
  FedAgent's clients do from theirs (the paper's "64 tasks from the whole
  dataset" when the partitions cover the pool).
- Local (baseline = local): client baseline.local-client trains alone on its partition.

Baselines keep FedAgent's T rounds of tau epochs, so all three run T * tau GRPO
epochs (the paper's "same total epochs"); the server sends the round to the one
learner and takes its weights as they come back.
"""

from __future__ import annotations

from collections import Counter

from datasets import Dataset

from envs import Task, make_env
from fedagent_flwr.config import RunConfig
from partitions import make_partitioner, task_table
from partitions.labels import load_labels

CENTRALIZED_LEARNER = 0  # the partition-id whose node plays the centralized learner


def partition_kwargs(cfg: RunConfig) -> dict:
    """The partitioner's own parameters from the run config (partition.tasks-per-client is L where a partition has one)."""
    if cfg.partition.scheme in ("uniform", "uniform-windows", "by-environment"):
        return {"partition_size": cfg.partition.tasks_per_client}
    if cfg.partition.scheme == "preference":
        return {"partition_size": cfg.partition.tasks_per_client, "omega": cfg.partition.preference_omega, "mix": cfg.partition.preference_mix}
    if cfg.partition.scheme == "coverage":
        return {"xi": cfg.partition.coverage_xi, "r": cfg.partition.coverage_r, "size_min": cfg.partition.coverage_l_min,
                "size_avg": cfg.partition.coverage_l_avg, "size_max": cfg.partition.coverage_l_max}
    if cfg.partition.scheme == "hardness":
        return {"partition_size": cfg.partition.tasks_per_client, "xi": cfg.partition.hardness_xi, "r": cfg.partition.hardness_r or None}
    raise ValueError(f"partition.scheme={cfg.partition.scheme!r} has no parameter mapping in fedagent_flwr/methods/tasks.py")


def pool_table(cfg: RunConfig, pool: list[Task]) -> Dataset:
    """The task table the partitioner reads; hardness adds the success labels."""
    table = task_table(pool)
    if cfg.partition.scheme == "hardness":
        table = table.add_column("success", load_labels(cfg.partition.success_labels, cfg.env, pool))
    return table


def all_partitions(cfg: RunConfig, num_partitions: int) -> list[list[Task]]:
    """Every client's tasks; raises ValueError naming the run-config keys when the partition is infeasible."""
    pool = make_env(cfg.env, cfg.rollout.max_steps).tasks_of_split("train")
    try:
        seed = cfg.seed if cfg.partition.seed < 0 else cfg.partition.seed
        partitioner = make_partitioner(cfg.partition.scheme, num_partitions, seed, **partition_kwargs(cfg))
        partitioner.dataset = pool_table(cfg, pool)
        rows = [partitioner.load_partition(k)["id"] for k in range(num_partitions)]
    except ValueError as err:
        raise ValueError(
            f"partition.scheme={cfg.partition.scheme!r} cannot split the {len(pool)} training tasks of env={cfg.env!r} among "
            f"K={num_partitions} clients: {err}"
        ) from None
    by_id = {t.id: t for t in pool}
    return [[by_id[i] for i in ids] for ids in rows]


def union_of(partitions: list[list[Task]]) -> list[Task]:
    """Each task held by any client, once, in first-seen order."""
    seen: dict[str, Task] = {}
    for tasks in partitions:
        for t in tasks:
            seen.setdefault(t.id, t)
    return list(seen.values())


def learner_tasks(cfg: RunConfig, partition_id: int, num_partitions: int) -> list[Task]:
    """The tasks partition `partition_id` trains on in this run (its own, or the union for centralized)."""
    partitions = all_partitions(cfg, num_partitions)
    if cfg.baseline.name == "centralized":
        if partition_id != CENTRALIZED_LEARNER:
            raise ValueError(f"baseline.name='centralized' trains on partition {CENTRALIZED_LEARNER} only; partition {partition_id} was asked")
        return union_of(partitions)
    if cfg.baseline.name == "local" and partition_id != cfg.baseline.local_client:
        raise ValueError(f"baseline.name='local' trains partition baseline.local-client={cfg.baseline.local_client} only; partition {partition_id} was asked")
    return partitions[partition_id]


def baseline_learner(cfg: RunConfig) -> int | None:
    """The one partition-id that trains under a baseline; None for FedAgent."""
    return {"none": None, "centralized": CENTRALIZED_LEARNER, "local": cfg.baseline.local_client}[cfg.baseline.name]


def holdings(cfg: RunConfig, partitions: list[list[Task]]) -> dict[str, dict[str, int]]:
    """Each learner of this run -> how many of its training tasks fall in each category (what a Local or a skewed
    client can learn from; a learner that trains nothing in a baseline run is left out)."""
    learner = baseline_learner(cfg)
    chosen = {"Centralized (all clients)": union_of(partitions)} if cfg.baseline.name == "centralized" else {
        f"client {k}": tasks for k, tasks in enumerate(partitions) if learner is None or k == learner}
    return {who: dict(sorted(Counter(t.category for t in tasks).items())) for who, tasks in chosen.items()}


def holdings_line(held: dict[str, dict[str, int]]) -> str:
    return "; ".join(f"{who}: " + ", ".join(f"{c} {n}" for c, n in cats.items()) for who, cats in held.items())
