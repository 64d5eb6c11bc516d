"""Heterogeneous tabular MDP families for federated RL (Jin et al., Section 7.2).

A FedRL task shares the state space, action space, reward R(s, a), discount and
initial distribution d0 across agents; only the transition kernels differ.
Heterogeneity is set by one scalar kappa: from a centre kernel P_0 and noise
kernels P_1, P_2, ... the agents' kernels are

    P_k^kappa = kappa * P_k + (1 - kappa) * P_0,

so kappa = 0 gives identical agents and larger kappa pulls each agent towards
its own noise kernel.

Two families, built as in the public reference code (pengyang7881187/FedRL,
tabular/utils.py and GridWorldEnvironment.py):

* RandomMDPs: nS = nA = 5, gamma = 0.9, R ~ U(0, 1). Each (s, a) row gets a
  random support (each next state kept with probability 0.5, never none and
  never all); P_0 puts uniform weights on that support and every noise kernel
  on its complement, so noise moves mass where P_0 has none.
* WindyCliffs: a 4 x 4 cliff walk with wind from the north (gamma = 0.95).
  Reward -1 per step, -100 on the cliff, +100 at the goal; the cliff cells and
  the goal send the agent back to the start. A non-"down" move is blown one
  cell down with probability theta / 3. The centre has theta = 0.5 and each
  noise kernel theta ~ U(0, 1); kernels are affine in theta, so P_k^kappa is
  itself a windy cliff with theta = (1 - kappa) * 0.5 + kappa * theta_k.

Layout conventions: kernels are (S, A, S') arrays, rewards (S, A).
The reference code lists [P_0, P_1^kappa, P_2^kappa, ...] and uses the first
n_train as training agents and the rest as held-out test environments, so the
centre itself is one of the training agents; ``center_in_training=False``
gives the paper's wording instead (all n_train agents are noisy copies).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

__all__ = [
    "FedTask",
    "HeterogeneousMDP",
    "RandomMDPs",
    "WindyCliffs",
    "mix_kernels",
    "stack_instances",
    "stack_tasks",
    "windy_cliff_kernel",
    "windy_cliff_reward",
]


def _check_kappa(kappa: float) -> float:
    kappa = float(kappa)
    if not 0.0 <= kappa <= 1.0:
        raise ValueError(f"kappa must lie in [0, 1], got {kappa}")
    return kappa


def _check_gamma(gamma: float) -> float:
    gamma = float(gamma)
    if not 0.0 < gamma < 1.0:
        raise ValueError(f"gamma must lie in (0, 1), got {gamma}")
    return gamma


def mix_kernels(center: np.ndarray, noise: np.ndarray, kappa: float) -> np.ndarray:
    """P^kappa = kappa * noise + (1 - kappa) * center (broadcast over leading axes of noise)."""
    kappa = _check_kappa(kappa)
    center = np.asarray(center, dtype=float)
    noise = np.asarray(noise, dtype=float)
    if center.ndim < 3 or noise.shape[-3:] != center.shape[-3:] or center.shape[-1] != center.shape[-3]:
        raise ValueError(f"noise kernels {noise.shape} and centre {center.shape} must share an (S, A, S) shape")
    return kappa * noise + (1.0 - kappa) * center


# The run-config names of the two tabular families (the Flower app's `env` for strategy qavg / pavg).
TABULAR_ENVS = ("random-mdp", "windy-cliffs")


@dataclass(frozen=True)
class FedTask:
    """One FedRL task: shared reward, discount and d0; per-agent kernels.

    Arrays may carry the same leading batch shape (one task per repetition);
    the vectorised engine works on such stacked tasks.

    reward: (..., S, A); train: (..., n, S, A, S) agents' kernels;
    test: (..., m, S, A, S) held-out kernels (m may be 0); center: (..., S, A, S)
    or None; d0: (..., S). ``value_offset`` is subtracted when values are reported
    (RandomMDPs report V - E[R] / (1 - gamma), as the reference code does).
    """

    reward: np.ndarray
    train: np.ndarray
    test: np.ndarray
    center: np.ndarray | None
    gamma: float
    d0: np.ndarray
    value_offset: float = 0.0
    name: str = ""

    def __post_init__(self):
        _check_gamma(self.gamma)
        S, A = self.reward.shape[-2:]
        batch = self.reward.shape[:-2]
        if self.train.ndim != len(batch) + 4 or self.train.shape[-3:] != (S, A, S) or self.train.shape[-4] < 1:
            raise ValueError(f"train kernels must have shape {batch} + (n >= 1, {S}, {A}, {S}), got {self.train.shape}")
        if self.test.ndim != len(batch) + 4 or self.test.shape[-3:] != (S, A, S):
            raise ValueError(f"test kernels must have shape {batch} + (m, {S}, {A}, {S}), got {self.test.shape}")
        if self.center is not None and self.center.shape[-3:] != (S, A, S):
            raise ValueError(f"centre kernel must have shape (..., {S}, {A}, {S}), got {self.center.shape}")
        if self.d0.shape[-1] != S:
            raise ValueError(f"d0 must have {S} entries per task, got shape {self.d0.shape}")

    @property
    def n_states(self) -> int:
        return self.reward.shape[-2]

    @property
    def n_actions(self) -> int:
        return self.reward.shape[-1]

    @property
    def n_agents(self) -> int:
        return self.train.shape[-4]

    @property
    def batch_shape(self) -> tuple[int, ...]:
        return self.reward.shape[:-2]

    def average_kernel(self) -> np.ndarray:
        """The 'imaginary environment' kernel P-bar = mean of the agents' kernels."""
        return self.train.mean(axis=-4)


