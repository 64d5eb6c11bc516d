"""The tabular QAvg / PAvg problem a run config describes, built identically on the server and every client.

Nothing about the problem travels: the server and each ClientApp rebuild it from
the run config (seed, repetition, kappa, env) and the number of partitions K.
The draw is the one ``python -m fedagent_flwr.experiments.fedrl_table1`` / ``fedrl.engine.run_cells`` makes
for repetition ``fedrl.repetition`` (``SeedSequence([seed, repetition])``), so a
Flower run and the vectorised engine compute the same numbers on the same seed.
Client k trains on kernel ``task.train[k]`` (P_k^kappa; with the reference
layout, client 0 holds the centre P_0 itself); the server scores the averaged
policy on P_0, on the K training kernels and on ``fedrl.test-envs`` held-out ones.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from fedagent_flwr.config import RunConfig
from fedrl.engine import rep_rngs
from fedrl.mdps import TABULAR_ENVS, FedTask, RandomMDPs, WindyCliffs
from fedrl.presets import PRESETS
from fedrl.tabular import (
    Algorithm,
    HarmonicStepSize,
    StallDecayStepSize,
    evaluate,
    get_algorithm,
)


def family(cfg: RunConfig, num_clients: int) -> RandomMDPs | WindyCliffs:
    if num_clients < 1:
        raise ValueError(f"a QAvg / PAvg federation needs at least one client, got {num_clients}")
    if cfg.env == "random-mdp":
        return RandomMDPs(n_train=num_clients, n_test=cfg.fedrl.test_envs, reward_scale=cfg.fedrl.random_mdp_reward_scale,
                          center_in_training=cfg.fedrl.center_in_training)
    if cfg.env == "windy-cliffs":
        return WindyCliffs(n_train=num_clients, n_test=cfg.fedrl.test_envs, center_in_training=cfg.fedrl.center_in_training)
    raise ValueError(f"env={cfg.env!r} is not a tabular QAvg / PAvg env; expected one of {', '.join(TABULAR_ENVS)}")


def local_steps(cfg: RunConfig) -> int | None:
    """E, or None for E = inf (fedrl.local-updates = 0)."""
    return cfg.fedrl.local_updates or None


def step_rule(cfg: RunConfig, num_clients: int, algorithm: str) -> HarmonicStepSize | StallDecayStepSize:
    """The run's step-size rule: fedagent_flwr.experiments.fedrl_table1's "fast" preset for this env and algorithm, or a constant step."""
    if cfg.fedrl.step_size > 0:
        return StallDecayStepSize(cfg.fedrl.step_size, cfg.fedrl.step_decay)
    fam = family(cfg, num_clients)
    rule = PRESETS["fast"][(fam.name, algorithm)].step_size
    scale = cfg.fedrl.random_mdp_reward_scale if cfg.env == "random-mdp" else 1.0
    if isinstance(rule, StallDecayStepSize) and scale != 1.0:
        # policy gradients scale with the reward; table1 divides the step the same way
        rule = StallDecayStepSize(rule.lr / scale, rule.decay, rule.tol)
    return rule


@dataclass(frozen=True)
class TabularProblem:
    task: FedTask
    algorithm: Algorithm
    init_params: np.ndarray  # (S, A): the common initial table every client starts from
    E: int | None
    step_size: HarmonicStepSize | StallDecayStepSize

    @property
    def report_objective(self) -> bool:
        """Whether clients compute d0 . V of the table they were sent (the stall rule needs it)."""
        return self.step_size.needs_objective or self.algorithm.objective_is_free

    def fingerprint(self) -> str:
        """SHA-256 of the problem's arrays: a node that built another problem fails the handshake."""
        h = hashlib.sha256()
        for a in (self.task.reward, self.task.train, self.task.test, self.task.center, self.init_params):
            h.update(np.ascontiguousarray(a, dtype=np.float64).tobytes())
        h.update(f"{self.algorithm.name}|{self.E}|{self.step_size!r}|{self.task.gamma}".encode())
        return h.hexdigest()

    def values(self, params: np.ndarray) -> dict[str, float]:
        """Exact objectives (d0 . V minus the reported offset) of the policy of ``params``."""
        t = self.task
        policy = self.algorithm.to_policy(np.asarray(params, dtype=float))
        out = {
            "center_value": float(evaluate(policy, t.center[None], t.reward, t.gamma, t.d0) - t.value_offset),
            "train_value": float(evaluate(policy, t.train, t.reward, t.gamma, t.d0) - t.value_offset),
        }
        if t.test.shape[0]:
            out["test_value"] = float(evaluate(policy, t.test, t.reward, t.gamma, t.d0) - t.value_offset)
        return out


def build_problem(cfg: RunConfig, num_clients: int, algorithm: str) -> TabularProblem:
    """The problem of repetition ``cfg.fedrl.repetition``, drawn exactly as fedrl.engine.run_cells draws it.

    `algorithm`: fedrl.tabular's key (qavg, softpavg or projpavg), which the run's method names.
    """
    fam = family(cfg, num_clients)
    algo = get_algorithm(algorithm)
    prob_rng, init_rng = rep_rngs(cfg.seed, cfg.fedrl.repetition)
    task = fam.sample(prob_rng).task(cfg.fedrl.kappa)
    init = algo.init_from_uniform(init_rng.uniform(size=task.reward.shape))
    return TabularProblem(task, algo, init, local_steps(cfg), step_rule(cfg, num_clients, algorithm))
