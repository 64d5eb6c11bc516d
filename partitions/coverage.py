"""CoveragePartition: FedAgentGym's coverage heterogeneity (Algorithm 3).

Clients differ in how many tasks they hold (their sampling scope per epoch) but
not in what kind. The total number of assignments is fixed at T = floor(r N), so
every task is held by floor(r) or ceil(r) clients on average r; the client sizes
come from a Beta distribution on [size_min, size_max] whose dispersion `xi`
sets the spread (large xi: sizes near the centre; xi = 1: widely spread).

Steps (Algorithm 3):
1. mu = (size_avg - size_min) / (size_max - size_min); x_k ~ Beta(mu xi, (1 - mu) xi).
2. u_k = size_min + x_k (size_max - size_min), rescaled so that sum u = T.
3. Integer sizes summing to T within [size_min, size_max] (clip, spread the
   clipped mass over the clients with room, largest-remainder rounding).
4. floor(r) replicas for each task, ceil(r) for T - floor(r) N of them chosen at
   random; each task's replicas go to distinct clients drawn with probability
   proportional to their remaining quota.

Because sizes are renormalised to sum T, the mean client size is T / K; it equals
size_avg only when r = K size_avg / N. Otherwise size_avg only places the mode of
the Beta shape (that is how the reference defaults behave: sizes centred at 500
within [100, 1000] with r = 1.3).

All clients are drawn together from one generator seeded with `seed` (the sizes
and the placement couple the clients, so a per-client seed cannot apply here).
"""

from __future__ import annotations

import math

import numpy as np
from datasets import Dataset

from .base import TaskPartitioner
from .params import check_int, check_real

# Public reference defaults (not in the paper): sizes centred at 500 within
# [min_goals_per_client = 100, 1000], overlap ratio r = 1.3.
DEFAULT_R = 1.3
DEFAULT_SIZE_MIN = 100
DEFAULT_SIZE_AVG = 500
DEFAULT_SIZE_MAX = 1000


def check_coverage_params(
    num_partitions: int, xi: float, r: float, size_min: int, size_avg: float, size_max: int
) -> None:
    """Reject bad parameters before any table is seen."""
    check_int("num_partitions", num_partitions, 1)
    if check_real("xi", xi) <= 0:
        raise ValueError(f"xi (the Beta dispersion) must be > 0, got {xi}")
    if check_real("r", r) <= 0:
        raise ValueError(f"r (average replicas per task) must be > 0, got {r}")
    check_int("size_min", size_min, 0)
    check_int("size_max", size_max, 1)
    check_real("size_avg", size_avg)
    if not size_min <= size_avg <= size_max:
        raise ValueError(
            f"client size bounds must satisfy size_min <= size_avg <= size_max, "
            f"got size_min={size_min}, size_avg={size_avg}, size_max={size_max}"
        )


def total_assignments(num_items: int, r: float) -> int:
    # The small slack keeps e.g. r = 1.15, N = 100 at 115 despite 1.15 * 100 = 114.999...
    return math.floor(r * num_items + 1e-9)


def round_to_sum(u: np.ndarray, total: int, low: int, high: int) -> np.ndarray:
    """Integers within [low, high] summing to `total`, as close to `u` as clipping allows.

    Clipping moves mass; it is spread back over the clients not yet at the bound it
    was pushed towards, in proportion to their values (keeping the shape), until the
    sum is met; then largest-remainder rounding restores integers exactly.
    """
    if not len(u) * low <= total <= len(u) * high:
        raise ValueError(f"cannot split {total} into {len(u)} sizes within [{low}, {high}]")
    x = np.clip(np.asarray(u, dtype=float), low, high)
    # Every pass either meets the sum or pins one more client at a bound; the gap keeps
    # its sign, so pinned clients stay pinned and at most len(u) passes are needed.
    for _ in range(len(x) + 1):
        gap = total - x.sum()
        if abs(gap) < 1e-9:
            break
        free = x < high if gap > 0 else x > low
        share = x[free]
        weights = share / share.sum() if share.sum() > 0 else np.full(share.size, 1.0 / share.size)
        x[free] = np.clip(x[free] + gap * weights, low, high)
    else:
        raise RuntimeError(f"round_to_sum did not converge (sum {x.sum()} vs {total})")
    floors = np.floor(x + 1e-9).astype(np.int64)
    short = total - int(floors.sum())
    remainders = np.where(floors < high, x - floors, -np.inf)
    floors[np.argsort(-remainders, kind="stable")[:short]] += 1
    return floors


def coverage_sizes(
    num_partitions: int,
    total: int,
    xi: float,
    size_min: int,
    size_avg: float,
    size_max: int,
    rng: np.random.Generator,
    cap: int | None = None,
) -> np.ndarray:
    """Client sizes: Beta(mu xi, (1 - mu) xi) shape on [size_min, size_max], renormalised to `total` (Alg. 3 lines 3-6).

    The integer sizes are kept within [size_min, cap] (cap defaults to size_max).
    """
    if size_max == size_min:
        x = np.zeros(num_partitions)
    else:
        mu = (size_avg - size_min) / (size_max - size_min)
        # Beta(0, b) and Beta(a, 0) are point masses at 0 and 1; numpy rejects a zero shape.
        x = np.full(num_partitions, mu) if mu in (0.0, 1.0) else rng.beta(mu * xi, (1 - mu) * xi, size=num_partitions)
    u = size_min + x * (size_max - size_min)
    if u.sum() > 0:
        u = u * (total / u.sum())
    return round_to_sum(u, total, size_min, size_max if cap is None else cap)


