"""Print the value of one run-config key in the fastest variant of an update_profile.py --json result, or with
`--sets` the whole fastest variant as gpu_round.py arguments.

    python benchmarks/fastest_variant.py RESULT.json engine.training-kernels
    python benchmarks/fastest_variant.py RESULT.json --sets          # --set grpo.ppo-max-token-len-per-gpu=24576 --set ...

"Fastest" is the smallest log-prob plus update time; variants that ran out of memory or failed do not count. A variant
without the key ran with the run config's default, so that default is printed: gpu_checks.sh passes the value on
as `--set KEY=VALUE`. `--sets` leaves out update_profile.py's own keys (host-waits, cudnn-attention, fused-adamw),
which are no run-config keys.
"""

from __future__ import annotations

import json
import sys

from fedagent_flwr.config import RunConfig


def fastest(result: dict, key: str) -> str:
    timed = [v for v in result.get("variants", []) if not v.get("out_of_memory") and not v.get("failed")]
    if not timed:
        raise ValueError("no variant finished")
    best = min(timed, key=lambda v: v["logprobs_s"] + v["update_s"])
    if key == "--sets":
        keys = RunConfig().to_run_config()
        return " ".join(f"--set {k}={str(x).lower() if isinstance(x, bool) else x}"
                        for k, x in best["variant"].items() if k in keys)
    return str(best["variant"].get(key, RunConfig().to_run_config()[key]))


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: fastest_variant.py RESULT.json KEY|--sets", file=sys.stderr)
        return 2
    try:
        with open(args[0]) as f:
            print(fastest(json.load(f), args[1]))
    except (OSError, ValueError, KeyError) as err:
        print(f"fastest_variant.py: {args[0]}: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
