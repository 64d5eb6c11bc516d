"""Tabular FedRL (Jin et al.): MDP families, QAvg / SoftPAvg / ProjPAvg and the batched engine."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedrl.engine import Cell, run_batched, run_cells
from fedrl.mdps import (
    RandomMDPs,
    WindyCliffs,
    mix_kernels,
    stack_tasks,
    windy_cliff_kernel,
)
from fedrl.tabular import (
    ALGORITHMS,
    HarmonicStepSize,
    StallDecayStepSize,
    _argmax_last,
    _max_last,
    _solve_systems,
    _sum_last,
    average,
    bellman_optimality,
    discounted_occupancy,
    evaluate,
    greedy_policy,
    policy_q_value,
    policy_value,
    project_to_simplex,
    projpavg_gradient,
    qavg_local_update,
    run_federated,
    softmax,
    softpavg_direction,
    value_iteration,
)


def _random_task(seed=0, kappa=0.6, **kw):
    return RandomMDPs(**kw).sample(np.random.default_rng(seed)).task(kappa)


# --- aggregation and projection -------------------------------------------------


def test_average_values_and_errors():
    a, b, c = np.array([[1.0, 2.0]]), np.array([[3.0, 6.0]]), np.array([[5.0, 10.0]])
    np.testing.assert_allclose(average([a, b, c]), [[3.0, 6.0]])
    np.testing.assert_allclose(average([a, b], weights=[3, 1]), [[1.5, 3.0]])
    stacked = np.stack([a, b, c], axis=1)  # clients on axis 1
    np.testing.assert_allclose(average(stacked, axis=1), [[3.0, 6.0]])
    with pytest.raises(ValueError, match="at least one"):
        average([])
    with pytest.raises(ValueError, match="non-negative"):
        average([a, b], weights=[1, -1])


@pytest.mark.parametrize(
    "x, expected",
    [
        ([0.5, 0.5], [0.5, 0.5]),
        ([2.0, 0.0], [1.0, 0.0]),
        ([1.0, 1.0, 1.0], [1 / 3, 1 / 3, 1 / 3]),
        ([0.6, 0.3, -0.2], [0.65, 0.35, 0.0]),
        ([-1.0, -1.0, 3.0, 0.0], [0.0, 0.0, 1.0, 0.0]),
        ([0.2, 0.2, 0.2, 0.2], [0.25, 0.25, 0.25, 0.25]),
    ],
)
def test_projection_hand_values(x, expected):
    np.testing.assert_allclose(project_to_simplex(np.array(x)), expected, atol=1e-12)


def test_projection_is_the_nearest_simplex_point_and_paths_agree():
    rng = np.random.default_rng(1)
    X = rng.normal(scale=2.0, size=(4000, 5))
    X[::7, 1] = X[::7, 0]  # ties
    Y = project_to_simplex(X)
    assert np.all(Y >= 0) and np.allclose(Y.sum(-1), 1.0)
    # KKT: y = max(x - tau, 0) with one tau per row, so x - y is constant on the support
    gap = np.where(Y > 0, X - Y, np.nan)
    assert np.nanmax(np.nanmax(gap, -1) - np.nanmin(gap, -1)) < 1e-12
    # nearer than any random point of the simplex
    Z = rng.dirichlet(np.ones(5), size=(200,))
    d_proj = ((X - Y) ** 2).sum(-1)
    d_rand = ((X[:, None] - Z[None]) ** 2).sum(-1).min(-1)
    assert np.all(d_proj <= d_rand + 1e-12)
    # rows longer than the unrolled network use the sort path
    wide = rng.normal(size=(50, 40))
    W = project_to_simplex(wide)
    np.testing.assert_allclose(W.sum(-1), 1.0)
    np.testing.assert_allclose(project_to_simplex(wide[:, :5]), project_to_simplex(wide[:, :5].copy()))


def test_short_axis_reductions_match_numpy():
    rng = np.random.default_rng(2)
    X = rng.integers(0, 3, size=(7, 6, 5)).astype(float)  # many ties
    np.testing.assert_array_equal(_argmax_last(X), X.argmax(-1))
    np.testing.assert_allclose(_sum_last(X), X.sum(-1))
    np.testing.assert_array_equal(_max_last(X), X.max(-1))


# --- MDP families ---------------------------------------------------------------


@pytest.mark.parametrize("kappa", [0.0, 0.2, 0.4, 0.6, 0.8, 1.0])
def test_random_mdp_kernels_are_stochastic_and_mixed_as_in_the_paper(kappa):
    fam = RandomMDPs()
    inst = fam.sample(np.random.default_rng(3))
    kernels = inst.kernels(kappa)
    assert kernels.shape == (25, 5, 5, 5)
    assert np.all(kernels >= 0)
    np.testing.assert_allclose(kernels.sum(-1), 1.0, atol=1e-12)
    # P_k^kappa = kappa P_k + (1 - kappa) P_0; the reference lists P_0 itself first
    np.testing.assert_allclose(kernels[0], inst.center)
    np.testing.assert_allclose(kernels[1:], kappa * inst.noise + (1 - kappa) * inst.center)
    task = inst.task(kappa)
    assert task.train.shape == (5, 5, 5, 5) and task.test.shape == (20, 5, 5, 5)


def test_random_mdp_noise_lives_on_the_complement_of_the_centre_support():
    inst = RandomMDPs().sample(np.random.default_rng(4))
    on = inst.center > 0
    assert np.all(inst.noise[:, on] == 0)
    assert np.all(inst.noise[:, ~on] > 0)
    support = on.sum(-1)
    assert support.min() >= 1 and support.max() <= 4  # never empty, never full
    assert inst.reward.shape == (5, 5) and np.all((inst.reward >= 0) & (inst.reward <= 1))
    assert inst.value_offset == pytest.approx(5.0)  # 0.5 / (1 - 0.9)


def test_paper_wording_variant_has_no_clean_centre_agent():
    inst = RandomMDPs(center_in_training=False).sample(np.random.default_rng(5))
    task = inst.task(0.5)
    assert inst.noise.shape[0] == 25
    assert not np.allclose(task.train[0], inst.center)


def test_windy_cliff_kernels_and_kappa_mixing():
    fam = WindyCliffs()
    inst = fam.sample(np.random.default_rng(6))
    np.testing.assert_allclose(inst.center, windy_cliff_kernel(0.5))
    P = inst.kernels(0.4)
    np.testing.assert_allclose(P.sum(-1), 1.0, atol=1e-12)
    # mixing windy kernels gives the windy kernel at the mixed wind strength
    theta_k = inst.noise[0, 4, 0, 0] * 3  # from state 4 going up, P(blown down to 0) = theta / 3
    np.testing.assert_allclose(P[1], windy_cliff_kernel(0.6 * 0.5 + 0.4 * theta_k), atol=1e-12)
    k0 = windy_cliff_kernel(0.0)
    assert k0[1, 0, 0] == 1.0 and k0[3, 2, 0] == 1.0  # cliff and goal send the agent back to the start
    assert k0[4, 3, 5] == 1.0  # no wind: "right" from (0, 1) goes to (1, 1)
    k1 = windy_cliff_kernel(0.9)
    assert k1[4, 3, 5] == pytest.approx(0.7) and k1[4, 3, 0] == pytest.approx(0.3)


def test_windy_cliff_optimum_on_the_centre_is_the_papers_133_97():
    task = WindyCliffs().sample(np.random.default_rng(0)).task(0.0)
    Q = value_iteration(task.center, task.reward, task.gamma)
    v = evaluate(greedy_policy(Q), task.center[None], task.reward, task.gamma, task.d0)
    assert v == pytest.approx(133.965, abs=5e-3)


@pytest.mark.parametrize(
    "make",
    [
        lambda: RandomMDPs(support_prob=1.0),
        lambda: RandomMDPs(gamma=1.0),
        lambda: RandomMDPs(n_states=1),
        lambda: WindyCliffs(center_theta=1.5),
        lambda: WindyCliffs(n_train=0),
    ],
)
def test_family_arguments_are_validated(make):
    with pytest.raises(ValueError):
        make()


def test_kappa_outside_unit_interval_is_rejected():
    inst = RandomMDPs().sample(np.random.default_rng(0))
    with pytest.raises(ValueError, match="kappa"):
        inst.task(1.2)
    with pytest.raises(ValueError, match="kappa"):
        mix_kernels(inst.center, inst.noise, -0.1)


# --- policy evaluation and gradients ---------------------------------------------


def test_policy_evaluation_matches_iteration_and_occupancy_sums_to_one():
    task = _random_task(7)
    rng = np.random.default_rng(7)
    pi = rng.dirichlet(np.ones(5), size=5)
    P, R, g = task.train[2], task.reward, task.gamma
    V = policy_value(pi, P, R, g)
    W = np.zeros(5)
    for _ in range(600):
        W = (pi * (R + g * (P @ W))).sum(-1)
    np.testing.assert_allclose(V, W, atol=1e-10)
    d = discounted_occupancy(pi, P, g, task.d0)
    assert d.sum() == pytest.approx(1.0) and np.all(d > 0)


def test_batched_lu_paths_match_lapack():
    rng = np.random.default_rng(8)
    for S, P in ((5, rng.dirichlet(np.ones(5), size=(600, 5, 3))), (16, windy_cliff_kernel(rng.uniform(size=600)))):
        pi = rng.dirichlet(np.ones(P.shape[-2]), size=(600, S))
        M = np.eye(S) - 0.95 * np.einsum("nsa,nsat->nst", pi, P)
        b = rng.normal(size=(600, S))
        x, y = _solve_systems(M, [(b, False), (b, True)])  # 600 systems: batch-last LU (banded for the grid)
        np.testing.assert_allclose(x, np.linalg.solve(M, b[..., None])[..., 0], atol=1e-10)
        np.testing.assert_allclose(y, np.linalg.solve(np.swapaxes(M, -1, -2), b[..., None])[..., 0], atol=1e-10)


def _objective(pi, P, R, g, d0):
    return float(policy_value(pi, P, R, g) @ d0)


def test_projpavg_gradient_matches_finite_differences():
    task = _random_task(9)
    pi = np.random.default_rng(9).dirichlet(np.ones(5), size=5)
    P, R, g, d0 = task.train[1], task.reward, task.gamma, task.d0
    grad, obj = projpavg_gradient(pi, P, R, g, d0)
    assert obj == pytest.approx(_objective(pi, P, R, g, d0))
    h = 1e-6
    for s, a in [(0, 0), (2, 3), (4, 1)]:
        e = np.zeros_like(pi)
        e[s, a] = h
        fd = (_objective(pi + e, P, R, g, d0) - _objective(pi - e, P, R, g, d0)) / (2 * h)
        assert grad[s, a] == pytest.approx(fd, rel=1e-5)


def test_softmax_directions():
    task = _random_task(10)
    logits = np.random.default_rng(10).normal(size=(5, 5))
    P, R, g, d0 = task.train[3], task.reward, task.gamma, task.d0
    vanilla, _ = softpavg_direction(logits, P, R, g, d0, "vanilla")
    h = 1e-6
    for s, a in [(1, 1), (3, 4)]:
        e = np.zeros_like(logits)
        e[s, a] = h
        fd = (_objective(softmax(logits + e), P, R, g, d0) - _objective(softmax(logits - e), P, R, g, d0)) / (2 * h)
        assert vanilla[s, a] == pytest.approx(fd, rel=1e-5)
    natural, _ = softpavg_direction(logits, P, R, g, d0)
    Qpi, V = policy_q_value(softmax(logits), P, R, g)
    np.testing.assert_allclose(natural, (Qpi - V[:, None]) / (1 - g))
    with pytest.raises(ValueError, match="direction"):
        softpavg_direction(logits, P, R, g, d0, "mirror")


# --- QAvg theory ----------------------------------------------------------------


def test_qavg_e1_step_is_a_bellman_step_on_the_average_kernel():
    task = _random_task(11, kappa=0.8)
    Q = np.random.default_rng(11).uniform(size=(5, 5))
    locals_ = [qavg_local_update(Q, P, task.reward, task.gamma, task.d0, [1.0], False).params for P in task.train]
    np.testing.assert_allclose(average(locals_), bellman_optimality(Q, task.average_kernel(), task.reward, task.gamma))


def test_qavg_e1_fixed_point_is_value_iteration_on_the_average_kernel():
    """Remark 1: with E = 1 the averaged Q converges to Q* of the imaginary environment P-bar."""
    task = _random_task(12, kappa=0.8)
    Q_star = value_iteration(task.average_kernel(), task.reward, task.gamma)
    res = run_federated(task, "qavg", 1, 4000, HarmonicStepSize(), np.zeros((5, 5)))
    np.testing.assert_allclose(res.params, Q_star, atol=5e-3)
    # with a constant full step it is exactly value iteration
    res = run_federated(task, "qavg", 1, 400, StallDecayStepSize(1.0), np.zeros((5, 5)))
    np.testing.assert_allclose(res.params, Q_star, atol=1e-10)
    # ... which differs from the average of the agents' own optima (what E = inf converges to)
    own = np.mean([value_iteration(P, task.reward, task.gamma) for P in task.train], axis=0)
    assert np.abs(own - Q_star).max() > 1e-3
    inf = run_federated(task, "qavg", math.inf, 400, StallDecayStepSize(1.0), np.zeros((5, 5)))
    np.testing.assert_allclose(inf.params, own, atol=1e-10)


def test_qavg_finite_e_reaches_the_same_policy():
    task = _random_task(13, kappa=0.6)
    values = [run_federated(task, "qavg", E, 1024, HarmonicStepSize(), np.zeros((5, 5))).center_value for E in (1, 2, 8)]
    assert max(values) - min(values) < 1e-9


# --- engine == per-client loop ---------------------------------------------------


@pytest.mark.parametrize(
    "algo, E, T, step",
    [
        ("qavg", 4, 24, HarmonicStepSize()),
        ("qavg", None, 12, StallDecayStepSize(0.5, 0.9)),
        ("softpavg", 2, 20, StallDecayStepSize(0.5, 0.5)),
        ("softpavg", math.inf, 10, StallDecayStepSize(0.5, 0.5, tol=0.05)),
        ("projpavg", 4, 24, StallDecayStepSize(0.05, 0.5, tol=0.01)),
        ("projpavg", None, 9, StallDecayStepSize(0.05, 0.5, tol=0.01)),
    ],
)
def test_engine_matches_per_client_loop_random_mdps(algo, E, T, step):
    fam = RandomMDPs()
    insts = [fam.sample(np.random.default_rng(100 + i)) for i in range(6)]
    tasks = [inst.task(0.6) for inst in insts]
    inits = np.random.default_rng(7).uniform(size=(6, 5, 5))
    inits = ALGORITHMS[algo].init_from_uniform(inits)
    cps = (0, 4, T // 2, T)
    batched = run_batched(stack_tasks(tasks), algo, E, T, step, inits, cps)
    for i, task in enumerate(tasks):
        one = run_federated(task, algo, E, T, step, inits[i], cps)
        np.testing.assert_allclose(batched.params[i], one.params, rtol=1e-9, atol=1e-12)
        for field in ("center_value", "train_value", "test_value"):
            assert getattr(batched, field)[i] == pytest.approx(getattr(one, field), rel=1e-9, abs=1e-12)
        np.testing.assert_allclose(batched.train_curve[:, i], one.train_curve, rtol=1e-9)
        np.testing.assert_allclose(batched.center_curve[:, i], one.center_curve, rtol=1e-9)


def test_run_cells_matches_per_client_loop_on_windy_cliffs_and_ignores_chunking():
    fam = WindyCliffs(n_test=4)
    cells = [
        Cell("softpavg", 4, 8, StallDecayStepSize(0.1, 0.4), 0.6),
        Cell("projpavg", 4, 8, StallDecayStepSize(0.01, 0.5), 0.6),
        Cell("qavg", 2, 8, HarmonicStepSize(), None, (2, 8)),
    ]
    a = run_cells(fam, cells, reps=5, seed=3, chunk_size=2)
    b = run_cells(fam, cells, reps=5, seed=3, chunk_size=5)
    for ra, rb in zip(a, b):
        np.testing.assert_array_equal(ra.center_value, rb.center_value)
        np.testing.assert_array_equal(ra.train_curve, rb.train_curve)
    from fedrl.engine import rep_rngs

    for i in range(5):
        prob_rng, init_rng = rep_rngs(3, i)
        inst = fam.sample(prob_rng)
        u = init_rng.uniform(size=(16, 4))
        for res, cell in zip(a[:2], cells[:2]):
            one = run_federated(inst.task(0.6), cell.algorithm, cell.E, cell.total_steps, cell.step_size,
                                ALGORITHMS[cell.algorithm].init_from_uniform(u))
            assert res.center_value[i] == pytest.approx(one.center_value, rel=1e-9)
            assert res.test_value[i] == pytest.approx(one.test_value, rel=1e-9)
    for i in range(5):
        prob_rng, init_rng = rep_rngs(3, i)
        task = fam.sample_uniform(prob_rng)
        one = run_federated(task, "qavg", 2, 8, HarmonicStepSize(), init_rng.uniform(size=(16, 4)), (2, 8))
        np.testing.assert_allclose(a[2].train_curve[:, i], one.train_curve, rtol=1e-9)


# --- magnitudes and trends --------------------------------------------------------


def test_reward_scale_ten_gives_ten_times_the_values():
    """The paper's RandomMDPs magnitudes (~35) are the reference objective (~3.5) with R ~ U(0, 10)."""
    base = RandomMDPs()
    scaled = RandomMDPs(reward_scale=10.0)
    for algo, step in (("qavg", HarmonicStepSize()), ("softpavg", StallDecayStepSize(0.05, 0.9)), ("projpavg", StallDecayStepSize(0.05, 0.9))):
        lr_scaled = step if algo == "qavg" else StallDecayStepSize(step.lr / 10, step.decay, step.tol)
        r1 = run_cells(base, [Cell(algo, 4, 32, step, 0.4)], reps=4, seed=1)[0]
        r10 = run_cells(scaled, [Cell(algo, 4, 32, lr_scaled, 0.4)], reps=4, seed=1)[0]
        np.testing.assert_allclose(r10.center_value, 10 * r1.center_value, rtol=1e-6)
    assert 3.0 < r1.center_value.mean() < 4.2


