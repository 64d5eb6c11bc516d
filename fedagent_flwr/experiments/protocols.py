"""FedAgentGym's experiment protocols as commands (FedAgent paper §5 Table 1, §6 Figure 3, §7 Figure 4).

    python -m fedagent_flwr.experiments.protocols table1 --preset cpu --seeds 0 1 2 --out runs/t1
    python -m fedagent_flwr.experiments.protocols decentralized --preset cpu --seeds 0 --out runs/dec
    python -m fedagent_flwr.experiments.protocols heterogeneity --preset cpu --seeds 0 --out runs/het
    python -m fedagent_flwr.experiments.protocols table1 --preset paper --dry-run --out /data/t1   # print the runs

Every configuration is one real federated run of this app (`python -m fedagent_flwr.simulation`
-> `flwr run`), in OUT/runs/<name>/; a run whose summary.json exists is reused,
so an interrupted protocol continues where it stopped. Then:

- table1: FedAgent vs Centralized vs Local(k) with the same rounds and local
  epochs (the baselines are run-config `baseline`); held-out success per task
  category and overall after the last round, mean ± standard error over seeds
  (and the std in the JSON) -> OUT/table1.md, OUT/table1.json.
- decentralized: three panels (tasks per client, clients per round, local
  epochs with total epochs T * tau fixed) of held-out success against training
  epochs -> OUT/decentralized.png, .md, .json.
- heterogeneity: preference omega, coverage xi, hardness xi' at the paper's low
  and high values -> OUT/heterogeneity.png, .md, .json. Hardness needs success
  labels: given with --success-labels, or made first from the base model with
  `python -m fedagent_flwr.experiments.success_labels` into OUT/success_labels.json.
  `--panels preference` (or any of the three) runs only those panels.

Presets (configs/fedagent-<preset>.toml): `cpu` runs the tiny Gridworld model at toy scale on a CPU (numbers from it
say nothing about the paper's setting); `paper` is the paper's scale (100
clients, 70 rounds of 3 epochs, Qwen2.5-1.5B-Instruct) for GPU machines.
`--set key=value` overrides any run-config key of every run.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import zlib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fedagent_flwr.atomic import atomic_write_text, write_json_atomic
from fedagent_flwr.config import RunConfig
from fedagent_flwr.simulation import parse_overrides
from fedagent_flwr.experiments.seed_statistics import (
    cell,
    ordering,
    paired_difference,
    stats,
)
from fedagent_flwr.methods.tasks import all_partitions
from fedagent_flwr.simulation import read_run_config_file

APP_DIR = Path(__file__).resolve().parents[2]  # the project folder (pyproject.toml, configs/) of a checkout



def load_presets(app: Path) -> dict[str, dict[str, Any]]:
    """The shared run config of each preset: configs/fedagent-<preset>.toml of the app folder."""
    folder = app / "configs"
    presets = {f.stem.removeprefix("fedagent-"): read_run_config_file(str(f)) for f in sorted(folder.glob("fedagent-*.toml"))}
    if not presets:
        raise FileNotFoundError(f"no configs/fedagent-*.toml presets in {app}; pass --app <the project folder>")
    return presets


# The cpu preset (configs/fedagent-cpu.toml) is scaled so a run takes a few minutes on 2 cores:
# Gridworld's 512 training rooms, 8 clients of 4.
PRESETS = load_presets(APP_DIR)
LOCAL_CLIENTS = {"cpu": (1, 3), "paper": (21, 42, 84)}
# §6 / Figure 3. The cpu values keep the paper's ratios (1 : 5 : 10 tasks per client scaled to 2 : 4 : 8).
DECENTRALIZED = {
    "cpu": {"tasks-per-client": (2, 4, 8), "clients-per-round": (1, 2, 4), "local-epochs": (1, 2, 3), "total-epochs": 6},
    "paper": {"tasks-per-client": (100, 500, 1000), "clients-per-round": (1, 2, 4), "local-epochs": (1, 3, 5), "total-epochs": 210},
}
# §7 / Figure 4: low vs high heterogeneity. Coverage hands out r * N task slots in all, so its clients' sizes follow
# the pool: cpu 1.3 x 512 Gridworld rooms over 8 clients, about 83 each (20..160); paper: the reference defaults
# (100..1000 around 500, r = 1.3; needs N >= K * 100 / 1.3 tasks, e.g. real WebShop).
HETEROGENEITY = {
    "cpu": {"coverage": {"coverage-r": 1.3, "coverage-l-min": 20, "coverage-l-avg": 83.2, "coverage-l-max": 160}},
    "paper": {"coverage": {"coverage-r": 1.3, "coverage-l-min": 100, "coverage-l-avg": 500.0, "coverage-l-max": 1000}},
}
HET_VALUES = {"preference": ("preference-omega", (0.1, 0.9)), "coverage": ("coverage-xi", (256.0, 1.0)),
              "hardness": ("hardness-xi", (256.0, 1.0))}


@dataclass
class Run:
    name: str
    group: str  # a row of the table / a panel of the figure
    label: str  # a curve within the panel
    seed: int
    config: dict[str, Any] = field(default_factory=dict)


# ------------------------------------------------------------------ plans


# Table 1 compares methods on one federation's data. At the cpu preset its partitions do not move with the seed
# (partition-seed 42), so "Local (client k)" is one data set and each seed pairs the methods up. The paper preset
# splits as the reference does (partition uniform-windows, partition-seed -1): its uniform split cuts a task list
# its environments reshuffle with the run's seed (shuffle_seed), so client data moves with the seed there, while a
# round's clients are drawn seeded 42 + round - 1 (client-sampling reference); 42 + k seeds client k only in the
# reference's other partitions (preference, coverage, hardness).
TABLE1_PARTITION_SEED = 42


def table1_runs(preset: str, seeds: list[int], base: dict, local_clients: tuple[int, ...]) -> list[Run]:
    base = {"partition-seed": TABLE1_PARTITION_SEED} | base  # a preset or --set may still choose another
    runs = []
    for s in seeds:
        runs.append(Run(f"table1-fedagent-s{s}", "FedAgent", "FedAgent", s, base | {"seed": s}))
        runs.append(Run(f"table1-centralized-s{s}", "Centralized", "Centralized", s, base | {"seed": s, "baseline": "centralized"}))
        for k in local_clients:
            runs.append(Run(f"table1-local{k}-s{s}", f"Local (client {k})", f"Local {k}", s,
                            base | {"seed": s, "baseline": "local", "local-client": k}))
    return runs


def decentralized_runs(preset: str, seeds: list[int], base: dict) -> list[Run]:
    spec = DECENTRALIZED[preset]
    runs = []
    for s in seeds:
        for key in ("tasks-per-client", "clients-per-round"):
            for v in spec[key]:
                runs.append(Run(f"dec-{key}-{v}-s{s}", key, f"{key} = {v}", s, base | {"seed": s, key: v}))
        for tau in spec["local-epochs"]:
            rounds = spec["total-epochs"] // tau
            runs.append(Run(f"dec-local-epochs-{tau}-s{s}", "local-epochs", f"local-epochs = {tau} ({rounds} rounds)", s,
                            base | {"seed": s, "local-epochs": tau, "num-server-rounds": rounds,
                                    "eval-every": max(1, rounds // 3)}))
    for r in runs:
        if r.group != "local-epochs":  # curves need a few points: about three evaluations per run
            r.config["eval-every"] = max(1, r.config["num-server-rounds"] // 3)
    return runs


def heterogeneity_runs(preset: str, seeds: list[int], base: dict, labels: str | None,
                       panels: tuple[str, ...] = tuple(HET_VALUES)) -> list[Run]:
    runs = []
    for s in seeds:
        for partition, (key, values) in HET_VALUES.items():
            if partition not in panels:
                continue
            extra = dict(HETEROGENEITY[preset].get(partition, {}))
            if partition == "hardness":
                extra["success-labels"] = labels
            for v in values:
                runs.append(Run(f"het-{partition}-{v:g}-s{s}", partition, f"{key} = {v:g}", s,
                                base | extra | {"seed": s, "partition": partition, key: v,
                                                "eval-every": max(1, base["num-server-rounds"] // 3)}))
    return runs


# ------------------------------------------------------------------ running


def run_args(run: Run, out: Path, num_cpus: int, num_gpus: float) -> list[str]:
    args = [sys.executable, "-m", "fedagent_flwr.simulation", "--app", str(APP_DIR)]
    for key, value in run.config.items():
        args += [f"--{key}", str(value)]
    args += ["--output-dir", str(out / "runs"), "--run-name", run.name,
             "--num-cpus-per-client", str(num_cpus), "--num-gpus-per-client", str(num_gpus)]
    return args


def isolated_env(out: Path) -> dict[str, str]:
    """A Flower home and SuperLink ports of the protocol's own, so concurrent flwr runs on this machine do not share
    (and stop) its SuperLink. The ports come from the output folder, so reruns of one protocol reuse them."""
    offset = zlib.crc32(str(out).encode()) % 500
    port = 41000 + 4 * offset
    return os.environ | {
        "FLWR_HOME": str(out / ".flwr"), "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": str(port),
        "FLWR_LOCAL_CONTROL_API_PORT": str(port + 2), "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
        "FLWR_TELEMETRY_ENABLED": "0", "RAY_AUTH_MODE": "disabled",
    }


def execute(runs: list[Run], out: Path, num_cpus: int, num_gpus: float, dry_run: bool) -> None:
    for cfg in runs:  # every configuration is validated before the first run starts
        if dry_run and cfg.config.get("partition") == "hardness" and not Path(cfg.config["success-labels"]).exists():
            continue  # a dry run does not make the labels file the real run would
        RunConfig.from_run_config(RunConfig().to_run_config() | cfg.config | {"output-dir": str(out / "runs")})
    for i, run in enumerate(runs, 1):
        done = out / "runs" / run.name / "summary.json"
        if done.exists():
            print(f"[protocol] {i}/{len(runs)} {run.name}: done before, reusing {done}", flush=True)
            continue
        args = run_args(run, out, num_cpus, num_gpus)
        print(f"[protocol] {i}/{len(runs)} {run.name}", flush=True)
        if dry_run:
            print("  " + " ".join(args), flush=True)
            continue
        log = out / "logs" / f"{run.name}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("w") as f:
            code = subprocess.call(args, stdout=f, stderr=subprocess.STDOUT, cwd=out, env=isolated_env(out))
        if code != 0 or not done.exists():
            raise RuntimeError(f"run {run.name} failed (exit {code}); see {log}")


# ------------------------------------------------------------------ results


def final_metrics(out: Path, run: Run) -> dict[str, float]:
    return json.loads((out / "runs" / run.name / "summary.json").read_text())["final"]


def curve(out: Path, run: Run) -> tuple[list[int], list[float]]:
    """(training epochs so far, held-out success) at every evaluation of the run."""
    tau = int(run.config["local-epochs"])
    xs, ys = [], []
    for line in (out / "runs" / run.name / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        if "eval/success_rate" in row:
            xs.append(int(row["round"]) * tau)
            ys.append(float(row["eval/success_rate"]))
    return xs, ys


def local_holding(run: Run) -> dict[str, int]:
    """Category -> how many of client k's training tasks fall in it, for a Local (client k) run."""
    cfg = RunConfig.from_run_config(RunConfig().to_run_config() | run.config)
    tasks = all_partitions(cfg, cfg.num_clients)[cfg.local_client]
    return dict(sorted(Counter(t.category for t in tasks).items()))


