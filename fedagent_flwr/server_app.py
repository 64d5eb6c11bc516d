"""ServerApp: validate the config, meet the clients, run the strategy, evaluate and report."""

from __future__ import annotations

import logging
import time
from datetime import datetime

from flwr.app import ConfigRecord, Context, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp import Grid, ServerApp

from envs import env_names, is_multi_spec, make_env
from envs.multi import per_env_spread
from strategies import make_strategy
from strategies.differential_privacy import with_differential_privacy
from strategies.single_learner import SingleLearner

from .agent import load_agent
from .assignment import all_partitions, baseline_learner
from .config import FEDRL_STRATEGIES, RunConfig
from .evaluation import GlobalEvaluator
from .local_training import rollout_config
from .multi_env import environment_table, format_row
from .reporting import RunReporter
from .resume import load_state, restore, resumable, save_state
from .weights import arrays_to_model, model_to_arrays

log = logging.getLogger(__name__)
app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    cfg = RunConfig.from_run_config(dict(context.run_config))  # fails fast on bad input
    run_federation(grid, cfg, context)


def run_federation(grid: Grid, cfg: RunConfig, context: Context | None = None) -> dict:
    if cfg.strategy in FEDRL_STRATEGIES:  # QAvg / PAvg train RL tables or networks: no LLM to load
        from .fedrl_server import run_fedrl

        return run_fedrl(grid, cfg)
    started = time.time()
    agent = load_agent(cfg.model, cfg.env, cfg.device)  # builds a tiny model first if needed
    nodes = wait_for_nodes(grid, cfg.num_clients)
    node_of_partition = handshake(grid, nodes, agent.base_fingerprint, cfg.round_timeout)
    num_clients = cfg.check_federation(len(node_of_partition))
    all_partitions(cfg, num_clients)  # an infeasible partition (or bad success labels) stops the run before round 1

    run_name = cfg.run_name or f"{cfg.env.replace(',', '+')}-{cfg.strategy}-{datetime.now():%Y%m%d-%H%M%S}"
    reporter = RunReporter(cfg.output_path / run_name)
    reporter.write_config(cfg.to_run_config() | {"resolved-num-clients": num_clients, "model-source": agent.spec.source})
    print(f"[fedagent] run folder: {reporter.run_dir}", flush=True)

    env = make_env(cfg.env, cfg.max_steps)
    eval_tasks = per_env_spread(env.tasks_of_split("test"), cfg.eval_tasks)  # a multi-env spec: eval-tasks per env
    evaluator = GlobalEvaluator(agent.model, agent.tokenizer, lambda: make_env(cfg.env, cfg.max_steps), eval_tasks,
                                rollout_config(cfg, evaluation=True), cfg.eval_samples_per_task, cfg.seed)
    fedse = None
    if cfg.baseline != "none":  # Centralized / Local(k): one learner per round, same rounds and epochs
        strategy = SingleLearner(node_of_partition, learner=baseline_learner(cfg), seed=cfg.seed)
    elif cfg.strategy == "fedse-lora":  # the global model is a LoRA adapter on the frozen base (fedse_server.py)
        from .fedse_server import FedSEGlobal

        fedse = FedSEGlobal(cfg, agent)
        strategy = fedse.make_strategy(node_of_partition)
    else:
        strategy = make_strategy(cfg.strategy, node_of_partition=node_of_partition, clients_per_round=cfg.clients_per_round,
                                 seed=cfg.seed, min_replies=cfg.min_replies)
    history: dict[int, dict[str, float]] = {}
    # The server's full state is saved after every round; resume=true continues from it (resume.py).
    state_config = cfg.to_run_config() | {"resolved-num-clients": num_clients}
    initial_arrays = fedse.initial_arrays() if fedse else model_to_arrays(agent.model)
    done = 0
    if cfg.resume:
        saved = load_state(reporter.run_dir, state_config)
        if saved.server_round >= cfg.num_server_rounds:
            raise ValueError(f"resume=true: {reporter.run_dir} already completed round {saved.server_round} of "
                             f"num-server-rounds={cfg.num_server_rounds}; raise num-server-rounds to train further")
        restore(saved, strategy)
        reporter.rows, history, initial_arrays, done = saved.rows, saved.history, saved.arrays, saved.server_round
        print(f"[fedagent] resuming {reporter.run_dir} after round {done}", flush=True)

    def evaluate_fn(server_round: int, arrays) -> MetricRecord | None:
        row: dict[str, float] = {"round": server_round, "elapsed_seconds": round(time.time() - started, 1)}
        for key, value in (strategy.last_train_metrics(server_round) or {}).items():
            row[f"train/{key}"] = value
        due = server_round == 0 or server_round % cfg.eval_every == 0 or server_round == cfg.num_server_rounds
        metrics = None
        if due:
            fedse.load(arrays) if fedse else arrays_to_model(agent.model, arrays)
            metrics = evaluator.evaluate(server_round)
            history[server_round] = metrics
            row.update({f"eval/{k}": v for k, v in metrics.items()})
            if fedse:  # a PEFT adapter folder
                fedse.checkpoint(reporter.run_dir, server_round)
            else:
                reporter.checkpoint(server_round, agent.model, agent.tokenizer)
            print(f"[fedagent] round {server_round}: held-out success {metrics['success_rate']:.3f} "
                  f"({int(metrics['episodes'])} episodes)", flush=True)
            if is_multi_spec(cfg.env):
                print(f"[fedagent] round {server_round} per environment: {format_row(metrics, env_names(cfg.env))}", flush=True)
        reporter.log(row)
        save_state(reporter.run_dir, state_config, server_round, arrays, strategy, reporter.rows, history)
        return MetricRecord(metrics) if metrics else None

    train_config = ConfigRecord({"fingerprint": agent.base_fingerprint})
    if cfg.secure_aggregation:  # Flower's SecAgg+ runs in its legacy workflow (secure_aggregation.py)
        from .secure_aggregation import SecureFedAgentAvg, run_secure_rounds

        if context is None:
            raise ValueError("secure-aggregation=true needs the ServerApp's Context (Flower's legacy workflow)")
        run_secure_rounds(grid, context, SecureFedAgentAvg(strategy, initial_arrays, train_config, evaluate_fn),
                          cfg.num_server_rounds, cfg.round_timeout, cfg.secagg_shares_fraction,
                          cfg.secagg_threshold_fraction, cfg.secagg_clipping_range)
    else:
        # The DP wrapper screens, clips and noises the replies; `strategy` keeps the bookkeeping read below.
        private = with_differential_privacy(strategy, cfg.dp_mode, cfg.dp_noise_multiplier, cfg.dp_clipping_norm,
                                            strategy.clients_per_round)
        resumable(private, done).start(
            grid=grid,
            initial_arrays=initial_arrays,
            num_rounds=cfg.num_server_rounds,
            timeout=cfg.round_timeout,
            train_config=train_config,
            evaluate_fn=evaluate_fn,
        )
    final_round = max(history)
    summary = {
        "run_dir": str(reporter.run_dir),
        "initial_success_rate": history[0]["success_rate"],
        "final_success_rate": history[final_round]["success_rate"],
        "initial": history[0],
        "final": history[final_round],
        "rounds": cfg.num_server_rounds,
        "clients": num_clients,
        "clients_per_round": cfg.clients_per_round,
        "sampled_clients": {str(r): p for r, p in strategy.sampled.items()},
        "failed_replies": {str(r): f for r, f in strategy.failures.items() if f},
        "model": cfg.model,
        "model_source": agent.spec.source,
        "env": cfg.env,
        "seconds": round(time.time() - started, 1),
    }
    if is_multi_spec(cfg.env):
        order = env_names(cfg.env)
        summary.update(environment_table(history[0], history[final_round], order))
        for label, r in (("before round 1", 0), (f"after round {final_round}", final_round)):
            print(f"[fedagent] held-out success per environment, {label}: {format_row(history[r], order)}", flush=True)
    reporter.write_summary(summary)
    if "mean_score" in history[final_round]:  # environments with a task score of their own (WebShop)
        print(f"[fedagent] held-out task score: before round 1 {history[0].get('mean_score', float('nan')):.3f} -> "
              f"after round {final_round} {history[final_round]['mean_score']:.3f}", flush=True)
    print(f"[fedagent] held-out success: before round 1 {summary['initial_success_rate']:.3f} -> "
          f"after round {final_round} {summary['final_success_rate']:.3f}; summary: {reporter.run_dir / 'summary.json'}",
          flush=True)
    return summary