def stack_tasks(tasks: list[FedTask]) -> FedTask:
    """Stack unbatched tasks along a new leading axis (one per repetition)."""
    if not tasks:
        raise ValueError("stack_tasks needs at least one task")
    first = tasks[0]
    for t in tasks:
        if t.gamma != first.gamma or t.value_offset != first.value_offset:
            raise ValueError("stacked tasks must share gamma and value_offset")
        if (t.center is None) != (first.center is None) or t.reward.ndim != 2:
            raise ValueError("stacked tasks must be unbatched and either all have a centre kernel or none")
    return FedTask(
        reward=np.stack([t.reward for t in tasks]),
        train=np.stack([t.train for t in tasks]),
        test=np.stack([t.test for t in tasks]),
        center=None if first.center is None else np.stack([t.center for t in tasks]),
        gamma=first.gamma,
        d0=np.stack([t.d0 for t in tasks]),
        value_offset=first.value_offset,
        name=first.name,
    )


@dataclass(frozen=True)
class HeterogeneousMDP:
    """One draw of a family: centre kernel, noise kernels and reward, before mixing.

    ``task(kappa)`` mixes them; every kappa of one draw shares the same centre,
    noise and reward, as in the reference code, so kappa rows are paired.
    Arrays may carry a leading batch axis (see ``stack_instances``).
    """

    reward: np.ndarray  # (..., S, A)
    center: np.ndarray  # (..., S, A, S)
    noise: np.ndarray  # (..., K, S, A, S)
    gamma: float
    d0: np.ndarray  # (..., S)
    n_train: int
    n_test: int
    center_in_training: bool = True
    value_offset: float = 0.0
    name: str = ""

    def kernels(self, kappa: float, include_test: bool = True) -> np.ndarray:
        """The n_train (+ n_test) kernels at this kappa (axis -4), training agents first."""
        count = self.n_train + (self.n_test if include_test else 0)
        first = 1 if self.center_in_training else 0
        mixed = mix_kernels(self.center[..., None, :, :, :], self.noise[..., : count - first, :, :, :], kappa)
        if self.center_in_training:
            return np.concatenate([self.center[..., None, :, :, :], mixed], axis=-4)
        return mixed

    def task(self, kappa: float, include_test: bool = True) -> FedTask:
        """The FedTask at this kappa; include_test=False leaves the held-out kernels out (m = 0)."""
        kernels = self.kernels(kappa, include_test)
        return FedTask(
            reward=self.reward,
            train=kernels[..., : self.n_train, :, :, :],
            test=kernels[..., self.n_train : self.n_train + (self.n_test if include_test else 0), :, :, :],
            center=self.center,
            gamma=self.gamma,
            d0=self.d0,
            value_offset=self.value_offset,
            name=self.name,
        )


