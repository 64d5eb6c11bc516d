"""DQNAvg on CartPoles / Acrobots with varied dynamics (Jin et al., Sections 6 and 7.4), plain torch.

Environments: gymnasium's CartPole-v1 with the pole's half-length drawn as
0.1 + 0.8 U(0, 1) (pole length in [0.2, 1.8], the paper's range) and Acrobot-v1
with link 1's mass 0.5 + U(0, 1) (the paper) or its length (``parameter="length_1"``).
CartPole caches ``polemass_length`` in its constructor, so it is recomputed
here; Acrobot's dynamics read LINK_LENGTH_1, LINK_COM_POS_1 and LINK_MASS_1,
set on the unwrapped instance before reset. ``cartpole-polarity`` adds CartPoles
whose push is reversed (a family no single policy can serve, for the
personalisation experiments).

Learner: DQN with a target network and epsilon-greedy exploration (the
reference code's defaults: one hidden layer of 128, Adam 1e-3, batch 16,
replay 1000, target sync every 10 steps, gamma 0.9, epsilon 1 decaying x0.99
per update; ``loss="huber"``, ``grad_clip`` and a separate embedding step size
``embed_lr`` are options, off by default). DQNAvg: every round each client trains E episodes from the global
weights, then the shared weights are averaged with ``fedrl.tabular.average``.
With ``embed_dim > 0`` each client's network also gets a private environment
embedding, concatenated to the observation and never averaged (personalised
FedRL; zeros at the start, or N(0, ``embed_init``^2) as an embedding layer is
initialised); ``adapt_embedding`` fits only that vector in a new environment by the TD
loss, ``EmbeddingSearch`` by episode returns.

Weights travel as lists of numpy arrays so a Flower client can send them as is.
"""

from __future__ import annotations

import copy
from collections import deque
from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from fedrl.tabular import average

__all__ = [
    "DQNConfig",
    "DQNLearner",
    "EmbeddingSearch",
    "QNet",
    "make_acrobot",
    "make_cartpole",
    "make_polarity_cartpole",
    "load_module_weights",
    "make_env",
    "module_weights",
    "averaging_schedule",
    "greedy_return",
    "run_averaging",
    "run_dqnavg",
    "sample_env_params",
]

EMBEDDING = "embedding"  # parameter name kept private in personalised DQNAvg


def make_cartpole(half_length: float, max_episode_steps: int = 200, reversed_push: bool = False) -> gym.Env:
    """CartPole-v1 whose pole has the given half-length (gymnasium default 0.5); with ``reversed_push``
    action 1 pushes the cart left instead of right (an actuator wired the other way round)."""
    if not half_length > 0:
        raise ValueError(f"half_length must be > 0, got {half_length}")
    env = gym.make("CartPole-v1", max_episode_steps=max_episode_steps)
    u = env.unwrapped
    u.length = float(half_length)
    u.polemass_length = u.masspole * u.length  # cached in __init__, must follow the length
    if reversed_push:
        u.force_mag = -u.force_mag  # read in every step: force = force_mag if action == 1 else -force_mag
    return env


def make_polarity_cartpole(signed_half_length: float, max_episode_steps: int = 200) -> gym.Env:
    """CartPole whose half-length is |value| and whose push is reversed where value < 0.

    A family in which no single policy is good everywhere (the same observation asks for
    opposite actions), so a private environment embedding has something to encode: on
    length-only CartPoles one policy balances every length in the paper's range.
    """
    return make_cartpole(abs(signed_half_length), max_episode_steps, reversed_push=signed_half_length < 0)


def make_acrobot(value: float, parameter: str = "mass_1", max_episode_steps: int = 500) -> gym.Env:
    """Acrobot-v1 with link 1's mass (paper) or length changed."""
    if not value > 0:
        raise ValueError(f"the acrobot parameter must be > 0, got {value}")
    env = gym.make("Acrobot-v1", max_episode_steps=max_episode_steps)
    u = env.unwrapped
    if parameter == "mass_1":
        u.LINK_MASS_1 = float(value)
    elif parameter == "length_1":
        u.LINK_LENGTH_1 = float(value)
        u.LINK_COM_POS_1 = 0.5 * float(value)  # centre of mass stays mid-link
    else:
        raise ValueError(f"parameter must be 'mass_1' or 'length_1', got {parameter!r}")
    return env


