"""Client partitions: uniform, preference (Alg. 2), coverage (Alg. 3), hardness (Alg. 4)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from datasets import Dataset

from partitions import (
    PARTITIONS,
    CoveragePartition,
    HardnessPartition,
    PreferencePartition,
    UniformPartitioner,
    coverage_partition,
    hardness_partition,
    make_partitioner,
    preference_partition,
)
from partitions.coverage import round_to_sum

CATEGORY_SIZES = (400, 250, 150, 100, 60, 40)  # 1,000 tasks in 6 uneven categories
SUCCESS_RATES = (0.7, 0.5, 0.4, 0.3, 0.2, 0.1)


def synthetic_table(seed: int = 0) -> Dataset:
    rng = np.random.default_rng(seed)
    categories = np.repeat([f"cat{i}" for i in range(len(CATEGORY_SIZES))], CATEGORY_SIZES)
    rates = np.repeat(SUCCESS_RATES, CATEGORY_SIZES)
    return Dataset.from_dict(
        {
            "id": [f"task-{i}" for i in range(len(categories))],
            "category": categories.tolist(),
            "split": ["train"] * len(categories),
            "success": (rng.random(len(categories)) < rates).tolist(),
        }
    )


TABLE = synthetic_table()
CATEGORIES = np.asarray(TABLE["category"])
SUCCESS = np.asarray(TABLE["success"])
NAMES = sorted(set(CATEGORIES.tolist()))
GLOBAL_MIX = np.array(CATEGORY_SIZES) / sum(CATEGORY_SIZES)


def client_mixes(clients: list[np.ndarray]) -> np.ndarray:
    return np.array([[np.mean(CATEGORIES[c] == name) for name in NAMES] for c in clients])


def mix_spread(clients: list[np.ndarray]) -> float:
    """Total variance of the clients' category shares around their own mean."""
    return float(client_mixes(clients).var(axis=0).sum())


def same_partition(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
    return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b))


def loaded(partitioner, table: Dataset = TABLE) -> list[Dataset]:
    partitioner.dataset = table
    return [partitioner.load_partition(k) for k in range(partitioner.num_partitions)]


# ---------------------------------------------------------------- uniform


def test_uniform_clients_hold_distinct_tasks_and_repeat_by_seed():
    parts = loaded(make_partitioner("uniform", 20, 42, partition_size=100))
    for part in parts:
        assert len(part) == 100 and len(set(part["id"])) == 100
    again = loaded(make_partitioner("uniform", 20, 42, partition_size=100))
    assert [p["id"] for p in parts] == [p["id"] for p in again]
    other = loaded(make_partitioner("uniform", 20, 43, partition_size=100))
    assert [p["id"] for p in parts] != [p["id"] for p in other]
    # Clients draw independently, so with 20 x 100 draws from 1,000 tasks some overlap.
    assert len(set().union(*(set(p["id"]) for p in parts))) < 2000


def test_uniform_rejects_a_partition_larger_than_the_pool():
    with pytest.raises(ValueError, match="partition_size"):
        loaded(UniformPartitioner(3, 1001, 42))


# ---------------------------------------------------------------- preference


@pytest.mark.parametrize("mix", ["gaussian", "dirichlet"])
def test_preference_clients_have_exactly_L_distinct_tasks(mix):
    clients = preference_partition(list(CATEGORIES), 50, 100, 0.9, 42, mix)
    assert len(clients) == 50
    for c in clients:
        assert len(c) == 100 and len(np.unique(c)) == 100 and c.min() >= 0 and c.max() < len(CATEGORIES)


@pytest.mark.parametrize("mix", ["gaussian", "dirichlet"])
def test_preference_spread_grows_with_omega(mix):
    spreads = [mix_spread(preference_partition(list(CATEGORIES), 100, 100, w, 42, mix)) for w in (0.1, 0.5, 0.9)]
    assert spreads[0] < spreads[1] < spreads[2]
    assert spreads[2] > 3 * spreads[0]