def stack_instances(instances: list[HeterogeneousMDP]) -> HeterogeneousMDP:
    """Stack unbatched draws of one family along a new leading axis, so one mix serves them all."""
    if not instances:
        raise ValueError("stack_instances needs at least one draw")
    first = instances[0]
    keys = ("gamma", "n_train", "n_test", "center_in_training", "value_offset")
    if any(tuple(getattr(i, k) for k in keys) != tuple(getattr(first, k) for k in keys) for i in instances):
        raise ValueError(f"stacked draws must share {keys}")
    return HeterogeneousMDP(
        reward=np.stack([i.reward for i in instances]),
        center=np.stack([i.center for i in instances]),
        noise=np.stack([i.noise for i in instances]),
        gamma=first.gamma,
        d0=np.stack([i.d0 for i in instances]),
        n_train=first.n_train,
        n_test=first.n_test,
        center_in_training=first.center_in_training,
        value_offset=first.value_offset,
        name=first.name,
    )


def _check_counts(n_train: int, n_test: int) -> None:
    if int(n_train) < 1:
        raise ValueError(f"n_train must be >= 1, got {n_train}")
    if int(n_test) < 0:
        raise ValueError(f"n_test must be >= 0, got {n_test}")


def _n_noise(n_train: int, n_test: int, center_in_training: bool) -> int:
    # The reference code spends one slot of the list on the centre itself.
    return n_train + n_test - (1 if center_in_training else 0)


@dataclass(frozen=True)
class RandomMDPs:
    """RandomMDPs family (reference defaults: nS = nA = 5, gamma = 0.9, 5 + 20 kernels).

    ``reward_scale`` draws R ~ U(0, reward_scale); the reported offset scales
    with it (0.5 * reward_scale / (1 - gamma)).
    """

    n_states: int = 5
    n_actions: int = 5
    gamma: float = 0.9
    n_train: int = 5
    n_test: int = 20
    support_prob: float = 0.5
    reward_scale: float = 1.0
    center_in_training: bool = True
    name: str = field(default="RandomMDPs")

    def __post_init__(self):
        _check_gamma(self.gamma)
        _check_counts(self.n_train, self.n_test)
        if self.n_states < 2 or self.n_actions < 1:
            raise ValueError(
                f"RandomMDPs needs n_states >= 2 (support and its complement must both be non-empty) "
                f"and n_actions >= 1, got {self.n_states}, {self.n_actions}"
            )
        if not 0.0 < self.support_prob < 1.0:
            raise ValueError(f"support_prob must lie in (0, 1), got {self.support_prob}")
        if not self.reward_scale > 0:
            raise ValueError(f"reward_scale must be > 0, got {self.reward_scale}")

    @property
    def value_offset(self) -> float:
        return 0.5 * self.reward_scale / (1.0 - self.gamma)

    def support(self, rng: np.random.Generator) -> np.ndarray:
        """(S, A, S) 0/1 support of P_0: Bernoulli(support_prob), never empty, never full."""
        S, A = self.n_states, self.n_actions
        sup = rng.binomial(1, self.support_prob, size=(S * A, S))
        empty = np.flatnonzero(sup.sum(1) == 0)
        sup[empty, rng.integers(S, size=empty.size)] = 1
        full = np.flatnonzero(sup.sum(1) == S)
        sup[full, rng.integers(S, size=full.size)] = 0
        return sup.reshape(S, A, S).astype(float)

    def sample(self, rng: np.random.Generator) -> HeterogeneousMDP:
        S, A = self.n_states, self.n_actions
        sup = self.support(rng)
        center = rng.uniform(size=(S, A, S)) * sup
        center /= center.sum(-1, keepdims=True)
        K = _n_noise(self.n_train, self.n_test, self.center_in_training)
        noise = rng.uniform(size=(K, S, A, S)) * (1.0 - sup)
        noise /= noise.sum(-1, keepdims=True)
        reward = rng.uniform(0.0, self.reward_scale, size=(S, A))
        return HeterogeneousMDP(
            reward=reward,
            center=center,
            noise=noise,
            gamma=self.gamma,
            d0=np.full(S, 1.0 / S),
            n_train=self.n_train,
            n_test=self.n_test,
            center_in_training=self.center_in_training,
            value_offset=self.value_offset,
            name=self.name,
        )


# Actions of the cliff walk, in the reference code's order.
UP, DOWN, LEFT, RIGHT = 0, 1, 2, 3
CLIFF_REWARD, GOAL_REWARD, STEP_REWARD = -100.0, 100.0, -1.0


def _grid_move(state: int, action: int, width: int, height: int) -> int:
    # States are numbered row by row from the bottom-left corner (y = 0 holds start, cliff, goal).
    y, x = divmod(state, width)
    if action == UP:
        y = min(y + 1, height - 1)
    elif action == DOWN:
        y = max(y - 1, 0)
    elif action == LEFT:
        x = max(x - 1, 0)
    else:
        x = min(x + 1, width - 1)
    return y * width + x


