"""FedAgent's Table 1 as a fair test (issue 95): FedAgentAvg against single learners given its budget, on the
directions preset, analysed as docs/preregistration-table1.md fixed before the first run.

    python -m fedagent_flwr.experiments.matched_table1 --preset configs/smollm2-fedagent-directions-cpu.toml \\
        --seeds 0 1 2 3 4 --out OUT          # runs what is missing, then writes OUT/matched-table1.md and .json
    python -m fedagent_flwr.experiments.matched_table1 --power   # the power of the pre-registered test, by seeds

Arms per seed, each one run of the app (experiments/protocols.py runs them, resumable, each baseline taking the
seed's FedAgentAvg evaluation before round 1):
- FedAgentAvg as the preset has it;
- Local(k), matched, for each k of --local-clients: client k's rooms alone, given every round the federation's
  episodes (clients-per-round x grpo.tasks-per-epoch x grpo.num-generations), a mini-batch as many times larger so it
  takes as many sequential AdamW steps as one FedAgentAvg client, and a fresh AdamW every round as a client has;
- Centralized, matched: all clients' rooms pooled, matched alike.
Every arm evaluates SAMPLES_PER_ROOM episodes per held-out room.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats as scipy_stats

from fedagent_flwr.atomic import atomic_write_text, write_json_atomic
from fedagent_flwr.config import RunConfig
from fedagent_flwr.experiments.doc_blocks import Block
from fedagent_flwr.experiments.paired_rounds import evaluation_rounds, success_by_task
from fedagent_flwr.experiments.protocols import Run, execute, federation_share, resolve_preset
from fedagent_flwr.experiments.seed_statistics import paired_difference
from fedagent_flwr.methods.tasks import all_partitions, holdings
from fedagent_flwr.runs.run_folder import recorded_run_config

SAMPLES_PER_ROOM = 6  # one arm's evaluation noise about 2.5-3 points on 48 rooms (binomial, success near one half)
LOCAL_CLIENTS = (0, 1)  # on the directions preset: north-east and south-west, opposite directions
OPPOSITE = {"north-east": "south-west", "south-west": "north-east", "north-west": "south-east", "south-east": "north-west"}
SUPPORTED_AT, REFUTED_BELOW, ALPHA = 0.06, 0.03, 0.05  # the pre-registered verdict's thresholds (success, 0-1)
# The pilot the power is computed from: FedAgentAvg and the earlier compute-matched Local(0) of the directions
# preset, seeds 0-2 (unequal budgets, but the same preset, rooms and evaluation seed).
PILOT = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "2026-12-04-cpu" / "table1-directions" / "runs"
PILOT_PAIRS = [(PILOT / f"table1-fedagent-s{s}", PILOT / f"table1-local0-matched-s{s}") for s in (0, 1, 2)]


def matched(base: dict[str, Any], seed: int, baseline: dict[str, Any]) -> dict[str, Any]:
    """A single learner's config given one FedAgentAvg round's budget every round: the episodes of the clients a round
    trains, a mini-batch as many times larger (as many sequential AdamW steps as one client takes), reset AdamW."""
    cfg = RunConfig.from_run_config(RunConfig().to_run_config() | base)
    share = federation_share(base)
    return base | {"seed": seed, **baseline, "baseline.optimizer": "reset",
                   "grpo.tasks-per-epoch": cfg.grpo.tasks_per_epoch * share,
                   "grpo.mini-batch-size": cfg.grpo.mini_batch_size * share}


def plan(seeds: list[int], base: dict[str, Any], local_clients: tuple[int, ...] = LOCAL_CLIENTS) -> list[Run]:
    """The arms of every seed, FedAgentAvg first (the baselines take its evaluation before round 1)."""
    base = base | {"eval.samples-per-task": SAMPLES_PER_ROOM}
    share = federation_share(base)
    runs = []
    for s in seeds:
        runs.append(Run(f"matched-fedagent-s{s}", "FedAgentAvg", "FedAgentAvg", s, base | {"seed": s}))
        for k in local_clients:
            runs.append(Run(f"matched-local{k}-s{s}", f"Local ({k}), matched", f"Local {k}", s,
                            matched(base, s, {"baseline.name": "local", "baseline.local-client": k}), cores=share))
        runs.append(Run(f"matched-centralized-s{s}", "Centralized, matched", "Centralized", s,
                        matched(base, s, {"baseline.name": "centralized"}), cores=share))
    return runs


# ------------------------------------------------------------------ records


def held_categories(run_dir: Path) -> set[str]:
    """The room categories a run's learners trained on (a Local: its client's; FedAgentAvg: every client's)."""
    cfg = recorded_run_config(run_dir)
    return {c for cats in holdings(cfg, all_partitions(cfg, cfg.num_clients)).values() for c, n in cats.items() if n}


