#!/usr/bin/env python
"""Each CPU rank's peak resident memory in a client's round against the memory plan of a rank (engine.ranks-per-client = N).

The plan counts what the model and the round hold (a rank's shards, the whole weights gathered to decode, AdamW's
moments, the KV cache, logits and activations, the larger of the rollout and the update: agent/engine/memory.py).
The process's own memory is not in it (the interpreter, torch, transformers, the model's code, the tokenizer): each rank
measures that first, once the round's code is imported and the tokenizer loaded, before any model is built. Then one round runs
(the run config's initial weights, partition 0's tasks), and each rank's peak (VmHWM) less that baseline is compared
with two plans:
- the run's plan (what placement checks against the memory given): every pass at the longest context the tasks allow,
  the rollout at rollout.generation-batch-size rows, every rank as loaded as the busiest;
- the rank's own plan: the same planner given what that rank ran, as the round recorded it: the longest sample it
  trained (prompt and completion), the episodes it played at once, the rows of its largest update pass (1 where it ran
  only spare passes) and of its largest no-grad log-prob pass. This one says whether the planner counts what a pass
  holds; the run's plan is an upper bound on it.
Each phase is measured apart (the peak reset through /proc/self/clear_refs where it starts): the rollout against the
plan's decode peak, the update against its update peak.

Resident memory counts file-backed pages too: the libraries' code a rank runs for the first time (libtorch's kernels,
the generation code), and the model files it maps from disk. They are the page cache's, shared by every process that
maps them and dropped under pressure, and the plan does not count them. A segment's private peak is therefore its peak
less the file-backed pages resident when it starts (and, at least, less those resident when it ends: they only grow
within a segment, so the true value lies between), against the baseline's private memory. Memory files on tmpfs
(the round's weights the ranks map) stay counted: they cannot be dropped.

    python benchmarks/rank_memory.py                                  # the default job's model and settings, 2 ranks
    python benchmarks/rank_memory.py --run-config configs/smollm2-fedagent-cpu.toml --set grpo.tasks-per-epoch=2
    python benchmarks/rank_memory.py --set engine.ranks-return-memory=true   # ranks that give what they free back

With `--json` (one JSON line) under `python benchmarks/raw_output.py run OUT.json -- ...` the result is kept with the
machine, versions and commit it ran on (benchmarks/results/README.md).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from fedagent_flwr.agent.engine.memory import ModelShape
from fedagent_flwr.agent.fsdp.launch import RankPool, backend_for
from fedagent_flwr.agent.fsdp.ranks import Ranks
from fedagent_flwr.agent.models.loading import load_agent
from fedagent_flwr.agent.models.sharded_load import empty_model
from fedagent_flwr.agent.models.pretrained import load_tokenizer, pick_device, resolve_model
from fedagent_flwr.agent.training import grpo
from fedagent_flwr.agent.training.lora import adapter_to_arrays, attached_lora
from fedagent_flwr.agent.training.weights import model_to_arrays
from fedagent_flwr.config import RunConfig
from fedagent_flwr.methods import ranked_round
from fedagent_flwr.agent.fsdp.tensor_files import Streamed
from fedagent_flwr.methods.memory import host_plan, memory_plan
from fedagent_flwr.methods.placement import process_placement, run_base_dtype
from fedagent_flwr.methods.tasks import learner_tasks
from fedagent_flwr.simulation import parse_overrides, read_run_config_file
from rank_rounds import status_mib  # benchmarks/ is the script's own folder

MIB = 1024**2


def baseline(rank: int, world: int, tensors: dict, model: str, env: str):
    """A rank's resident memory with the round's code imported (the model's own modeling code too: its modules are
    built once on the meta device, holding no weights, and dropped) and the tokenizer loaded, before any model (a
    target of the rank pool: every rank's, on rank 0)."""
    spec = resolve_model(model, env)
    load_tokenizer(spec)
    empty_model(spec.source, torch.float32)
    mine = {"rss_mib": status_mib("self", "VmRSS"), "file_mib": status_mib("self", "RssFile")}
    return {}, {"baseline": Ranks(rank, world).gather({str(rank): mine})}


class RoundRecord:
    """What one rank's round ran and held: each segment's peak resident memory (load, rollout, advantages, update,
    reply), the episodes it played, the longest sample it trained and the rows of its largest update and no-grad
    passes. Kept by wrappers around the trainer's own methods, installed in the rank's process by `measured_round`."""

    def __init__(self) -> None:
        self.segment, self.peaks = "load", {}
        self.files = {"load": status_mib("self", "RssFile")}  # each segment's file-backed pages at its start, then end
        self.files_end = {}
        self.episodes = self.longest = self.update_rows = self.logprob_rows = 0
        self.scoring = False

    def enter(self, segment: str) -> None:
        self.peaks[self.segment] = max(self.peaks.get(self.segment, 0.0), status_mib("self", "VmHWM"))
        self.files_end[self.segment] = status_mib("self", "RssFile")
        Path("/proc/self/clear_refs").write_text("5")  # the peak (VmHWM) starts again from what is resident now
        self.segment = segment
        self.files.setdefault(segment, status_mib("self", "RssFile"))

    def install(self) -> None:
        """This record the one the wrappers write to; the wrappers put in place once a process."""
        _RECORD[:] = [self]
        if getattr(grpo.GRPOTrainer, "_recorded", False):
            return
        play, update, logprobs, passes = (grpo.GRPOTrainer._play, grpo.GRPOTrainer.update, grpo.GRPOTrainer._logprobs,
                                          Ranks.passes)

        class Current:  # the record of the round now running
            def __getattr__(self, name):
                return getattr(_RECORD[0], name)

            def __setattr__(self, name, value):
                setattr(_RECORD[0], name, value)

        record = Current()

        def _play(trainer, env_factory, chosen, *args):
            record.enter("rollout")
            record.episodes = trainer.config.num_generations * len(trainer.ranks.share(range(len(chosen))))
            out = play(trainer, env_factory, chosen, *args)
            record.enter("advantages")
            return out

        def _update(trainer, samples, *args):
            record.enter("update")
            record.longest = max([s.length for s in samples], default=0)
            out = update(trainer, samples, *args)
            record.enter("reply")
            return out

        def _logprobs(trainer, *args, **kwargs):
            record.scoring = True
            try:
                return logprobs(trainer, *args, **kwargs)
            finally:
                record.scoring = False

        def _passes(ranks, plan):
            out = passes(ranks, plan)
            rows = max([len(p.rows) for p in out if not p.spare], default=0)
            if record.scoring:
                record.logprob_rows = max(record.logprob_rows, rows)
            else:
                record.update_rows = max(record.update_rows, rows)
            return out

        grpo.GRPOTrainer._play, grpo.GRPOTrainer.update, grpo.GRPOTrainer._logprobs = _play, _update, _logprobs
        Ranks.passes = _passes
        grpo.GRPOTrainer._recorded = True


_RECORD: list[RoundRecord] = []  # in a rank's process: the record of the round it runs


def measured_round(rank: int, world: int, tensors: dict, *args):
    """ranked_round's round on this rank, recorded (a target of the rank pool: every rank's record, on rank 0). The
    reply segment lasts until the reply's stream ends, as the launcher writes it (rank 0) or drains it (the others)."""
    record = RoundRecord()
    record.install()
    Path("/proc/self/clear_refs").write_text("5")
    out, info = ranked_round._round_on_rank(rank, world, tensors, *args)

    def arrays():
        yield from out.arrays
        # run as the stream is found exhausted (the writer's strict zip asks once more; a drain iterates to the end),
        # before rank 0 writes its info: every rank gathers the records here, in step
        record.enter("end")
        mine = {"peaks_mib": record.peaks, "files_mib": record.files, "files_end_mib": record.files_end,
                "episodes": record.episodes, "longest": record.longest,
                "update_rows": record.update_rows, "logprob_rows": record.logprob_rows}
        info["records"] = Ranks(rank, world).gather({str(rank): mine})

    return Streamed(out.layout, arrays(), out.order), info


def own_plan(cfg: RunConfig, shape: ModelShape, placement, ran: dict):
    """The planner given what a rank ran: its longest sample as the context, its passes' rows, its episodes."""
    ran_cfg = cfg.updated({"grpo.ppo-micro-batch-size-per-gpu": max(1, ran["update_rows"]), "grpo.ppo-max-token-len-per-gpu": 0, "grpo.log-prob-micro-batch-size-per-gpu": max(1, ran["logprob_rows"]), "grpo.log-prob-max-token-len-per-gpu": 0})
    return memory_plan(ran_cfg, shape, ran["longest"], placement, min(placement.rollout_rows, ran["episodes"]))


def round_inputs(cfg: RunConfig):
    """This process's agent (the sent weights and the plan come from it), partition 0's tasks, the sent weights as the
    client's message holds them, and the client's placement."""
    agent = load_agent(cfg.model, cfg.env, "cpu", run_base_dtype(cfg))
    tasks = learner_tasks(cfg, 0, cfg.num_clients or 2)  # num-clients 0: one per SuperNode, the default job's 2
    if cfg.grpo.finetuning == "lora":
        with attached_lora(agent.model, cfg.lora, seed=cfg.seed) as peft_model:
            sent = adapter_to_arrays(peft_model)
            placement = process_placement(cfg, agent, tasks, model=peft_model)
    else:
        sent = model_to_arrays(agent.model)
        placement = process_placement(cfg, agent, tasks)
    return agent, tasks, sent, placement


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-config", default=None, help="a run-config TOML (default: the app's defaults)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a run-config value over it")
    parser.add_argument("--json", action="store_true", help="one JSON line on stdout")
    args = parser.parse_args()
    values = {"engine.ranks-per-client": 2} | (read_run_config_file(args.run_config) if args.run_config else {})
    values |= parse_overrides(args.set)
    try:
        cfg = RunConfig.from_run_config(values)
    except ValueError as err:
        parser.error(str(err))
    if cfg.engine.ranks_per_client < 2 or pick_device(cfg.device).type != "cpu":
        parser.error(f"engine.ranks-per-client={cfg.engine.ranks_per_client}, device={cfg.device}: CPU ranks, at least 2")
    agent, tasks, sent, placement = round_inputs(cfg)
    shape = ModelShape.of(agent.model.config)
    plan = memory_plan(cfg, shape, placement.context_tokens, placement, placement.rollout_rows)
    host = host_plan(cfg, shape)
    with RankPool(cfg.engine.ranks_per_client, backend_for(pick_device(cfg.device)), cfg.federation.round_timeout,
                  ranked_round.mmap_threshold(cfg), collective_timeout_s=cfg.engine.rank_timeout_s or None) as pool:
        _, info = pool.run(baseline, {}, cfg.model, cfg.env)
        # the client's process holds the sent weights already (Flower's message): its round adds the rest
        client_before = status_mib("self", "VmRSS")
        Path("/proc/self/clear_refs").write_text("5")
        reply, round_info = ranked_round.round_on_ranks(cfg, sent, tasks, 1, 0, pool=pool, target=measured_round)
        client_peak = status_mib("self", "VmHWM") - client_before
        del reply
    print(plan.table().replace(f"{plan.who}:", f"{plan.who} (the run's plan, {plan.total / MIB:.0f} MiB):"), flush=True)
    print(host.table(), flush=True)
    rows = dict(host.rows)
    # the client's process: what its round adds to the message it holds, against the plan's rows of it
    client_rows = sum(b for name, b in host.rows if name.startswith(("round file", "the reply")))
    throughout = sum(b for name, b in plan.rows if name not in plan.decode and name not in plan.update)
    gathered_row = rows["rank 0: a weight gathered, and its buffer"]
    ranks = []
    for r in range(cfg.engine.ranks_per_client):
        base, ran = info["baseline"][str(r)], round_info["records"][str(r)]
        held = {k: v - base["rss_mib"] for k, v in ran["peaks_mib"].items()}
        # private: less the file-backed pages at the segment's start (at most) or its end (at least)
        private_base = base["rss_mib"] - base["file_mib"]
        private = {k: v - ran["files_mib"][k] - private_base for k, v in ran["peaks_mib"].items()}
        private_least = {k: v - ran["files_end_mib"][k] - private_base for k, v in ran["peaks_mib"].items()}
        mine = own_plan(cfg, shape, placement, ran)
        peak, peak_private = max(held.values()), max(private.values())
        ranks.append({"baseline_mib": base["rss_mib"], "baseline_file_mib": base["file_mib"], "round_mib": peak,
                      "over_plan": peak * MIB / plan.total, "segments_mib": held,
                      "private_mib": peak_private, "private_least_mib": max(private_least.values()),
                      "private_segments_mib": private, "private_least_segments_mib": private_least,
                      "ran": {k: v for k, v in ran.items() if not k.endswith("_mib")},
                      "own_plan": mine.as_dict(), "own_plan_mib": mine.total / MIB, "over_own_plan": peak * MIB / mine.total,
                      "private_over_own_plan": peak_private * MIB / mine.total,
                      "private_least_over_own_plan": max(private_least.values()) * MIB / mine.total,
                      "rollout_over_own": held["rollout"] * MIB / mine.peak("decode"),
                      "update_over_own": held["update"] * MIB / mine.peak("update"),
                      "private_rollout_over_own": private["rollout"] * MIB / mine.peak("decode"),
                      "private_update_over_own": private["update"] * MIB / mine.peak("update"),
                      # the reply: what the rank holds throughout, and on rank 0 one weight gathered to write
                      "reply_over_own": held["reply"] * MIB / (throughout + (gathered_row if r == 0 else 0))})
        x = ranks[-1]
        print(f"rank {r}: {base['rss_mib']:.0f} MiB before the model; the round's peak {peak:.0f} MiB above it, against "
              f"the run's plan of {plan.total / MIB:.0f} MiB ({x['over_plan']:.2f}x) and its own of "
              f"{x['own_plan_mib']:.0f} MiB ({x['over_own_plan']:.2f}x: {ran['longest']} tokens, {ran['episodes']} "
              f"episodes, passes of {ran['update_rows']} and {ran['logprob_rows']} rows); rollout {held['rollout']:.0f} "
              f"against {mine.peak('decode') / MIB:.0f} MiB, update {held['update']:.0f} against "
              f"{mine.peak('update') / MIB:.0f}. Private (less file-backed pages): {x['private_least_mib']:.0f}-"
              f"{peak_private:.0f} MiB, {x['private_least_over_own_plan']:.2f}-{x['private_over_own_plan']:.2f}x its "
              f"own plan; rollout {private_least['rollout']:.0f}-{private['rollout']:.0f}, update "
              f"{private_least['update']:.0f}-{private['update']:.0f}", flush=True)
    node_peak = sum(x["round_mib"] for x in ranks) + client_peak
    node_plan = (sum(x["own_plan_mib"] for x in ranks) * MIB + client_rows + gathered_row) / MIB
    print(f"the reply: rank 0 {ranks[0]['segments_mib']['reply']:.0f} MiB above its baseline against "
          f"{(throughout + gathered_row) / MIB:.0f} planned ({ranks[0]['reply_over_own']:.2f}x); the client's process "
          f"{client_peak:.0f} MiB above the message it holds, against {client_rows / MIB:.0f} planned "
          f"({client_peak * MIB / client_rows:.2f}x); the node (every rank's round peak and the client's) {node_peak:.0f} "
          f"MiB against {node_plan:.0f} planned ({node_peak / node_plan:.2f}x)", flush=True)
    result = {"settings": {"ranks": cfg.engine.ranks_per_client, "model": cfg.model, "env": cfg.env,
                           "finetuning": cfg.grpo.finetuning, "precision": placement.precision, "run_config": values},
              "plan": plan.as_dict(), "plan_mib": plan.total / MIB, "ranks": ranks,
              "host_plan": host.as_dict(), "client_round_mib": client_peak, "client_plan_mib": client_rows / MIB,
              "client_over_plan": client_peak * MIB / client_rows, "node_round_mib": node_peak, "node_plan_mib": node_plan,
              "node_over_plan": node_peak / node_plan,
              "episodes": round_info["metrics"].get("episodes")}
    if args.json:
        print(json.dumps(result))


if __name__ == "__main__":
    main()
