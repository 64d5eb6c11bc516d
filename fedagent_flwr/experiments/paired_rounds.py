"""`python -m fedagent_flwr.experiments.paired_rounds RUN_DIR`: did held-out success change between two of a run's
evaluations, tested room by room from the episodes the server already played.

Each evaluation writes `<run>/episodes/round-NNNN.json` (every episode's task and outcome). This compares the last
evaluation with the first (or `--rounds LATER EARLIER`): each held-out task's success rate is one pair, and a paired
t-test over tasks gives the standard error and p (episodes of one task are correlated, tasks are not). The same test
as `python -m fedagent_flwr.evaluation --paired-with`, without playing both models again; both evaluations must
have played the same tasks.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

from fedagent_flwr.experiments.seed_statistics import paired_difference
from fedagent_flwr.experiments.seed_statistics import success_by_task as task_success


def success_by_task(record: dict) -> dict[str, float]:
    return task_success((e["task"], e["won"]) for e in record["episodes"])


def evaluation_rounds(run_dir: Path) -> list[int]:
    return sorted(int(p.stem.removeprefix("round-")) for p in (run_dir / "episodes").glob("round-*.json"))


def compare(run_dir: Path, later: int, earlier: int) -> dict:
    """later minus earlier, per task: n, mean, se, ci95, p, and both success rates."""
    records = {r: json.loads((run_dir / "episodes" / f"round-{r:04d}.json").read_text()) for r in (later, earlier)}
    a, b = success_by_task(records[later]), success_by_task(records[earlier])
    if a.keys() != b.keys():
        raise ValueError(f"rounds {later} and {earlier} of {run_dir} evaluated different tasks")
    out = {k: v for k, v in paired_difference(a, b).items() if k != "seeds"}
    out.update(later=later, earlier=earlier, tasks=len(a),
               episodes=len(records[later]["episodes"]),
               later_success=sum(e["won"] for e in records[later]["episodes"]) / len(records[later]["episodes"]),
               earlier_success=sum(e["won"] for e in records[earlier]["episodes"]) / len(records[earlier]["episodes"]))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m fedagent_flwr.experiments.paired_rounds", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_dir", type=Path, help="a run folder (it holds episodes/round-NNNN.json)")
    p.add_argument("--rounds", type=int, nargs=2, metavar=("LATER", "EARLIER"),
                   help="the two evaluations to compare (default: the last and the first)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    args = p.parse_args(argv)
    rounds = evaluation_rounds(args.run_dir)
    if len(rounds) < 2 and not args.rounds:
        p.error(f"run_dir {args.run_dir}: needs two evaluations' episodes/round-NNNN.json, found rounds {rounds}")
    later, earlier = args.rounds or (rounds[-1], rounds[0])
    for r in (later, earlier):
        if r not in rounds:
            p.error(f"--rounds: no episodes/round-{r:04d}.json in {args.run_dir}; evaluated rounds: {rounds}")
    try:
        d = compare(args.run_dir, later, earlier)
    except ValueError as err:
        p.error(str(err))
    if args.json:
        print(json.dumps(d))
    else:
        print(f"round {later} minus round {earlier}: {d['later_success']:.3f} - {d['earlier_success']:.3f} = "
              f"{d['mean']:+.3f} +- {d['se']:.3f} success per task (95% interval [{d['ci95'][0]:+.3f}, {d['ci95'][1]:+.3f}]), "
              f"gain / SE {d['mean'] / d['se'] if d['se'] else float('nan'):.1f}, paired t-test over {d['n']} tasks "
              f"p = {d['p']:.2g} ({d['episodes']} episodes an evaluation)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
