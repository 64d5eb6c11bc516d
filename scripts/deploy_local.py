#!/usr/bin/env python
"""Run the app on a real SuperLink and SuperNodes on this machine (loopback), then stop them all.

    python scripts/deploy_local.py --nodes 2 --secure --run-config "num-server-rounds=2 eval.tasks=1"

--secure: TLS with a CA generated for the run and SuperNode authentication
(every SuperNode's key registered with `flwr supernode register`). Certificates,
keys, each process's FLWR_HOME and log live under --workdir. See docs/deployment.md
for the same steps on separate machines.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fedagent_flwr.deployment import run_local_deployment  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=2, help="SuperNodes to start (one partition each; default 2)")
    parser.add_argument("--secure", action="store_true", help="TLS + SuperNode authentication (default: insecure)")
    parser.add_argument("--run-config", default="", help='run-config overrides, e.g. "num-server-rounds=2"')
    parser.add_argument("--workdir", default="deploy-local", help="certificates, keys, FLWR_HOMEs and logs (default ./deploy-local)")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds the run may take (default 3600)")
    args = parser.parse_args(argv)
    if args.nodes < 1:
        parser.error("--nodes must be >= 1")
    run_config = f"num-clients={args.nodes} {args.run_config}".strip()
    if "output-dir" not in run_config:  # the ServerApp runs in the SuperLink's folder: make the path absolute
        run_config += f" output-dir='{Path(args.workdir).resolve() / 'runs'}'"
    result = run_local_deployment(Path(args.workdir), args.nodes, args.secure, run_config, timeout=args.timeout)
    print(result.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
