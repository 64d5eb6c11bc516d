"""PreferencePartition: FedAgentGym's preference heterogeneity (Algorithm 2).

Every client holds exactly `partition_size` (L) tasks whose category mix is the
global mix perturbed by a client-specific draw; `omega` sets how far the draws
stray, so small omega gives near-identical clients and large omega specialised
ones. Clients draw independently, so two clients may share tasks.

Two ways to draw a client's mix q:

- ``mix="gaussian"`` (default, the paper's Algorithm 2): with p the global
  category shares, anchor l_c = log(p_c / (1 - p_c)), draw z_c ~ N(l_c, omega^2)
  and take q = softmax(z). Note that softmax of the logit anchors is
  proportional to p_c / (1 - p_c), not p_c, so even at omega = 0 the mix leans
  towards the large categories; that is how the algorithm is written.
- ``mix="dirichlet"`` (the public reference code): q ~ Dirichlet(p (1 - omega) / omega),
  whose mean is exactly p; omega must lie in (0, 1).

Then per client: category counts a ~ Multinomial(L; q); a category asked for more
tasks than it has is capped at its size and the overflow is redrawn by q over
the categories with room left; the tasks of each category are drawn without
replacement.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from datasets import Dataset

from .base import TaskPartitioner, client_rng
from .params import check_int, check_real

MIXES = ("gaussian", "dirichlet")


def check_preference_params(num_partitions: int, partition_size: int, omega: float, mix: str) -> None:
    """Reject bad parameters before any table is seen."""
    check_int("num_partitions", num_partitions, 1)
    check_int("partition_size", partition_size, 1)
    check_real("omega", omega)
    if mix not in MIXES:
        raise ValueError(f"mix must be one of {', '.join(MIXES)}, got {mix!r}")
    if mix == "gaussian" and omega < 0:
        raise ValueError(f"omega (the noise scale) must be >= 0 for mix='gaussian', got {omega}")
    if mix == "dirichlet" and not 0 < omega < 1:
        raise ValueError(f"omega must be in (0, 1) for mix='dirichlet', got {omega}")


def _category_pools(categories: Sequence[str]) -> tuple[list[str], list[np.ndarray]]:
    """Category names (sorted, so the result does not depend on row order) and their row indices."""
    labels = np.asarray(categories, dtype=object)
    names = sorted(set(labels.tolist()))
    return names, [np.flatnonzero(labels == name) for name in names]


def _client_mix(p: np.ndarray, omega: float, mix: str, rng: np.random.Generator) -> np.ndarray:
    if mix == "dirichlet":
        q = rng.dirichlet(p * (1.0 - omega) / omega)
    else:
        if len(p) == 1:  # the logit of p = 1 is infinite; one category can only get everything
            return np.ones(1)
        z = rng.normal(np.log(p / (1.0 - p)), omega)
        q = np.exp(z - z.max())  # shifted for numerical safety; softmax is shift-invariant
    return q / q.sum()


def _capped_counts(q: np.ndarray, sizes: np.ndarray, total: int, rng: np.random.Generator) -> np.ndarray:
    """Multinomial(total; q) counts, capped at `sizes` with the overflow redrawn by q (Alg. 2 line 5)."""
    counts = rng.multinomial(total, q)
    overflow = int(np.maximum(counts - sizes, 0).sum())
    counts = np.minimum(counts, sizes)
    # Each pass either places all the overflow or fills one more category, so it ends
    # within len(q) passes (total <= sizes.sum() is checked by the caller).
    while overflow > 0:
        room = sizes - counts
        weights = np.where(room > 0, q, 0.0)
        if weights.sum() <= 0:  # q may underflow to 0 on the open categories (tiny Dirichlet draws)
            weights = room.astype(float)
        extra = rng.multinomial(overflow, weights / weights.sum())
        counts = counts + extra
        overflow = int(np.maximum(counts - sizes, 0).sum())
        counts = np.minimum(counts, sizes)
    return counts


def preference_partition(
    categories: Sequence[str],
    num_partitions: int,
    partition_size: int,
    omega: float,
    seed: int,
    mix: str = "gaussian",
) -> list[np.ndarray]:
    """Sorted row indices of each client: `partition_size` distinct tasks with a perturbed category mix."""
    check_preference_params(num_partitions, partition_size, omega, mix)
    num_tasks = len(categories)
    if num_tasks == 0:
        raise ValueError("the task pool is empty (no categories given)")
    if partition_size > num_tasks:
        raise ValueError(f"partition_size must be in [1, {num_tasks}] (the pool's size), got {partition_size}")

    names, pools = _category_pools(categories)
    sizes = np.array([len(pool) for pool in pools])
    p = sizes / sizes.sum()
    clients = []
    for k in range(num_partitions):
        rng = client_rng(seed, k)
        q = _client_mix(p, omega, mix, rng)
        counts = _capped_counts(q, sizes, partition_size, rng)
        picked = [rng.choice(pool, size=a, replace=False) for pool, a in zip(pools, counts) if a > 0]
        clients.append(np.sort(np.concatenate(picked)))
    return clients


class PreferencePartition(TaskPartitioner):
    """Algorithm 2 over the `category` column of the task table."""

    def __init__(
        self,
        num_partitions: int,
        partition_size: int,
        omega: float,
        seed: int = 42,
        mix: str = "gaussian",
    ) -> None:
        super().__init__(num_partitions)
        check_preference_params(num_partitions, partition_size, omega, mix)
        self.partition_size = partition_size
        self.omega = omega
        self.seed = seed
        self.mix = mix

    def assign(self, dataset: Dataset) -> list[np.ndarray]:
        if "category" not in dataset.column_names:
            raise ValueError(f"PreferencePartition needs a 'category' column; the table has {dataset.column_names}")
        return preference_partition(
            list(dataset["category"]), self.num_partitions, self.partition_size, self.omega, self.seed, self.mix
        )