ENV_NAMES = ("cartpole", "acrobot", "cartpole-polarity")


def make_env(name: str, value: float, **kwargs) -> gym.Env:
    if name == "cartpole":
        return make_cartpole(value, **kwargs)
    if name == "acrobot":
        return make_acrobot(value, **kwargs)
    if name == "cartpole-polarity":
        return make_polarity_cartpole(value, **kwargs)
    raise ValueError(f"unknown environment {name!r}; choose one of {ENV_NAMES}")


def sample_env_params(name: str, rng: np.random.Generator, n: int) -> np.ndarray:
    """The paper's ranges: CartPole half-length 0.1 + 0.8 U(0, 1); Acrobot link-1 mass 0.5 + U(0, 1).

    cartpole-polarity: CartPole's half-lengths with the push reversed (negative value) in every
    second environment, so any run of consecutive environments holds both kinds.
    """
    u = rng.uniform(size=n)
    if name == "cartpole":
        return 0.1 + 0.8 * u
    if name == "acrobot":
        return 0.5 + u
    if name == "cartpole-polarity":
        return (0.1 + 0.8 * u) * np.where(np.arange(n) % 2 == 0, 1.0, -1.0)
    raise ValueError(f"unknown environment {name!r}; choose one of {ENV_NAMES}")


def module_weights(module: nn.Module, shared_only: bool = False) -> list[np.ndarray]:
    """A module's state_dict as numpy arrays, in order; ``shared_only`` leaves out the private embedding."""
    return [v.detach().cpu().numpy().copy() for k, v in module.state_dict().items() if not (shared_only and k == EMBEDDING)]


def load_module_weights(module: nn.Module, weights: list[np.ndarray], shared_only: bool = False) -> None:
    """Inverse of ``module_weights``, checking count and shapes; with ``shared_only`` the embedding is kept."""
    state = module.state_dict()
    keys = [k for k in state if not (shared_only and k == EMBEDDING)]
    if len(weights) != len(keys):
        raise ValueError(f"expected {len(keys)} weight arrays, got {len(weights)}")
    for k, w in zip(keys, weights):
        if tuple(state[k].shape) != tuple(np.shape(w)):
            raise ValueError(f"weight {k}: expected shape {tuple(state[k].shape)}, got {np.shape(w)}")
        state[k] = torch.as_tensor(np.asarray(w), dtype=state[k].dtype)
    module.load_state_dict(state)


def greedy_return(env: gym.Env, act, rng: np.random.Generator, episodes: int) -> float:
    """Mean undiscounted return of ``act(obs, greedy=True)`` over ``episodes`` resets seeded from ``rng``."""
    total = 0.0
    for _ in range(episodes):
        obs, _ = env.reset(seed=int(rng.integers(2**31)))
        done = False
        while not done:
            obs, r, terminated, truncated, _ = env.step(act(obs, greedy=True))
            total += float(r)
            done = terminated or truncated
    return total / episodes


class QNet(nn.Module):
    """One-hidden-layer Q network; optional private environment embedding joined to the observation."""

    def __init__(self, obs_size: int, n_actions: int, hidden: int = 128, embed_dim: int = 0, embed_init: float = 0.0):
        super().__init__()
        self.embed_dim = embed_dim
        if embed_dim > 0:
            # zeros: every client starts alike; embed_init > 0: N(0, embed_init^2), as an embedding
            # layer is initialised, so clients differ from the start and the shared layers can tell them apart
            self.embedding = nn.Parameter(torch.randn(embed_dim) * embed_init if embed_init > 0 else torch.zeros(embed_dim))
        self.net = nn.Sequential(nn.Linear(obs_size + embed_dim, hidden), nn.ReLU(), nn.Linear(hidden, n_actions))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        if self.embed_dim > 0:
            obs = torch.cat([obs, self.embedding.expand(obs.shape[0], -1)], dim=1)
        return self.net(obs)