def test_preference_gaussian_centres_on_softmax_of_logit_anchors():
    # Algorithm 2 anchors z at logit(p); with no noise q = softmax(logit p), proportional to p / (1 - p).
    anchor = GLOBAL_MIX / (1 - GLOBAL_MIX)
    anchor /= anchor.sum()
    mean_mix = client_mixes(preference_partition(list(CATEGORIES), 300, 100, 0.0, 7)).mean(axis=0)
    assert np.abs(mean_mix - anchor).max() < 0.01
    assert np.abs(mean_mix - GLOBAL_MIX).max() > 0.05  # visibly not p itself


def test_preference_dirichlet_mix_is_the_global_mix_on_average():
    mean_mix = client_mixes(preference_partition(list(CATEGORIES), 400, 100, 0.1, 7, "dirichlet")).mean(axis=0)
    assert np.abs(mean_mix - GLOBAL_MIX).max() < 0.02


def test_preference_capacity_fix_keeps_L_when_categories_are_small():
    # Two 3-task categories and a large one; wild noise often asks the small ones for more than they have.
    cats = ["a"] * 3 + ["b"] * 3 + ["c"] * 94
    clients = preference_partition(cats, 200, 60, 3.0, 1)
    labels = np.asarray(cats)
    for c in clients:
        assert len(c) == 60 and len(np.unique(c)) == 60
        assert np.sum(labels[c] == "a") <= 3 and np.sum(labels[c] == "b") <= 3
    assert any(np.sum(labels[c] == "a") == 3 for c in clients)  # the cap was actually hit
    # L = N leaves no choice: every client holds the whole pool.
    for c in preference_partition(cats, 5, 100, 2.0, 1):
        assert np.array_equal(c, np.arange(100))


def test_preference_is_seeded_per_client():
    a = preference_partition(list(CATEGORIES), 6, 100, 0.9, 42)
    assert same_partition(a, preference_partition(list(CATEGORIES), 6, 100, 0.9, 42))
    assert not same_partition(a, preference_partition(list(CATEGORIES), 6, 100, 0.9, 43))
    # Client k uses seed + k, so its tasks do not depend on how many clients follow it.
    assert same_partition(a[:3], preference_partition(list(CATEGORIES), 3, 100, 0.9, 42))


def test_preference_partitioner_serves_rows():
    parts = loaded(PreferencePartition(8, 100, omega=0.9, seed=42))
    expected = preference_partition(list(CATEGORIES), 8, 100, 0.9, 42)
    for part, rows in zip(parts, expected):
        assert part["id"] == [f"task-{i}" for i in rows]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(omega=-0.1), "omega"),
        (dict(omega=float("nan")), "omega"),
        (dict(omega=1.0, mix="dirichlet"), r"omega must be in \(0, 1\)"),
        (dict(omega=0.5, mix="softmax"), "mix must be one of gaussian, dirichlet"),
        (dict(omega=0.5, partition_size=0), "partition_size"),
    ],
)
def test_preference_rejects_bad_parameters(kwargs, message):
    params = dict(partition_size=100) | kwargs
    with pytest.raises(ValueError, match=message):
        make_partitioner("preference", 10, 42, **params)


def test_preference_rejects_L_above_pool_and_a_table_without_categories():
    with pytest.raises(ValueError, match="partition_size must be in"):
        preference_partition(list(CATEGORIES), 2, 1001, 0.1, 42)
    with pytest.raises(ValueError, match="'category' column"):
        loaded(PreferencePartition(2, 10, 0.1), Dataset.from_dict({"id": ["a", "b"]}))


# ---------------------------------------------------------------- coverage

# K = 10 clients, r = 1.3 over 1,000 tasks: T = 1300 assignments, so L_avg = 130 is the exact mean.
COVERAGE = dict(r=1.3, size_min=40, size_avg=130, size_max=300)