def test_value_on_p0_falls_as_kappa_grows():
    cells = [Cell("qavg", 4, 64, HarmonicStepSize(), k) for k in (0.0, 0.8)]
    lo, hi = run_cells(RandomMDPs(), cells, reps=300, seed=0)
    diff = lo.center_value - hi.center_value  # paired repetitions
    assert diff.mean() > 5 * diff.std(ddof=1) / np.sqrt(diff.size)


# --- validation -------------------------------------------------------------------


def test_bad_arguments_raise_value_errors():
    task = _random_task(14)
    Q = np.zeros((5, 5))
    with pytest.raises(ValueError, match="E must be"):
        run_federated(task, "qavg", 0, 10, HarmonicStepSize(), Q)
    with pytest.raises(ValueError, match="total_steps"):
        run_federated(task, "qavg", 8, 4, HarmonicStepSize(), Q)
    with pytest.raises(ValueError, match="unknown algorithm"):
        run_federated(task, "dqnavg", 1, 4, HarmonicStepSize(), Q)
    with pytest.raises(ValueError, match="step sizes"):
        qavg_local_update(Q, task.train[0], task.reward, task.gamma, task.d0, [0.5, -1.0])
    with pytest.raises(ValueError, match="kernel"):
        qavg_local_update(np.zeros((4, 5)), task.train[0], task.reward, task.gamma, task.d0, [0.5])
    with pytest.raises(ValueError, match="lr > 0"):
        StallDecayStepSize(0.0)
    with pytest.raises(ValueError, match="checkpoints"):
        run_federated(task, "qavg", 1, 4, HarmonicStepSize(), Q, checkpoints=(5,))


