"""DDPGAvg on Pendulums with varied pole length / mass (Jin et al., Section 7, at CPU scale), plain torch.

The paper's continuous-control tasks are MuJoCo Hoppers / HalfCheetahs with varied
leg lengths; those are far beyond a CPU budget, so the same structure runs here on
gymnasium's Pendulum-v1 (swing up and hold a pole with a torque in [-2, 2]) with
the pole length ``l`` and/or mass ``m`` changed per client. Pendulum reads ``l``
and ``m`` in every ``step`` (nothing is cached in the constructor), so setting them
on the unwrapped instance is enough: theta'' = 3 g / (2 l) sin(theta) + 3 u / (m l^2).

Learner: DDPG (Lillicrap et al.): a deterministic tanh actor, a Q critic, target
copies of both with soft (Polyak) updates, a replay buffer, Gaussian exploration
noise and uniformly random actions for the first ``warmup_steps`` steps. DDPGAvg:
every round each client trains E episodes from the global weights, then the shared
actor and critic parameters are averaged with ``fedrl.tabular.average``. With
``embed_dim > 0`` each client also holds a private environment embedding,
concatenated to the observation of both actor and critic and never averaged
(PerDDPGAvg); ``adapt_embedding`` fits only that vector in a new environment.

Weights travel as lists of numpy arrays (``fedrl.deep.module_weights``), so a
Flower client could send them as is.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from fedrl.deep import averaging_schedule, greedy_return, load_module_weights, module_weights, run_averaging

__all__ = [
    "CONTINUOUS_ENVS",
    "DDPGConfig",
    "DDPGLearner",
    "DDPGNets",
    "make_continuous_env",
    "make_pendulum",
    "run_ddpgavg",
    "sample_continuous_params",
    "sample_pendulum_params",
    "soft_update",
]


def make_pendulum(length: float = 1.0, mass: float = 1.0, max_episode_steps: int = 200) -> gym.Env:
    """Pendulum-v1 with the given pole length and mass (gymnasium defaults: 1.0 and 1.0)."""
    if not (length > 0 and mass > 0):
        raise ValueError(f"length and mass must be > 0, got {length}, {mass}")
    env = gym.make("Pendulum-v1", max_episode_steps=max_episode_steps)
    env.unwrapped.l = float(length)
    env.unwrapped.m = float(mass)
    return env


def sample_pendulum_params(rng: np.random.Generator, n: int, length_range=(0.5, 1.5), mass_range=(1.0, 1.0)) -> np.ndarray:
    """n (length, mass) pairs, each uniform on its range (default: length U(0.5, 1.5), mass 1)."""
    lengths = rng.uniform(*length_range, size=n)
    masses = rng.uniform(*mass_range, size=n)
    return np.stack([lengths, masses], axis=1)


CONTINUOUS_ENVS = ("pendulum", "hopper", "half-cheetah")


def make_continuous_env(name: str, param, max_episode_steps: int | None = None) -> gym.Env:
    """One client's environment; ``param``: (length, mass) for pendulum, (leg size,) for hopper,
    (back thigh, front thigh) for half-cheetah (fedrl.mujoco_envs, needs the ``mujoco`` extra)."""
    kw = {"max_episode_steps": max_episode_steps} if max_episode_steps else {}
    if name == "pendulum":
        return make_pendulum(*param, **kw)
    if name in ("hopper", "half-cheetah"):
        from fedrl.mujoco_envs import make_half_cheetah, make_hopper

        return (make_hopper if name == "hopper" else make_half_cheetah)(*param, **kw)
    raise ValueError(f"unknown environment {name!r}; choose one of {CONTINUOUS_ENVS}")


def sample_continuous_params(name: str, rng: np.random.Generator, n: int, length_range=(0.5, 1.5),
                             mass_range=(1.0, 1.0)) -> np.ndarray:
    """n parameter rows for ``make_continuous_env``: pendulum (length, mass) from the given ranges, the MuJoCo
    families from the paper's ranges (the two range arguments apply to pendulum only)."""
    if name == "pendulum":
        return sample_pendulum_params(rng, n, length_range, mass_range)
    if name in ("hopper", "half-cheetah"):
        from fedrl.mujoco_envs import sample_half_cheetah_params, sample_hopper_params

        return sample_hopper_params(rng, n)[:, None] if name == "hopper" else sample_half_cheetah_params(rng, n)
    raise ValueError(f"unknown environment {name!r}; choose one of {CONTINUOUS_ENVS}")


def _mlp(sizes, out_act=None) -> nn.Sequential:
    layers = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        layers.append(nn.Linear(a, b))
        if i < len(sizes) - 2:
            layers.append(nn.ReLU())
    if out_act is not None:
        layers.append(out_act)
    return nn.Sequential(*layers)


