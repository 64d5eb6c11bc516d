"""ServerApp side of QAvg / PAvg: no LLM; tabular envs are scored exactly every round, deep ones by greedy episodes.

The server builds the same problem as the clients (fedrl_problem), checks in the
handshake that every node built it too, runs the QAvg or PAvg strategy, and after
every round scores the global policy exactly on the centre kernel P_0, on the K
training kernels (the FedRL objective) and on the held-out kernels. It writes the
run folder the LLM path writes (config.json, metrics.jsonl / .csv, summary.json,
learning_curve.png) plus the final table. Deep envs (DQNAvg / DDPGAvg, fedrl_deep) are
scored with greedy episodes on the training and held-out environments every eval-every rounds.
"""

from __future__ import annotations

import io
import json
import os
import tempfile
import time
from datetime import datetime
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord
from flwr.serverapp import Grid

from strategies import make_strategy

from .config import RunConfig
from .fedrl_deep import DEEP_ENVS, DeepProblem, build_deep_problem
from .fedrl_problem import TabularProblem, algorithm_name, build_problem
from .reporting import RunReporter, atomic_write_text

VALUE_KEYS = ("center_value", "train_value", "test_value")


class FedRLReporter(RunReporter):
    """RunReporter whose learning curve shows the exact values of the global policy."""

    def plot(self) -> None:
        fig, ax = plt.subplots(figsize=(6, 4))
        labels = {"center_value": "centre kernel P_0", "train_value": "the K clients' kernels", "test_value": "held-out kernels"}
        for key, label in labels.items():
            pts = [(r["round"], r[f"eval/{key}"]) for r in self.rows if f"eval/{key}" in r]
            if pts:
                ax.plot(*zip(*pts), marker=".", label=label)
        ax.set_xlabel("round")
        ax.set_ylabel("value of the global policy (d0 . V, or greedy return)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        fd, tmp = tempfile.mkstemp(prefix=".learning_curve-", suffix=".png", dir=self.run_dir)
        os.close(fd)
        fig.savefig(tmp, dpi=110)
        plt.close(fig)
        os.replace(tmp, self.run_dir / "learning_curve.png")

    def save_table(self, name: str, params: np.ndarray | dict[str, np.ndarray]) -> Path:
        final = self.run_dir / name
        buf = io.BytesIO()
        np.savez(buf, **params) if isinstance(params, dict) else np.save(buf, params)
        fd, tmp = tempfile.mkstemp(prefix=f".{name}-", dir=self.run_dir)
        with os.fdopen(fd, "wb") as f:
            f.write(buf.getvalue())
        os.replace(tmp, final)
        return final


def strategy_for(cfg: RunConfig, problem: TabularProblem | DeepProblem, node_of_partition: dict[int, int]):
    kwargs = dict(
        node_of_partition=node_of_partition,
        local_steps=problem.E,
        clients_per_round=None if cfg.fedrl_clients == "all" else cfg.clients_per_round,
        seed=cfg.seed,
        min_replies=cfg.min_replies,
        step_size=problem.step_size,
        gamma=problem.task.gamma if isinstance(problem, TabularProblem) else None,
        independent_steps=cfg.independent_steps_per_round,
    )
    if cfg.strategy == "pavg":
        kwargs["variant"] = cfg.pavg_variant
    return make_strategy(cfg.strategy, **kwargs)


def run_fedrl(grid: Grid, cfg: RunConfig) -> dict:
    from .server_app import handshake, wait_for_nodes  # server_app imports this module

    started = time.time()
    nodes = wait_for_nodes(grid, cfg.num_clients)
    deep = cfg.env in DEEP_ENVS
    problem = (build_deep_problem if deep else build_problem)(cfg, cfg.num_clients or len(nodes))
    node_of_partition = handshake(grid, nodes, problem.fingerprint(), cfg.round_timeout)
    num_clients = cfg.check_federation(len(node_of_partition))
    name = problem.name if deep else problem.algorithm.name
    algo = name.lower() if deep else algorithm_name(cfg)
    E = "inf" if problem.E is None else problem.E
    steps_per_round = cfg.independent_steps_per_round if problem.E is None else problem.E

    run_name = cfg.run_name or f"{cfg.env}-{algo}-{datetime.now():%Y%m%d-%H%M%S}"
    reporter = FedRLReporter(cfg.output_path / run_name)
    reporter.write_config(cfg.to_run_config() | {"resolved-num-clients": num_clients, "algorithm": algo,
                                                  "step-size-rule": repr(problem.step_size), "problem-fingerprint": problem.fingerprint()})
    heterogeneity = "dynamics parameters drawn per client" if deep else f"kappa={cfg.kappa}"
    print(f"[fedrl] {name} on {cfg.env}, K={num_clients}, {heterogeneity}, E={E}; run folder: {reporter.run_dir}", flush=True)

    strategy = strategy_for(cfg, problem, node_of_partition)
    history: dict[int, dict[str, float]] = {}

    def evaluate_fn(server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
        row: dict[str, float] = {"round": server_round, "local_steps": server_round * steps_per_round,
                                 "elapsed_seconds": round(time.time() - started, 2)}
        for key, value in (strategy.last_train_metrics(server_round) or {}).items():
            row[f"train/{key}"] = value
        # exact tabular values cost microseconds: every round; greedy episodes: every eval-every rounds
        due = not deep or server_round in (0, cfg.num_server_rounds) or server_round % cfg.eval_every == 0
        values = None
        if due:
            values = problem.values(arrays) if deep else problem.values(arrays["params"].numpy())
            history[server_round] = values
            row.update({f"eval/{k}": v for k, v in values.items()})
            head = f"value on P_0 {values['center_value']:.4f}, " if "center_value" in values else ""
            print(f"[fedrl] round {server_round}: {head}on the clients' envs {values['train_value']:.4f}", flush=True)
        reporter.log(row)
        if server_round == cfg.num_server_rounds:
            if deep:
                reporter.save_table("final_weights.npz", {k: arrays[k].numpy() for k in arrays.keys()})
            else:
                reporter.save_table("final_params.npy", arrays["params"].numpy())
        return MetricRecord(values) if values else None

    initial = problem.initial_arrays() if deep else ArrayRecord({"params": Array(np.ascontiguousarray(problem.init_params))})
    strategy.start(grid=grid, initial_arrays=initial, num_rounds=cfg.num_server_rounds, timeout=cfg.round_timeout,
                   train_config=ConfigRecord({"fingerprint": problem.fingerprint()}), evaluate_fn=evaluate_fn)
    final_round = max(history)
    summary = {
        "run_dir": str(reporter.run_dir),
        "algorithm": name,
        "env": cfg.env,
        "kappa": None if deep else cfg.kappa,
        "E": E,
        "step_size_rule": repr(problem.step_size),
        "env_params": {"train": list(problem.train_params), "test": list(problem.test_params)} if deep else None,
        "local_steps": final_round * steps_per_round,
        "initial": history[0],
        "final": history[final_round],
        "rounds": cfg.num_server_rounds,
        "clients": num_clients,
        "clients_per_round": len(strategy.sampled.get(1, [])),
        "sampled_clients": {str(r): p for r, p in strategy.sampled.items()},
        "failed_replies": {str(r): f for r, f in strategy.failures.items() if f},
        "seed": cfg.seed,
        "repetition": cfg.fedrl_repetition,
        "seconds": round(time.time() - started, 1),
    }
    reporter.write_summary(summary)
    atomic_write_text(reporter.run_dir / "step_sizes.json", json.dumps({str(r): e for r, e in strategy.step_sizes.items()}))
    key = "train_value" if deep else "center_value"
    print(f"[fedrl] {key}: before round 1 {history[0][key]:.4f} -> after round {final_round} "
          f"{history[final_round][key]:.4f}; summary: {reporter.run_dir / 'summary.json'}", flush=True)
    return summary