def test_round_to_sum_hand_cases():
    assert round_to_sum(np.array([3.4, 3.3, 3.3]), 10, 0, 10).tolist() == [4, 3, 3]
    # Clipping to [2, 6] pins all three; the sum still holds.
    assert round_to_sum(np.array([0.5, 0.5, 9.0]), 10, 2, 6).tolist() == [2, 2, 6]
    # The mass clipped off the first client goes to the others in proportion.
    assert round_to_sum(np.array([12.0, 4.0, 4.0]), 20, 0, 10).tolist() == [10, 5, 5]
    with pytest.raises(ValueError, match="cannot split"):
        round_to_sum(np.array([1.0, 1.0]), 30, 0, 10)


@pytest.mark.parametrize("xi", [1.0, 16.0, 256.0])
def test_coverage_keeps_total_mean_bounds_and_replicas(xi):
    clients = coverage_partition(1000, 10, xi, 42, **COVERAGE)
    sizes = np.array([len(c) for c in clients])
    assert sizes.sum() == math.floor(1.3 * 1000) == 1300
    assert sizes.mean() == 130
    assert sizes.min() >= 40 and sizes.max() <= 300
    for c in clients:
        assert len(np.unique(c)) == len(c)
    # Every task held by floor(r) = 1 or ceil(r) = 2 clients: exactly T - N = 300 of them twice.
    held = np.bincount(np.concatenate(clients), minlength=1000)
    assert np.bincount(held).tolist() == [0, 700, 300]


def test_coverage_size_variance_falls_as_xi_grows():
    def size_var(xi: float) -> float:
        return np.mean([np.var([len(c) for c in coverage_partition(1000, 10, xi, s, **COVERAGE)]) for s in range(5)])

    variances = [size_var(xi) for xi in (1.0, 16.0, 256.0)]
    assert variances[0] > variances[1] > variances[2]
    assert variances[0] > 20 * variances[2]


def test_coverage_keeps_every_task_placed_when_r_is_below_one():
    clients = coverage_partition(1000, 4, 1.0, 3, r=0.5, size_min=50, size_avg=125, size_max=400)
    held = np.bincount(np.concatenate(clients), minlength=1000)
    assert sum(len(c) for c in clients) == 500 and set(held.tolist()) == {0, 1}


def test_coverage_is_reproducible_and_served_as_rows():
    a = coverage_partition(1000, 10, 1.0, 42, **COVERAGE)
    assert same_partition(a, coverage_partition(1000, 10, 1.0, 42, **COVERAGE))
    assert not same_partition(a, coverage_partition(1000, 10, 1.0, 43, **COVERAGE))
    parts = loaded(make_partitioner("coverage", 10, 42, xi=1.0, **COVERAGE))
    assert [len(p) for p in parts] == [len(c) for c in a]
    assert parts[0]["id"] == [f"task-{i}" for i in a[0]]


def test_coverage_rejects_infeasible_sizes():
    # K L_min = 10 * 200 = 2000 > T = 1300.
    with pytest.raises(ValueError, match=r"infeasible coverage partition: T = floor\(r N\)"):
        coverage_partition(1000, 10, 1.0, 42, r=1.3, size_min=200, size_avg=250, size_max=300)
    # T = 1300 > K L_max = 10 * 100.
    with pytest.raises(ValueError, match="infeasible coverage partition"):
        coverage_partition(1000, 10, 1.0, 42, r=1.3, size_min=10, size_avg=50, size_max=100)
    # The reference defaults (sizes 100..1000) need K * 100 <= 1.3 N.
    with pytest.raises(ValueError, match="infeasible coverage partition"):
        loaded(CoveragePartition(100, xi=1.0))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(xi=0.0), "xi"),
        (dict(xi=1.0, r=0.0), "r "),
        (dict(xi=1.0, size_min=50, size_avg=40, size_max=300), "size_min <= size_avg <= size_max"),
        (dict(xi=1.0, size_min=1.5), "size_min must be an integer"),
    ],
)
def test_coverage_rejects_bad_parameters(kwargs, message):
    with pytest.raises(ValueError, match=message):
        make_partitioner("coverage", 10, 42, **kwargs)