@lru_cache(maxsize=8)
def _windy_parts(width: int, height: int) -> tuple[np.ndarray, np.ndarray]:
    """P_theta = base + theta * slope for the windy cliff walk (cached, read-only)."""
    S = width * height
    base = np.zeros((S, 4, S))
    slope = np.zeros((S, 4, S))
    for s in range(S):
        for a in range(4):
            if 1 <= s <= width - 1:  # cliff cells and the goal return to the start
                base[s, a, 0] = 1.0
                continue
            intended = _grid_move(s, a, width, height)
            base[s, a, intended] += 1.0
            if a != DOWN:
                blown = _grid_move(s, DOWN, width, height)
                slope[s, a, intended] -= 1.0 / 3.0
                slope[s, a, blown] += 1.0 / 3.0
    base.flags.writeable = False
    slope.flags.writeable = False
    return base, slope


def windy_cliff_kernel(theta, width: int = 4, height: int = 4) -> np.ndarray:
    """Windy cliff kernel(s) for wind intensity theta in [0, 1]; shape theta.shape + (S, 4, S)."""
    if width < 3 or height < 2:
        raise ValueError(f"a windy cliff needs width >= 3 and height >= 2, got {width} x {height}")
    theta = np.asarray(theta, dtype=float)
    if np.any(theta < 0) or np.any(theta > 1):
        raise ValueError(f"theta must lie in [0, 1], got {theta}")
    base, slope = _windy_parts(width, height)
    return base + theta[..., None, None, None] * slope


def windy_cliff_reward(width: int = 4, height: int = 4) -> np.ndarray:
    """(S, 4) reward: it depends on the current state only."""
    r = np.full(width * height, STEP_REWARD)
    r[1 : width - 1] = CLIFF_REWARD
    r[width - 1] = GOAL_REWARD
    return np.repeat(r[:, None], 4, axis=1)


@dataclass(frozen=True)
class WindyCliffs:
    """WindyCliffs family (paper: 4 x 4 map, gamma = 0.95, centre theta 0.5, noise theta ~ U(0, 1))."""

    width: int = 4
    height: int = 4
    gamma: float = 0.95
    n_train: int = 5
    n_test: int = 20
    center_theta: float = 0.5
    center_in_training: bool = True
    name: str = field(default="WindyCliffs")

    def __post_init__(self):
        _check_gamma(self.gamma)
        _check_counts(self.n_train, self.n_test)
        if self.width < 3 or self.height < 2:
            raise ValueError(f"a windy cliff needs width >= 3 and height >= 2, got {self.width} x {self.height}")
        if not 0.0 <= self.center_theta <= 1.0:
            raise ValueError(f"center_theta must lie in [0, 1], got {self.center_theta}")

    @property
    def n_states(self) -> int:
        return self.width * self.height

    def d0(self) -> np.ndarray:
        d0 = np.zeros(self.n_states)
        d0[0] = 1.0  # every episode starts at the bottom-left corner
        return d0

    def sample(self, rng: np.random.Generator) -> HeterogeneousMDP:
        K = _n_noise(self.n_train, self.n_test, self.center_in_training)
        thetas = rng.uniform(size=K)
        return HeterogeneousMDP(
            reward=windy_cliff_reward(self.width, self.height),
            center=windy_cliff_kernel(self.center_theta, self.width, self.height),
            noise=windy_cliff_kernel(thetas, self.width, self.height),
            gamma=self.gamma,
            d0=self.d0(),
            n_train=self.n_train,
            n_test=self.n_test,
            center_in_training=self.center_in_training,
            value_offset=0.0,
            name=self.name,
        )

    def sample_uniform(self, rng: np.random.Generator) -> FedTask:
        """Figure 2's setting: every training agent has theta ~ U(0, 1); test thetas evenly cover [0, 1]."""
        train = windy_cliff_kernel(rng.uniform(size=self.n_train), self.width, self.height)
        test = windy_cliff_kernel(np.linspace(0.0, 1.0, self.n_test), self.width, self.height)
        return FedTask(
            reward=windy_cliff_reward(self.width, self.height),
            train=train,
            test=test,
            center=windy_cliff_kernel(self.center_theta, self.width, self.height),
            gamma=self.gamma,
            d0=self.d0(),
            value_offset=0.0,
            name=self.name + "-uniform",
        )
