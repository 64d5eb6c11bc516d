"""Which environments the QAvg / PAvg strategies run on (their traits, as every strategy's, are in
fedagent_flwr/config/strategy_traits.py; runs/preflight.py checks a run's env against this table)."""

from __future__ import annotations

from fedrl.ddpg import CONTINUOUS_ENVS
from fedrl.deep import ENV_NAMES as DISCRETE_ENVS
from fedrl.mdps import TABULAR_ENVS

FEDRL_TABULAR_ENVS = TABULAR_ENVS
FEDRL_DQN_ENVS = DISCRETE_ENVS  # qavg: DQNAvg (discrete actions)
FEDRL_DDPG_ENVS = CONTINUOUS_ENVS  # pavg: DDPGAvg (continuous actions)
FEDRL_ENVS = FEDRL_TABULAR_ENVS + FEDRL_DQN_ENVS + FEDRL_DDPG_ENVS
FEDRL_STRATEGY_ENVS = {
    "qavg": FEDRL_TABULAR_ENVS + FEDRL_DQN_ENVS,  # deep QAvg is DQNAvg: discrete actions
    "pavg": FEDRL_TABULAR_ENVS + FEDRL_DDPG_ENVS,  # deep PAvg is DDPGAvg: continuous actions
}