def table1_report(out: Path, runs: list[Run], title: str) -> dict:
    categories = sorted({k.split("/", 1)[1] for r in runs for k in final_metrics(out, r) if k.startswith("success_rate/")})
    columns = categories + ["overall"]
    key = {c: "success_rate" if c == "overall" else f"success_rate/{c}" for c in columns}
    # group -> column -> seed -> success; the base model once per seed (every method of a seed starts from the
    # same model and evaluates with the same seed, so its runs repeat one measurement, not several)
    by_seed: dict[str, dict[str, dict[int, float]]] = {}
    base: dict[str, dict[int, float]] = {}
    for r in runs:
        m = final_metrics(out, r)
        start = json.loads((out / "runs" / r.name / "summary.json").read_text())["initial"]
        for c in columns:
            by_seed.setdefault(r.group, {}).setdefault(c, {})[r.seed] = m.get(key[c], math.nan)
            base.setdefault(c, {}).setdefault(r.seed, start[key[c]])
    result = {"title": title, "columns": columns,
              "rows": {g: {c: stats(list(v.values())) for c, v in row.items()} for g, row in by_seed.items()},
              "base_model": {c: stats(list(v.values())) for c, v in base.items()}}
    lines = [f"# {title}", "", "Held-out success (%) after the last round; mean ± standard error over seeds "
             f"({', '.join(str(s) for s in sorted({r.seed for r in runs}))}).", "",
             "| method | " + " | ".join(columns) + " |", "| --- |" + " --- |" * len(columns)]
    for g, row in result["rows"].items():
        lines.append(f"| {g} | " + " | ".join(cell(row[c]) for c in columns) + " |")
    lines.append("| base model (before training) | " + " | ".join(cell(result["base_model"][c]) for c in columns) + " |")
    # What each Local learner trains on explains its row (a skewed partition leaves it categories it never sees).
    holdings = {r.group: local_holding(r) for r in runs if r.config.get("baseline") == "local" and r.seed == runs[0].seed}
    result["local_tasks"] = holdings
    if holdings:
        # With partition-seed = -1 (a --set may choose it) each seed holds other tasks: say which seed is listed.
        moves = int(runs[0].config.get("partition-seed", -1)) < 0
        lines += ["", "Training tasks of each Local learner, by category"
                  + (f" (seed {runs[0].seed}; the partition moves with the seed)" if moves else "") + ": " + "; ".join(
            f"{g}: " + ", ".join(f"{c} {n}" for c, n in held.items()) for g, held in holdings.items()) + "."]
    # The orderings Table 1 is read for, each with its paired test over seeds (experiments/seed_statistics.py).
    overall = {g: row["overall"] for g, row in by_seed.items()} | {"the base model": base["overall"]}
    claims = [(g, "the base model") for g in ("FedAgent", "Centralized")] + \
             [("FedAgent", g) for g in by_seed if g.startswith("Local")]
    comparisons = {f"{a} > {b}": paired_difference(overall[a], overall[b]) for a, b in claims}
    gap = paired_difference(overall["FedAgent"], overall["Centralized"])
    result["comparisons"] = comparisons | {"FedAgent - Centralized": gap}
    verdicts = [ordering(a, b, comparisons[f"{a} > {b}"]) for a, b in claims]
    verdicts.append(f"FedAgent - Centralized: {100 * gap['mean']:+.1f} points, 95% interval "
                    f"[{100 * gap['ci95'][0]:+.1f}, {100 * gap['ci95'][1]:+.1f}] ({gap['n']} seeds)")
    result["verdict"] = verdicts
    lines += [""] + [f"- {v}" for v in verdicts] + [""]
    atomic_write_text(out / "table1.md", "\n".join(lines))
    write_json_atomic(out / "table1.json", result)
    print("\n".join(lines), flush=True)
    return result


