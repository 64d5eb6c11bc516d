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

from collections.abc import Mapping

from flwr.app import Context, Message, MetricRecord, RecordDict
from flwr.serverapp.strategy import Strategy

from envs import make_env, per_env_numbers, task_env
from fedagent_flwr.agent.agenttraj import client_share, read_items, seed_trajectories
from fedagent_flwr.agent.training.experience import ExperienceBuffer, StoredTrajectory
from fedagent_flwr.agent.play.seeding import seed_everything
from fedagent_flwr.agent.self_evolution import client_buffer_dir, self_evolution_round
from fedagent_flwr.config import RunConfig
from fedagent_flwr.methods.base import AgentLoader
from fedagent_flwr.methods.fedagent import LanguageAgentMethod
from fedagent_flwr.methods.tasks import learner_tasks
from strategies.fedse_lora import RUN_KEY, FedSELoRA, clients_for_fraction
from strategies.transfer import decode, encode
from fedagent_flwr.methods.library_configs import rollout_config
from fedagent_flwr.methods.placement import process_placement


class FedSE(LanguageAgentMethod):
    """The global model is always a LoRA adapter; clients evolve it on their own buffers."""

    def trains_adapter(self) -> bool:
        return True

    def make_strategy(self, node_of_partition: Mapping[int, int]) -> Strategy:
        cfg = self.cfg
        m = clients_for_fraction(len(node_of_partition), cfg.fedse.fraction_train)
        return FedSELoRA(node_of_partition, clients_per_round=m, seed=cfg.seed, min_replies=min(cfg.federation.min_replies, m),
                         aggregation=cfg.fedse.aggregation, transfer_dtype=cfg.federation.transfer_dtype)

    def train(self, msg: Message, context: Context, partition_id: int, num_partitions: int,
              load_agent: AgentLoader) -> Message:
        cfg, agent = self.cfg, load_agent()
        config = msg.content.config_records["config"]
        server_round = int(config["server-round"])
        seed_everything(cfg.seed, server_round, partition_id)  # exploration sampling is reproducible per (round, client)
        buffer = ExperienceBuffer(client_buffer_dir(cfg.fedse.buffer_dir, str(config[RUN_KEY]), partition_id), agent.base_fingerprint)
        tasks = learner_tasks(cfg, partition_id, num_partitions)
        placement = process_placement(cfg, agent, tasks)  # every auto of this client, once
        seed_data = (lambda: agenttraj_seed(cfg, agent.tokenizer, partition_id, num_partitions)) if cfg.fedse.seed_data else None
        adapter, metrics = self_evolution_round(
            agent, cfg.fedse, cfg.lora, rollout_config(cfg, placement=placement),
            lambda: make_env(cfg.env, cfg.rollout.max_steps), tasks, server_round, buffer,
            decode(msg.content.array_records["arrays"], cfg.federation.transfer_dtype), seed_data,
            seed=cfg.seed, precision=placement.compute_precision, attention=cfg.engine.attn_implementation)
        return Message(RecordDict({"arrays": encode(adapter, cfg.federation.transfer_dtype), "metrics": MetricRecord(metrics)}), reply_to=msg)


def agenttraj_seed(cfg: RunConfig, tokenizer, partition_id: int, num_partitions: int) -> tuple[list[StoredTrajectory], int]:
    """Client `partition_id`'s D_k^0 from fedse.seed-data: its share of the items of each environment its training
    tasks come from (the holders of an environment: every client whose tasks include it), capped per environment
    where fedse.seed-demos names environments."""
    holders: dict[str, list[int]] = {}
    for p in range(num_partitions):
        for env in sorted({task_env(t) or cfg.env for t in learner_tasks(cfg, p, num_partitions)}):
            holders.setdefault(env, []).append(p)
    caps = per_env_numbers(cfg.fedse.seed_demos) if isinstance(cfg.fedse.seed_demos, str) else None
    items = client_share(read_items(cfg.fedse.seed_data), holders, partition_id, caps)
    return seed_trajectories(items, tokenizer, cfg.rollout.max_context_tokens)
