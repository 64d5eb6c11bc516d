"""QAvg / PAvg (Jin et al.) as methods: no LLM; tabular envs are scored exactly every round, deep ones by greedy episodes.

The server builds the same problem as the clients (problem.py, deep.py), checks in the
handshake that every node built it too, runs the QAvg or PAvg strategy, and after
every round scores the global policy exactly on the centre kernel P_0, on the K
training kernels (the FedRL objective) and on the held-out kernels. It writes the
run folder the LLM path writes (config.json, metrics.jsonl / .csv, summary.json,
learning_curve.png) plus the final table. Deep envs (DQNAvg / DDPGAvg, deep.py) are
scored with greedy episodes on the training and held-out environments every eval.test-freq rounds.
Clients: tabular.py (the local update on the client's own kernel) and deep.py (DQN / DDPG).
"""

from __future__ import annotations

import io
import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from flwr.app import Array, ArrayRecord, Context, Message
from flwr.serverapp.strategy import Strategy

from fedagent_flwr.atomic import atomic_write_text
from fedagent_flwr.methods.base import AgentLoader, Method
from fedagent_flwr.methods.fedrl import deep, tabular
from fedagent_flwr.methods.fedrl.deep import DEEP_ENVS, DeepProblem, build_deep_problem
from fedagent_flwr.methods.fedrl.problem import TabularProblem, build_problem
from fedagent_flwr.runs.reporting import RunReporter
from strategies import PAvg, QAvg
from strategies.pavg import (
    VARIANTS as PAVG_ALGORITHMS,  # fedrl.pavg-variant -> fedrl.tabular's algorithm key
)


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