def curves_report(out: Path, runs: list[Run], stem: str, title: str) -> dict:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = list(dict.fromkeys(r.group for r in runs))
    fig, axes = plt.subplots(1, len(groups), figsize=(5 * len(groups), 3.8), squeeze=False)
    result: dict[str, Any] = {"title": title, "panels": {}}
    lines = [f"# {title}", "", "Held-out success (%) after the last round; mean ± SE over seeds.", "",
             "| panel | setting | start | final |", "| --- | --- | --- | --- |"]
    for ax, group in zip(axes[0], groups):
        panel = {}
        for label in dict.fromkeys(r.label for r in runs if r.group == group):
            members = [r for r in runs if r.group == group and r.label == label]
            points = [curve(out, r) for r in members]
            xs = points[0][0]
            ys = np.mean([p[1] for p in points if p[0] == xs], axis=0)
            ax.plot(xs, ys, marker="o", label=label)
            finals = stats([p[1][-1] for p in points])
            starts = stats([p[1][0] for p in points])
            panel[label] = {"epochs": xs, "mean_success": [float(y) for y in ys], "final": finals, "start": starts,
                            "final_by_seed": {r.seed: p[1][-1] for r, p in zip(members, points)}}
            lines.append(f"| {group} | {label} | {cell(starts)} | {cell(finals)} |")
        ax.set_title(group)
        ax.set_xlabel("training epochs (rounds x local epochs)")
        ax.set_ylabel("held-out success")
        ax.legend(fontsize=8)
        result["panels"][group] = panel
    # A panel of two settings (the heterogeneity protocol: low, then high) is read for the direction of the
    # effect: the first setting's final success minus the second's, paired by seed, with its test.
    verdicts = []
    for group, panel in result["panels"].items():
        if len(panel) == 2:
            (first, a), (second, b) = panel.items()
            comparison = paired_difference(a["final_by_seed"], b["final_by_seed"])
            panel["comparison"] = comparison
            verdicts.append(f"{group}: " + ordering(first, second, comparison))
    if verdicts:
        lines += [""] + [f"- {v}" for v in verdicts]
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    tmp = out / f".{stem}.png.tmp.png"
    fig.savefig(tmp, dpi=120)
    plt.close(fig)
    tmp.replace(out / f"{stem}.png")
    atomic_write_text(out / f"{stem}.md", "\n".join(lines) + "\n")
    write_json_atomic(out / f"{stem}.json", result)
    print("\n".join(lines), flush=True)
    return result


