"""Tabular QAvg, SoftPAvg and ProjPAvg (Jin et al., Section 4) as pure numpy functions.

Every function works on arrays with arbitrary leading batch axes, so the same
code serves one client (``Q`` of shape (S, A)) and the vectorised engine
(``Q`` of shape (reps, clients, S, A)). Shapes: parameters and rewards (..., S, A),
kernels (..., S, A, S'), value vectors and d0 (..., S).

Per client and round, a federated wrapper calls ``<algo>_local_update`` with the
broadcast global parameters and that client's kernel, then ``average`` on the
returned parameters; ``run_federated`` is exactly that loop and is the
reference the batched engine is tested against.

* QAvg: E local steps Q <- (1 - eta_t) Q + eta_t T_k Q with the Bellman optimality
  operator T_k of the client's kernel; the server averages Q tables; the policy
  is greedy in the averaged Q.
* SoftPAvg: softmax policy on logits. The default direction is the one the
  reference code uses, A^pi(s, a) / (1 - gamma) (the natural policy gradient of the
  softmax parametrisation); ``direction="vanilla"`` uses the plain gradient
  d^pi(s) pi(a|s) A^pi(s, a) / (1 - gamma).
* ProjPAvg: direct parametrisation, gradient d^pi(s) Q^pi(s, a) / (1 - gamma),
  then Euclidean projection of each state's row onto the probability simplex.

Policies are evaluated exactly: V^pi = (I - gamma P_pi)^-1 R_pi.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, ClassVar, NamedTuple, Sequence

import numpy as np

from fedrl.mdps import FedTask

__all__ = [
    "ALGORITHMS",
    "Algorithm",
    "HarmonicStepSize",
    "LocalResult",
    "RunResult",
    "StallDecayStepSize",
    "average",
    "bellman_optimality",
    "check_local_steps",
    "discounted_occupancy",
    "evaluate",
    "expected_next_value",
    "get_algorithm",
    "greedy_policy",
    "model_at",
    "policy_kernel",
    "policy_q_value",
    "policy_value",
    "project_to_simplex",
    "projpavg_gradient",
    "projpavg_local_update",
    "qavg_local_update",
    "run_federated",
    "softmax",
    "softpavg_direction",
    "softpavg_local_update",
    "value_iteration",
]

# ---------------------------------------------------------------------------
# Reductions over a short last axis. numpy's reduce over a tiny inner axis costs
# about 10x an unrolled loop of whole-array operations, and these reductions
# (over actions or states) sit in every local step.

_UNROLL = 16


def _sum_last(X: np.ndarray) -> np.ndarray:
    n = X.shape[-1]
    if n == 0 or n > _UNROLL:
        return X.sum(axis=-1)
    out = X[..., 0].copy()
    for i in range(1, n):
        out += X[..., i]
    return out


def _max_last(X: np.ndarray) -> np.ndarray:
    n = X.shape[-1]
    if n == 0 or n > _UNROLL:
        return X.max(axis=-1)
    out = X[..., 0].copy()
    for i in range(1, n):
        np.maximum(out, X[..., i], out=out)
    return out


def _argmax_last(X: np.ndarray) -> np.ndarray:
    """First maximiser along the last axis, like np.argmax."""
    n = X.shape[-1]
    if n == 0 or n > _UNROLL:
        return X.argmax(axis=-1)
    best = X[..., 0].copy()
    idx = np.zeros(best.shape, dtype=np.intp)
    for i in range(1, n):
        better = X[..., i] > best
        idx[better] = i
        np.maximum(best, X[..., i], out=best)
    return idx


# ---------------------------------------------------------------------------
# MDP primitives


def expected_next_value(P: np.ndarray, V: np.ndarray) -> np.ndarray:
    """sum_s' P(s'|s, a) V(s') -> (..., S, A)."""
    S, A, S2 = P.shape[-3:]
    flat = P.reshape(P.shape[:-3] + (S * A, S2))
    out = np.matmul(flat, V[..., :, None])[..., 0]
    return out.reshape(out.shape[:-1] + (S, A))


def bellman_optimality(Q: np.ndarray, P: np.ndarray, R: np.ndarray, gamma: float) -> np.ndarray:
    """(T Q)(s, a) = R(s, a) + gamma * sum_s' P(s'|s, a) max_a' Q(s', a')."""
    return R + gamma * expected_next_value(P, _max_last(Q))


def policy_kernel(pi: np.ndarray, P: np.ndarray) -> np.ndarray:
    """P_pi(s'|s) = sum_a pi(a|s) P(s'|s, a) -> (..., S, S')."""
    batch = np.broadcast_shapes(pi.shape[:-2], P.shape[:-3])
    # einsum takes a slow path (about 2.5x) when an operand is a stride-0 broadcast view
    pi = np.ascontiguousarray(np.broadcast_to(pi, batch + pi.shape[-2:]))
    P = np.broadcast_to(P, batch + P.shape[-3:])
    return np.einsum("...sa,...sat->...st", pi, P)


# Many small systems (at least 256) are solved by an LU written in numpy with the batch on
# the last axis: for S <= 8, or when the matrices are banded (the grid worlds' are, bandwidth
# = width), it beats LAPACK's one-matrix-at-a-time calls (about 5x at S = 5, 2-3x for the
# 16-state cliff walk); otherwise LAPACK is used.
_SMALL_SYSTEM = 8
_MANY_SYSTEMS = 256


def _bandwidth(M: np.ndarray) -> int:
    """Largest |i - j| with a non-zero M[..., i, j] in any matrix of the batch."""
    S = M.shape[-1]
    nz = np.flatnonzero(np.any(M.reshape(-1, S * S) != 0, axis=0))
    return int(np.abs(nz // S - nz % S).max()) if nz.size else 0


def _lu_batch_last(Mt: np.ndarray, band: int) -> np.ndarray:
    """In-place banded LU without pivoting of (S, S, N) matrices: U on and above the
    diagonal, L's multipliers below. Elimination keeps the band, so only it is touched.

    No pivoting is needed: I - gamma P_pi is strictly diagonally dominant by rows
    (and so its transpose by columns).
    """
    S = Mt.shape[0]
    for k in range(S - 1):
        e = min(S, k + band + 1)
        f = Mt[k + 1 : e, k] / Mt[k, k]
        Mt[k + 1 : e, k] = f
        Mt[k + 1 : e, k + 1 : e] -= f[:, None] * Mt[k, None, k + 1 : e]
    return Mt


def _lu_solve(LU: np.ndarray, b: np.ndarray, band: int, transpose: bool) -> np.ndarray:
    """Solve (LU) x = b, or (LU)^T x = b, for b of shape (S, N)."""
    S = LU.shape[0]
    x = b.copy()
    if not transpose:
        for k in range(1, S):  # L y = b, unit diagonal
            lo = max(0, k - band)
            x[k] -= (LU[k, lo:k] * x[lo:k]).sum(0)
        for k in range(S - 1, -1, -1):  # U x = y
            hi = min(S, k + band + 1)
            x[k] = (x[k] - (LU[k, k + 1 : hi] * x[k + 1 : hi]).sum(0)) / LU[k, k]
    else:
        for k in range(S):  # U^T y = b
            lo = max(0, k - band)
            x[k] = (x[k] - (LU[lo:k, k] * x[lo:k]).sum(0)) / LU[k, k]
        for k in range(S - 2, -1, -1):  # L^T x = y
            hi = min(S, k + band + 1)
            x[k] -= (LU[k + 1 : hi, k] * x[k + 1 : hi]).sum(0)
    return x


def _solve_systems(M: np.ndarray, rhs: list[tuple[np.ndarray, bool]]) -> list[np.ndarray]:
    """Solve M x = b (transpose=False) or M^T x = b (True) for each (b, transpose), batched over leading axes."""
    S = M.shape[-1]
    batch = np.broadcast_shapes(M.shape[:-2], *(b.shape[:-1] for b, _ in rhs))
    N = int(np.prod(batch, dtype=np.int64))
    band = S - 1
    if N >= _MANY_SYSTEMS and S > _SMALL_SYSTEM:
        band = _bandwidth(M)
    if N < _MANY_SYSTEMS or (S > _SMALL_SYSTEM and 3 * band > S):
        Mb = np.broadcast_to(M, batch + (S, S))
        out = []
        for b, transpose in rhs:
            A = np.swapaxes(Mb, -1, -2) if transpose else Mb
            # numpy >= 2 treats b as a batch of vectors only with the trailing unit axis.
            out.append(np.linalg.solve(A, np.broadcast_to(b, batch + (S,))[..., None])[..., 0])
        return out
    LU = _lu_batch_last(np.broadcast_to(M, batch + (S, S)).reshape(N, S, S).transpose(1, 2, 0).copy(), band)
    out = []
    for b, transpose in rhs:
        bt = np.broadcast_to(b, batch + (S,)).reshape(N, S).T  # _lu_solve works on a copy
        out.append(_lu_solve(LU, bt, band, transpose).T.reshape(batch + (S,)))
    return out


def _solve(M: np.ndarray, b: np.ndarray) -> np.ndarray:
    return _solve_systems(M, [(b, False)])[0]


def _evaluation_matrix(pi: np.ndarray, P: np.ndarray, gamma: float) -> np.ndarray:
    S = P.shape[-1]
    return np.eye(S) - gamma * policy_kernel(pi, P)


def policy_value(pi: np.ndarray, P: np.ndarray, R: np.ndarray, gamma: float) -> np.ndarray:
    """V^pi on kernel P, exact: (I - gamma P_pi)^-1 R_pi -> (..., S)."""
    return _solve(_evaluation_matrix(pi, P, gamma), _sum_last(pi * R))


def policy_q_value(pi: np.ndarray, P: np.ndarray, R: np.ndarray, gamma: float) -> tuple[np.ndarray, np.ndarray]:
    """(Q^pi, V^pi)."""
    V = policy_value(pi, P, R, gamma)
    return R + gamma * expected_next_value(P, V), V


def discounted_occupancy(pi: np.ndarray, P: np.ndarray, gamma: float, d0: np.ndarray) -> np.ndarray:
    """d^pi(s) = (1 - gamma) sum_t gamma^t Pr(s_t = s | s_0 ~ d0); sums to 1."""
    M = _evaluation_matrix(pi, P, gamma)
    return (1.0 - gamma) * _solve_systems(M, [(d0, True)])[0]


def value_iteration(P: np.ndarray, R: np.ndarray, gamma: float, tol: float = 1e-12, max_iter: int = 100_000) -> np.ndarray:
    """Optimal Q of one kernel (batched), iterating T until the sup-norm change is below tol."""
    Q = np.zeros(np.broadcast_shapes(R.shape, P.shape[:-1]))
    for _ in range(max_iter):
        new = bellman_optimality(Q, P, R, gamma)
        if np.max(np.abs(new - Q)) < tol:
            return new
        Q = new
    raise RuntimeError(f"value iteration did not reach tol={tol} in {max_iter} sweeps")


def greedy_policy(Q: np.ndarray) -> np.ndarray:
    """Deterministic policy argmax_a Q(s, a) as one-hot rows (first maximiser on ties)."""
    return (np.arange(Q.shape[-1]) == _argmax_last(Q)[..., None]).astype(float)


def softmax(logits: np.ndarray) -> np.ndarray:
    z = logits - _max_last(logits)[..., None]
    np.exp(z, out=z)
    z /= _sum_last(z)[..., None]
    return z


def project_to_simplex(X: np.ndarray) -> np.ndarray:
    """Euclidean projection of each row (last axis) onto the probability simplex.

    With u sorted in decreasing order, the projection is max(x - tau, 0) with
    tau = max_j (u_1 + ... + u_j - 1) / j (that sequence rises while u_j lies
    above it and falls afterwards, so its maximum sits at the support size).
    Short rows are sorted with an odd-even transposition network on whole columns.
    """
    X = np.asarray(X, dtype=float)
    n = X.shape[-1]
    if n == 0:
        raise ValueError("cannot project an empty row onto the simplex")
    if n > _UNROLL:
        u = np.sort(X, axis=-1)[..., ::-1]
        css = (np.cumsum(u, axis=-1) - 1.0) / np.arange(1, n + 1)
        return np.maximum(X - css.max(axis=-1, keepdims=True), 0.0)
    flat = X.reshape(-1, n)  # keeps 1-D rows from turning into scalars below
    cols = [flat[:, i] for i in range(n)]
    for r in range(n):
        for i in range(r % 2, n - 1, 2):
            a, b = cols[i], cols[i + 1]
            cols[i], cols[i + 1] = np.maximum(a, b), np.minimum(a, b)
    partial = cols[0] - 1.0
    tau = partial.copy()
    for j in range(1, n):
        partial = partial + cols[j]
        np.maximum(tau, partial / (j + 1), out=tau)
    return np.maximum(flat - tau[:, None], 0.0).reshape(X.shape)


def evaluate(policy: np.ndarray, kernels: np.ndarray, R: np.ndarray, gamma: float, d0: np.ndarray) -> np.ndarray:
    """Objective g_d0: mean over the kernel axis (-4) of d0 . V^pi_k -> (...,); NaN if there are no kernels."""
    if kernels.shape[-4] == 0:
        return np.full(np.broadcast_shapes(policy.shape[:-2], kernels.shape[:-4]), np.nan)
    V = policy_value(policy[..., None, :, :], kernels, R[..., None, :, :], gamma)
    return _sum_last(V * d0[..., None, :]).mean(-1)


# ---------------------------------------------------------------------------
# Local updates (one client, E steps) and aggregation


class LocalResult(NamedTuple):
    """A client's new parameters and the objective d0 . V_k of the parameters it was sent.

    The start objective is what the client reports back as a metric; the
    stall-decay step-size rule is driven by its average over clients.
    """

    params: np.ndarray
    start_objective: np.ndarray | None


def _as_step_sizes(step_sizes) -> np.ndarray:
    etas = np.asarray(step_sizes, dtype=float)
    if etas.ndim == 0 or etas.shape[0] < 1:
        raise ValueError(f"step_sizes must be a sequence of E >= 1 step sizes (optionally batched), got shape {etas.shape}")
    if not np.all(np.isfinite(etas)) or np.any(etas <= 0):
        raise ValueError("step sizes must be finite and > 0")
    return etas


def _check_shapes(params: np.ndarray, P: np.ndarray, R: np.ndarray) -> None:
    S, A = params.shape[-2:]
    if P.shape[-3:] != (S, A, S) or R.shape[-2:] != (S, A):
        raise ValueError(f"kernel {P.shape} and reward {R.shape} must end in ({S}, {A}, {S}) and ({S}, {A})")


def _objective(V: np.ndarray, d0: np.ndarray) -> np.ndarray:
    return _sum_last(V * d0)


def qavg_local_update(
    Q: np.ndarray,
    P: np.ndarray,
    R: np.ndarray,
    gamma: float,
    d0: np.ndarray,
    step_sizes,
    report_objective: bool = True,
) -> LocalResult:
    """E = len(step_sizes) QAvg local steps Q <- (1 - eta_t) Q + eta_t (R + gamma P max_a Q)."""
    _check_shapes(Q, P, R)
    etas = _as_step_sizes(step_sizes)
    start = _objective(policy_value(greedy_policy(Q), P, R, gamma), d0) if report_objective else None
    for eta in etas:
        eta = eta[..., None, None]
        Q = (1.0 - eta) * Q + eta * bellman_optimality(Q, P, R, gamma)
    return LocalResult(Q, start)


def softpavg_direction(
    logits: np.ndarray, P: np.ndarray, R: np.ndarray, gamma: float, d0: np.ndarray, direction: str = "natural"
) -> tuple[np.ndarray, np.ndarray]:
    """Ascent direction on the logits and the current objective d0 . V^pi."""
    pi = softmax(logits)
    Qpi, V = policy_q_value(pi, P, R, gamma)
    adv = Qpi - V[..., None]
    if direction == "natural":
        g = adv / (1.0 - gamma)
    elif direction == "vanilla":
        d = discounted_occupancy(pi, P, gamma, d0)
        g = d[..., None] * pi * adv / (1.0 - gamma)
    else:
        raise ValueError(f"direction must be 'natural' or 'vanilla', got {direction!r}")
    return g, _objective(V, d0)


def softpavg_local_update(
    logits: np.ndarray,
    P: np.ndarray,
    R: np.ndarray,
    gamma: float,
    d0: np.ndarray,
    step_sizes,
    report_objective: bool = True,
    direction: str = "natural",
) -> LocalResult:
    """E SoftPAvg local steps: logits <- logits + eta_t * direction."""
    _check_shapes(logits, P, R)
    etas = _as_step_sizes(step_sizes)
    start = None
    for i, eta in enumerate(etas):
        g, obj = softpavg_direction(logits, P, R, gamma, d0, direction)
        if i == 0:
            start = obj
        logits = logits + eta[..., None, None] * g
    return LocalResult(logits, start)


def projpavg_gradient(pi: np.ndarray, P: np.ndarray, R: np.ndarray, gamma: float, d0: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """d g_d0 / d pi(a|s) = d^pi(s) Q^pi(s, a) / (1 - gamma), and the objective d0 . V^pi."""
    M = _evaluation_matrix(pi, P, gamma)
    # one factorisation for V^pi and for d^pi / (1 - gamma) = (I - gamma P_pi^T)^-1 d0
    V, d_scaled = _solve_systems(M, [(_sum_last(pi * R), False), (d0, True)])
    Qpi = R + gamma * expected_next_value(P, V)
    return d_scaled[..., None] * Qpi, _objective(V, d0)


def projpavg_local_update(
    pi: np.ndarray,
    P: np.ndarray,
    R: np.ndarray,
    gamma: float,
    d0: np.ndarray,
    step_sizes,
    report_objective: bool = True,
) -> LocalResult:
    """E ProjPAvg local steps: pi <- Proj_simplex(pi + eta_t * grad) row by row."""
    _check_shapes(pi, P, R)
    etas = _as_step_sizes(step_sizes)
    start = None
    for i, eta in enumerate(etas):
        g, obj = projpavg_gradient(pi, P, R, gamma, d0)
        if i == 0:
            start = obj
        pi = project_to_simplex(pi + eta[..., None, None] * g)
    return LocalResult(pi, start)


def average(params, weights=None, axis: int = 0) -> np.ndarray:
    """Server aggregation: (weighted) mean of client parameters along ``axis``.

    ``params`` is a list of equally shaped arrays (axis 0 then indexes clients)
    or one array whose ``axis`` indexes clients.
    """
    stack = np.stack(params) if isinstance(params, (list, tuple)) else np.asarray(params, dtype=float)
    if stack.ndim == 0 or stack.shape[axis] == 0:
        raise ValueError("average needs at least one client's parameters")
    if weights is None:
        return stack.mean(axis=axis)
    w = np.asarray(weights, dtype=float)
    if w.shape != (stack.shape[axis],) or np.any(w < 0) or w.sum() <= 0:
        raise ValueError(f"weights must be {stack.shape[axis]} non-negative numbers with a positive sum, got {w}")
    return np.tensordot(w / w.sum(), np.moveaxis(stack, axis, 0), axes=1)


# ---------------------------------------------------------------------------
# Algorithms and step-size rules


@dataclass(frozen=True)
class Algorithm:
    """What a federated wrapper needs: the local update, the parameters -> policy map and initialisation."""

    name: str
    local_update: Callable[..., LocalResult]
    to_policy: Callable[[np.ndarray], np.ndarray]
    init_from_uniform: Callable[[np.ndarray], np.ndarray]  # U(0, 1) table -> initial parameters
    objective_is_free: bool  # the local update computes V^pi anyway


ALGORITHMS: dict[str, Algorithm] = {
    "qavg": Algorithm("QAvg", qavg_local_update, greedy_policy, lambda u: u.copy(), False),
    "softpavg": Algorithm("SoftPAvg", softpavg_local_update, softmax, lambda u: u.copy(), True),
    "projpavg": Algorithm("ProjPAvg", projpavg_local_update, lambda p: p, lambda u: u / u.sum(-1, keepdims=True), True),
}


def get_algorithm(name: str) -> Algorithm:
    try:
        return ALGORITHMS[name.lower()]
    except KeyError:
        raise ValueError(f"unknown algorithm {name!r}; choose one of {sorted(ALGORITHMS)}") from None


@dataclass(frozen=True)
class HarmonicStepSize:
    """eta_t = min(cap, scale / ((1 - gamma) (t + offset))), t counting local steps from 0.

    scale = 2 and offset = E is Theorem 2's schedule for QAvg; with E = inf the
    offset defaults to 1.
    """

    scale: float = 2.0
    offset: float | None = None
    cap: float = 1.0
    needs_objective: ClassVar[bool] = False

    def __post_init__(self):
        if not self.scale > 0 or not self.cap > 0 or (self.offset is not None and not self.offset > 0):
            raise ValueError(f"harmonic step size needs scale > 0, cap > 0 and offset > 0, got {self}")

    def initial_state(self, shape) -> np.ndarray:
        return np.zeros(shape)

    def next_state(self, state, history: Sequence[np.ndarray]):
        return state

    def step_sizes(self, state, t0: int, n: int, gamma: float, E: int | None) -> np.ndarray:
        offset = self.offset if self.offset is not None else (E if E is not None else 1)
        t = np.arange(t0, t0 + n, dtype=float)
        etas = np.minimum(self.cap, self.scale / ((1.0 - gamma) * (t + offset)))
        return np.broadcast_to(etas.reshape((n,) + (1,) * np.ndim(state)), (n,) + np.shape(state))


@dataclass(frozen=True)
class StallDecayStepSize:
    """Reference-code rule: start at lr; before round r >= 3 multiply by decay when
    J[r-1] - J[r-2] < tol * |J[r-2]|, J[r] being the objective reported at the start of round r.

    (The reference compares against tol * J without the absolute value; with
    negative objectives that would only decay after a drop.)
    """

    lr: float
    decay: float = 1.0
    tol: float = 1e-3
    needs_objective: ClassVar[bool] = True

    def __post_init__(self):
        if not self.lr > 0 or not 0 < self.decay <= 1 or self.tol < 0:
            raise ValueError(f"stall-decay step size needs lr > 0, 0 < decay <= 1 and tol >= 0, got {self}")

    def initial_state(self, shape) -> np.ndarray:
        return np.full(shape, self.lr)

    def next_state(self, state, history: Sequence[np.ndarray]):
        if len(history) < 3:
            return state
        prev, prev2 = history[-1], history[-2]
        return np.where(prev - prev2 < self.tol * np.abs(prev2), state * self.decay, state)

    def step_sizes(self, state, t0: int, n: int, gamma: float, E: int | None) -> np.ndarray:
        return np.broadcast_to(state, (n,) + np.shape(state))


def check_local_steps(E) -> int | None:
    """Validate E: a positive int, or inf/None for 'never communicate' (returned as None)."""
    if E is None or (isinstance(E, float) and math.isinf(E) and E > 0) or (isinstance(E, str) and E.lower() in ("inf", "infinity")):
        return None
    if isinstance(E, (int, np.integer)) and not isinstance(E, bool) and E >= 1:
        return int(E)
    raise ValueError(f"E must be a positive integer or inf (never communicate), got {E!r}")


def model_at(t: int, E: int | None, total_steps: int) -> int:
    """Index of the model in force at local step t: rounds completed (finite E) or steps taken (E = inf)."""
    if E is None:
        return min(t, total_steps)
    return min(t // E, total_steps // E)


# ---------------------------------------------------------------------------
# The per-client federated loop (what a Flower strategy + clients do)


@dataclass
class RunResult:
    """Values are d0-weighted values minus the task's value_offset."""

    params: np.ndarray
    policy: np.ndarray
    center_value: float
    train_value: float
    test_value: float
    checkpoints: np.ndarray
    train_curve: np.ndarray
    center_curve: np.ndarray
    reported_objectives: list = field(default_factory=list)


def _values(policy: np.ndarray, task: FedTask) -> tuple[float, float, float]:
    R, g, d0, off = task.reward, task.gamma, task.d0, task.value_offset
    center = evaluate(policy, task.center[None], R, g, d0) - off if task.center is not None else np.nan
    return float(center), float(evaluate(policy, task.train, R, g, d0) - off), float(evaluate(policy, task.test, R, g, d0) - off)


def run_federated(
    task: FedTask,
    algorithm: str | Algorithm,
    E,
    total_steps: int,
    step_size,
    init_params: np.ndarray,
    checkpoints: Sequence[int] = (),
    **local_kwargs,
) -> RunResult:
    """Run one FedRL experiment client by client.

    Finite E: total_steps // E rounds; in each round every client runs E local
    steps from the global parameters and the server averages. E = inf: every
    client runs total_steps steps on its own (its step-size rule fed by its own
    objective, checked every step) and the final model is the average.
    ``checkpoints`` are local-step counts at which the model then in force is
    evaluated (for E = inf, the average of the local models).
    """
    algo = algorithm if isinstance(algorithm, Algorithm) else get_algorithm(algorithm)
    E = check_local_steps(E)
    if task.batch_shape != ():
        raise ValueError("run_federated takes one unbatched task; use fedrl.engine for batches")
    if int(total_steps) < (E or 1):
        raise ValueError(f"total_steps must be >= E (at least one round), got {total_steps} with E={E}")
    if init_params.shape != (task.n_states, task.n_actions):
        raise ValueError(f"init_params must have shape {(task.n_states, task.n_actions)}, got {init_params.shape}")
    checkpoints = np.asarray(checkpoints, dtype=int)
    if np.any(checkpoints < 0) or np.any(checkpoints > total_steps):
        raise ValueError(f"checkpoints must lie in [0, total_steps={total_steps}]")
    R, gamma, d0, n = task.reward, task.gamma, task.d0, task.n_agents
    report = step_size.needs_objective or algo.objective_is_free
    off = task.value_offset

    def curve_point(model):
        pol = algo.to_policy(model)
        c = evaluate(pol, task.center[None], R, gamma, d0) - off if task.center is not None else np.nan
        return float(evaluate(pol, task.train, R, gamma, d0) - off), float(c)

    models = {}  # model index -> parameters, kept only where a checkpoint needs them
    wanted = {model_at(int(t), E, total_steps) for t in checkpoints}
    reported: list = []
    if E is not None:
        rounds = total_steps // E
        state = step_size.initial_state(())
        params = init_params.astype(float)
        for r in range(rounds):
            if r in wanted:
                models[r] = params
            state = step_size.next_state(state, reported)
            etas = step_size.step_sizes(state, r * E, E, gamma, E)
            results = [algo.local_update(params, task.train[k], R, gamma, d0, etas, report, **local_kwargs) for k in range(n)]
            if report:
                reported.append(float(np.mean([res.start_objective for res in results])))
            params = average([res.params for res in results])
        models[rounds] = params
    else:
        locals_ = [init_params.astype(float) for _ in range(n)]
        states = [step_size.initial_state(()) for _ in range(n)]
        history: list[list] = [[] for _ in range(n)]
        for t in range(total_steps):
            if t in wanted:
                models[t] = average(locals_)
            for k in range(n):
                states[k] = step_size.next_state(states[k], history[k])
                etas = step_size.step_sizes(states[k], t, 1, gamma, None)
                res = algo.local_update(locals_[k], task.train[k], R, gamma, d0, etas, report, **local_kwargs)
                locals_[k] = res.params
                if report:
                    history[k].append(float(res.start_objective))
        params = average(locals_)
        models[total_steps] = params
        reported = history
    curve = [curve_point(models[model_at(int(t), E, total_steps)]) for t in checkpoints]
    policy = algo.to_policy(params)
    center, train, test = _values(policy, task)
    return RunResult(
        params=params,
        policy=policy,
        center_value=center,
        train_value=train,
        test_value=test,
        checkpoints=checkpoints,
        train_curve=np.array([c[0] for c in curve]),
        center_curve=np.array([c[1] for c in curve]),
        reported_objectives=reported,
    )