def test_held_out_kernels_can_be_left_out():
    inst = RandomMDPs().sample(np.random.default_rng(15))
    full, lean = inst.task(0.4), inst.task(0.4, include_test=False)
    assert lean.test.shape[0] == 0
    np.testing.assert_array_equal(lean.train, full.train)
    cell = Cell("qavg", 4, 16, HarmonicStepSize(), 0.4, evaluate_test=False)
    (res,) = run_cells(RandomMDPs(), [cell], reps=3, seed=0)
    assert np.all(np.isnan(res.test_value)) and np.all(np.isfinite(res.center_value))


def test_table1_cli_writes_the_table_and_figure(tmp_path):
    from fedagent_flwr.experiments.fedrl_table1 import main

    assert main(["--reps", "2", "--fig2-reps", "2", "--out", str(tmp_path), "--workers", "1"]) == 0
    md = (tmp_path / "table1.md").read_text()
    assert "| kappa = 0.8 |" in md and "| E = inf |" in md and "RandomMDPs x 10" in md
    assert (tmp_path / "fig2.png").stat().st_size > 10_000
    import json

    report = json.loads((tmp_path / "table1.json").read_text())
    assert len(report["table1"]["RandomMDPs"]) == 15 and len(report["fig2"]) == 21
    windy = {(c["algorithm"], c["kappa"]): c for c in report["table1"]["WindyCliffs"]}
    assert windy[("QAvg", 0.0)]["center_value"]["mean"] == pytest.approx(133.965, abs=0.01)
    with pytest.raises(SystemExit):
        main(["--reps", "0", "--out", str(tmp_path)])


def test_whether_the_centre_kernel_trains_is_a_run_config_key():
    from fedagent_flwr.config import RunConfig
    from fedagent_flwr.methods.fedrl.problem import family

    for env in ("random-mdp", "windy-cliffs"):
        for center_in_training in (True, False):  # True: the reference's, client 0 trains on P_0 itself
            fam = family(RunConfig.from_run_config({"strategy": "qavg", "env": env, "fedrl.center-in-training": center_in_training}), 3)
            mdp = fam.sample(np.random.default_rng(0))
            holds_p0 = [bool(np.allclose(k, mdp.center)) for k in mdp.kernels(0.5, include_test=False)]
            assert holds_p0 == [center_in_training, False, False], (env, holds_p0)
