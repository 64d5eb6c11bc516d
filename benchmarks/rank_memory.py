#!/usr/bin/env python
"""Each CPU rank's peak resident memory in a client's round against the memory plan of a rank (ranks-per-client = N).

The plan counts what the model and the round hold (a rank's shards, the whole weights gathered to decode, AdamW's
moments, the KV cache, logits and activations, the larger of the rollout and the update: agent/engine/memory.py).
The process's own memory is not in it (the interpreter, torch, transformers, the tokenizer): each rank measures that
first, once the round's code is imported and the tokenizer loaded, before any model is built. Then one round runs
(the run config's initial weights, partition 0's tasks), and each rank's peak (VmHWM) less that baseline is compared
with the plan's total.

    python benchmarks/rank_memory.py                                  # the default job's model and settings, 2 ranks
    python benchmarks/rank_memory.py --run-config configs/smollm2-fedagent-cpu.toml --set ranks-per-client=2 \
        --set tasks-per-epoch=2

With `--json` (one JSON line) under `python benchmarks/raw_output.py run OUT.json -- ...` the result is kept with the
machine, versions and commit it ran on (benchmarks/results/README.md).
"""

from __future__ import annotations

import argparse
import json

from fedagent_flwr.agent.engine.memory import GB, ModelShape
from fedagent_flwr.agent.fsdp.launch import RankPool, backend_for
from fedagent_flwr.agent.fsdp.ranks import Ranks
from fedagent_flwr.agent.models.loading import load_agent
from fedagent_flwr.agent.models.pretrained import load_tokenizer, pick_device, resolve_model
from fedagent_flwr.agent.training.lora import adapter_to_arrays, attached_lora
from fedagent_flwr.agent.training.weights import model_to_arrays
from fedagent_flwr.config import RunConfig
from fedagent_flwr.methods.memory import memory_plan
from fedagent_flwr.methods.placement import process_placement
from fedagent_flwr.methods.ranked_round import train_on_ranks
from fedagent_flwr.methods.tasks import learner_tasks
from fedagent_flwr.simulation import parse_overrides, read_run_config_file
from rank_rounds import status_mib  # benchmarks/ is the script's own folder

MIB = 1024**2


def baseline(rank: int, world: int, tensors: dict, model: str, env: str):
    """A rank's resident memory with the round's code imported and the tokenizer loaded, before any model (a target
    of the rank pool: every rank's, on rank 0)."""
    load_tokenizer(resolve_model(model, env))
    return {}, {"rss_mib": Ranks(rank, world).gather({str(rank): status_mib("self", "VmRSS")})}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-config", default=None, help="a run-config TOML (default: the app's defaults)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a run-config value over it")
    parser.add_argument("--json", action="store_true", help="one JSON line on stdout")
    args = parser.parse_args()
    values = {"ranks-per-client": 2} | (read_run_config_file(args.run_config) if args.run_config else {})
    values |= parse_overrides(args.set)
    try:
        cfg = RunConfig.from_run_config(values)
    except ValueError as err:
        parser.error(str(err))
    if cfg.ranks_per_client < 2 or pick_device(cfg.device).type != "cpu":
        parser.error(f"ranks-per-client={cfg.ranks_per_client}, device={cfg.device}: CPU ranks, at least 2")
    agent = load_agent(cfg.model, cfg.env, "cpu", cfg.base_dtype())  # this process's: the sent weights and the plan
    tasks = learner_tasks(cfg, 0, cfg.num_clients or 2)  # num-clients 0: one per SuperNode, the default job's 2
    if cfg.finetuning == "lora":
        with attached_lora(agent.model, cfg.lora_spec(), seed=cfg.seed) as peft_model:
            sent = adapter_to_arrays(peft_model)
            placement = process_placement(cfg, agent, tasks, model=peft_model)
    else:
        sent = model_to_arrays(agent.model)
        placement = process_placement(cfg, agent, tasks)
    plan = memory_plan(cfg, ModelShape.of(agent.model.config), placement.context_tokens, placement,
                       placement.rollout_rows)
    with RankPool(cfg.ranks_per_client, backend_for(pick_device(cfg.device)), cfg.rank_timeout_s) as pool:
        _, info = pool.run(baseline, {}, cfg.model, cfg.env)
        _, metrics = train_on_ranks(cfg, sent, tasks, 1, 0, pool=pool)
        peaks = [status_mib(p.pid, "VmHWM") for p in pool.processes]
    base = [info["rss_mib"][str(r)] for r in range(cfg.ranks_per_client)]
    ranks = [{"baseline_mib": b, "peak_mib": p, "round_mib": p - b, "over_plan": (p - b) * MIB / plan.total}
             for b, p in zip(base, peaks)]
    result = {"settings": {"ranks": cfg.ranks_per_client, "model": cfg.model, "env": cfg.env,
                           "finetuning": cfg.finetuning, "precision": placement.precision, "run_config": values},
              "plan": plan.as_dict(), "plan_mib": plan.total / MIB, "ranks": ranks,
              "episodes": metrics.get("episodes")}
    print(plan.table().replace(f"{plan.who}:", f"{plan.who} (plan, {plan.total / GB * 1024:.0f} MiB):"), flush=True)
    for r, x in enumerate(ranks):
        print(f"rank {r}: {x['baseline_mib']:.0f} MiB before the model, peak {x['peak_mib']:.0f} MiB: the round "
              f"{x['round_mib']:.0f} MiB against a plan of {plan.total / MIB:.0f} MiB ({x['over_plan']:.2f}x)", flush=True)
    if args.json:
        print(json.dumps(result))


if __name__ == "__main__":
    main()