def place_replicas(num_items: int, sizes: np.ndarray, r: float, rng: np.random.Generator) -> list[np.ndarray]:
    """Each item to floor(r) or ceil(r) distinct clients, drawn in proportion to remaining quota (Alg. 3 lines 7-13).

    `sizes` must sum to floor(r N). A client whose remaining quota equals the number of
    items still to place must take every one of them, so it is always included; with
    two replica counts one apart this keeps the placement completable at every step
    (the Gale-Ryser condition reduces to "no quota exceeds the items left").
    """
    sizes = np.asarray(sizes, dtype=np.int64)
    total = int(sizes.sum())
    low, high = math.floor(r), math.ceil(r)
    replicas = np.full(num_items, low, dtype=np.int64)
    extra = total - low * num_items
    if not 0 <= extra <= (num_items if high > low else 0):
        raise ValueError(f"client sizes sum to {total}, which floor(r) / ceil(r) replicas of {num_items} items cannot make")
    if extra > 0:
        replicas[rng.choice(num_items, size=extra, replace=False)] = high
    items_left = int(np.count_nonzero(replicas))
    if sizes.max(initial=0) > items_left:
        raise ValueError(f"a client of size {sizes.max()} cannot get that many distinct items out of {items_left}")

    remaining = sizes.copy()
    members: list[list[int]] = [[] for _ in sizes]
    for item in range(num_items):
        need = int(replicas[item])
        if need == 0:
            continue
        forced = np.flatnonzero(remaining == items_left)
        open_ = np.flatnonzero((remaining > 0) & (remaining < items_left))
        drawn = need - len(forced)
        if drawn < 0 or drawn > len(open_):  # cannot happen for feasible sizes; guards the invariant above
            raise RuntimeError(f"placement of item {item} is stuck: {len(forced)} forced clients, need {need}")
        chosen = forced
        if drawn > 0:
            weights = remaining[open_] / remaining[open_].sum()
            chosen = np.concatenate([forced, rng.choice(open_, size=drawn, replace=False, p=weights)])
        remaining[chosen] -= 1
        for client in chosen:
            members[client].append(item)
        items_left -= 1
    return [np.asarray(m, dtype=np.int64) for m in members]


def coverage_partition(
    num_tasks: int,
    num_partitions: int,
    xi: float,
    seed: int,
    r: float = DEFAULT_R,
    size_min: int = DEFAULT_SIZE_MIN,
    size_avg: float = DEFAULT_SIZE_AVG,
    size_max: int = DEFAULT_SIZE_MAX,
) -> list[np.ndarray]:
    """Sorted task indices of each client; sizes sum to floor(r N) and lie in [size_min, size_max]."""
    check_coverage_params(num_partitions, xi, r, size_min, size_avg, size_max)
    check_int("num_tasks", num_tasks, 1)
    total = total_assignments(num_tasks, r)
    # A client cannot hold more distinct tasks than the pool has.
    cap = min(size_max, num_tasks)
    if not num_partitions * size_min <= total <= num_partitions * cap:
        raise ValueError(
            f"infeasible coverage partition: T = floor(r N) = floor({r} * {num_tasks}) = {total} assignments "
            f"must lie in [K size_min, K min(size_max, N)] = [{num_partitions * size_min}, {num_partitions * cap}] "
            f"for K = {num_partitions} clients; change r, the size bounds or the number of clients"
        )
    rng = np.random.default_rng(seed)
    sizes = coverage_sizes(num_partitions, total, xi, size_min, size_avg, size_max, rng, cap=cap)
    return [np.sort(m) for m in place_replicas(num_tasks, sizes, r, rng)]


class CoveragePartition(TaskPartitioner):
    """Algorithm 3 over the rows of the task table."""

    def __init__(
        self,
        num_partitions: int,
        xi: float,
        seed: int = 42,
        r: float = DEFAULT_R,
        size_min: int = DEFAULT_SIZE_MIN,
        size_avg: float = DEFAULT_SIZE_AVG,
        size_max: int = DEFAULT_SIZE_MAX,
    ) -> None:
        super().__init__(num_partitions)
        check_coverage_params(num_partitions, xi, r, size_min, size_avg, size_max)
        self.xi, self.seed, self.r = xi, seed, r
        self.size_min, self.size_avg, self.size_max = size_min, size_avg, size_max

    def assign(self, dataset: Dataset) -> list[np.ndarray]:
        return coverage_partition(
            len(dataset), self.num_partitions, self.xi, self.seed, self.r, self.size_min, self.size_avg, self.size_max
        )
