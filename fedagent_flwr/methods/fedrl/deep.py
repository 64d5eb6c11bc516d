"""Deep QAvg / PAvg as Flower ClientApp + ServerApp pieces: DQNAvg (strategy 'qavg') on CartPoles /
Acrobots, DDPGAvg (strategy 'pavg') on Pendulums / Hoppers / HalfCheetahs; Per* with a private embedding.

Client k gets environment parameter ``params[k]`` (pole half-length, link-1 mass,
(pole length, mass), leg size or thigh lengths) drawn from the run's seed, and runs
fedrl's DQN or DDPG learner: E episodes per round from the global network(s), then it
returns their weights. Its replay buffer, optimizer moments, exploration state, random
streams and (personalised) environment embedding persist across rounds in
``context.state`` and never travel: a reply carries only the shared layers. The server
scores the averaged network with greedy (noise-free) episodes on the K training
environments and on held-out ones; with personalisation the server has no client's
embedding, so it scores with the embedding's initial value (zeros), which is what a new
environment starts from before any adaptation.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch
from flwr.app import (
    Array,
    ArrayRecord,
    ConfigRecord,
    Context,
    Message,
    MetricRecord,
    RecordDict,
)

from fedagent_flwr.config import RunConfig
from fedrl.ddpg import (
    CONTINUOUS_ENVS,
    DDPGConfig,
    DDPGLearner,
    DDPGNets,
    make_continuous_env,
    sample_continuous_params,
)
from fedrl.deep import (
    EMBEDDING,
    ENV_NAMES,
    DQNConfig,
    DQNLearner,
    QNet,
    make_env,
    sample_env_params,
)

DQN_ENVS = ENV_NAMES  # discrete actions: strategy 'qavg' (DQNAvg)
DDPG_ENVS = CONTINUOUS_ENVS  # continuous actions: strategy 'pavg' (DDPGAvg)
DEEP_ENVS = DQN_ENVS + DDPG_ENVS
STATE = "fedrl-learner"  # context.state keys of the client's learner
STATE_META = "fedrl-learner-meta"


@dataclass(frozen=True)
class DeepProblem:
    env: str
    train_params: tuple
    test_params: tuple
    config: DQNConfig | DDPGConfig
    seed: int
    E: int | None
    eval_episodes: int
    max_steps: int = 0  # episode cap; 0 = the environment's own
    step_size = None  # the strategy sends no step sizes: the learner's optimizers are the client's own

    @property
    def ddpg(self) -> bool:
        return self.env in DDPG_ENVS

    @property
    def name(self) -> str:
        return ("Per" if self.personalised else "") + ("DDPGAvg" if self.ddpg else "DQNAvg")

    def make_env(self, param):
        if self.ddpg:
            return make_continuous_env(self.env, param, self.max_steps or None)
        return make_env(self.env, param, **({"max_episode_steps": self.max_steps} if self.max_steps else {}))

    def learner(self, k: int | None) -> DQNLearner | DDPGLearner:
        """Client k's learner (k=None: the server's scorer); the network initialisation depends on the seed only."""
        param = self.train_params[k if k is not None else 0]
        torch.set_num_threads(1)
        seed = self.seed * 7919 + (1000 * k if k is not None else 999)
        ln = (DDPGLearner if self.ddpg else DQNLearner)(self.make_env(param), self.config, seed=seed)
        torch.manual_seed(self.seed)  # the common initial network, on every node
        c = self.config
        if self.ddpg:
            obs, act = ln.env.observation_space.shape[0], ln.env.action_space.shape[0]
            init = DDPGNets(obs, act, ln.max_action, c.actor_hidden, c.critic_hidden, c.embed_dim)
        else:
            init = QNet(ln.net.net[0].in_features - c.embed_dim, ln.n_actions, c.hidden, c.embed_dim)
        ln.net.load_state_dict(init.state_dict())
        ln.target.load_state_dict(init.state_dict())
        return ln

    def shared_keys(self, ln) -> list[str]:
        return [k for k in ln.net.state_dict() if k != EMBEDDING]

    def initial_arrays(self) -> ArrayRecord:
        ln = self.learner(None)
        return ArrayRecord({k: Array(w) for k, w in zip(self.shared_keys(ln), ln.get_weights(shared_only=self.personalised))})

    @property
    def personalised(self) -> bool:
        return self.config.embed_dim > 0

    def fingerprint(self) -> str:
        h = hashlib.sha256(repr((self.env, self.train_params, self.test_params, self.config, self.seed, self.E,
                                 self.max_steps)).encode())
        for a in self.initial_arrays().values():
            h.update(a.numpy().tobytes())
        return h.hexdigest()

    def values(self, arrays: ArrayRecord) -> dict[str, float]:
        """Mean greedy return of the global network on the training and the held-out environments."""
        scorer = self.learner(None)
        weights = [arrays[k].numpy() for k in self.shared_keys(scorer)]
        scorer.set_weights(weights, shared_only=self.personalised)  # the embedding keeps its initial zeros
        out = {"train_value": float(np.mean([scorer.evaluate(self.make_env(p), self.eval_episodes) for p in self.train_params]))}
        if self.test_params:
            out["test_value"] = float(np.mean([scorer.evaluate(self.make_env(p), self.eval_episodes) for p in self.test_params]))
        return out


def build_deep_problem(cfg: RunConfig, num_clients: int) -> DeepProblem:
    if cfg.env not in DEEP_ENVS:
        raise ValueError(f"env={cfg.env!r} is not a deep QAvg / PAvg env; expected one of {', '.join(DEEP_ENVS)}")
    if num_clients < 1:
        raise ValueError(f"a deep QAvg / PAvg federation needs at least one client, got {num_clients}")
    rng, n = np.random.default_rng([cfg.seed, 17]), num_clients + cfg.fedrl.test_envs
    if cfg.env in DDPG_ENVS:
        params = [tuple(float(x) for x in row) for row in sample_continuous_params(cfg.env, rng, n)]
        config = DDPGConfig(embed_dim=cfg.fedrl.env_embedding_dim)
    else:
        params = [float(x) for x in sample_env_params(cfg.env, rng, n)]
        config = DQNConfig(embed_dim=cfg.fedrl.env_embedding_dim)
    return DeepProblem(cfg.env, tuple(params[:num_clients]), tuple(params[num_clients:]), config, cfg.seed,
                       cfg.fedrl.local_updates or None, cfg.eval.samples_per_task, cfg.rollout.max_steps)


@lru_cache(maxsize=4)
def _problem(cfg: RunConfig, num_clients: int) -> DeepProblem:
    return build_deep_problem(cfg, num_clients)


# ----- the learner's state in context.state ---------------------------------------------------------------


def _optimizers(ln) -> dict[str, torch.optim.Optimizer]:
    return {"actor": ln.actor_opt, "critic": ln.critic_opt} if isinstance(ln, DDPGLearner) else {"q": ln.opt}


REPLAY = ("obs", "action", "reward", "next_obs", "terminal")


def _replay(ln) -> list[np.ndarray]:
    """The stored transitions, one array per field, in storage order (DDPG: its ring arrays up to their fill)."""
    if isinstance(ln, DDPGLearner):
        return [x[: ln.size] for x in (ln._obs, ln._act, ln._rew, ln._obs2, ln._term)]
    return [np.asarray([np.asarray(b[i], dtype=np.float64) for b in ln.buffer]) for i in range(len(REPLAY))]


def _restore_replay(ln, cols: list[np.ndarray], next_slot: int) -> None:
    # the same slots as before: minibatches are drawn by slot index, so order matters for an exact resume
    if isinstance(ln, DDPGLearner):
        n = len(cols[0])
        for dst, src in zip((ln._obs, ln._act, ln._rew, ln._obs2, ln._term), cols):
            dst[:n] = src
        ln.size, ln._next = n, next_slot
        return
    ln.buffer.clear()
    for obs, a, r, obs2, done in zip(*cols):
        ln.buffer.append((obs.astype(np.float32), int(a), float(r), obs2.astype(np.float32), float(done)))


def save_learner(ln: DQNLearner | DDPGLearner, state: RecordDict) -> None:
    """Everything a DQN or DDPG learner needs to go on next round exactly as if it had never stopped."""
    arrays = {f"net/{k}": v.numpy().copy() for k, v in ln.net.state_dict().items()}
    arrays |= {f"target/{k}": v.numpy().copy() for k, v in ln.target.state_dict().items()}
    for opt_name, opt in _optimizers(ln).items():
        for idx, moments in opt.state_dict()["state"].items():
            for name, t in moments.items():
                arrays[f"opt/{opt_name}/{idx}/{name}"] = np.atleast_1d(t.numpy()).copy()
    cols = _replay(ln)
    if len(cols[0]):
        arrays |= {f"buffer/{name}": col for name, col in zip(REPLAY, cols)}
    state[STATE] = ArrayRecord({k: Array(np.ascontiguousarray(v)) for k, v in arrays.items()})
    state[STATE_META] = ConfigRecord({
        "epsilon": float(getattr(ln, "epsilon", 0.0)), "updates": int(ln.updates), "steps": int(getattr(ln, "steps", 0)),
        "buffer": len(cols[0]), "next-slot": int(getattr(ln, "_next", 0)), "rng": json.dumps(ln.rng.bit_generator.state), "eval-rng": json.dumps(ln.eval_rng.bit_generator.state),
    })


def load_learner(ln: DQNLearner | DDPGLearner, state: RecordDict) -> None:
    arrays, meta = state.array_records[STATE], state.config_records[STATE_META]
    ln.net.load_state_dict({k: torch.as_tensor(arrays[f"net/{k}"].numpy()) for k in ln.net.state_dict()})
    ln.target.load_state_dict({k: torch.as_tensor(arrays[f"target/{k}"].numpy()) for k in ln.target.state_dict()})
    for opt_name, opt in _optimizers(ln).items():
        moments: dict[int, dict[str, torch.Tensor]] = {}
        prefix = f"opt/{opt_name}/"
        for key in arrays.keys():
            if key.startswith(prefix):
                idx, name = key[len(prefix):].split("/")
                value = torch.as_tensor(arrays[key].numpy())
                moments.setdefault(int(idx), {})[name] = value.reshape(()) if name == "step" else value
        opt.load_state_dict({"state": moments, "param_groups": opt.state_dict()["param_groups"]})
    if int(meta["buffer"]):
        _restore_replay(ln, [arrays[f"buffer/{n}"].numpy() for n in REPLAY], int(meta["next-slot"]))
    ln.updates = int(meta["updates"])
    if isinstance(ln, DDPGLearner):
        ln.steps = int(meta["steps"])
    else:
        ln.epsilon = float(meta["epsilon"])
    ln.rng.bit_generator.state = json.loads(str(meta["rng"]))
    ln.eval_rng.bit_generator.state = json.loads(str(meta["eval-rng"]))


# ----- ClientApp ------------------------------------------------------------------------------------------


def client_fingerprint(cfg: RunConfig, partition_id: int, num_partitions: int) -> str:
    if not 0 <= partition_id < num_partitions:
        raise ValueError(f"partition-id {partition_id} is outside 0..{num_partitions - 1}")
    return _problem(cfg, num_partitions).fingerprint()


def train(msg: Message, context: Context, cfg: RunConfig, partition_id: int, num_partitions: int) -> Message:
    """E episodes of DQN / DDPG from the global network(s) (E = inf: from this client's own after round 1)."""
    config = msg.content.config_records["config"]
    problem = _problem(cfg, num_partitions)
    if config.get("fingerprint") != problem.fingerprint():
        raise ValueError(f"this node built a different {problem.name} problem than the server (fingerprint mismatch)")
    ln = problem.learner(partition_id)
    keys = problem.shared_keys(ln)
    resumed = STATE in context.state.array_records
    if resumed:
        load_learner(ln, context.state)
    independent = bool(config["independent"])
    if not independent or not resumed:
        incoming = msg.content.array_records.get("arrays")
        if incoming is None or set(incoming.keys()) != set(keys):
            raise ValueError(f"the server's message must carry exactly the shared layers {keys}")
        ln.set_weights([incoming[k].numpy() for k in keys], shared_only=problem.personalised)
    returns = ln.train_episodes(int(config["local-steps"]))
    save_learner(ln, context.state)
    out = ArrayRecord({k: Array(w) for k, w in zip(keys, ln.get_weights(shared_only=problem.personalised))})
    metrics = {"train-return": float(np.mean(returns)), "episodes": float(len(returns))}
    if isinstance(ln, DQNLearner):
        metrics["epsilon"] = float(ln.epsilon)
    metrics = MetricRecord(metrics)
    return Message(RecordDict({"arrays": out, "metrics": metrics}), reply_to=msg)