# ---------------------------------------------------------------- hardness

HARDNESS = dict(partition_size=50)  # successful counts in [0, 50], centred at 25


@pytest.mark.parametrize("xi", [1.0, 256.0])
def test_hardness_clients_have_L_tasks_and_the_set_mean_success_count(xi):
    clients = hardness_partition(SUCCESS, 20, 50, xi, 42)
    counts = np.array([SUCCESS[c].sum() for c in clients])
    for c in clients:
        assert len(c) == 50 and len(np.unique(c)) == 50
    assert counts.min() >= 0 and counts.max() <= 50
    assert counts.mean() == 25  # r defaults to K success_avg / |S|


def test_hardness_success_share_spreads_more_at_small_xi():
    def share_std(xi: float) -> float:
        return np.mean([np.std([SUCCESS[c].mean() for c in hardness_partition(SUCCESS, 20, 50, xi, s)]) for s in range(5)])

    assert share_std(1.0) > 5 * share_std(256.0)
    assert share_std(256.0) < 0.05


def test_hardness_successful_tasks_keep_the_overlap_r():
    n_solved = int(SUCCESS.sum())
    clients = hardness_partition(SUCCESS, 10, 100, 4.0, 0, r=1.5, success_min=0, success_avg=50, success_max=100)
    held = np.bincount(np.concatenate(clients), minlength=len(SUCCESS))[SUCCESS]
    total = math.floor(1.5 * n_solved)
    assert held.sum() == total and np.bincount(held).tolist() == [0, 2 * n_solved - total, total - n_solved]


def test_hardness_is_reproducible_and_served_as_rows():
    a = hardness_partition(SUCCESS, 20, 50, 1.0, 42)
    assert same_partition(a, hardness_partition(SUCCESS, 20, 50, 1.0, 42))
    assert not same_partition(a, hardness_partition(SUCCESS, 20, 50, 1.0, 43))
    parts = loaded(make_partitioner("hardness", 20, 42, xi=1.0, **HARDNESS))
    assert [sum(p["success"]) for p in parts] == [int(SUCCESS[c].sum()) for c in a]


def test_hardness_rejects_bad_inputs():
    with pytest.raises(ValueError, match="'success' column"):
        loaded(HardnessPartition(2, 10, 1.0), TABLE.remove_columns("success"))
    with pytest.raises(ValueError, match="boolean"):
        hardness_partition(np.ones(100, dtype=int), 2, 10, 1.0, 42)
    with pytest.raises(ValueError, match="no task is labelled successful"):
        hardness_partition(np.zeros(100, dtype=bool), 2, 10, 1.0, 42)
    with pytest.raises(ValueError, match="only 5 tasks are unsuccessful"):
        hardness_partition(np.arange(100) >= 5, 2, 10, 1.0, 42)
    with pytest.raises(ValueError, match="success_max must be <= partition_size"):
        make_partitioner("hardness", 2, 42, partition_size=10, xi=1.0, success_max=20)
    with pytest.raises(ValueError, match="infeasible hardness partition"):
        hardness_partition(SUCCESS, 10, 50, 1.0, 42, r=3.0)


# ---------------------------------------------------------------- registry