@dataclass(frozen=True)
class DQNConfig:
    hidden: int = 128
    lr: float = 1e-3
    batch_size: int = 16
    replay_size: int = 1000
    target_sync: int = 10
    gamma: float = 0.9
    epsilon: float = 1.0
    epsilon_decay: float = 0.99
    epsilon_min: float = 0.02
    embed_dim: int = 0
    loss: str = "mse"  # "mse" (reference code) or "huber" (smooth L1)
    grad_clip: float = 0.0  # max gradient norm per update; 0 = no clipping
    embed_lr: float = 0.0  # Adam step size of the private embedding; 0 = lr
    embed_init: float = 0.0  # std of the private embedding's N(0, std^2) start; 0 = zeros

    def __post_init__(self):
        if self.loss not in ("mse", "huber"):
            raise ValueError(f"loss must be 'mse' or 'huber', got {self.loss!r}")
        if self.embed_lr < 0:
            raise ValueError(f"embed_lr must be >= 0, got {self.embed_lr}")
        if self.grad_clip < 0:
            raise ValueError(f"grad_clip must be >= 0, got {self.grad_clip}")
        if self.embed_init < 0:
            raise ValueError(f"embed_init must be >= 0, got {self.embed_init}")


class DQNLearner:
    """One client's DQN: its environment, replay buffer, online and target networks."""

    def __init__(self, env: gym.Env, config: DQNConfig = DQNConfig(), seed: int = 0):
        self.env, self.config = env, config
        # separate streams, so how often a learner is scored does not change how it trains
        self.rng, self.eval_rng = (np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(2))
        torch.manual_seed(seed)
        obs_size = env.observation_space.shape[0]
        self.n_actions = env.action_space.n
        self.net = QNet(obs_size, self.n_actions, config.hidden, config.embed_dim, config.embed_init)
        self.target = copy.deepcopy(self.net)
        if config.embed_dim > 0 and config.embed_lr > 0:
            rest = [p for name, p in self.net.named_parameters() if name != EMBEDDING]
            self.opt = torch.optim.Adam([{"params": [self.net.embedding], "lr": config.embed_lr}, {"params": rest}], lr=config.lr)
        else:
            self.opt = torch.optim.Adam(self.net.parameters(), lr=config.lr)
        self.buffer: deque = deque(maxlen=config.replay_size)
        self.epsilon = config.epsilon
        self.updates = 0

    # weights as numpy arrays, in state_dict order
    def get_weights(self, shared_only: bool = False) -> list[np.ndarray]:
        return module_weights(self.net, shared_only)

    def set_weights(self, weights: list[np.ndarray], shared_only: bool = False) -> None:
        load_module_weights(self.net, weights, shared_only)
        self.target.load_state_dict(self.net.state_dict())

    @torch.no_grad()
    def act(self, obs: np.ndarray, greedy: bool = False) -> int:
        if not greedy and self.rng.random() < self.epsilon:
            return int(self.rng.integers(self.n_actions))
        return int(self.net(torch.as_tensor(obs, dtype=torch.float32)[None]).argmax(1).item())

    def _update(self, params=None) -> None:
        c = self.config
        idx = self.rng.integers(len(self.buffer), size=c.batch_size)
        s, a, r, s2, done = (torch.as_tensor(np.array(x), dtype=torch.float32) for x in zip(*(self.buffer[i] for i in idx)))
        with torch.no_grad():
            target = r + c.gamma * (1.0 - done) * self.target(s2).max(1).values
        q = self.net(s).gather(1, a.long()[:, None])[:, 0]
        loss = nn.functional.mse_loss(q, target) if c.loss == "mse" else nn.functional.smooth_l1_loss(q, target)
        self.opt.zero_grad()
        loss.backward()
        if params is not None:  # adapt only these parameters
            keep = {id(p) for p in params}
            for p in self.net.parameters():
                if id(p) not in keep:
                    p.grad = None
        if c.grad_clip > 0:
            nn.utils.clip_grad_norm_([p for p in self.net.parameters() if p.grad is not None], c.grad_clip)
        self.opt.step()
        self.updates += 1
        self.epsilon = max(c.epsilon_min, self.epsilon * c.epsilon_decay)
        if self.updates % c.target_sync == 0:
            self.target.load_state_dict(self.net.state_dict())

    def train_episodes(self, n: int, params=None) -> list[float]:
        """Run n exploring episodes, learning after every step once the buffer holds two batches."""
        returns = []
        for _ in range(n):
            obs, _ = self.env.reset(seed=int(self.rng.integers(2**31)))
            total, done = 0.0, False
            while not done:
                a = self.act(obs)
                obs2, r, terminated, truncated, _ = self.env.step(a)
                # bootstrapping stops only at a real terminal state, not at the time limit
                self.buffer.append((obs, a, r, obs2, float(terminated)))
                total += r
                obs, done = obs2, terminated or truncated
                if len(self.buffer) >= 2 * self.config.batch_size:
                    self._update(params)
            returns.append(total)
        return returns

    def evaluate(self, env: gym.Env | None = None, episodes: int = 5) -> float:
        """Mean undiscounted return of the greedy policy."""
        return greedy_return(env or self.env, self.act, self.eval_rng, episodes)

    def adapt_embedding(self, episodes: int) -> list[float]:
        """Few-shot adaptation to a new environment: train only the private embedding."""
        if self.config.embed_dim == 0:
            raise ValueError("adapt_embedding needs a network built with embed_dim > 0")
        return self.train_episodes(episodes, params=[self.net.embedding])


