"""The contract between the one server loop (fedagent_flwr/federation.py), the ClientApp and a method.

A method is one seed system: FedAgent (GRPO agents, FedAgentAvg), its Table 1 baselines,
Fed-SE (self-evolving LoRA adapters, FedSE-LoRA) or QAvg / PAvg (RL tables and networks).
The server loop meets the clients, keeps the run folder, resumes, evaluates and writes the
summary for every method alike; a method supplies only what differs, through the hooks
below. Client hooks get a `load_agent()` callable rather than loading a model themselves, so
a method that trains no language model never loads one, and the ClientApp stays the one
place that decides how a process caches its model.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from flwr.app import ArrayRecord, Context, Message
from flwr.serverapp.strategy import Strategy

from envs import env_names, make_env
from fedagent_flwr.agent.models.loading import Agent
from fedagent_flwr.config import RunConfig
from fedagent_flwr.runs.reporting import RunReporter

AgentLoader = Callable[[], Agent]


class Method:
    """Base class: a subclass fills the hooks it needs; every hook has one caller."""

    def __init__(self, cfg: RunConfig) -> None:
        self.cfg = cfg

    # ----- server side, in the order federation.run_federation calls them -------------------------
    def prepare(self) -> None:
        """Load or build what the server needs before the clients are met (e.g. the base model)."""

    def fingerprint(self, num_clients: int) -> str:
        """What every client must hold identically (base weights, or the RL problem's draw)."""
        raise NotImplementedError

    def check_federation(self, num_clients: int) -> None:
        """Raise before round 1 if this federation cannot run the method (e.g. an infeasible partition)."""

    def run_label(self) -> str:
        """Names run folders: <env>-<label>-<timestamp>."""
        return self.cfg.strategy

    def config_facts(self) -> dict[str, Any]:
        """Resolved facts written to config.json beside the run config."""
        return {}

    def reporter(self, run_dir: Path) -> RunReporter:
        return RunReporter(run_dir, self.cfg.tracker)

    def announce(self, run_dir: Path, num_clients: int) -> None:
        print(f"[fedagent] run folder: {run_dir}", flush=True)
        if "alfworld" in env_names(self.cfg.env):
            pool = make_env("alfworld")
            if pool.source == "generated":  # the papers' numbers come from the official games: say so where runs start
                print(f"[fedagent] NOTE: ALFWorld plays our {len(pool.tasks_of_split('train'))} generated training games "
                      f"(and {len(pool.tasks()) - len(pool.tasks_of_split('train'))} held out), not the official ALFWorld "
                      "set the papers use: set ALFWORLD_DATA to a folder of the official games (alfworld-download) for it",
                      flush=True)

    def make_strategy(self, node_of_partition: Mapping[int, int]) -> Strategy:
        raise NotImplementedError

    def initial_arrays(self) -> ArrayRecord:
        raise NotImplementedError

    def row_facts(self, server_round: int) -> dict[str, float]:
        """Extra columns of every metrics row (before the elapsed time)."""
        return {}

    def evaluation_due(self, server_round: int) -> bool:
        cfg = self.cfg
        return server_round == 0 or server_round % cfg.eval.test_freq == 0 or server_round == cfg.num_server_rounds

    def evaluate(self, server_round: int, arrays: ArrayRecord) -> dict[str, float]:
        """Score the global model held in `arrays`; the metrics of one evaluation."""
        raise NotImplementedError

    def after_evaluation(self, reporter: RunReporter, server_round: int, metrics: dict[str, float]) -> None:
        """Checkpoint the model just evaluated and say how it did."""

    def after_round(self, reporter: RunReporter, server_round: int, arrays: ArrayRecord) -> None:
        """Anything to keep once a round is logged (e.g. the final table)."""

    def summary(self, history: dict[int, dict[str, float]], strategy: Strategy) -> dict[str, Any]:
        """The method's part of summary.json."""
        return {}

    def report(self, reporter: RunReporter, history: dict[int, dict[str, float]], strategy: Strategy,
               summary: dict[str, Any]) -> None:
        """The closing lines on the console (and any file beside summary.json)."""

    def close(self) -> None:
        """Give back what `prepare` took (the server loop calls it however the run ends)."""

    # ----- client side ---------------------------------------------------------------------------
    def client_fingerprint(self, partition_id: int, num_partitions: int, load_agent: AgentLoader) -> str:
        """The client's answer to the handshake: the same thing `fingerprint` computes on the server."""
        raise NotImplementedError

    def train(self, msg: Message, context: Context, partition_id: int, num_partitions: int,
              load_agent: AgentLoader) -> Message:
        """One round of local work; the reply carries only tensors and numeric metrics."""
        raise NotImplementedError
