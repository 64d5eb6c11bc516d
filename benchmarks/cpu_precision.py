#!/usr/bin/env python
"""What `precision = auto` takes on this processor for a run config, and the probe behind it measured afresh.

A run decides its CPU precision from one probe (agent/engine/cpu_rates.py: the model's MLP matmul timed in fp32 and
in bf16 on one thread), cached per processor. This prints each role's start-up line as the run would print it, then
measures the probe `--repeats` more times, bypassing the cache, so its spread shows whether the decision sits near
the 1.25x threshold or far from it.

    python benchmarks/raw_output.py run OUT.json -- python benchmarks/cpu_precision.py \
        --run-config configs/smollm2-fedagent-cpu.toml --repeats 5 --json
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import asdict

import torch

from fedagent_flwr.agent.engine.cpu_rates import measure, this_processor
from fedagent_flwr.agent.engine.placement import BF16_CLEARLY_FASTER
from fedagent_flwr.config import RunConfig
from fedagent_flwr.agent.models.pretrained import model_dims
from fedagent_flwr.methods.placement import place_run
from fedagent_flwr.simulation import parse_overrides, read_run_config_file


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run-config", required=True, help="a run-config TOML file (a preset)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a run-config value over it")
    parser.add_argument("--repeats", type=int, default=5, help="fresh probes after the run's own (>= 1)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error(f"--repeats={args.repeats} is not allowed: expected an integer >= 1")
    try:
        cfg = RunConfig.from_run_config(RunConfig().to_run_config() | read_run_config_file(args.run_config)
                                        | parse_overrides(args.set))
    except ValueError as err:
        parser.error(str(err))
    lines = {role: place_run(cfg, role).summary() for role in ("client", "server")}  # the run's cached probe
    hidden, intermediate = model_dims(cfg.model, cfg.env)
    processor = this_processor()
    fresh = [measure(hidden, intermediate, processor) for _ in range(args.repeats)]
    speedups = [r.bf16_speedup for r in fresh]
    report = {"run_config": args.run_config, "set": args.set, "model": cfg.model, "processor": processor.name,
              "flags": processor.flags, "torch": torch.__version__, "threshold": BF16_CLEARLY_FASTER,
              "start_up_lines": lines, "fresh": [asdict(r) for r in fresh],
              "bf16_speedup": {"min": min(speedups), "median": statistics.median(speedups), "max": max(speedups)}}
    if args.json:
        print(json.dumps(report))  # one line: raw_output.py keeps the last JSON line
    else:
        for role, line in lines.items():
            print(f"{role}: {line}")
        for r in fresh:
            print(f"fresh probe: {r.describe()} in {r.seconds * 1000:.0f} ms")
        s = report["bf16_speedup"]
        print(f"bf16 / fp32 over {args.repeats} fresh probes: {s['min']:.2f}-{s['max']:.2f}x (median {s['median']:.2f}x; "
              f"auto takes bf16-base for an adapter at {BF16_CLEARLY_FASTER}x or more)")
    return report


if __name__ == "__main__":
    main()