class EmbeddingSearch:
    """E-Update driven by return: a cross-entropy search over a learner's private embedding only.

    ``adapt_embedding`` follows the TD loss, which need not lead to an embedding that plays well:
    on cartpole-polarity it took the mean embedding away from ones that play the reversed
    environments well (fedrl/README.md). The embedding has only ``embed_dim`` numbers, so a
    derivative-free search on episode returns is affordable: every ``step`` plays ``population``
    greedy episodes, one per embedding drawn from N(mu, diag(sigma^2)), moves mu to the mean of the
    ``elite`` best and sigma towards their spread (keeping ``std_smoothing`` of the old sigma,
    floored at ``min_std``: a spread estimated from a few elites collapses before the search
    arrives), and leaves mu in the network. ``std`` is the starting sigma, one number or one per
    dimension. One step is one update of the embedding. Works with
    any learner that has ``net.embedding``, ``env``, ``act`` and ``rng`` (DQNLearner, fedrl.ddpg.DDPGLearner).
    """

    def __init__(self, learner, population: int = 4, elite: int = 2, std: float = 1.0, min_std: float = 0.05,
                 std_smoothing: float = 0.7, seed: int = 0):
        if getattr(learner.config, "embed_dim", 0) == 0:
            raise ValueError("EmbeddingSearch needs a network built with embed_dim > 0")
        if not 1 <= elite < population:
            raise ValueError(f"need 1 <= elite < population, got elite={elite}, population={population}")
        if not (np.all(np.asarray(std) > 0) and min_std >= 0 and 0 <= std_smoothing < 1):
            raise ValueError(f"need std > 0, min_std >= 0 and 0 <= std_smoothing < 1, got {std}, {min_std}, {std_smoothing}")
        self.learner, self.population, self.elite, self.min_std = learner, population, elite, min_std
        self.std_smoothing = std_smoothing
        self.mean = learner.net.embedding.detach().numpy().astype(np.float64)
        self.std = np.full_like(self.mean, np.asarray(std, dtype=np.float64))
        self.rng = np.random.default_rng(seed)
        self.updates = 0

    def _set(self, e: np.ndarray) -> None:
        with torch.no_grad():
            self.learner.net.embedding.copy_(torch.as_tensor(e, dtype=torch.float32))

    def step(self) -> list[float]:
        """One search iteration; returns the greedy return of each candidate (``population`` episodes)."""
        ln = self.learner
        candidates = self.mean + self.std * self.rng.standard_normal((self.population, self.mean.size))
        returns = []
        for e in candidates:
            self._set(e)
            returns.append(greedy_return(ln.env, ln.act, ln.rng, 1))
        best = candidates[np.argsort(returns, kind="stable")[::-1][: self.elite]]
        self.mean = best.mean(axis=0)
        self.std = np.maximum(self.std_smoothing * self.std + (1 - self.std_smoothing) * best.std(axis=0), self.min_std)
        self._set(self.mean)
        self.updates += 1
        return returns


