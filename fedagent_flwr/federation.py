"""The one server loop, for every method: meet the clients, keep the run folder, run the strategy, report.

    claim the run folder (and check a resumed run's saved state) -> load what the server needs
    -> wait for the SuperNodes -> handshake (partition-ids, fingerprints) -> check the federation
    -> config.json -> strategy (DP-wrapped if asked; resumed if asked)
    -> Flower's Strategy.start() with an evaluate_fn that logs, evaluates, checkpoints and saves state
    -> summary.json from the Result

A method (fedagent_flwr/methods/) supplies only what differs: what the clients must share, the
strategy, the initial arrays, how the global model is evaluated and what the summary holds.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from flwr.app import (
    ConfigRecord,
    Context,
    Message,
    MessageType,
    MetricRecord,
    RecordDict,
)
from flwr.serverapp import Grid

from fedagent_flwr.config import RunConfig
from fedagent_flwr.methods import Method, method_for
from fedagent_flwr.privacy.differential_privacy import with_differential_privacy
from fedagent_flwr.privacy.secure_aggregation import (
    SecureFedAgentAvg,
    run_secure_rounds,
)
from fedagent_flwr.runs.reporting import round_line, trimmed_flower_log
from fedagent_flwr.runs.resume import (
    ServerState,
    check_resumable_config,
    read_state,
    restore,
    resumable,
    save_state,
)
from fedagent_flwr.runs.provenance import record_start
from fedagent_flwr.runs.run_folder import claim_run_folder


def run_federation(grid: Grid, cfg: RunConfig, context: Context | None = None) -> dict[str, Any]:
    """Run a whole federated job; returns (and writes) its summary."""
    method = method_for(cfg)
    started = time.time()
    # Before any model is loaded: the run folder (never another run's), and a resumed run's state and config.
    run_dir = claim_run_folder(cfg.output_path, cfg.run_name, cfg.resume, f"{cfg.env.replace(',', '+')}-{method.run_label()}")
    saved, saved_config = None, {}
    if cfg.resume:
        saved, saved_config = read_state(run_dir)
        check_resumable_config(saved_config, cfg.to_run_config(), ignore=("resolved-num-clients",))
        if saved.server_round >= cfg.num_server_rounds:
            raise ValueError(f"resume=true: {run_dir} already completed round {saved.server_round} of "
                             f"num-server-rounds={cfg.num_server_rounds}; raise num-server-rounds to train further")
    method.prepare()
    try:
        return _run(grid, cfg, context, method, started, run_dir, saved, saved_config)
    finally:
        method.close()


def _run(grid: Grid, cfg: RunConfig, context: Context | None, method: Method, started: float, run_dir: Path,
         saved: ServerState | None, saved_config: dict[str, Any]) -> dict[str, Any]:
    nodes = wait_for_nodes(grid, cfg.num_clients)
    fingerprint = method.fingerprint(cfg.num_clients or len(nodes))
    node_of_partition = handshake(grid, nodes, fingerprint, cfg.federation.round_timeout)
    num_clients = cfg.check_federation(len(node_of_partition))
    method.check_federation(num_clients)
    state_config = cfg.to_run_config() | {"resolved-num-clients": num_clients}
    if saved is not None:
        check_resumable_config(saved_config, state_config)  # now with the federation's size

    reporter = method.reporter(run_dir)
    reporter.write_config(state_config | method.config_facts())  # a resume only gets here once accepted
    record_start(reporter.run_dir, resumed=saved is not None)  # provenance.json: command, commit, machine
    method.announce(reporter.run_dir, num_clients)

    try:  # the tracker's run is closed (flushed, finished) whether the run succeeds or fails
        strategy = method.make_strategy(node_of_partition)
        initial_arrays = method.initial_arrays()
        # The server's full state is saved after every round; resume=true continues from it (runs/resume.py).
        history: dict[int, dict[str, float]] = {}  # evaluations before a resume; the Result holds the rest
        done = 0
        if saved is not None:
            restore(saved, strategy)
            reporter.rows, history, initial_arrays, done = saved.rows, saved.history, saved.arrays, saved.server_round
            reporter.resume_clients(done)
            print(f"[fedagent] resuming {reporter.run_dir} after round {done}", flush=True)

        def evaluate_fn(server_round: int, arrays) -> MetricRecord | None:
            row: dict[str, float] = {"round": server_round, **method.row_facts(server_round)}
            for key, value in (strategy.last_train_metrics(server_round) or {}).items():
                row[f"train/{key}"] = value
            metrics = None
            if method.evaluation_due(server_round):
                metrics = method.evaluate(server_round, arrays)
                row.update({f"eval/{k}": v for k, v in metrics.items()})
                method.after_evaluation(reporter, server_round, metrics)
            # Read after the evaluation: the round line's "seconds so far" then include it (they once said 9 s
            # for a round 0 whose evaluation took 368 s, and charged that time to round 1).
            row["elapsed_seconds"] = round(time.time() - started, 1)
            reporter.log(row)
            reporter.log_clients(server_round, strategy.client_train_metrics(server_round))
            reporter.prune_checkpoints(cfg.eval.save_total_limit)
            print(round_line(row, strategy.sampled.get(server_round)), flush=True)
            method.after_round(reporter, server_round, arrays)
            if cfg.traits.resume:
                save_state(reporter.run_dir, state_config, server_round, arrays, strategy, reporter.rows, evaluations(reporter.rows))
            return MetricRecord(metrics) if metrics else None

        train_config = ConfigRecord({"fingerprint": fingerprint})
        if cfg.privacy.secure_aggregation:  # Flower's SecAgg+ runs in its legacy workflow, which returns no Result
            if context is None:
                raise ValueError("privacy.secure-aggregation=true needs the ServerApp's Context (Flower's legacy workflow)")
            run_secure_rounds(grid, context, SecureFedAgentAvg(strategy, initial_arrays, train_config, evaluate_fn),
                              cfg.num_server_rounds, cfg.federation.round_timeout, cfg.privacy.secagg_shares_fraction,
                              cfg.privacy.secagg_threshold_fraction, cfg.privacy.secagg_clipping_range)
            history = evaluations(reporter.rows)
        else:
            # The DP wrapper screens, clips and noises the replies; `strategy` keeps the bookkeeping read below.
            private = with_differential_privacy(strategy, cfg.privacy.dp_mode, cfg.privacy.noise_multiplier, cfg.privacy.clipping_norm,
                                                strategy.clients_per_round)
            with trimmed_flower_log():  # the round lines and the summary below say it in the project's words
                result = resumable(private, done).start(grid=grid, initial_arrays=initial_arrays,
                                                        num_rounds=cfg.num_server_rounds, timeout=cfg.federation.round_timeout,
                                                        train_config=train_config, evaluate_fn=evaluate_fn)
            # A resumed strategy counts its rounds from 1 again: shift them back to the run's rounds.
            history |= {r + done: dict(m) for r, m in result.evaluate_metrics_serverapp.items()}
        summary = {
            "run_dir": str(reporter.run_dir),
            "rounds": cfg.num_server_rounds,
            "clients": num_clients,
            "sampled_clients": {str(r): p for r, p in strategy.sampled.items()},
            "failed_replies": {str(r): f for r, f in strategy.failures.items() if f},
            **method.summary(history, strategy),
            "seconds": round(time.time() - started, 1),
        }
        reporter.write_summary(summary)
        method.report(reporter, history, strategy, summary)
    finally:
        reporter.close()
    return summary


def evaluations(rows: list[dict[str, Any]]) -> dict[int, dict[str, float]]:
    """round -> the metrics of that round's evaluation, read back from the logged rows."""
    return {int(r["round"]): {k[len("eval/"):]: v for k, v in r.items() if k.startswith("eval/")}
            for r in rows if any(k.startswith("eval/") for k in r)}


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
    """Ask every node its partition-id and fingerprint; map partition-id -> node id.

    A node whose base weights (or RL problem) differ from the server's would silently train
    something else (and, with adapters, aggregate nonsense): stop before round 1.
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
                f"vs the server's {fingerprint[:12]}); every node must load the same model files in the same dtype "
                "(precision='auto' takes bf16-base on a CPU whose probe finds bf16 faster and fp32 on another: a "
                "federation of different processors sets precision)"
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