def test_registry_lists_every_partition_and_checks_parameters():
    assert PARTITIONS == ("uniform", "uniform-windows", "preference", "coverage", "hardness", "by-environment")
    assert isinstance(make_partitioner("uniform", 3, 42, partition_size=10), UniformPartitioner)
    assert isinstance(make_partitioner("hardness", 3, 42, partition_size=10, xi=1.0), HardnessPartition)
    with pytest.raises(ValueError, match="unknown partition 'dirichlet'; available: uniform, uniform-windows, preference"):
        make_partitioner("dirichlet", 3, 42)
    with pytest.raises(ValueError, match="missing omega.*Required: partition_size, omega; optional: mix"):
        make_partitioner("preference", 3, 42, partition_size=10)
    with pytest.raises(ValueError, match="unknown L"):
        make_partitioner("uniform", 3, 42, partition_size=10, L=5)
    part = make_partitioner("uniform", 3, 42, partition_size=10)
    part.dataset = TABLE
    with pytest.raises(ValueError, match="partition_id"):
        part.load_partition(3)


# ---------------------------------------------------------------- plots


def test_plots_reads_a_csv_table_and_draws_the_figure(tmp_path, capsys):
    from partitions.plots import load_tasks, main

    table = tmp_path / "tasks.csv"
    rows = ["id,category,success"] + [f"t{i},{'ab'[i % 2]},{'true' if i % 3 else 'False'}" for i in range(120)]
    table.write_text("\n".join(rows) + "\n")
    loaded_table = load_tasks(table)
    assert loaded_table["success"][:4] == [False, True, True, False]
    summary = main(["--partition", "hardness", "--xi", "1", "--partition-size", "20", "--num-partitions", "8",
                    "--tasks", str(table), "--out", str(tmp_path / "figs")])
    figure = tmp_path / "figs" / "hardness_xi-1.png"
    assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert summary["size_mean"] == 20 and summary["success_share_mean"] == 0.5
    assert '"figure"' in capsys.readouterr().out


def test_plots_rejects_bad_tables_and_parameters(tmp_path, capsys):
    from partitions.plots import load_tasks, main

    bad = tmp_path / "bad.csv"
    bad.write_text("id,category,success\nt0,a,maybe\n")
    with pytest.raises(ValueError, match="success must be true/false"):
        load_tasks(bad)
    (tmp_path / "t.json").write_text('[{"id": "t0"}]')
    with pytest.raises(ValueError, match="lacks an 'id' or 'category'"):
        load_tasks(tmp_path / "t.json")
    with pytest.raises(SystemExit):
        main(["--partition", "coverage", "--omega", "0.1", "--out", str(tmp_path)])
    assert "unknown omega" in capsys.readouterr().err


def test_uniform_windows_are_the_references_contiguous_slices_of_a_seeded_order():
    """verl-agent's uniform_partition over a list shuffled by the seed, read by hand for N = 10: the order drawn
    from seed 0 is [4 6 2 7 3 5 9 0 8 1]."""
    from partitions import uniform_windows

    assert np.random.default_rng(0).permutation(10).tolist() == [4, 6, 2, 7, 3, 5, 9, 0, 8, 1]
    # K = 3: windows of 10 // 3 = 3, disjoint; the 10th task is in no window (the reference drops the remainder)
    assert [w.tolist() for w in uniform_windows(10, 3, 3, 0)] == [[2, 4, 6], [3, 5, 7], [0, 8, 9]]
    # K = 4, 4 tasks each: windows of 2 grow by 1 on each side where there is room, else 2 to the side that has it
    # (positions [0, 4), [1, 5), [3, 7), [5, 9)) and then overlap
    assert [w.tolist() for w in uniform_windows(10, 4, 4, 0)] == [[2, 4, 6, 7], [2, 3, 6, 7], [3, 5, 7, 9], [0, 5, 8, 9]]
    # a pool larger than K x partition.tasks-per-client: each client holds N // K tasks, as the reference's do
    assert {len(w) for w in uniform_windows(100, 4, 8, 0)} == {25}
    # another seed, other clients' data; the same seed, the same
    assert uniform_windows(10, 3, 3, 1)[0].tolist() != uniform_windows(10, 3, 3, 0)[0].tolist()
    assert make_partitioner("uniform-windows", 3, 0, partition_size=3).assign(synthetic_table().select(range(10)))[1].tolist() == [3, 5, 7]
