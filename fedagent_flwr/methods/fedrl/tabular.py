"""ClientApp side of tabular QAvg / PAvg (deep envs: deep.py): client k runs fedrl's local update on its own kernel P_k^kappa.

The client rebuilds the run's problem from the run config (see problem.py) and
takes kernel ``task.train[partition-id]``; only the parameter table and numeric
metrics leave it. Finite E: the server sends the global table and the round's E
step sizes, the client runs ``<algo>_local_update`` once and returns the new table
and the objective of the table it was sent. E = inf: the client keeps its table,
its step-size state and its objective history in ``context.state`` (which persists
per node across rounds) and never loads a model after round 1.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
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
from fedagent_flwr.methods.fedrl.problem import TabularProblem, build_problem
from fedrl.tabular import evaluate

STATE_ARRAYS = "fedrl-local"  # context.state keys of the E = inf client's own table and rule state
STATE_CONFIG = "fedrl-history"


@lru_cache(maxsize=4)
def _problem(cfg: RunConfig, num_clients: int, algorithm: str) -> TabularProblem:
    return build_problem(cfg, num_clients, algorithm)


def client_fingerprint(cfg: RunConfig, algorithm: str, partition_id: int, num_partitions: int) -> str:
    """The problem's fingerprint, so the server can tell a node built another problem."""
    if not 0 <= partition_id < num_partitions:
        raise ValueError(f"partition-id {partition_id} is outside 0..{num_partitions - 1}")
    return _problem(cfg, num_partitions, algorithm).fingerprint()


def _own_value(problem: TabularProblem, params: np.ndarray, partition_id: int) -> float:
    t = problem.task
    policy = problem.algorithm.to_policy(params)
    return float(evaluate(policy, t.train[partition_id][None], t.reward, t.gamma, t.d0) - t.value_offset)


def train(msg: Message, context: Context, cfg: RunConfig, algorithm: str, partition_id: int, num_partitions: int) -> Message:
    """One round of local updates; returns the client's table and metrics."""
    config = msg.content.config_records["config"]
    problem = _problem(cfg, num_partitions, algorithm)
    t = problem.task
    if config.get("fingerprint") != problem.fingerprint():
        raise ValueError("this node built a different QAvg / PAvg problem than the server (fingerprint mismatch)")
    if str(config["algorithm"]) != algorithm:
        raise ValueError(f"server runs {config['algorithm']!r} but this client's config gives {algorithm!r}")
    P = t.train[partition_id]
    update = problem.algorithm.local_update
    report = problem.report_objective
    steps, first = int(config["local-steps"]), int(config["first-step"])
    metrics: dict[str, float] = {"local-steps": float(steps)}
    if not bool(config["independent"]):
        params = _incoming(msg)
        etas = np.asarray(config["step-sizes"], dtype=float)
        if etas.shape != (steps,):
            raise ValueError(f"expected {steps} step sizes, got {etas.shape}")
        res = update(params, P, t.reward, t.gamma, t.d0, etas, report)
        params = res.params
        if report:
            metrics["start-objective"] = float(res.start_objective)
    else:
        params, rule_state, history = _load_independent(msg, context, problem, first)
        rule = problem.step_size
        for step in range(first, first + steps):
            rule_state = rule.next_state(rule_state, history)
            etas = rule.step_sizes(rule_state, step, 1, t.gamma, None)
            res = update(params, P, t.reward, t.gamma, t.d0, etas, report)
            params = res.params
            if report:
                history.append(float(res.start_objective))
        context.state[STATE_ARRAYS] = ArrayRecord({"params": Array(np.ascontiguousarray(params)),
                                                   "rule-state": Array(np.atleast_1d(np.asarray(rule_state, dtype=float)))})
        context.state[STATE_CONFIG] = ConfigRecord({"next-step": first + steps, "history": history})
    metrics["local-value"] = _own_value(problem, params, partition_id)
    content = RecordDict({"arrays": ArrayRecord({"params": Array(np.ascontiguousarray(params))}), "metrics": MetricRecord(metrics)})
    return Message(content, reply_to=msg)


def _incoming(msg: Message) -> np.ndarray:
    arrays = msg.content.array_records.get("arrays")
    if arrays is None or "params" not in arrays:
        raise ValueError("the server's message carries no 'params' table")
    return arrays["params"].numpy().astype(float)


def _load_independent(msg: Message, context: Context, problem: TabularProblem, first: int):
    """E = inf: the client's own table, rule state and objective history (round 1: the common initial table)."""
    if first == 0:
        return _incoming(msg), problem.step_size.initial_state(()), []
    if STATE_ARRAYS not in context.state.array_records:
        raise ValueError("E = inf round after the first, but this node holds no local table (was it restarted?)")
    saved = context.state.array_records[STATE_ARRAYS]
    meta = context.state.config_records[STATE_CONFIG]
    if int(meta["next-step"]) != first:
        raise ValueError(f"this node's local table is at step {meta['next-step']}, the server asks to continue from {first}")
    rule_state = saved["rule-state"].numpy()[0]
    return saved["params"].numpy().astype(float), np.float64(rule_state), [float(x) for x in meta["history"]]
