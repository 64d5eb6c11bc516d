"""Vectorised FedRL experiments: many repetitions x all clients in one numpy batch.

``run_batched`` is ``tabular.run_federated`` with the repetition and client
loops turned into array axes (reps, clients, S, A); it must give the same
numbers (tests/test_fedrl_tabular.py checks it). ``run_cells`` draws the
repetitions from a seed, splits them into memory-sized chunks, optionally over
worker processes, and returns per-repetition values for every requested cell
(algorithm, E, steps, step-size rule, kappa). Repetition i always uses
``SeedSequence([seed, i])``, so results do not depend on chunking or workers.
"""

from __future__ import annotations

import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np

from fedrl.mdps import FedTask, RandomMDPs, WindyCliffs, stack_instances, stack_tasks
from fedrl.tabular import (
    Algorithm,
    HarmonicStepSize,
    StallDecayStepSize,
    average,
    check_local_steps,
    evaluate,
    get_algorithm,
    model_at,
)

__all__ = ["BatchedResult", "Cell", "CellResult", "run_batched", "run_cells", "rep_rngs"]


class _Tail:
    """The last two entries and the length of a history, enough for the stall-decay rule."""

    def __init__(self):
        self.count = 0
        self.last: list = []

    def append(self, x):
        self.count += 1
        self.last = (self.last + [x])[-2:]

    def __len__(self):
        return self.count

    def __getitem__(self, i):
        if i not in (-1, -2):
            raise IndexError("only the last two entries are kept")
        return self.last[i]


@dataclass
class BatchedResult:
    """Per-repetition values (d0-weighted, minus the task's value_offset)."""

    params: np.ndarray  # (B, S, A)
    center_value: np.ndarray  # (B,)
    train_value: np.ndarray
    test_value: np.ndarray
    checkpoints: np.ndarray  # (C,)
    train_curve: np.ndarray  # (C, B)
    center_curve: np.ndarray  # (C, B)


def run_batched(
    task: FedTask,
    algorithm: str | Algorithm,
    E,
    total_steps: int,
    step_size,
    init_params: np.ndarray,
    checkpoints: Sequence[int] = (),
    **local_kwargs,
) -> BatchedResult:
    """``run_federated`` for a batch of tasks with leading axis B (see that function for the protocol)."""
    algo = algorithm if isinstance(algorithm, Algorithm) else get_algorithm(algorithm)
    E = check_local_steps(E)
    if len(task.batch_shape) != 1:
        raise ValueError(f"run_batched needs tasks stacked along one leading axis, got batch shape {task.batch_shape}")
    B, S, A, n = task.batch_shape[0], task.n_states, task.n_actions, task.n_agents
    if int(total_steps) < (E or 1):
        raise ValueError(f"total_steps must be >= E (at least one round), got {total_steps} with E={E}")
    if init_params.shape != (B, S, A):
        raise ValueError(f"init_params must have shape {(B, S, A)}, got {init_params.shape}")
    checkpoints = np.asarray(checkpoints, dtype=int)
    if np.any(checkpoints < 0) or np.any(checkpoints > total_steps):
        raise ValueError(f"checkpoints must lie in [0, total_steps={total_steps}]")
    gamma, off = task.gamma, task.value_offset
    P = task.train  # (B, n, S, A, S)
    R = task.reward[:, None]  # clients share the reward
    d0 = task.d0[:, None]
    report = step_size.needs_objective or algo.objective_is_free
    wanted = {model_at(int(t), E, total_steps) for t in checkpoints}
    models = {}

    if E is not None:
        rounds = total_steps // E
        state = step_size.initial_state((B,))
        reported = _Tail()
        params = init_params.astype(float)
        for r in range(rounds):
            if r in wanted:
                models[r] = params
            state = step_size.next_state(state, reported)
            etas = step_size.step_sizes(state, r * E, E, gamma, E)[..., None]  # (E, B, 1): same for all clients
            local = np.broadcast_to(params[:, None], (B, n, S, A))
            res = algo.local_update(local, P, R, gamma, d0, etas, report, **local_kwargs)
            if report:
                reported.append(res.start_objective.mean(axis=1))
            params = average(res.params, axis=1)
        models[rounds] = params
    else:
        local = np.broadcast_to(init_params.astype(float)[:, None], (B, n, S, A))
        state = step_size.initial_state((B, n))
        history = _Tail()
        for t in range(total_steps):
            if t in wanted:
                models[t] = average(local, axis=1)
            state = step_size.next_state(state, history)
            etas = step_size.step_sizes(state, t, 1, gamma, None)
            res = algo.local_update(local, P, R, gamma, d0, etas, report, **local_kwargs)
            local = res.params
            if report:
                history.append(res.start_objective)
        params = average(local, axis=1)
        models[total_steps] = params

    def values(policy, kernels):
        return evaluate(policy, kernels, task.reward, gamma, task.d0) - off

    def center(policy):
        return values(policy, task.center[:, None]) if task.center is not None else np.full(B, np.nan)

    curve_models = [algo.to_policy(models[model_at(int(t), E, total_steps)]) for t in checkpoints]
    policy = algo.to_policy(params)
    return BatchedResult(
        params=params,
        center_value=center(policy),
        train_value=values(policy, task.train),
        test_value=values(policy, task.test),
        checkpoints=checkpoints,
        train_curve=np.array([values(p, task.train) for p in curve_models]).reshape(len(checkpoints), B),
        center_curve=np.array([center(p) for p in curve_models]).reshape(len(checkpoints), B),
    )