def wait_for_nodes(grid: Grid, expected: int, timeout: float = 120.0) -> list[int]:
    """Node ids once `expected` nodes (or, with expected=0, a stable set) have connected."""
    deadline, last, stable_since = time.time() + timeout, None, time.time()
    while time.time() < deadline:
        nodes = sorted(grid.get_node_ids())
        if nodes and expected and len(nodes) >= expected:
            return nodes
        if nodes != last:
            last, stable_since = nodes, time.time()
        elif nodes and not expected and time.time() - stable_since >= 3.0:
            return nodes
        time.sleep(0.5)
    raise RuntimeError(f"only {len(last or [])} SuperNode(s) connected within {timeout:.0f} s (expected {expected or 'at least 1'})")


def handshake(grid: Grid, nodes: list[int], fingerprint: str, timeout: float) -> dict[int, int]:
    """Ask every node its partition-id and base-model fingerprint; map partition-id -> node id.

    A node whose base weights differ from the server's would silently train a
    different model (and, with adapters, aggregate nonsense): stop before round 1.
    """
    messages = [
        Message(content=RecordDict({"config": ConfigRecord({"fingerprint": fingerprint})}),
                message_type=MessageType.QUERY, dst_node_id=n)
        for n in nodes
    ]
    node_of_partition: dict[int, int] = {}
    problems = []
    answered = set()
    for reply in grid.send_and_receive(messages, timeout=timeout):
        node = reply.metadata.src_node_id
        answered.add(node)
        if reply.has_error():
            problems.append(f"node {node} failed the handshake: {reply.error.reason}")
            continue
        info = reply.content.config_records["info"]
        pid = int(info["partition-id"])
        if info["fingerprint"] != fingerprint:
            problems.append(
                f"node {node} (partition {pid}) holds different base weights (fingerprint {str(info['fingerprint'])[:12]} "
                f"vs the server's {fingerprint[:12]}); every node must load the same model files"
            )
        if pid in node_of_partition:
            problems.append(f"partition-id {pid} is claimed by nodes {node_of_partition[pid]} and {node}")
        node_of_partition[pid] = node
    silent = sorted(set(nodes) - answered)
    if silent:
        problems.append(f"node(s) {silent} did not answer the handshake within {timeout:.0f} s")
    if problems:
        raise RuntimeError("client handshake failed:\n  " + "\n  ".join(problems))
    expected = list(range(len(node_of_partition)))
    if sorted(node_of_partition) != expected:
        raise RuntimeError(f"partition-ids must be 0..{len(node_of_partition) - 1}, got {sorted(node_of_partition)}")
    return node_of_partition

