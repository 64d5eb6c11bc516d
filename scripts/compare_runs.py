"""Do two run folders hold the same numbers? Every metric of every round, timing and byte-rate keys aside.

    python scripts/compare_runs.py RUN_A RUN_B      # exit 0 and "identical" when they agree, else 1 and the first differences

Used to check that a run depends only on its seed and the packages it uses: the default job run in an
environment with the optional extras installed and in one without them (docs/results.md) must agree.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

TIMING = ("seconds", "elapsed")  # wall-clock keys differ between any two runs


def rows(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def differences(a: list[dict], b: list[dict]) -> list[str]:
    if len(a) != len(b):
        return [f"{len(a)} rounds vs {len(b)}"]
    out = []
    for ra, rb in zip(a, b):
        for key in sorted(ra.keys() | rb.keys()):
            if not any(t in key for t in TIMING) and ra.get(key) != rb.get(key):
                out.append(f"round {ra.get('round')}: {key} {ra.get(key)!r} vs {rb.get(key)!r}")
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    found = differences(rows(Path(argv[0])), rows(Path(argv[1])))
    print("identical" if not found else "\n".join(found[:20]))
    return 1 if found else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