def budget(run_dir: Path) -> dict[str, float]:
    """What a run spent in training, from its metric rows: episodes over every client, AdamW steps along the global
    model's path (a round's mean client: FedAgentAvg's clients step side by side), and fresh optimizers along it."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    trained = [r for r in rows if r.get("train/replies", 0) > 0]
    cfg = recorded_run_config(run_dir)
    kept = cfg.baseline.name != "none" and cfg.baseline.optimizer == "keep"
    return {"episodes": sum(r.get("train/episodes", 0.0) * r["train/replies"] for r in trained),
            "path_steps": sum(r.get("train/optimizer_steps", 0.0) for r in trained),
            "optimizer_resets": float(min(1, len(trained)) if kept else len(trained))}


def evaluation(run_dir: Path, round_: int | None = None) -> tuple[dict[str, float], dict[str, str]]:
    """(success by room, category by room) of a run's evaluation of `round_` (default: its last)."""
    round_ = evaluation_rounds(run_dir)[-1] if round_ is None else round_
    record = json.loads((run_dir / "episodes" / f"round-{round_:04d}.json").read_text())
    return success_by_task(record), {e["task"]: e.get("category") for e in record["episodes"]}


def on_rooms(run_dir: Path, categories: set[str], round_: int | None = None) -> float:
    """A run's held-out success at `round_` (default: its last evaluation) over the rooms of `categories`, each room
    weighing alike."""
    success, category = evaluation(run_dir, round_)
    rooms = [t for t in success if category[t] in categories]
    return float(np.mean([success[t] for t in rooms])) if rooms else math.nan


# ------------------------------------------------------------------ the pre-registered analysis


def endpoints(seeds: dict[int, dict[str, Path]], local_clients: tuple[int, ...]) -> dict[str, dict[str, Any]]:
    """The pre-registered effects over seeds, each FedAgentAvg minus an arm (success, 0-1), paired t-tests over seeds.
    `seeds`: seed -> arm ("fedagent", "local<k>", "centralized") -> run folder.
    - primary: on the held-out rooms of the directions client k does not hold, against Local(k), averaged over k;
    - overall: all held-out rooms, against Local(k) averaged over k;
    - opposite: the rooms of the direction opposite to client k's, against Local(k), averaged over k;
    - centralized: all held-out rooms, against matched Centralized."""
    every = set(OPPOSITE)
    a: dict[str, dict[int, float]] = {name: {} for name in ("primary", "overall", "opposite", "centralized")}
    b: dict[str, dict[int, float]] = {name: {} for name in a}
    for s, arms in seeds.items():
        fed = arms["fedagent"]
        for name, rooms_of in (("primary", lambda held: every - held), ("overall", lambda held: every),
                               ("opposite", lambda held: {OPPOSITE[c] for c in held})):
            pairs = [(on_rooms(fed, rooms_of(held)), on_rooms(arms[f"local{k}"], rooms_of(held)))
                     for k in local_clients if (held := held_categories(arms[f"local{k}"]))]
            a[name][s], b[name][s] = float(np.mean([x for x, _ in pairs])), float(np.mean([y for _, y in pairs]))
        if "centralized" in arms:
            a["centralized"][s], b["centralized"][s] = on_rooms(fed, every), on_rooms(arms["centralized"], every)
    return {name: {k: v for k, v in paired_difference(a[name], b[name]).items()} for name in a if a[name]}


def verdict(primary: dict[str, Any]) -> str:
    """The pre-registration's rule: supported where the effect is at least +6 points with p < 0.05; refuted where its
    95% interval lies below +3 points; otherwise inconclusive."""
    if primary["mean"] >= SUPPORTED_AT and primary["p"] < ALPHA:
        return "supported"
    if primary["ci95"][1] < REFUTED_BELOW:
        return "refuted"
    return "inconclusive"


def power(seeds: int, effect: float, sd: float, alpha: float = ALPHA) -> float:
    """The chance a two-sided paired t-test over `seeds` seeds gives p < alpha when the true mean difference is
    `effect` and its spread from seed to seed is `sd` (the noncentral t distribution)."""
    df, nc = seeds - 1, effect / (sd / math.sqrt(seeds))
    t = scipy_stats.t.ppf(1 - alpha / 2, df)
    return float(scipy_stats.nct.sf(t, df, nc) + scipy_stats.nct.cdf(-t, df, nc))


def pilot_spread(pairs: list[tuple[Path, Path]] = PILOT_PAIRS) -> tuple[list[float], float]:
    """The pilot's per-seed primary differences (FedAgentAvg minus the Local on the rooms its client does not hold)
    and their standard deviation over seeds."""
    every = set(OPPOSITE)
    diffs = [on_rooms(fed, every - held_categories(local)) - on_rooms(local, every - held_categories(local))
             for fed, local in pairs]
    return diffs, float(np.std(diffs, ddof=1))


def power_lines(seed_counts: tuple[int, ...] = (5, 6, 8, 10)) -> list[str]:
    diffs, sd = pilot_spread()
    lines = [f"Pilot (the earlier directions table, FedAgentAvg minus the compute-matched Local(0) on the rooms of the "
             f"three directions client 0 does not hold, seeds 0-2): {', '.join(f'{100 * d:+.1f}' for d in diffs)} "
             f"points; standard deviation over seeds {100 * sd:.1f} points.",
             f"Power of the primary test (two-sided paired t, p < {ALPHA}) to detect a true +{100 * SUPPORTED_AT:.0f} "
             "points with that spread: " + ", ".join(f"{n} seeds {power(n, SUPPORTED_AT, sd):.2f}" for n in seed_counts) + "."]
    return lines