# ---------------------------------------------------------------------------
# Experiments over many repetitions


@dataclass(frozen=True)
class Cell:
    """One table cell: an algorithm run at one heterogeneity level.

    fedrl.kappa=None runs the family's ``sample_uniform`` task (WindyCliffs, Figure 2).
    """

    algorithm: str
    E: int | None
    total_steps: int
    step_size: HarmonicStepSize | StallDecayStepSize
    kappa: float | None
    checkpoints: tuple[int, ...] = ()
    local_kwargs: tuple[tuple[str, object], ...] = ()
    evaluate_test: bool = True  # False skips the held-out kernels (test_value is NaN), which saves their cost

    def __post_init__(self):
        get_algorithm(self.algorithm)
        object.__setattr__(self, "E", check_local_steps(self.E))
        if int(self.total_steps) < (self.E or 1):
            raise ValueError(f"total_steps must be >= E, got {self.total_steps} with E={self.E}")


@dataclass
class CellResult:
    cell: Cell
    center_value: np.ndarray  # (reps,)
    train_value: np.ndarray
    test_value: np.ndarray
    train_curve: np.ndarray  # (C, reps)
    center_curve: np.ndarray
    seconds: float = 0.0

    @staticmethod
    def mean_se(x: np.ndarray) -> tuple[float, float]:
        x = np.asarray(x, dtype=float)
        se = x.std(axis=-1, ddof=1) / np.sqrt(x.shape[-1]) if x.shape[-1] > 1 else np.nan
        return float(x.mean(axis=-1)), float(se)


def rep_rngs(seed: int, rep: int) -> tuple[np.random.Generator, np.random.Generator]:
    """(problem rng, initialisation rng) of repetition ``rep``."""
    a, b = np.random.SeedSequence([int(seed), int(rep)]).spawn(2)
    return np.random.default_rng(a), np.random.default_rng(b)


def _draw(family, seed: int, start: int, stop: int, uniform: bool):
    problems, inits = [], []
    for i in range(start, stop):
        prob_rng, init_rng = rep_rngs(seed, i)
        problems.append(family.sample_uniform(prob_rng) if uniform else family.sample(prob_rng))
        inits.append(init_rng.uniform(size=problems[-1].reward.shape))
    # heterogeneous draws are stacked once so each kappa is one vectorised mix
    return (problems if uniform else stack_instances(problems)), np.stack(inits)


def _run_chunk(args):
    family, cells, seed, start, stop = args
    import time

    out = []
    draws, tasks = {}, {}
    for cell in cells:
        uniform = cell.kappa is None
        if uniform not in draws:
            draws[uniform] = _draw(family, seed, start, stop, uniform)
        problems, uni = draws[uniform]
        key = (cell.kappa, cell.evaluate_test)
        if key not in tasks:
            if uniform:
                task = stack_tasks(problems)
                tasks[key] = task if cell.evaluate_test else replace(task, test=task.test[:, :0])
            else:
                tasks[key] = problems.task(cell.kappa, include_test=cell.evaluate_test)
        algo = get_algorithm(cell.algorithm)
        t0 = time.perf_counter()
        res = run_batched(
            tasks[key], algo, cell.E, cell.total_steps, cell.step_size,
            algo.init_from_uniform(uni), cell.checkpoints, **dict(cell.local_kwargs),
        )
        out.append((res.center_value, res.train_value, res.test_value, res.train_curve, res.center_curve,
                    time.perf_counter() - t0))
    return out


def _bytes_per_rep(family) -> int:
    if isinstance(family, RandomMDPs):
        S, A = family.n_states, family.n_actions
    elif isinstance(family, WindyCliffs):
        S, A = family.n_states, 4
    else:
        raise ValueError(f"unknown family {family!r}")
    # kernels of every agent, test environment and the centre, plus working copies during the run
    return 8 * S * A * S * (family.n_train + family.n_test + 1) * 3


def run_cells(
    family: RandomMDPs | WindyCliffs,
    cells: Sequence[Cell],
    reps: int,
    seed: int = 0,
    chunk_size: int | None = None,
    workers: int = 1,
    memory_per_chunk: int = 96 * 2**20,
) -> list[CellResult]:
    """Run every cell on the same ``reps`` repetitions (paired across cells)."""
    if int(reps) < 1:
        raise ValueError(f"reps must be >= 1, got {reps}")
    if int(workers) < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    cells = list(cells)
    if chunk_size is None:
        chunk_size = max(1, min(reps, memory_per_chunk // _bytes_per_rep(family)))
    bounds = [(s, min(s + chunk_size, reps)) for s in range(0, reps, chunk_size)]
    jobs = [(family, cells, seed, a, b) for a, b in bounds]
    if workers == 1 or len(jobs) == 1:
        parts = [_run_chunk(j) for j in jobs]
    else:
        with ProcessPoolExecutor(max_workers=min(workers, len(jobs), os.cpu_count() or 1)) as pool:
            parts = list(pool.map(_run_chunk, jobs))
    results = []
    for c, cell in enumerate(cells):
        pieces = [p[c] for p in parts]
        results.append(
            CellResult(
                cell=cell,
                center_value=np.concatenate([q[0] for q in pieces]),
                train_value=np.concatenate([q[1] for q in pieces]),
                test_value=np.concatenate([q[2] for q in pieces]),
                train_curve=np.concatenate([q[3] for q in pieces], axis=1),
                center_curve=np.concatenate([q[4] for q in pieces], axis=1),
                seconds=float(sum(q[5] for q in pieces)),
            )
        )
    return results