def run_dqnavg(
    env_name: str,
    env_params,
    E: int | None,
    total_episodes: int,
    config: DQNConfig = DQNConfig(),
    eval_params=None,
    eval_episodes: int = 3,
    eval_every: int | None = None,
    seed: int = 0,
) -> dict:
    """DQNAvg: each client trains E episodes from the global weights, then the shared weights are averaged.

    Runs total_episodes // E rounds (E=None: the clients never communicate).
    Every ``eval_every`` episodes (default: every round, or total/8 for E=None)
    it records the mean greedy return of the averaged model on the clients'
    environments ("train") and on ``eval_params`` environments ("test"), and of
    each client's own model on its own environment ("local").
    """
    env_params = list(env_params)
    if not env_params:
        raise ValueError("run_dqnavg needs at least one client environment")
    block = averaging_schedule(E, total_episodes, eval_every)
    learners = [DQNLearner(make_env(env_name, p), config, seed=seed + 1000 * k) for k, p in enumerate(env_params)]
    scorer = DQNLearner(make_env(env_name, env_params[0]), config, seed=seed + 999_999)
    eval_envs = [make_env(env_name, p) for p in (eval_params if eval_params is not None else [])]
    return run_averaging(learners, scorer, eval_envs, E, total_episodes, block, eval_episodes)


def averaging_schedule(E: int | None, total_episodes: int, eval_every: int | None) -> int:
    """Checks E and the budget; returns the episodes between evaluations (default: every round, or total/8 for E=None)."""
    torch.set_num_threads(1)  # small networks; threads only add overhead on a shared CPU
    if E is not None and (not isinstance(E, int) or isinstance(E, bool) or E < 1):
        raise ValueError(f"E must be a positive integer or None (never communicate), got {E!r}")
    if int(total_episodes) < (E or 1):
        raise ValueError(f"total_episodes must be >= E, got {total_episodes} with E={E}")
    block = eval_every or (E if E is not None else max(1, total_episodes // 8))
    if E is not None and block % E:
        raise ValueError(f"eval_every must be a multiple of E={E}, got {block}")
    return block


def run_averaging(learners: list, scorer, eval_envs: list, E: int | None, total_episodes: int, block: int,
                  eval_episodes: int) -> dict:
    """The loop DQNAvg and DDPGAvg share: each round every learner trains E episodes from the global shared
    weights, which are then averaged (E=None: never); every ``block`` episodes it records the mean greedy
    return of the averaged model on the clients' environments ("train") and on ``eval_envs`` ("test"), and
    of each client's own model on its own environment ("local"). Learners are DQNLearner or DDPGLearner."""
    shared = learners[0].config.embed_dim > 0
    start = learners[0].get_weights(shared_only=shared)
    for ln in learners:  # one common initialisation
        ln.set_weights(start, shared_only=shared)
    history = {"episodes": [], "train": [], "test": [], "local": []}
    global_w = None
    for done in range(block, total_episodes + 1, block):
        for _ in range(block // E if E is not None else 1):
            for ln in learners:
                ln.train_episodes(E if E is not None else block)
            global_w = [average(ws) for ws in zip(*(ln.get_weights(shared_only=shared) for ln in learners))]
            if E is not None:
                for ln in learners:
                    ln.set_weights(global_w, shared_only=shared)
        full_w = global_w
        if shared:  # the averaged model needs an embedding: the clients' mean (state_dict lists it first)
            full_w = [average([ln.net.embedding.detach().numpy() for ln in learners])] + global_w
        scorer.set_weights(full_w)
        history["episodes"].append(done)
        history["local"].append(float(np.mean([ln.evaluate(episodes=eval_episodes) for ln in learners])))
        history["train"].append(float(np.mean([scorer.evaluate(ln.env, eval_episodes) for ln in learners])))
        history["test"].append(float(np.mean([scorer.evaluate(env, eval_episodes) for env in eval_envs])) if eval_envs else float("nan"))
    return {"history": history, "global_weights": full_w, "learners": learners}