def doc_parts() -> list[Block]:
    """The pilot's spread and the test's power in docs/preregistration-table1.md (scripts/write_docs.py)."""
    return [Block("docs/preregistration-table1.md", "power", tuple(power_lines()))]


# ------------------------------------------------------------------ report


def report(out: Path, runs: list[Run], local_clients: tuple[int, ...], title: str) -> dict[str, Any]:
    folder = {r.name: out / "runs" / r.name for r in runs}
    arm_of = {r.name: ("fedagent" if r.group == "FedAgentAvg" else "centralized" if r.group.startswith("Centralized")
                       else f"local{r.config['baseline.local-client']}") for r in runs}
    seeds: dict[int, dict[str, Path]] = {}
    for r in runs:
        seeds.setdefault(r.seed, {})[arm_of[r.name]] = folder[r.name]
    directions = sorted(OPPOSITE)
    lines = [f"# {title}", "", f"Held-out success (%) after the last round, by the goal direction of the held-out room "
             f"({SAMPLES_PER_ROOM} episodes a room), and what each arm spent in training, read from its records.", "",
             "| arm | seed | " + " | ".join(directions) + " | overall | episodes | AdamW steps along the path | fresh optimizers | records |",
             "| --- | --- |" + " --- |" * (len(directions) + 5)]
    table = []
    for r in runs:
        d = folder[r.name]
        spent = budget(d)
        row = {"arm": r.group, "seed": r.seed, **{c: on_rooms(d, {c}) for c in directions},
               "overall": on_rooms(d, set(directions)), **spent}
        table.append(row)
        lines.append(f"| {r.group} | {r.seed} | " + " | ".join(f"{100 * row[c]:.1f}" for c in directions + ["overall"])
                     + f" | {spent['episodes']:.0f} | {spent['path_steps']:.1f} | {spent['optimizer_resets']:.0f} | {r.name} |")
    effects = endpoints(seeds, local_clients)
    names = {"primary": "primary: FedAgentAvg - Local(k) on the directions client k does not hold, mean over k",
             "overall": "overall success, FedAgentAvg - Local(k), mean over k",
             "opposite": "the direction opposite to client k's, FedAgentAvg - Local(k), mean over k",
             "centralized": "overall success, FedAgentAvg - Centralized"}
    lines += ["", "| endpoint | difference (points) | 95% interval | p | seeds |", "| --- | --- | --- | --- | --- |"]
    for name, e in effects.items():
        lines.append(f"| {names[name]} | {100 * e['mean']:+.1f} ± {100 * e['se']:.1f} | [{100 * e['ci95'][0]:+.1f}, "
                     f"{100 * e['ci95'][1]:+.1f}] | {e['p']:.3g} | {e['n']} |")
    result = {"title": title, "table": table, "endpoints": effects, "verdict": verdict(effects["primary"])}
    lines += ["", f"Verdict (docs/preregistration-table1.md): **{result['verdict']}**.", ""]
    atomic_write_text(out / "matched-table1.md", "\n".join(lines))
    write_json_atomic(out / "matched-table1.json", result)
    print("\n".join(lines), flush=True)
    return result


def main(argv: list[str] | None = None) -> dict[str, Any] | None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="configs/smollm2-fedagent-directions-cpu.toml", help="a run-config file")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    p.add_argument("--local-clients", type=int, nargs="+", default=list(LOCAL_CLIENTS))
    p.add_argument("--out", help="folder for runs, logs and the table")
    p.add_argument("--power", action="store_true", help="print the pilot's spread and the test's power, and stop")
    p.add_argument("--num-cpus-per-client", type=int, default=1)
    p.add_argument("--num-gpus-per-client", type=float, default=0.0)
    p.add_argument("--dry-run", action="store_true", help="print the runs without starting them")
    args = p.parse_args(argv)
    if args.power:
        print("\n".join(power_lines()))
        return None
    if not args.out:
        p.error("--out is required (unless --power)")
    preset, base = resolve_preset(args.preset)
    locals_ = tuple(args.local_clients)
    if bad := [k for k in locals_ if not 0 <= k < base["num-clients"]]:
        p.error(f"--local-clients {bad}: must be partition-ids 0 .. {base['num-clients'] - 1}")
    out = Path(args.out).expanduser().resolve()
    out.mkdir(parents=True, exist_ok=True)
    runs = plan(args.seeds, base, locals_)
    execute(runs, out, args.num_cpus_per_client, args.num_gpus_per_client, args.dry_run)
    if args.dry_run:
        return None
    return report(out, runs, locals_, f"Table 1, budgets matched ({preset} preset, seeds {', '.join(map(str, args.seeds))})")


if __name__ == "__main__":
    main()