# ------------------------------------------------------------------ command


def parse_set(items: list[str]) -> dict[str, Any]:
    try:
        return parse_overrides(items)
    except ValueError as err:
        raise SystemExit(str(err)) from None


def ensure_labels(out: Path, base: dict, given: str | None, dry_run: bool) -> str:
    if given:
        return str(Path(given).expanduser().resolve())
    path = out / "success_labels.json"
    if path.exists() or dry_run:
        return str(path)
    args = [sys.executable, "-m", "fedagent_flwr.experiments.success_labels", "--env", base["env"], "--model", base["model"],
            "--out", str(path), "--samples", "4", "--history-length", str(base.get("history-length", 0)),
            "--max-new-tokens", str(base.get("max-new-tokens", 32)), "--seed", "0"]
    print("[protocol] success labels: " + " ".join(args), flush=True)
    subprocess.run(args, check=True, cwd=APP_DIR)
    return str(path)


def setting(preset: str, base: dict, overrides: list[str]) -> str:
    """The settings a report's title names: the preset's essentials and every --set, so a table says what it ran."""
    where = f"{preset} preset: env {base['env']}, model {base['model']}, K={base['num-clients']}"
    return where + ("; --set " + " ".join(overrides) if overrides else "")


def main(argv: list[str] | None = None) -> dict | None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("protocol", choices=("table1", "decentralized", "heterogeneity"))
    p.add_argument("--preset", choices=tuple(PRESETS), default="cpu")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--out", required=True, help="folder for runs, logs, tables and figures")
    p.add_argument("--local-clients", type=int, nargs="+", help="table1: Local(k) baselines (cpu: 1 3; paper: 21 42 84)")
    p.add_argument("--success-labels", help="heterogeneity: labels file for the hardness runs (default: made from the base model)")
    p.add_argument("--panels", nargs="+", choices=tuple(HET_VALUES), default=list(HET_VALUES),
                   help="heterogeneity: the panels to run (default: all three)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="run-config override for every run")
    p.add_argument("--num-cpus-per-client", type=int, default=1)
    p.add_argument("--num-gpus-per-client", type=float, default=0.0)
    p.add_argument("--dry-run", action="store_true", help="print the runs without starting them")
    args = p.parse_args(argv)

    out = Path(args.out).expanduser().resolve()
    out.mkdir(parents=True, exist_ok=True)
    base = PRESETS[args.preset] | parse_set(args.set)
    where = setting(args.preset, base, args.set)
    if args.protocol == "table1":
        locals_ = tuple(args.local_clients or LOCAL_CLIENTS[args.preset])
        bad = [k for k in locals_ if not 0 <= k < base["num-clients"]]
        if bad:
            raise SystemExit(f"--local-clients {bad}: must be partition-ids 0 .. {base['num-clients'] - 1}")
        runs = table1_runs(args.preset, args.seeds, base, locals_)
    elif args.protocol == "decentralized":
        runs = decentralized_runs(args.preset, args.seeds, base)
    else:
        labels = ensure_labels(out, base, args.success_labels, args.dry_run) if "hardness" in args.panels else None
        runs = heterogeneity_runs(args.preset, args.seeds, base, labels, tuple(args.panels))
    execute(runs, out, args.num_cpus_per_client, args.num_gpus_per_client, args.dry_run)
    if args.dry_run:
        return None
    if args.protocol == "table1":
        return table1_report(out, runs, f"Table 1 protocol ({where})")
    if args.protocol == "decentralized":
        return curves_report(out, runs, "decentralized", f"Decentralized settings, Figure 3 protocol ({where})")
    return curves_report(out, runs, "heterogeneity", f"Heterogeneity, Figure 4 protocol ({where})")


if __name__ == "__main__":
    main()
