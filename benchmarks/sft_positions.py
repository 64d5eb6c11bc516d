#!/usr/bin/env python
"""How many positions a Fed-SE fine-tuning pass computes, and how many a pass sharing its rows' common prompt prefix
would: an upper bound on that lever before anyone builds it.

A micro-batch's rows are agent steps (prompt ids, completion ids) padded to the longest. Every prompt opens with the
same instructions, so a pass could run the micro-batch's common prefix once and only each row's rest (padded to the
longest rest) on top of it, with the same loss: the completions come after the prefix, which is held to leave every
row at least one prompt token of its own (the position whose logits predict the first completion token). This reads
the buffers a finished Fed-SE run left (the last round's training samples: the buffer is cumulative), draws
micro-batches as the trainer does (uniformly, without replacement within a batch) and counts, per micro-batch:

- padded: rows x the longest row, what the pass computes today (a padded position costs what a real one does);
- real: the rows' own tokens (what a padding-free pass would compute; on a CPU such a pass packs the rows into one
  sequence whose attention is computed whole and masked, so it is not a cheaper pass there);
- shared prefix: the prefix once plus rows x the longest rest.

The ratio padded / shared prefix bounds what the lever can save in the fine-tuning's passes (attention and the other
per-position work scale otherwise, but at a few hundred tokens the layers' matrix products dominate).

    python benchmarks/raw_output.py run OUT.json -- python benchmarks/sft_positions.py --run-dir RUNS/NAME --json
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from fedagent_flwr.agent.self_evolution import client_buffer_dir
from fedagent_flwr.agent.training.experience import ExperienceBuffer


def common_prefix(rows: list[tuple[list[int], list[int]]]) -> int:
    """The tokens every row's prompt opens with, leaving each prompt at least one token of its own."""
    first = rows[0][0]
    n = min(len(p) for p, _ in rows) - 1
    for i in range(n):
        if any(p[i] != first[i] for p, _ in rows):
            return i
    return max(n, 0)


def positions(rows: list[tuple[list[int], list[int]]]) -> dict[str, int]:
    lengths = [len(p) + len(c) for p, c in rows]
    prefix = common_prefix(rows)
    return {"padded": len(rows) * max(lengths), "real": sum(lengths),
            "shared_prefix": prefix + len(rows) * (max(lengths) - prefix), "prefix": prefix}


def micro_batches(samples: list, micro: int, draws: int, rng: random.Random) -> dict[str, float]:
    totals = {"padded": 0, "real": 0, "shared_prefix": 0, "prefix": 0}
    for _ in range(draws):
        for k, v in positions(rng.sample(samples, min(micro, len(samples)))).items():
            totals[k] += v
    mean = {k: v / draws for k, v in totals.items()}
    return {**mean, "padded_over_real": totals["padded"] / totals["real"],
            "padded_over_shared_prefix": totals["padded"] / totals["shared_prefix"]}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run-dir", type=Path, required=True, help="a finished Fed-SE run folder")
    parser.add_argument("--micro-batch", type=int, default=0, help="rows a pass (default: the run's micro-batch size)")
    parser.add_argument("--draws", type=int, default=2000, help="micro-batches drawn per client")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    config = json.loads((args.run_dir / "config.json").read_text())
    if config.get("strategy") != "fedse-lora":
        raise SystemExit(f"--run-dir: strategy={config.get('strategy')!r}, expected a fedse-lora run")
    if config.get("fedse.loss-tokens", "completion") != "completion":
        raise SystemExit(f"fedse.loss-tokens={config['fedse.loss-tokens']!r}: only 'completion' rows are counted here")
    run_key = json.loads((args.run_dir / "state" / "server.json").read_text())["strategy"]["run_key"]  # kept on resume
    micro = args.micro_batch or int(config["fedse.sft-micro-batch-size"]) or int(config["fedse.sft-batch-size"])
    rng = random.Random(args.seed)
    clients = {}
    for partition in range(int(config["num-clients"])):
        samples = ExperienceBuffer(client_buffer_dir(config["fedse.buffer-dir"], run_key, partition)).samples()
        if samples:
            clients[partition] = {"samples": len(samples), **micro_batches(samples, micro, args.draws, rng)}
    every = list(clients.values())
    report = {"run": args.run_dir.name, "micro_batch": micro, "draws": args.draws, "clients": clients,
              "padded_over_shared_prefix": sum(c["padded"] for c in every) / sum(c["shared_prefix"] for c in every),
              "padded_over_real": sum(c["padded"] for c in every) / sum(c["real"] for c in every)}
    if args.json:
        print(json.dumps(report))  # one line: raw_output.py keeps the last JSON line
    else:
        for p, c in clients.items():
            print(f"client {p}: {c['samples']} samples, a micro-batch of {micro}: {c['padded']:.0f} positions padded, "
                  f"{c['real']:.0f} real, {c['shared_prefix']:.0f} with its {c['prefix']:.0f}-token prefix once")
        print(f"padded / shared prefix: {report['padded_over_shared_prefix']:.3f}; padded / real: "
              f"{report['padded_over_real']:.3f}")
    return report


if __name__ == "__main__":
    main()
