"""Tabular federated RL with environment heterogeneity: QAvg, SoftPAvg, ProjPAvg (Jin et al.).

fedrl.mdps: heterogeneous MDP families (RandomMDPs, WindyCliffs) with kappa mixing;
fedrl.tabular: per-client local updates, averaging, exact policy evaluation and the
client-by-client federated loop; fedrl.engine: the same loop vectorised over
repetitions and clients; ``python -m fedagent_flwr.experiments.fedrl_table1``: Table 1 and Figure 2;
fedrl.deep (imported on its own, needs torch and gymnasium): DQNAvg on CartPole / Acrobot;
fedrl.ddpg (likewise): DDPGAvg on Pendulums with varied pole length / mass.
"""

from fedrl.mdps import FedTask, HeterogeneousMDP, RandomMDPs, WindyCliffs, mix_kernels, stack_tasks
from fedrl.tabular import (
    ALGORITHMS,
    HarmonicStepSize,
    LocalResult,
    StallDecayStepSize,
    average,
    evaluate,
    greedy_policy,
    project_to_simplex,
    projpavg_local_update,
    qavg_local_update,
    run_federated,
    softpavg_local_update,
    value_iteration,
)

__all__ = [
    "ALGORITHMS",
    "FedTask",
    "HarmonicStepSize",
    "HeterogeneousMDP",
    "LocalResult",
    "RandomMDPs",
    "StallDecayStepSize",
    "WindyCliffs",
    "average",
    "evaluate",
    "greedy_policy",
    "mix_kernels",
    "project_to_simplex",
    "projpavg_local_update",
    "qavg_local_update",
    "run_federated",
    "softpavg_local_update",
    "stack_tasks",
    "value_iteration",
]
