"""`python -m fedagent_flwr.experiments.paired_rounds RUN_DIR`: did held-out success change between two of a run's
evaluations, tested room by room from the episodes the server already played.

Each evaluation writes `<run>/episodes/round-NNNN.json` (every episode's task and outcome). This compares the last
evaluation with the first (or `--rounds LATER EARLIER`): each held-out task's success rate is one pair, and a paired
t-test over tasks gives the standard error and p (episodes of one task are correlated, tasks are not). The same test
as `python -m fedagent_flwr.evaluation --paired-with`, without playing both models again; both evaluations must
have played the same tasks.

`--against OTHER_RUN` compares two runs instead, room by room: this run's last evaluation minus the other's (or
`--rounds A B`: this run's round A minus the other's round B). Two methods run with the same seed evaluate the same
held-out rooms, so this is the per-seed paired test between them; across seeds, test the per-seed differences.

    python -m fedagent_flwr.experiments.paired_rounds RUN                      # last minus first evaluation
    python -m fedagent_flwr.experiments.paired_rounds RUN --against OTHER_RUN  # RUN's last minus OTHER_RUN's last
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


def _record(run_dir: Path, round_: int) -> dict:
    return json.loads((run_dir / "episodes" / f"round-{round_:04d}.json").read_text())


def _paired(first: dict, second: dict, what: str) -> dict:
    """first minus second, per task: n, mean, se, ci95, p, both success rates and the episodes an evaluation."""
    a, b = success_by_task(first), success_by_task(second)
    if a.keys() != b.keys():
        raise ValueError(f"{what} evaluated different tasks")
    out = {k: v for k, v in paired_difference(a, b).items() if k != "seeds"}
    out.update(tasks=len(a), episodes=len(first["episodes"]),
               later_success=sum(e["won"] for e in first["episodes"]) / len(first["episodes"]),
               earlier_success=sum(e["won"] for e in second["episodes"]) / len(second["episodes"]))
    return out


def compare(run_dir: Path, later: int, earlier: int) -> dict:
    """later minus earlier, per task: n, mean, se, ci95, p, and both success rates."""
    return compare_runs(run_dir, run_dir, later, earlier)


def compare_runs(run_dir: Path, other_dir: Path, round_: int, other_round: int) -> dict:
    """run_dir's evaluation at `round_` minus other_dir's at `other_round`, per task (later_* = run_dir's)."""
    what = (f"rounds {round_} and {other_round} of {run_dir}" if other_dir == run_dir
            else f"{run_dir} round {round_} and {other_dir} round {other_round}")
    out = _paired(_record(run_dir, round_), _record(other_dir, other_round), what)
    out.update(later=round_, earlier=other_round)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m fedagent_flwr.experiments.paired_rounds", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_dir", type=Path, help="a run folder (it holds episodes/round-NNNN.json)")
    p.add_argument("--rounds", type=int, nargs=2, metavar=("LATER", "EARLIER"),
                   help="the two evaluations to compare (default: the last and the first)")
    p.add_argument("--against", type=Path, metavar="OTHER_RUN",
                   help="compare with another run folder's evaluation instead (default: both runs' last)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    args = p.parse_args(argv)
    other = args.against if args.against is not None else args.run_dir
    mine, theirs = evaluation_rounds(args.run_dir), evaluation_rounds(other)
    if args.against is None and len(mine) < 2 and not args.rounds:
        p.error(f"run_dir {args.run_dir}: needs two evaluations' episodes/round-NNNN.json, found rounds {mine}")
    for folder, rounds in ((args.run_dir, mine), (other, theirs)):
        if not rounds:
            p.error(f"{folder}: no episodes/round-NNNN.json (a run folder of this project, evaluated at least once)")
    # one run: its last minus its first evaluation; two runs: each one's last
    first, second = args.rounds or (mine[-1], theirs[-1] if args.against is not None else theirs[0])
    for folder, r, rounds in ((args.run_dir, first, mine), (other, second, theirs)):
        if r not in rounds:
            p.error(f"--rounds: no episodes/round-{r:04d}.json in {folder}; evaluated rounds: {rounds}")
    try:
        d = compare_runs(args.run_dir, other, first, second)
    except ValueError as err:
        p.error(str(err))
    if args.json:
        print(json.dumps(d))
        return 0
    what = (f"round {first} minus round {second}" if args.against is None
            else f"{args.run_dir.name} round {first} minus {other.name} round {second}")
    print(f"{what}: {d['later_success']:.3f} - {d['earlier_success']:.3f} = {d['mean']:+.3f} +- {d['se']:.3f} success "
          f"per task (95% interval [{d['ci95'][0]:+.3f}, {d['ci95'][1]:+.3f}]), difference / SE "
          f"{d['mean'] / d['se'] if d['se'] else float('nan'):.1f}, paired t-test over {d['n']} tasks p = {d['p']:.2g} "
          f"({d['episodes']} episodes an evaluation)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