class DDPGNets(nn.Module):
    """Actor and critic in one module, so one state_dict (embedding first) carries a client's whole model."""

    def __init__(self, obs_size: int, act_size: int, max_action: float, actor_hidden=(64, 64), critic_hidden=(64, 64),
                 embed_dim: int = 0):
        super().__init__()
        self.embed_dim, self.max_action = embed_dim, max_action
        if embed_dim > 0:
            self.embedding = nn.Parameter(torch.zeros(embed_dim))
        self.actor = _mlp([obs_size + embed_dim, *actor_hidden, act_size], nn.Tanh())
        self.critic = _mlp([obs_size + embed_dim + act_size, *critic_hidden, 1])

    def _with_embedding(self, obs: torch.Tensor, detach: bool) -> torch.Tensor:
        if self.embed_dim == 0:
            return obs
        e = self.embedding.detach() if detach else self.embedding
        return torch.cat([obs, e.expand(obs.shape[0], -1)], dim=1)

    def pi(self, obs: torch.Tensor) -> torch.Tensor:
        # the actor reads the embedding but does not train it: maximising Q over the embedding
        # would move it towards whatever code the critic overrates, not towards the environment
        return self.max_action * self.actor(self._with_embedding(obs, detach=True))

    def q(self, obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        return self.critic(torch.cat([self._with_embedding(obs, detach=False), action], dim=1))[:, 0]


def soft_update(target: nn.Module, source: nn.Module, tau: float) -> None:
    """target <- (1 - tau) target + tau source, parameter by parameter."""
    with torch.no_grad():
        for t, s in zip(target.parameters(), source.parameters()):
            t.mul_(1.0 - tau).add_(s, alpha=tau)


@dataclass(frozen=True)
class DDPGConfig:
    actor_hidden: tuple = (64, 64)
    critic_hidden: tuple = (64, 64)
    actor_lr: float = 1e-3
    critic_lr: float = 1e-3
    tau: float = 0.01  # Polyak step of the target networks per update
    gamma: float = 0.99
    replay_size: int = 50_000
    batch_size: int = 64
    noise: float = 0.1  # std of the Gaussian exploration noise, as a fraction of the largest action
    warmup_steps: int = 1000  # uniformly random actions before the actor acts
    embed_dim: int = 0
    embed_lr: float = 0.0  # Adam step size of the private embedding; 0 = critic_lr

    def __post_init__(self):
        if not 0 < self.tau <= 1:
            raise ValueError(f"tau must be in (0, 1], got {self.tau}")
        if self.noise < 0 or self.warmup_steps < 0 or self.embed_lr < 0:
            raise ValueError("noise, warmup_steps and embed_lr must be >= 0")
        if self.batch_size < 1 or self.replay_size < self.batch_size:
            raise ValueError("need 1 <= batch_size <= replay_size")


class DDPGLearner:
    """One client's DDPG: its environment, replay buffer, online and target actor-critic."""

    def __init__(self, env: gym.Env, config: DDPGConfig = DDPGConfig(), seed: int = 0):
        self.env, self.config = env, config
        # separate streams, so how often a learner is scored does not change how it trains
        self.rng, self.eval_rng = (np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(2))
        torch.manual_seed(seed)
        obs_size, act_size = env.observation_space.shape[0], env.action_space.shape[0]
        self.max_action = float(env.action_space.high[0])
        self.net = DDPGNets(obs_size, act_size, self.max_action, config.actor_hidden, config.critic_hidden, config.embed_dim)
        self.target = copy.deepcopy(self.net)
        self.actor_opt = torch.optim.Adam(self.net.actor.parameters(), lr=config.actor_lr)
        critic_groups = [{"params": self.net.critic.parameters()}]
        if config.embed_dim > 0:
            critic_groups.append({"params": [self.net.embedding], "lr": config.embed_lr or config.critic_lr})
        self.critic_opt = torch.optim.Adam(critic_groups, lr=config.critic_lr)
        # preallocated arrays: sampling a batch from a deque of tuples costs more than the update itself
        n = config.replay_size
        self._obs = np.zeros((n, obs_size), np.float32)
        self._act = np.zeros((n, act_size), np.float32)
        self._rew = np.zeros(n, np.float32)
        self._obs2 = np.zeros((n, obs_size), np.float32)
        self._term = np.zeros(n, np.float32)
        self.size = self._next = 0
        self.steps = self.updates = 0

    def get_weights(self, shared_only: bool = False) -> list[np.ndarray]:
        return module_weights(self.net, shared_only)

    def set_weights(self, weights: list[np.ndarray], shared_only: bool = False) -> None:
        """Load weights; the targets restart from them, as a client does after receiving a global model."""
        load_module_weights(self.net, weights, shared_only)
        self.target.load_state_dict(self.net.state_dict())

    @torch.no_grad()
    def act(self, obs: np.ndarray, greedy: bool = False) -> np.ndarray:
        c = self.config
        if not greedy and self.steps < c.warmup_steps:
            return self.rng.uniform(-self.max_action, self.max_action, size=self._act.shape[1]).astype(np.float32)
        a = self.net.pi(torch.as_tensor(obs, dtype=torch.float32)[None])[0].numpy()
        if not greedy:
            a = a + c.noise * self.max_action * self.rng.standard_normal(a.shape)
        return np.clip(a, -self.max_action, self.max_action).astype(np.float32)

    def _store(self, obs, a, r, obs2, terminated) -> None:
        i = self._next
        self._obs[i], self._act[i], self._rew[i], self._obs2[i], self._term[i] = obs, a, r, obs2, terminated
        self._next = (i + 1) % self.config.replay_size
        self.size = min(self.size + 1, self.config.replay_size)

    def _update(self, embedding_only: bool = False) -> None:
        c = self.config
        idx = self.rng.integers(self.size, size=c.batch_size)
        s, a, r, s2, term = (torch.as_tensor(x[idx]) for x in (self._obs, self._act, self._rew, self._obs2, self._term))
        with torch.no_grad():
            y = r + c.gamma * (1.0 - term) * self.target.q(s2, self.target.pi(s2))
        critic_loss = nn.functional.mse_loss(self.net.q(s, a), y)
        self.critic_opt.zero_grad()
        critic_loss.backward()
        if embedding_only:  # Adam skips parameters without a gradient
            for p in self.net.critic.parameters():
                p.grad = None
        self.critic_opt.step()
        if not embedding_only:
            actor_loss = -self.net.q(s, self.net.pi(s)).mean()
            self.actor_opt.zero_grad()
            actor_loss.backward()  # also fills the critic's grads; its optimizer zeroes them before its next step
            self.actor_opt.step()
        soft_update(self.target, self.net, c.tau)
        self.updates += 1

    def train_episodes(self, n: int, embedding_only: bool = False) -> list[float]:
        """Run n exploring episodes, one update per step once the buffer holds a batch and warm-up is over."""
        returns = []
        for _ in range(n):
            obs, _ = self.env.reset(seed=int(self.rng.integers(2**31)))
            total, done = 0.0, False
            while not done:
                a = self.act(obs)
                obs2, r, terminated, truncated, _ = self.env.step(a)
                # bootstrapping stops only at a real terminal state, not at the time limit
                self._store(obs, a, r, obs2, float(terminated))
                self.steps += 1
                total += float(r)
                obs, done = obs2, terminated or truncated
                if self.steps >= self.config.warmup_steps and self.size >= self.config.batch_size:
                    self._update(embedding_only)
            returns.append(total)
        return returns

    def evaluate(self, env: gym.Env | None = None, episodes: int = 5) -> float:
        """Mean undiscounted return of the noise-free actor."""
        return greedy_return(env or self.env, self.act, self.eval_rng, episodes)

    def adapt_embedding(self, episodes: int) -> list[float]:
        """Few-shot adaptation to a new environment: train only the private embedding (through the critic's TD loss)."""
        if self.config.embed_dim == 0:
            raise ValueError("adapt_embedding needs networks built with embed_dim > 0")
        return self.train_episodes(episodes, embedding_only=True)


def _as_pairs(env_params) -> list[tuple[float, float]]:
    """Accept lengths (mass 1) or (length, mass) pairs."""
    out = []
    for p in env_params:
        p = np.atleast_1d(np.asarray(p, dtype=float))
        out.append((float(p[0]), float(p[1]) if p.size > 1 else 1.0))
    return out


def run_ddpgavg(
    env_params,
    E: int | None,
    total_episodes: int,
    config: DDPGConfig = DDPGConfig(),
    eval_params=None,
    eval_episodes: int = 3,
    eval_every: int | None = None,
    seed: int = 0,
) -> dict:
    """DDPGAvg: each client trains E episodes from the global weights, then the shared actor and critic are averaged.

    ``env_params``: one pole length or (length, mass) pair per client. Runs
    total_episodes // E rounds (E=None: the clients never communicate). Every
    ``eval_every`` episodes (default: every round, or total/8 for E=None) it
    records the mean greedy return of the averaged model on the clients'
    environments ("train") and on ``eval_params`` environments ("test"), and of
    each client's own model on its own environment ("local").
    """
    pairs = _as_pairs(env_params)
    if not pairs:
        raise ValueError("run_ddpgavg needs at least one client environment")
    block = averaging_schedule(E, total_episodes, eval_every)
    learners = [DDPGLearner(make_pendulum(*p), config, seed=seed + 1000 * k) for k, p in enumerate(pairs)]
    scorer = DDPGLearner(make_pendulum(*pairs[0]), config, seed=seed + 999_999)
    eval_envs = [make_pendulum(*p) for p in _as_pairs(eval_params if eval_params is not None else [])]
    return run_averaging(learners, scorer, eval_envs, E, total_episodes, block, eval_episodes)
