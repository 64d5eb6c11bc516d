#!/usr/bin/env python
"""What a client's round on N ranks costs beyond its training: ranks kept between rounds against ranks started anew.

A client with `engine.ranks-per-client = N` answers each round through its ranks (agent/fsdp/launch.py's RankPool). Kept,
they were started (a fresh interpreter each, torch and transformers imported, the process group joined, the model
loaded and sharded) once, in the client's first round; started anew, every round pays for all of that again. Both
variants train the same round (the run config's initial weights, partition 0's tasks, the same server round) and
alternate round by round, so drift in the machine falls on both. Per round: the wall time of `train_on_ranks`, the
seconds the ranks spent training inside it (the round's own `seconds` metric), and the rest, the overhead. Printed:
each variant's overhead over rounds 2.. (mean and standard error), the kept ranks' first round, the ratio,
and the kept ranks' peak resident memory.

    python benchmarks/rank_rounds.py --rounds 4                      # the default job's model and settings, 2 ranks
    python benchmarks/rank_rounds.py --run-config configs/smollm2-fedagent-cpu.toml --set engine.ranks-per-client=2 --rounds 3

With `--json` (one JSON line) under `python benchmarks/raw_output.py run OUT.json -- ...` the result is kept with the
machine, versions and commit it ran on (benchmarks/results/README.md).
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from fedagent_flwr.agent.fsdp.launch import RankPool, backend_for
from fedagent_flwr.agent.models.loading import load_agent
from fedagent_flwr.agent.models.pretrained import pick_device
from fedagent_flwr.agent.training.lora import adapter_to_arrays, attached_lora
from fedagent_flwr.agent.training.weights import model_to_arrays
from fedagent_flwr.config import RunConfig
from fedagent_flwr.methods.placement import run_base_dtype
from fedagent_flwr.methods.ranked_round import train_on_ranks
from fedagent_flwr.methods.tasks import learner_tasks
from fedagent_flwr.simulation import parse_overrides, read_run_config_file


def timed_round(cfg: RunConfig, pool: RankPool, sent, tasks, server_round: int) -> dict[str, float]:
    started = time.perf_counter()
    _, metrics = train_on_ranks(cfg, sent, tasks, server_round, 0, pool=pool)
    wall = time.perf_counter() - started
    return {"wall_s": wall, "training_s": metrics["seconds"], "overhead_s": wall - metrics["seconds"]}


def status_mib(pid: int | str, field: str = "VmHWM") -> float:
    """A field of a running process's /proc/PID/status (VmHWM: its peak resident memory, VmRSS: now), in MiB."""
    for line in open(f"/proc/{pid}/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-config", default=None, help="a run-config TOML (default: the app's defaults)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a run-config value over it")
    parser.add_argument("--rounds", type=int, default=4, help="rounds per variant (at least 2)")
    parser.add_argument("--json", action="store_true", help="one JSON line on stdout")
    args = parser.parse_args()
    values = {"engine.ranks-per-client": 2} | (read_run_config_file(args.run_config) if args.run_config else {})
    try:
        cfg = RunConfig.from_run_config(values | parse_overrides(args.set))
    except ValueError as err:
        parser.error(str(err))
    values |= parse_overrides(args.set)
    if cfg.engine.ranks_per_client < 2 or args.rounds < 2:
        parser.error(f"engine.ranks-per-client={cfg.engine.ranks_per_client} and --rounds {args.rounds}: both must be at least 2")
    agent = load_agent(cfg.model, cfg.env, "cpu", run_base_dtype(cfg))
    if cfg.grpo.finetuning == "lora":
        with attached_lora(agent.model, cfg.lora, seed=cfg.seed) as peft_model:
            sent = adapter_to_arrays(peft_model)
    else:
        sent = model_to_arrays(agent.model)
    tasks = learner_tasks(cfg, 0, cfg.num_clients or 2)  # num-clients 0: one per SuperNode, the default job's 2
    backend = backend_for(pick_device(cfg.device))
    rounds: dict[str, list[dict[str, float]]] = {"kept": [], "new": []}
    deadlines = {"timeout_s": cfg.federation.round_timeout, "collective_timeout_s": cfg.engine.rank_timeout_s or None}
    with RankPool(cfg.engine.ranks_per_client, backend, **deadlines) as kept:
        for r in range(1, args.rounds + 1):
            for variant in (("kept", "new") if r % 2 else ("new", "kept")):
                if variant == "kept":
                    rounds["kept"].append(timed_round(cfg, kept, sent, tasks, r))
                else:
                    with RankPool(cfg.engine.ranks_per_client, backend, **deadlines) as fresh:
                        rounds["new"].append(timed_round(cfg, fresh, sent, tasks, r))
        peak_mb = [status_mib(p.pid) for p in kept.processes]  # the kept ranks' high-water mark over every round
    later = {v: np.array([x["overhead_s"] for x in rounds[v][1:]]) for v in rounds}
    se = {v: float(later[v].std(ddof=1) / np.sqrt(len(later[v]))) if len(later[v]) > 1 else float("nan") for v in later}
    result = {
        "settings": {"rounds": args.rounds, "ranks": cfg.engine.ranks_per_client, "model": cfg.model, "env": cfg.env,
                     "finetuning": cfg.grpo.finetuning, "run_config": values},
        "rounds": rounds,
        "overhead_later_rounds_s": {v: {"mean": float(later[v].mean()), "se": se[v]} for v in later},
        "kept_first_round_overhead_s": rounds["kept"][0]["overhead_s"],
        "kept_rank_peak_rss_mb": peak_mb,
        "overhead_ratio_new_over_kept": float(later["new"].mean() / later["kept"].mean()),
    }
    for v in ("kept", "new"):
        walls = " ".join(f"{x['wall_s']:.1f}" for x in rounds[v])
        print(f"{v:>4}: round walls {walls} s; overhead over rounds 2..{args.rounds}: "
              f"{later[v].mean():.2f} +- {se[v]:.2f} s", flush=True)
    print(f"kept ranks' first round overhead {result['kept_first_round_overhead_s']:.2f} s; ranks started anew spend "
          f"{result['overhead_ratio_new_over_kept']:.1f}x the overhead of kept ranks in a later round; kept ranks' peak "
          f"RSS {', '.join(f'{m:.0f}' for m in peak_mb)} MiB", flush=True)
    if args.json:
        print(json.dumps(result))


if __name__ == "__main__":
    main()
