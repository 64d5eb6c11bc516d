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

Several runs (one per seed) give each seed's line and then the test over seeds: the per-seed changes (or per-seed
differences between the two methods, runs paired in the order given, which must have the same seeds) with their
standard error over seeds and a paired t-test, the unit a claim about a method rests on. A run that predates the
episode records still enters the test over seeds through its metrics.jsonl success rate; its room-by-room line is
left out.

    python -m fedagent_flwr.experiments.paired_rounds RUN                      # last minus first evaluation
    python -m fedagent_flwr.experiments.paired_rounds RUN --against OTHER_RUN  # RUN's last minus OTHER_RUN's last
    python -m fedagent_flwr.experiments.paired_rounds A-s0 A-s1 A-s2 --against B-s0 B-s1 B-s2   # and over seeds
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

from fedagent_flwr.experiments.seed_statistics import ALPHA, paired_difference
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


def run_seed(run_dir: Path) -> int | None:
    """The seed a run folder was run with (its config.json), or None when the folder has no config."""
    config = run_dir / "config.json"
    return json.loads(config.read_text()).get("seed") if config.is_file() else None


def _metrics_success(run_dir: Path) -> dict[int, float]:
    """Held-out success by evaluated round from metrics.jsonl: the fallback for runs without episode records."""
    metrics = run_dir / "metrics.jsonl"
    if not metrics.is_file():
        return {}
    rows = (json.loads(line) for line in metrics.read_text().splitlines() if line.strip())
    return {int(r["round"]): float(r["eval/success_rate"]) for r in rows if "eval/success_rate" in r}


def success_rounds(run_dir: Path) -> dict[int, float]:
    """Every evaluated round's held-out success: from the episode records where they exist, else metrics.jsonl."""
    out = _metrics_success(run_dir)
    for r in evaluation_rounds(run_dir):
        episodes = _record(run_dir, r)["episodes"]
        out[r] = sum(e["won"] for e in episodes) / len(episodes)
    return dict(sorted(out.items()))


def over_seeds(pairs: Sequence[tuple[float, float]]) -> dict:
    """(later, earlier) success, one pair per seed -> later minus earlier over seeds: mean, se, ci95, paired t-test p."""
    out = paired_difference(dict(enumerate(a for a, _ in pairs)), dict(enumerate(b for _, b in pairs)))
    return {k: v for k, v in out.items() if k != "seeds"}


def _line(d: dict) -> str:
    ratio = d["mean"] / d["se"] if d["se"] else float("nan")
    return (f"{d['later_success']:.3f} - {d['earlier_success']:.3f} = {d['mean']:+.3f} +- {d['se']:.3f} success per "
            f"task (95% interval [{d['ci95'][0]:+.3f}, {d['ci95'][1]:+.3f}]), difference / SE {ratio:.1f}, paired "
            f"t-test over {d['n']} tasks p = {d['p']:.2g} ({d['episodes']} episodes an evaluation)")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m fedagent_flwr.experiments.paired_rounds", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_dirs", type=Path, nargs="+", metavar="run_dir",
                   help="run folders, one per seed (each holds episodes/round-NNNN.json)")
    p.add_argument("--rounds", type=int, nargs=2, metavar=("LATER", "EARLIER"),
                   help="the two evaluations to compare (default: the last and the first)")
    p.add_argument("--against", type=Path, nargs="+", metavar="OTHER_RUN",
                   help="compare with other run folders' evaluations instead, one per run_dir in the same order "
                        "(default: each run's last)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    args = p.parse_args(argv)
    if args.against is not None and len(args.against) != len(args.run_dirs):
        p.error(f"--against: {len(args.against)} runs for {len(args.run_dirs)} run_dir; give one per run_dir, "
                f"in the same seed order")
    others = args.against if args.against is not None else args.run_dirs
    results, seeds = [], []
    for run_dir, other in zip(args.run_dirs, others):
        mine, theirs = success_rounds(run_dir), success_rounds(other)
        for folder, rounds in ((run_dir, mine), (other, theirs)):
            if not rounds:
                p.error(f"{folder}: no episodes/round-NNNN.json and no evaluated round in metrics.jsonl (a run "
                        f"folder of this project, evaluated at least once)")
        if args.against is None and len(mine) < 2 and not args.rounds:
            p.error(f"run_dir {run_dir}: needs two evaluations, found rounds {list(mine)}")
        # one run: its last minus its first evaluation; two runs: each one's last
        first, second = args.rounds or (list(mine)[-1], list(theirs)[-1] if args.against is not None else list(theirs)[0])
        for folder, r, rounds in ((run_dir, first, mine), (other, second, theirs)):
            if r not in rounds:
                p.error(f"--rounds: round {r} of {folder} was not evaluated; evaluated rounds: {list(rounds)}")
        seed, other_seed = run_seed(run_dir), run_seed(other)
        if None not in (seed, other_seed) and seed != other_seed:
            p.error(f"--against: {run_dir} ran seed {seed} and {other} seed {other_seed}; pair runs of the same seed")
        with_records = all(r in evaluation_rounds(f) for f, r in ((run_dir, first), (other, second)))
        if with_records:
            try:
                d = compare_runs(run_dir, other, first, second)
            except ValueError as err:
                p.error(str(err))
        else:  # no room records: the run still counts over seeds, with its evaluation's success rate
            d = {"later_success": mine[first], "earlier_success": theirs[second], "later": first, "earlier": second,
                 "mean": mine[first] - theirs[second]}
        d.update(seed=seed, run=str(run_dir), other=str(other), rooms=with_records)
        results.append(d)
        seeds.append(seed)
    known = [s for s in seeds if s is not None]
    if len(results) > 1 and len(set(known)) != len(known):
        p.error(f"run_dir: seeds {seeds} repeat; give one run per seed")
    summary = (over_seeds([(d["later_success"], d["earlier_success"]) for d in results])
               if len(results) > 1 else None)
    if args.json:
        print(json.dumps(results[0] if summary is None else {"runs": results, "over_seeds": summary}))
        return 0
    for d in results:
        what = (f"round {d['later']} minus round {d['earlier']}" if args.against is None
                else f"{Path(d['run']).name} round {d['later']} minus {Path(d['other']).name} round {d['earlier']}")
        prefix = f"seed {d['seed']}: " if summary is not None else ""
        if d["rooms"]:
            print(f"{prefix}{what}: {_line(d)}")
        else:
            print(f"{prefix}{what}: {d['later_success']:.3f} - {d['earlier_success']:.3f} = {d['mean']:+.3f} (from "
                  f"metrics.jsonl: no episode records, so no test room by room)")
    if summary is not None:
        s = summary
        verdict = "shown" if s["p"] < ALPHA else "not shown"
        print(f"over {s['n']} seeds: {s['mean']:+.3f} +- {s['se']:.3f} (95% interval [{s['ci95'][0]:+.3f}, "
              f"{s['ci95'][1]:+.3f}]), paired t-test over seeds p = {s['p']:.2g}: a change {verdict} at p < {ALPHA}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
