"""FedAgent (the FedAgentGym paper, Algorithm 1): GRPO agents averaged by FedAgentAvg.

Server: the base model's weights are the global model; each round FedAgentAvg samples M of the
K clients by partition-id and replaces the weights by the plain mean of the local models that
come back; the server evaluates the global model on held-out tasks. Client: tau epochs of GRPO on
the client's own partition (methods/local_round.py, with no Flower in sight; on N ranks:
methods/ranked_round.py). The client's tasks and trajectories never leave it - only the updated weights and
numeric metrics do.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.serverapp.strategy import Strategy

from envs import env_names, is_multi_spec, make_env
from envs.multi import per_env_spread
from fedagent_flwr.agent.play.evaluation import GlobalEvaluator, evaluation_seed
from fedagent_flwr.agent.models.loading import load_agent
from fedagent_flwr.agent.training.lora import (
    adapter_num_parameters,
    adapter_to_arrays,
    arrays_to_adapter,
    attached_lora,
    save_adapter,
)
from fedagent_flwr.agent.engine.memory import GB, ModelShape
from fedagent_flwr.agent.play.multi_env import environment_table, format_row
from fedagent_flwr.agent.play.transcripts import short_example, write_transcripts

from fedagent_flwr.agent.training.weights import arrays_to_model, model_to_arrays
from fedagent_flwr.atomic import atomic_write_text, write_json_atomic
from fedagent_flwr.config import RunConfig
from fedagent_flwr.methods.base import AgentLoader, Method
from fedagent_flwr.methods.memory import check_memory, host_plan, memory_budget, memory_plans
from fedagent_flwr.methods.placement import context_tokens, place_run, run_base_dtype
from fedagent_flwr.methods.local_round import local_round
from fedagent_flwr.methods.ranked_round import idle_ranks_note, train_on_ranks
from fedagent_flwr.methods.tasks import all_partitions, holdings, holdings_line, learner_tasks
from fedagent_flwr.privacy.differential_privacy import update_norm
from fedagent_flwr.runs.reporting import RunReporter
from fedagent_flwr.runs.reused_evaluation import IDENTITY, evaluation_identity, reused_evaluation
from strategies import FedAgentAvg
from strategies.transfer import decode, encode
from fedagent_flwr.methods.library_configs import rollout_config


OPTIMIZER_STATE = "optimizer"  # context.state key of a single learner's AdamW state between rounds

class LanguageAgentMethod(Method):
    """What every method that trains a language-model agent shares: the base model, the global model
    (its full weights, or a LoRA adapter on the frozen base), held-out evaluation and checkpoints."""

    def trains_adapter(self) -> bool:
        """Whether the global model is a LoRA adapter (the server injects it into its copy of the base once,
        so the evaluation generates with base + global adapter) rather than the full weights."""
        return self.cfg.grpo.finetuning == "lora"

    def prepare(self) -> None:
        cfg = self.cfg
        self.agent = load_agent(cfg.model, cfg.env, cfg.device_key("server"), run_base_dtype(cfg))  # builds a tiny model first if needed
        env = make_env(cfg.env, cfg.rollout.max_steps)
        eval_tasks = per_env_spread(env.tasks_of_split("test"), cfg.eval.tasks)  # a multi-env spec: eval.tasks per env
        # Every auto resolved once, with the model in hand: rollout.name='static' for a model the static engine refuses
        # stops the run here, and auto's fall-back to hf is named on the console at start-up (clients resolve alike on
        # their machines). The server plans its own rows in engine.server-memory-gb (or the GPU memory free here); a client's
        # rows are planned here only as engine.client-memory-gb allows, for the plan checked before round 1.
        shape, context = ModelShape.of(self.agent.model.config), context_tokens(cfg, self.agent.tokenizer, env, eval_tasks)
        self.placements = {role: place_run(cfg, role, model=self.agent.model, shape=shape, context_tokens=context,
                                           budget_bytes=budget)
                           for role, budget in (("client", cfg.engine.client_memory_gb * GB),
                                                ("server", memory_budget(cfg, self.agent.device, "server")))}
        self.evaluator = GlobalEvaluator(self.agent.model, self.agent.tokenizer, lambda: make_env(cfg.env, cfg.rollout.max_steps),
                                         eval_tasks, rollout_config(cfg, True, placement=self.placements["server"]),
                                         cfg.eval.samples_per_task, cfg.seed, precision=self.placements["server"].precision)
        self.memory = memory_plans(cfg, shape, context, self.placements["client"], self.placements["server"])
        if cfg.engine.ranks_per_client > 1:  # what the client's process and rank 0 hold on the host beside the ranks' plans
            self.memory += (host_plan(cfg, shape),)
        self._stack = contextlib.ExitStack()
        self.peft_model = None
        if self.trains_adapter():  # phi_0: A from the run's seed, B = 0, so the run starts exactly at the base model
            self.peft_model = self._stack.enter_context(attached_lora(self.agent.model, cfg.lora, seed=cfg.seed))
        self.initial_identity: dict[str, Any] = {}  # what the evaluation before round 1 depends on, once known
        self.reused = None  # eval.initial-evaluation: another run's evaluation of exactly these weights, checked before round 1
        if cfg.eval.initial_evaluation:
            self.reused = reused_evaluation(cfg.eval.initial_evaluation, self.evaluation_identity(self.initial_arrays()))

    def evaluation_identity(self, arrays: ArrayRecord) -> dict[str, Any]:
        """What the server's evaluation of `arrays` depends on (runs/reused_evaluation.py)."""
        cfg, evaluator = self.cfg, self.evaluator
        return evaluation_identity(
            model=cfg.model, base_fingerprint=self.agent.base_fingerprint, weights=arrays, env=cfg.env,
            max_steps=cfg.rollout.max_steps, task_ids=[t.id for t in evaluator.tasks], samples_per_task=evaluator.samples_per_task,
            evaluation_seed=evaluation_seed(evaluator.seed), rollout=evaluator.config, precision=evaluator.precision,
            device=str(evaluator.device), weights_dtype=str(next(self.agent.model.parameters()).dtype))

    def close(self) -> None:
        """Restore the plain base model in this process."""
        self._stack.close()

    def fingerprint(self, num_clients: int) -> str:
        return self.agent.base_fingerprint

    def check_federation(self, num_clients: int) -> None:
        # An infeasible partition (or bad success labels) stops the run before round 1; else say what each learner holds.
        held = holdings(self.cfg, all_partitions(self.cfg, num_clients))
        print(f"[fedagent] training tasks by category ({self.cfg.partition.scheme} partition): {holdings_line(held)}", flush=True)
        check_memory(self.memory, self.cfg.engine.client_memory_gb, self.cfg.engine.server_memory_gb)

    def config_facts(self) -> dict[str, Any]:
        facts: dict[str, Any] = {"model-source": self.agent.spec.source,
                                 "memory-plan-client-bytes": self.memory[0].total, "memory-plan-server-bytes": self.memory[1].total}
        if self.peft_model is not None:
            facts["adapter-parameters"] = adapter_num_parameters(self.peft_model)
        return facts

    def initial_arrays(self) -> ArrayRecord:
        return adapter_to_arrays(self.peft_model) if self.peft_model is not None else model_to_arrays(self.agent.model)

    def announce(self, run_dir, num_clients: int) -> None:
        super().announce(run_dir, num_clients)
        write_json_atomic(run_dir / "memory_plan.json", {plan.who: plan.as_dict() for plan in self.memory})
        print("[fedagent] memory plan (an estimate, docs/gpu.md):\n" + "\n".join(plan.table() for plan in self.memory), flush=True)
        for role, placement in self.placements.items():  # what auto became on this machine (clients on theirs)
            print(f"[fedagent] {role} on this machine: {placement.summary()}", flush=True)
        if note := idle_ranks_note(self.cfg):
            print(f"[fedagent] {note}", flush=True)

    def load_global(self, arrays: ArrayRecord) -> None:
        if self.peft_model is not None:
            arrays_to_adapter(self.peft_model, arrays)
        else:
            arrays_to_model(self.agent.model, arrays)

    def evaluate(self, server_round: int, arrays: ArrayRecord) -> dict[str, float]:
        if server_round == 0 and self.reused is not None:  # checked in prepare: the same weights and episodes
            self.evaluator.last_trajectories = []
            print(f"[fedagent] round 0: the evaluation before round 1 taken from {self.cfg.eval.initial_evaluation} (the same "
                  "initial weights, held-out episodes, settings, sources and libraries; not played again)", flush=True)
            return {**self.reused[0], "seconds": 0.0}
        if server_round == 0:
            self.initial_identity = self.evaluation_identity(arrays)
        self.load_global(arrays)
        return self.evaluator.evaluate(server_round)

    def checkpoint(self, reporter: RunReporter, server_round: int) -> None:
        if self.peft_model is not None:  # a PEFT adapter folder
            save_adapter(self.peft_model, reporter.run_dir / "checkpoints" / f"round-{server_round:04d}", self.agent.tokenizer,
                         base_model=self.cfg.model)
        else:
            reporter.checkpoint(server_round, self.agent.model, self.agent.tokenizer)

    def after_evaluation(self, reporter: RunReporter, server_round: int, metrics: dict[str, float]) -> None:
        self.checkpoint(reporter, server_round)  # the round's console line is federation.py's
        episodes = reporter.run_dir / "episodes" / f"round-{server_round:04d}.json"
        if server_round == 0 and self.reused is not None:  # the source run's record, saying where it came from
            write_json_atomic(episodes, self.reused[1] | {"taken-from": self.cfg.eval.initial_evaluation})
            transcript = Path(self.cfg.eval.initial_evaluation).expanduser() / "episodes" / "round-0000.txt"
            if transcript.is_file():
                atomic_write_text(episodes.with_suffix(".txt"), transcript.read_text())
        elif self.evaluator.last_trajectories:
            # every episode's outcome, so two evaluations of a run compare room by room without playing them again
            # (python -m fedagent_flwr.experiments.paired_rounds); the first also says what it depends on, so that a
            # later run from the same weights may take it (eval.initial-evaluation)
            record = evaluation_record(self.evaluator.last_trajectories, server_round, self.cfg)
            if server_round == 0:
                record[IDENTITY] = self.initial_identity
            write_json_atomic(episodes, record)
        if self.cfg.eval.transcripts and self.evaluator.last_trajectories:
            path = write_transcripts(reporter.run_dir / "episodes" / f"round-{server_round:04d}.txt",
                                     self.evaluator.last_trajectories, self.cfg.eval.transcripts,
                                     header=f"held-out episodes after round {server_round} (model {self.cfg.model}, "
                                            f"eval.temperature {self.cfg.eval.temperature:g})")
            reporter.text("episodes", path.read_text(), server_round)
            print(f"[fedagent] round {server_round} example: {short_example(self.evaluator.last_trajectories)} "
                  f"(more: {path})", flush=True)
        if is_multi_spec(self.cfg.env):
            print(f"[fedagent] round {server_round} per environment: {format_row(metrics, env_names(self.cfg.env))}", flush=True)

    def summary(self, history: dict[int, dict[str, float]], strategy: Strategy) -> dict[str, Any]:
        cfg, final = self.cfg, max(history)
        out = {
            "initial_success_rate": history[0]["success_rate"],
            "final_success_rate": history[final]["success_rate"],
            "initial": history[0],
            "final": history[final],
            "clients_per_round": strategy.clients_per_round,  # fedse-lora sets its own (fedse.fraction-train)
            "model": cfg.model,
            "model_source": self.agent.spec.source,
            "env": cfg.env,
        }
        if is_multi_spec(cfg.env):
            out.update(environment_table(history[0], history[final], env_names(cfg.env)))
        return out

    def report(self, reporter: RunReporter, history: dict[int, dict[str, float]], strategy: Strategy,
               summary: dict[str, Any]) -> None:
        final = max(history)
        if is_multi_spec(self.cfg.env):
            order = env_names(self.cfg.env)
            for label, r in (("before round 1", 0), (f"after round {final}", final)):
                print(f"[fedagent] held-out success per environment, {label}: {format_row(history[r], order)}", flush=True)
        if "mean_score" in history[final]:  # environments with a task score of their own (WebShop)
            print(f"[fedagent] held-out task score: before round 1 {history[0].get('mean_score', float('nan')):.3f} -> "
                  f"after round {final} {history[final]['mean_score']:.3f}", flush=True)
        print(f"[fedagent] held-out success: before round 1 {summary['initial_success_rate']:.3f} -> "
              f"after round {final} {summary['final_success_rate']:.3f}; summary: {reporter.run_dir / 'summary.json'}",
              flush=True)

    def client_fingerprint(self, partition_id: int, num_partitions: int, load_agent: AgentLoader) -> str:
        return load_agent().base_fingerprint


