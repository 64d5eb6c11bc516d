#!/usr/bin/env python
"""A CPU rank's round with the memory it frees given back to the system, against glibc's own behaviour: time and peak.

Each rank sets a fixed threshold from which its C library maps a block on its own (agent/fsdp/launch.py
return_freed_memory), so that a freed tensor's pages leave the process. glibc's default threshold moves: it rises to
the size of each mapped block that is freed (up to 32 MiB), after which tensors of that size come from the heap, and
what they free stays resident. Mapping costs time (a fresh block's pages are faulted in and zeroed). The variants
alternate, each repeat on new ranks (a threshold once moved stays moved), on the same round (the run config's initial
weights, partition 0's tasks): per variant the round's seconds (its own `seconds` metric) and each rank's peak resident
memory above what it held before any model (benchmarks/rank_memory.py's measurement), and the time ratio of each
variant to the first with its standard error over the paired repeats.

    python benchmarks/freed_memory.py --repeats 3
    python benchmarks/freed_memory.py --run-config configs/smollm2-fedagent-cpu.toml --set grpo.tasks-per-epoch=2 --repeats 3

With `--json` (one JSON line) under `python benchmarks/raw_output.py run OUT.json -- ...` the result is kept with the
machine, versions and commit it ran on (benchmarks/results/README.md).
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from fedagent_flwr.agent.fsdp.launch import MMAP_THRESHOLD, RankPool, backend_for
from fedagent_flwr.agent.models.pretrained import pick_device
from fedagent_flwr.config import RunConfig
from fedagent_flwr.methods import ranked_round
from fedagent_flwr.simulation import parse_overrides, read_run_config_file
from rank_memory import baseline, measured_round, round_inputs  # benchmarks/ is the script's own folder


def one_round(cfg: RunConfig, sent, tasks, threshold: int) -> dict:
    with RankPool(cfg.engine.ranks_per_client, backend_for(pick_device(cfg.device)), cfg.federation.round_timeout,
                  mmap_threshold=threshold, collective_timeout_s=cfg.engine.rank_timeout_s or None) as pool:
        _, info = pool.run(baseline, {}, cfg.model, cfg.env)
        _, out = ranked_round.round_on_ranks(cfg, sent, tasks, 1, 0, pool=pool, target=measured_round)
    peaks = [max(out["records"][str(r)]["peaks_mib"].values()) - info["baseline"][str(r)]["rss_mib"]
             for r in range(cfg.engine.ranks_per_client)]
    return {"seconds": out["metrics"]["seconds"], "peak_mib": peaks, "episodes": out["metrics"].get("episodes")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-config", default=None, help="a run-config TOML (default: the app's defaults)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a run-config value over it")
    parser.add_argument("--repeats", type=int, default=3, help="rounds per variant (at least 2)")
    parser.add_argument("--thresholds", default=f"0,{MMAP_THRESHOLD}",
                        help="comma-separated mmap thresholds in bytes, the first the reference (0 = glibc's own)")
    parser.add_argument("--json", action="store_true", help="one JSON line on stdout")
    args = parser.parse_args()
    values = {"engine.ranks-per-client": 2} | (read_run_config_file(args.run_config) if args.run_config else {})
    values |= parse_overrides(args.set)
    thresholds = [int(t) for t in args.thresholds.split(",")]
    try:
        cfg = RunConfig.from_run_config(values)
    except ValueError as err:
        parser.error(str(err))
    if cfg.engine.ranks_per_client < 2 or pick_device(cfg.device).type != "cpu" or args.repeats < 2 or len(thresholds) < 2:
        parser.error("CPU ranks (at least 2), --repeats at least 2 and at least two --thresholds")
    _, tasks, sent, _ = round_inputs(cfg)
    runs: dict[int, list[dict]] = {t: [] for t in thresholds}
    for repeat in range(args.repeats):
        for t in thresholds if repeat % 2 == 0 else thresholds[::-1]:  # alternating, so drift falls on every variant
            runs[t].append(one_round(cfg, sent, tasks, t))
            print(f"repeat {repeat}, threshold {t}: {runs[t][-1]['seconds']:.1f} s, peaks "
                  f"{', '.join(f'{p:.0f}' for p in runs[t][-1]['peak_mib'])} MiB", flush=True)
    reference = np.array([r["seconds"] for r in runs[thresholds[0]]])
    variants = {}
    for t in thresholds:
        seconds = np.array([r["seconds"] for r in runs[t]])
        ratio = seconds / reference
        variants[str(t)] = {"seconds": seconds.tolist(), "seconds_mean": float(seconds.mean()),
                            "time_ratio_mean": float(ratio.mean()),
                            "time_ratio_se": float(ratio.std(ddof=1) / np.sqrt(len(ratio))),
                            "peak_mib": [r["peak_mib"] for r in runs[t]],
                            "peak_mib_mean": [float(np.mean(p)) for p in zip(*(r["peak_mib"] for r in runs[t]))]}
        v = variants[str(t)]
        print(f"threshold {t or 'glibc default'}: {v['seconds_mean']:.1f} s a round ({v['time_ratio_mean']:.3f} +- "
              f"{v['time_ratio_se']:.3f} of the first), peaks {', '.join(f'{p:.0f}' for p in v['peak_mib_mean'])} MiB",
              flush=True)
    if args.json:
        print(json.dumps({"settings": {"ranks": cfg.engine.ranks_per_client, "model": cfg.model, "run_config": values,
                                       "repeats": args.repeats, "thresholds": thresholds},
                          "variants": variants, "episodes": runs[thresholds[0]][0]["episodes"]}))


if __name__ == "__main__":
    main()