class FedRL(Method):
    """QAvg / PAvg rounds on the tabular or deep problem the run config describes; subclasses name the algorithm."""

    strategy_class: type[QAvg] = QAvg

    @property
    def deep(self) -> bool:
        return self.cfg.env in DEEP_ENVS

    def algorithm(self) -> str:
        """fedrl.tabular's algorithm key the clients run: qavg, softpavg or projpavg."""
        raise NotImplementedError

    def problem(self, num_clients: int) -> TabularProblem | DeepProblem:
        if self.deep:
            return build_deep_problem(self.cfg, num_clients)
        return build_problem(self.cfg, num_clients, self.algorithm())

    # ----- server side ---------------------------------------------------------------------------
    def fingerprint(self, num_clients: int) -> str:
        self._problem = self.problem(num_clients)
        return self._problem.fingerprint()

    @property
    def steps_per_round(self) -> int:
        p = self._problem
        return self.cfg.fedrl.independent_steps_per_round if p.E is None else p.E

    def run_label(self) -> str:
        return self._problem.name.lower() if self.deep else self.algorithm()

    def config_facts(self) -> dict[str, Any]:
        p = self._problem
        return {"algorithm": self.run_label(), "step-size-rule": repr(p.step_size), "problem-fingerprint": p.fingerprint()}

    def reporter(self, run_dir: Path) -> RunReporter:
        return FedRLReporter(run_dir, self.cfg.tracker)

    def announce(self, run_dir: Path, num_clients: int) -> None:
        p = self._problem
        name = p.name if self.deep else p.algorithm.name
        heterogeneity = "dynamics parameters drawn per client" if self.deep else f"fedrl.kappa={self.cfg.fedrl.kappa}"
        E = "inf" if p.E is None else p.E
        print(f"[fedrl] {name} on {self.cfg.env}, K={num_clients}, {heterogeneity}, E={E}; run folder: {run_dir}", flush=True)

    def make_strategy(self, node_of_partition: Mapping[int, int]) -> Strategy:
        cfg, p = self.cfg, self._problem
        return self.strategy_class(
            node_of_partition=node_of_partition,
            local_steps=p.E,
            clients_per_round=None if cfg.fedrl.clients == "all" else cfg.clients_per_round,
            seed=cfg.seed,
            min_replies=cfg.federation.min_replies,
            step_size=p.step_size,
            gamma=p.task.gamma if isinstance(p, TabularProblem) else None,
            independent_steps=cfg.fedrl.independent_steps_per_round,
            **self.strategy_kwargs(),
        )

    def strategy_kwargs(self) -> dict[str, Any]:
        return {}

    def initial_arrays(self) -> ArrayRecord:
        p = self._problem
        return p.initial_arrays() if self.deep else ArrayRecord({"params": Array(np.ascontiguousarray(p.init_params))})

    def row_facts(self, server_round: int) -> dict[str, float]:
        return {"local_steps": server_round * self.steps_per_round}

    def evaluation_due(self, server_round: int) -> bool:
        # exact tabular values cost microseconds: every round; greedy episodes: every eval.test-freq rounds
        return not self.deep or super().evaluation_due(server_round)

    def evaluate(self, server_round: int, arrays: ArrayRecord) -> dict[str, float]:
        return self._problem.values(arrays) if self.deep else self._problem.values(arrays["params"].numpy())

    def after_evaluation(self, reporter: RunReporter, server_round: int, metrics: dict[str, float]) -> None:
        head = f"value on P_0 {metrics['center_value']:.4f}, " if "center_value" in metrics else ""
        print(f"[fedrl] round {server_round}: {head}on the clients' envs {metrics['train_value']:.4f}", flush=True)

    def after_round(self, reporter: RunReporter, server_round: int, arrays: ArrayRecord) -> None:
        if server_round != self.cfg.num_server_rounds:
            return
        if self.deep:
            reporter.save_table("final_weights.npz", {k: arrays[k].numpy() for k in arrays.keys()})
        else:
            reporter.save_table("final_params.npy", arrays["params"].numpy())

    def summary(self, history: dict[int, dict[str, float]], strategy: Strategy) -> dict[str, Any]:
        cfg, p, final = self.cfg, self._problem, max(history)
        return {
            "algorithm": p.name if self.deep else p.algorithm.name,
            "env": cfg.env,
            "kappa": None if self.deep else cfg.fedrl.kappa,
            "E": "inf" if p.E is None else p.E,
            "step_size_rule": repr(p.step_size),
            "env_params": {"train": list(p.train_params), "test": list(p.test_params)} if self.deep else None,
            "local_steps": final * self.steps_per_round,
            "initial": history[0],
            "final": history[final],
            "clients_per_round": len(strategy.sampled.get(1, [])),
            "seed": cfg.seed,
            "repetition": cfg.fedrl.repetition,
        }

    def report(self, reporter: RunReporter, history: dict[int, dict[str, float]], strategy: Strategy,
               summary: dict[str, Any]) -> None:
        atomic_write_text(reporter.run_dir / "step_sizes.json", json.dumps({str(r): e for r, e in strategy.step_sizes.items()}))
        key, final = ("train_value" if self.deep else "center_value"), max(history)
        print(f"[fedrl] {key}: before round 1 {history[0][key]:.4f} -> after round {final} "
              f"{history[final][key]:.4f}; summary: {reporter.run_dir / 'summary.json'}", flush=True)

    # ----- client side ---------------------------------------------------------------------------
    def client_fingerprint(self, partition_id: int, num_partitions: int, load_agent: AgentLoader) -> str:
        if self.deep:
            return deep.client_fingerprint(self.cfg, partition_id, num_partitions)
        return tabular.client_fingerprint(self.cfg, self.algorithm(), partition_id, num_partitions)

    def train(self, msg: Message, context: Context, partition_id: int, num_partitions: int,
              load_agent: AgentLoader) -> Message:
        if self.deep:
            return deep.train(msg, context, self.cfg, partition_id, num_partitions)
        return tabular.train(msg, context, self.cfg, self.algorithm(), partition_id, num_partitions)


class QAvgMethod(FedRL):
    """QAvg: averaged Q tables (deep: DQNAvg / PerDQNAvg)."""

    strategy_class = QAvg

    def algorithm(self) -> str:
        return "qavg"


class PAvgMethod(FedRL):
    """PAvg: averaged policies, softmax logits or simplex tables (deep: DDPGAvg / PerDDPGAvg)."""

    strategy_class = PAvg

    def algorithm(self) -> str:
        return PAVG_ALGORITHMS[self.cfg.fedrl.pavg_variant]

    def strategy_kwargs(self) -> dict[str, Any]:
        return {"variant": self.cfg.fedrl.pavg_variant}
