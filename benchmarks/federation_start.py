#!/usr/bin/env python
"""How long a simulated federation takes to reach round 1, by its number of SuperNodes.

Each size runs the default job through `run_simulation.py` with as little work as it allows (one round, one client a
round, one task a client, one held-out episode) and times, from the command's start, the moment the ServerApp logs
round 1 (SuperLink, Ray, the SuperNodes, the handshake with every node and the partitions before it) and the end. A
least-squares line over the sizes gives the start-up's fixed seconds and its seconds a node, which run_simulation.py's
start-up estimate for a large federation quotes (fedagent_flwr/simulation.py, START_S and NODE_S).

    python benchmarks/federation_start.py --clients 4,32,128 --json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
LEAST_WORK = ["--clients-per-round", "1", "--partition.tasks-per-client", "1", "--num-server-rounds", "1", "--eval.tasks", "1",
              "--eval.samples-per-task", "1", "--eval.test-freq", "1", "--eval.transcripts", "0"]


def time_start(clients: int, out: Path) -> dict:
    """Seconds from the command's start to the ServerApp's round-1 line, and to its end, for `clients` SuperNodes."""
    cmd = [sys.executable, str(ROOT / "run_simulation.py"), "--num-clients", str(clients), *LEAST_WORK,
           "--output-dir", str(out), "--run-name", f"clients-{clients}"]
    started, first_round = time.monotonic(), None
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT)
    for line in proc.stdout:
        if first_round is None and "[ROUND 1/" in line:
            first_round = time.monotonic() - started
    code = proc.wait()
    if code != 0 or first_round is None:
        raise SystemExit(f"{' '.join(cmd)}: exit {code}, round 1 {'seen' if first_round else 'never logged'}")
    return {"clients": clients, "round_1_s": round(first_round, 1), "total_s": round(time.monotonic() - started, 1)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--clients", default="4,32,128", help="comma-separated SuperNode counts (default 4,32,128)")
    p.add_argument("--json", action="store_true", help="print the result as one JSON line last")
    args = p.parse_args(argv)
    sizes = [int(k) for k in args.clients.split(",") if k.strip().isdigit()]
    if len(sizes) < 2 or len(sizes) != len(args.clients.split(",")) or min(sizes) < 1:
        p.error(f"--clients={args.clients!r} is not allowed: expected two or more counts >= 1")
    with tempfile.TemporaryDirectory(prefix="federation-start-") as out:
        runs = [time_start(k, Path(out)) for k in sizes]
    for r in runs:
        print(f"{r['clients']:>6} SuperNodes: round 1 after {r['round_1_s']:.1f} s, done after {r['total_s']:.1f} s", flush=True)
    node_s, start_s = np.polyfit([r["clients"] for r in runs], [r["round_1_s"] for r in runs], 1)
    print(f"start-up = {start_s:.1f} s + {node_s:.3f} s a SuperNode (least squares over {len(runs)} sizes)")
    if args.json:
        print(json.dumps({"settings": {"clients": sizes}, "runs": runs, "start_s": round(float(start_s), 2),
                          "node_s": round(float(node_s), 4)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
