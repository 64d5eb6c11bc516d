"""Fed-SE (the Fed-SE paper, Algorithm 1): self-evolving agents that federate a LoRA adapter.

Server: the global model is a LoRA adapter on the frozen base (phi_0: A from the run's seed,
B = 0, so the run starts exactly at the base model). The server injects it into its copy of
the base model once, so the held-out evaluation generates with base + global adapter, and every
evaluation saves the adapter as a standard PEFT folder (`PeftModel.from_pretrained(base, folder)`
loads it). FedSE-LoRA (strategies/fedse_lora.py) samples a fraction of the clients and aggregates
their adapters. Client: one self-evolution round (agent/self_evolution.py) on the client's
partition, its experience buffer kept on the client's own disk.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping

from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.serverapp.strategy import Strategy

from envs import make_env
from fedagent_flwr.agent.experience import ExperienceBuffer
from fedagent_flwr.agent.lora import (
    adapter_num_parameters,
    adapter_to_arrays,
    arrays_to_adapter,
    attached_lora,
    save_adapter,
)
from fedagent_flwr.agent.seeding import seed_everything
from fedagent_flwr.agent.self_evolution import client_buffer_dir, self_evolution_round
from fedagent_flwr.methods.base import AgentLoader
from fedagent_flwr.methods.fedagent import LanguageAgentMethod
from fedagent_flwr.methods.tasks import learner_tasks
from fedagent_flwr.runs.reporting import RunReporter
from strategies.fedse_lora import RUN_KEY, FedSELoRA, clients_for_fraction


class FedSE(LanguageAgentMethod):
    """Owns the server's PEFT wrapper for the run; `close()` restores the plain base."""

    def prepare(self) -> None:
        super().prepare()
        self._stack = contextlib.ExitStack()
        self.peft_model = self._stack.enter_context(attached_lora(self.agent.model, self.cfg.lora_spec(), seed=self.cfg.seed))
        self.num_parameters = adapter_num_parameters(self.peft_model)

    def make_strategy(self, node_of_partition: Mapping[int, int]) -> Strategy:
        cfg = self.cfg
        m = clients_for_fraction(len(node_of_partition), cfg.fedse_client_fraction)
        return FedSELoRA(node_of_partition, clients_per_round=m, seed=cfg.seed, min_replies=min(cfg.min_replies, m),
                         aggregation=cfg.fedse_aggregation)

    def initial_arrays(self) -> ArrayRecord:
        return adapter_to_arrays(self.peft_model)

    def load_global(self, arrays: ArrayRecord) -> None:
        arrays_to_adapter(self.peft_model, arrays)

    def checkpoint(self, reporter: RunReporter, server_round: int) -> None:  # a PEFT adapter folder
        save_adapter(self.peft_model, reporter.run_dir / "checkpoints" / f"round-{server_round:04d}", self.agent.tokenizer)

    def close(self) -> None:
        self._stack.close()

    def train(self, msg: Message, context: Context, partition_id: int, num_partitions: int,
              load_agent: AgentLoader) -> Message:
        cfg, agent = self.cfg, load_agent()
        config = msg.content.config_records["config"]
        server_round = int(config["server-round"])
        seed_everything(cfg.seed, server_round, partition_id)  # exploration sampling is reproducible per (round, client)
        buffer = ExperienceBuffer(client_buffer_dir(cfg.fedse_buffer_dir, str(config[RUN_KEY]), partition_id), agent.base_fingerprint)
        adapter, metrics = self_evolution_round(
            agent, cfg.self_evolution_config(), cfg.rollout_config(), lambda: make_env(cfg.env, cfg.max_steps),
            learner_tasks(cfg, partition_id, num_partitions), server_round, buffer, msg.content.array_records["arrays"])
        return Message(RecordDict({"arrays": adapter, "metrics": MetricRecord(metrics)}), reply_to=msg)