class FedAgent(LanguageAgentMethod):
    """FedAgentAvg on the full weights or on a LoRA adapter, clients training with GRPO."""

    def make_strategy(self, node_of_partition: Mapping[int, int]) -> Strategy:
        cfg = self.cfg
        return FedAgentAvg(node_of_partition, clients_per_round=cfg.clients_per_round, seed=cfg.seed, min_replies=cfg.federation.min_replies,
                           transfer_dtype=cfg.federation.transfer_dtype, client_sampling=cfg.federation.client_sampling)

    def carried_optimizer(self, context: Context) -> dict[str, np.ndarray] | None:
        """The AdamW state a client continues from (None: a fresh optimizer each round, as a FedAgent client starts
        from the broadcast global model). The single-learner baselines override it."""
        return None

    def train(self, msg: Message, context: Context, partition_id: int, num_partitions: int,
              load_agent: AgentLoader) -> Message:
        cfg = self.cfg
        sent = decode(msg.content.array_records["arrays"], cfg.federation.transfer_dtype)
        tasks = learner_tasks(cfg, partition_id, num_partitions)
        server_round = int(msg.content.config_records["config"]["server-round"])
        optimizer = self.carried_optimizer(context)
        if cfg.engine.ranks_per_client > 1:  # the client's ranks, each in a process of its own (methods/ranked_round.py)
            trained, metrics = train_on_ranks(cfg, sent, tasks, server_round, partition_id, optimizer)
        else:
            trained, metrics = local_round(cfg, load_agent(), sent, tasks, server_round, partition_id, optimizer)
        if optimizer is not None:  # kept on the client (Flower's per-node state), never sent
            context.state[OPTIMIZER_STATE] = ArrayRecord({k: Array(np.ascontiguousarray(v)) for k, v in optimizer.items()})
        metrics["update_norm"] = update_norm(trained, sent)  # what a DP clipping norm is compared with
        return Message(RecordDict({"arrays": encode(trained, cfg.federation.transfer_dtype), "metrics": MetricRecord(metrics)}), reply_to=msg)


def evaluation_record(trajectories, server_round: int, cfg: RunConfig) -> dict[str, Any]:
    """One evaluation's episodes as plain data: task, category, won, reward and steps of each, in play order."""
    return {"round": server_round, "env": cfg.env, "model": cfg.model, "seed": cfg.seed,
            "eval.temperature": cfg.eval.temperature, "eval.samples-per-task": cfg.eval.samples_per_task,
            "episodes": [{"task": t.task.id, "category": t.task.category, "won": bool(t.won),
                          "reward": float(t.reward), "steps": len(t.steps)} for t in trajectories]}
