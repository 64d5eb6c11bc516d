"""FedAgentGym's experiment protocols as commands (FedAgent paper §5 Table 1, §6 Figure 3, §7 Figure 4).

    python -m fedagent_flwr.experiments.protocols table1 --preset cpu --seeds 0 1 2 --out runs/t1
    python -m fedagent_flwr.experiments.protocols decentralized --preset cpu --seeds 0 --out runs/dec
    python -m fedagent_flwr.experiments.protocols heterogeneity --preset cpu --seeds 0 --out runs/het
    python -m fedagent_flwr.experiments.protocols table1 --preset paper --dry-run --out /data/t1   # print the runs

Every configuration is one real federated run of this app (`python -m fedagent_flwr.simulation`
-> `flwr run`), in OUT/runs/<name>/; a run whose summary.json exists is reused, and one
left without it is moved aside (kept) and run again, so an interrupted protocol continues
where it stopped. Baselines take the evaluation before round 1 from their seed's FedAgent
run (`eval.initial-evaluation`); on CPUs `--parallel 2` runs one-core learners two at a time. Then:

- table1: FedAgent vs Local(k) vs Centralized with the same rounds and local
  epochs (the baselines are run-config `baseline`), and a compute-matched Local
  (the first k given a round's worth of the federation's episodes); held-out
  success per task category and overall after the last round, mean ± standard
  error over seeds (and the std in the JSON), the episodes and AdamW steps each
  spent, tests paired over seeds and, within each seed, over the held-out rooms
  -> OUT/table1.md, OUT/table1.json.
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
clients, 70 rounds of 3 epochs, Qwen2.5-1.5B-Instruct) for GPU machines. `--preset` also takes any run-config
file, e.g. configs/smollm2-fedagent-directions-cpu.toml (SmolLM2, each client one goal direction).
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
from fedagent_flwr.experiments.paired_rounds import compare_runs, evaluation_rounds, success_by_task
from fedagent_flwr.methods.tasks import all_partitions, holdings, holdings_line
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
FILE_PRESET_LOCAL_CLIENTS = (0, 1)  # a preset given as a file: clients 0 and 1 unless --local-clients says others

# §6 / Figure 3. The cpu values keep the paper's ratios (1 : 5 : 10 tasks per client scaled to 2 : 4 : 8).
DECENTRALIZED = {
    "cpu": {"partition.tasks-per-client": (2, 4, 8), "clients-per-round": (1, 2, 4), "grpo.local-epochs": (1, 2, 3), "total-epochs": 6},
    "paper": {"partition.tasks-per-client": (100, 500, 1000), "clients-per-round": (1, 2, 4), "grpo.local-epochs": (1, 3, 5), "total-epochs": 210},
}
# §7 / Figure 4: low vs high heterogeneity. Coverage hands out r * N task slots in all, so its clients' sizes follow
# the pool: cpu 1.3 x 512 Gridworld rooms over 8 clients, about 83 each (20..160); paper: the reference defaults
# (100..1000 around 500, r = 1.3; needs N >= K * 100 / 1.3 tasks, e.g. real WebShop).
HETEROGENEITY = {
    "cpu": {"coverage": {"partition.coverage-r": 1.3, "partition.coverage-l-min": 20, "partition.coverage-l-avg": 83.2, "partition.coverage-l-max": 160}},
    "paper": {"coverage": {"partition.coverage-r": 1.3, "partition.coverage-l-min": 100, "partition.coverage-l-avg": 500.0, "partition.coverage-l-max": 1000}},
}
HET_VALUES = {"preference": ("partition.preference-omega", (0.1, 0.9)), "coverage": ("partition.coverage-xi", (256.0, 1.0)),
              "hardness": ("partition.hardness-xi", (256.0, 1.0))}


def resolve_preset(text: str) -> tuple[str, dict[str, Any]]:
    """(name, run config) of --preset: a preset's name (configs/fedagent-<name>.toml) or the path of any run-config TOML
    file (e.g. configs/smollm2-fedagent-directions-cpu.toml), named by its stem."""
    if text in PRESETS:
        return text, PRESETS[text]
    if not text.endswith(".toml"):
        raise SystemExit(f"--preset {text!r}: expected one of {', '.join(PRESETS)} or the path of a run-config *.toml file")
    try:
        return Path(text).stem, read_run_config_file(text)
    except ValueError as err:
        raise SystemExit(f"--preset {text}: {err}") from None


@dataclass
class Run:
    name: str
    group: str  # a row of the table / a panel of the figure
    label: str  # a curve within the panel
    seed: int
    config: dict[str, Any] = field(default_factory=dict)
    cores: int = 1  # the clients of a federation round this one learner's work stands for: it gets their CPUs


# ------------------------------------------------------------------ plans


# Table 1 compares methods on one federation's data. At the cpu preset its partitions do not move with the seed
# (partition.seed 42), so "Local (client k)" is one data set and each seed pairs the methods up. The paper preset
# splits as the reference does (partition uniform-windows, partition.seed -1): its uniform split cuts a task list
# its environments reshuffle with the run's seed (shuffle_seed), so client data moves with the seed there, while a
# round's clients are drawn seeded 42 + round - 1 (federation.client-sampling reference); 42 + k seeds client k only in the
# reference's other partitions (preference, coverage, hardness).
TABLE1_PARTITION_SEED = 42


def federation_share(base: dict) -> int:
    """Clients that train in a FedAgent round of this config (clients-per-round, or every client when it is 0)."""
    cfg = RunConfig.from_run_config(RunConfig().to_run_config() | base)
    return cfg.clients_per_round or cfg.num_clients


def compute_matched(base: dict, k: int, seed: int) -> dict[str, Any]:
    """Local (client k) given a round's worth of the whole federation's work: the clients a round trains times the
    episodes (grpo.tasks-per-epoch x grpo.num-generations) and, through the same grpo.mini-batch-size, about as many AdamW steps, all
    played from the round-start policy as each client's are. It tells "more kinds of rooms" from "more compute"."""
    share = federation_share(base)
    return base | {"seed": seed, "baseline.name": "local", "baseline.local-client": k,
                   "grpo.tasks-per-epoch": int(base.get("grpo.tasks-per-epoch", RunConfig().grpo.tasks_per_epoch)) * share}


def table1_runs(preset: str, seeds: list[int], base: dict, local_clients: tuple[int, ...],
                matched: bool = True) -> list[Run]:
    """Per seed: FedAgent, each Local(k), Centralized and (with `matched`) the compute-matched Local of the first k."""
    base = {"partition.seed": TABLE1_PARTITION_SEED} | base  # a preset or --set may still choose another
    runs = []
    for s in seeds:
        runs.append(Run(f"table1-fedagent-s{s}", "FedAgent", "FedAgent", s, base | {"seed": s}))
        for k in local_clients:
            runs.append(Run(f"table1-local{k}-s{s}", f"Local (client {k})", f"Local {k}", s,
                            base | {"seed": s, "baseline.name": "local", "baseline.local-client": k}))
        runs.append(Run(f"table1-centralized-s{s}", "Centralized", "Centralized", s, base | {"seed": s, "baseline.name": "centralized"}))
        if matched and local_clients:
            k = local_clients[0]
            runs.append(Run(f"table1-local{k}-matched-s{s}", f"Local (client {k}), compute-matched",
                            f"Local {k} matched", s, compute_matched(base, k, s), cores=federation_share(base)))
    return runs


def decentralized_runs(preset: str, seeds: list[int], base: dict) -> list[Run]:
    spec = DECENTRALIZED[preset]
    runs = []
    for s in seeds:
        for key in ("partition.tasks-per-client", "clients-per-round"):
            for v in spec[key]:
                runs.append(Run(f"dec-{key}-{v}-s{s}", key, f"{key} = {v}", s, base | {"seed": s, key: v}))
        for tau in spec["grpo.local-epochs"]:
            rounds = spec["total-epochs"] // tau
            runs.append(Run(f"dec-local-epochs-{tau}-s{s}", "grpo.local-epochs", f"grpo.local-epochs = {tau} ({rounds} rounds)", s,
                            base | {"seed": s, "grpo.local-epochs": tau, "num-server-rounds": rounds,
                                    "eval.test-freq": max(1, rounds // 3)}))
    for r in runs:
        if r.group != "grpo.local-epochs":  # curves need a few points: about three evaluations per run
            r.config["eval.test-freq"] = max(1, r.config["num-server-rounds"] // 3)
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
                extra["partition.success-labels"] = labels
            for v in values:
                runs.append(Run(f"het-{partition}-{v:g}-s{s}", partition, f"{key} = {v:g}", s,
                                base | extra | {"seed": s, "partition.scheme": partition, key: v,
                                                "eval.test-freq": max(1, base["num-server-rounds"] // 3)}))
    return runs


# ------------------------------------------------------------------ running


def run_args(run: Run, out: Path, num_cpus: int, num_gpus: float) -> list[str]:
    args = [sys.executable, "-m", "fedagent_flwr.simulation", "--app", str(APP_DIR)]
    for key, value in run.config.items():
        args += [f"--{key}", str(value)]
    if num_gpus == 0 and run.cores > 1:  # on CPUs the compute-matched learner gets the cores the federation spreads over
        num_cpus = max(num_cpus, min(num_cpus * run.cores, os.cpu_count() or 1))
    args += ["--output-dir", str(out / "runs"), "--run-name", run.name,
             "--num-cpus-per-client", str(num_cpus), "--num-gpus-per-client", str(num_gpus)]
    return args


def isolated_env(out: Path, slot: int = 0, threads: int | None = None) -> dict[str, str]:
    """A Flower home and SuperLink ports of the protocol's own, so concurrent flwr runs on this machine do not share
    (and stop) its SuperLink. The ports come from the output folder, so reruns of one protocol reuse them; each of
    the runs a protocol runs at once (`slot`) has its own. `threads` caps the torch threads of a run that shares the
    cores with another (each server's evaluation would otherwise take every core)."""
    offset = zlib.crc32(str(out).encode()) % 500
    port = 41000 + 4 * offset + 2000 * slot
    env = os.environ | {
        "FLWR_HOME": str(out / (".flwr" if slot == 0 else f".flwr-{slot}")), "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": str(port),
        "FLWR_LOCAL_CONTROL_API_PORT": str(port + 2), "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
        "FLWR_TELEMETRY_ENABLED": "0", "RAY_AUTH_MODE": "disabled",
    }
    return env | ({"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)} if threads else {})


def resumable(folder: Path) -> bool:
    """A run stopped after saving a round (runs/resume.py's state/): the protocol resumes it rather than start it
    again, so a protocol of many hours can go on across stops without losing the rounds done."""
    return (folder / "state" / "manifest.json").is_file() and not (folder / "summary.json").exists()


def set_aside(folder: Path) -> Path | None:
    """Move a run folder a stopped protocol left without summary.json and without a saved round to <name>.stopped-N
    (kept, never deleted), so the run starts again under its own name."""
    if not folder.exists():
        return None
    n = 1
    while folder.with_name(f"{folder.name}.stopped-{n}").exists():
        n += 1
    return folder.rename(folder.with_name(f"{folder.name}.stopped-{n}"))


def first_evaluation_source(run: Run, runs: list[Run], out: Path) -> Path | None:
    """The same seed's FedAgent run, whose evaluation before round 1 a baseline takes (`eval.initial-evaluation`: the same
    model, seed and held-out episodes; runs/reused_evaluation.py refuses it in one line if anything differs)."""
    if run.config.get("baseline.name", "none") == "none":
        return None
    source = next((r for r in runs if r.seed == run.seed and r.config.get("baseline.name", "none") == "none"), None)
    folder = out / "runs" / source.name if source else None
    return folder if folder and (folder / "episodes" / "round-0000.json").is_file() else None


def shares_the_cores(run: Run, num_gpus: float) -> bool:
    """A run that may go beside another on CPUs: one learner on one core (Local, Centralized)."""
    return num_gpus == 0 and run.cores == 1 and run.config.get("baseline.name", "none") != "none"


def waves(runs: list[Run], parallel: int, num_gpus: float) -> list[list[Run]]:
    """The runs in order, consecutive one-core learners grouped `parallel` at a time; every other run alone."""
    out: list[list[Run]] = []
    for run in runs:
        if out and parallel > 1 and shares_the_cores(run, num_gpus) and len(out[-1]) < parallel \
                and all(shares_the_cores(r, num_gpus) for r in out[-1]):
            out[-1].append(run)
        else:
            out.append([run])
    return out


def execute(runs: list[Run], out: Path, num_cpus: int, num_gpus: float, dry_run: bool, parallel: int = 1,
            reuse_first_evaluation: bool = True) -> None:
    for cfg in runs:  # every configuration is validated before the first run starts
        if dry_run and cfg.config.get("partition.scheme") == "hardness" and not Path(cfg.config["partition.success-labels"]).exists():
            continue  # a dry run does not make the labels file the real run would
        RunConfig.from_run_config(RunConfig().to_run_config() | cfg.config | {"output-dir": str(out / "runs")})
    number = {run.name: i for i, run in enumerate(runs, 1)}
    for wave in waves(runs, parallel, num_gpus):
        started, pending = [], []
        for run in wave:
            done = out / "runs" / run.name / "summary.json"
            if done.exists():
                print(f"[protocol] {number[run.name]}/{len(runs)} {run.name}: done before, reusing {done}", flush=True)
            else:
                pending.append(run)
        beside = len(pending) > 1
        for slot, run in enumerate(pending):
            i, done = number[run.name], out / "runs" / run.name / "summary.json"
            source = first_evaluation_source(run, runs, out) if reuse_first_evaluation else None
            args = run_args(run, out, num_cpus, num_gpus) + (["--eval.initial-evaluation", str(source)] if source else [])
            resume = resumable(out / "runs" / run.name)
            args += ["--resume", "true"] if resume else []
            print(f"[protocol] {i}/{len(runs)} {run.name}" + (" (beside the others of its wave, one thread each)"
                                                              if beside else "")
                  + (", resumed after its last saved round" if resume else ""), flush=True)
            if dry_run:
                print("  " + " ".join(args), flush=True)
                continue
            aside = None if resume else set_aside(out / "runs" / run.name)
            if aside:
                print(f"[protocol] {run.name} had stopped before its summary: its folder is kept as {aside}", flush=True)
            log = out / "logs" / f"{run.name}.log"
            log.parent.mkdir(parents=True, exist_ok=True)
            f = log.open("w")
            started.append((run, f, log, done, subprocess.Popen(args, stdout=f, stderr=subprocess.STDOUT, cwd=out,
                                                                 env=isolated_env(out, slot, 1 if beside else None))))
        failed = []
        for run, f, log, done, proc in started:
            code = proc.wait()
            f.close()
            if code != 0 or not done.exists():
                failed.append(f"run {run.name} failed (exit {code}); see {log}")
        if failed:
            raise RuntimeError("; ".join(failed))


# ------------------------------------------------------------------ results


def final_metrics(out: Path, run: Run) -> dict[str, float]:
    return json.loads((out / "runs" / run.name / "summary.json").read_text())["final"]


def curve(out: Path, run: Run) -> tuple[list[int], list[float]]:
    """(training epochs so far, held-out success) at every evaluation of the run."""
    tau = int(run.config["grpo.local-epochs"])
    xs, ys = [], []
    for line in (out / "runs" / run.name / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        if "eval/success_rate" in row:
            xs.append(int(row["round"]) * tau)
            ys.append(float(row["eval/success_rate"]))
    return xs, ys


def run_holdings(run: Run) -> dict[str, dict[str, int]]:
    """Each learner of `run` -> its training tasks by category (methods/tasks.holdings, as the run prints them)."""
    cfg = RunConfig.from_run_config(RunConfig().to_run_config() | run.config)
    return holdings(cfg, all_partitions(cfg, cfg.num_clients))


def spent(run_dir: Path) -> dict[str, float]:
    """Episodes played and AdamW steps taken in training by the run in `run_dir`, over every client of every round
    (metrics.jsonl holds each round's mean per replying client and the number of replies)."""
    total = {"episodes": 0.0, "optimizer_steps": 0.0}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        if not line.strip():
            continue
        row = json.loads(line)
        replies = row.get("train/replies", 0.0)
        for k in total:
            total[k] += row.get(f"train/{k}", 0.0) * replies
    return total


def room_tests(out: Path, runs: list[Run], a: str, b: str) -> dict[int, dict]:
    """Group a minus group b in each seed both ran, paired over the held-out rooms of their last evaluations (both
    methods of a seed evaluate the same rooms with the same seed)."""
    last = {(r.group, r.seed): r for r in runs}
    tests = {}
    for seed in sorted({r.seed for r in runs}):
        if (a, seed) in last and (b, seed) in last:
            ra, rb = (out / "runs" / last[g, seed].name for g in (a, b))
            if evaluation_rounds(ra) and evaluation_rounds(rb):  # runs from before the episode records: no test
                tests[seed] = compare_runs(ra, rb, evaluation_rounds(ra)[-1], evaluation_rounds(rb)[-1])
                tests[seed]["by_category"] = category_tests(ra, rb)
    return tests


def category_tests(ra: Path, rb: Path) -> dict[str, dict]:
    """ra's last evaluation minus rb's, paired over the held-out rooms of each category (each episode records its
    room's category): where a Local trained on one kind of room gains and where it loses."""
    last = [json.loads((d / "episodes" / f"round-{evaluation_rounds(d)[-1]:04d}.json").read_text()) for d in (ra, rb)]
    category = {e["task"]: e.get("category") for e in last[0]["episodes"]}
    a, b = (success_by_task(record) for record in last)
    out = {}
    for c in sorted({v for v in category.values() if v}):
        rooms = [t for t in a if category[t] == c and t in b]
        test = paired_difference({t: a[t] for t in rooms}, {t: b[t] for t in rooms})
        out[c] = {k: v for k, v in test.items() if k != "seeds"}
    return out


def room_line(a: str, b: str, seed: int, t: dict) -> str:
    line = (f"{a} - {b}, seed {seed}, paired over {t['n']} held-out rooms: {100 * t['mean']:+.1f} ± {100 * t['se']:.1f} "
            f"points, 95% interval [{100 * t['ci95'][0]:+.1f}, {100 * t['ci95'][1]:+.1f}], p = {t['p']:.3f}")
    parts = [f"{c} {100 * d['mean']:+.1f} ± {100 * d['se']:.1f} (p = {d['p']:.3f}, {d['n']} rooms)"
             for c, d in t.get("by_category", {}).items() if d["n"] > 1]
    return line + ("; by category: " + ", ".join(parts) if parts else "")


def table1_report(out: Path, runs: list[Run], title: str) -> dict:
    categories = sorted({k.split("/", 1)[1] for r in runs for k in final_metrics(out, r) if k.startswith("success_rate/")})
    columns = categories + ["overall"]
    key = {c: "success_rate" if c == "overall" else f"success_rate/{c}" for c in columns}
    # group -> column -> seed -> success; the base model once per seed (every method of a seed starts from the
    # same model and evaluates with the same seed, so its runs repeat one measurement, not several)
    by_seed: dict[str, dict[str, dict[int, float]]] = {}
    base: dict[str, dict[int, float]] = {}
    cost: dict[str, dict[str, list[float]]] = {}
    for r in runs:
        m = final_metrics(out, r)
        start = json.loads((out / "runs" / r.name / "summary.json").read_text())["initial"]
        for c in columns:
            by_seed.setdefault(r.group, {}).setdefault(c, {})[r.seed] = m.get(key[c], math.nan)
            base.setdefault(c, {}).setdefault(r.seed, start[key[c]])
        for k, v in spent(out / "runs" / r.name).items():
            cost.setdefault(r.group, {}).setdefault(k, []).append(v)
    result = {"title": title, "columns": columns,
              "rows": {g: {c: stats(list(v.values())) for c, v in row.items()} for g, row in by_seed.items()},
              "base_model": {c: stats(list(v.values())) for c, v in base.items()},
              "spent": {g: {k: float(np.mean(v)) for k, v in c.items()} for g, c in cost.items()}}
    seeds = sorted({r.seed for r in runs})
    lines = [f"# {title}", "", "Held-out success (%) after the last round; mean ± standard error over seeds "
             f"({', '.join(str(s) for s in seeds)}); episodes and AdamW steps spent in training (all clients, all "
             "rounds; mean over seeds).", "",
             "| method | " + " | ".join(columns) + " | episodes | steps |", "| --- |" + " --- |" * (len(columns) + 2)]
    for g, row in result["rows"].items():
        used = result["spent"][g]
        lines.append(f"| {g} | " + " | ".join(cell(row[c]) for c in columns)
                     + f" | {used['episodes']:.0f} | {used['optimizer_steps']:.0f} |")
    lines.append("| base model (before training) | " + " | ".join(cell(result["base_model"][c]) for c in columns)
                 + " | 0 | 0 |")
    # What each learner trains on explains its row (a skewed partition leaves a Local categories it never sees).
    first = [r for r in runs if r.seed == runs[0].seed]
    clients = next((run_holdings(r) for r in first if r.config.get("baseline.name", "none") == "none"), {})
    held = {r.group: run_holdings(r) for r in first if r.config.get("baseline.name") == "local"}
    result["local_tasks"] = {g: next(iter(h.values())) for g, h in held.items()}
    result["client_tasks"] = clients
    if clients or held:
        # With partition.seed = -1 (a --set may choose it) each seed holds other tasks: say which seed is listed.
        moves = int(runs[0].config.get("partition.seed", -1)) < 0
        where = f" (seed {runs[0].seed}; the partition moves with the seed)" if moves else ""
        lines += ["", f"Training tasks by category{where}: {holdings_line(clients | result['local_tasks'])}."]
    # The orderings Table 1 is read for, each with its paired test over seeds (experiments/seed_statistics.py), and
    # within each seed paired over the held-out rooms (experiments/paired_rounds.py).
    overall = {g: row["overall"] for g, row in by_seed.items()} | {"the base model": base["overall"]}
    plain_locals = [g for g in by_seed if g.startswith("Local") and not g.endswith("compute-matched")]
    claims = [(g, "the base model") for g in ("FedAgent", "Centralized") if g in by_seed] + \
             [("FedAgent", g) for g in plain_locals]
    gaps = [g for g in by_seed if g == "Centralized" or g.endswith("compute-matched")]
    comparisons = {f"{a} > {b}": paired_difference(overall[a], overall[b]) for a, b in claims}
    intervals = {f"FedAgent - {g}": paired_difference(overall["FedAgent"], overall[g]) for g in gaps}
    result["comparisons"] = comparisons | intervals
    verdicts = [ordering(a, b, comparisons[f"{a} > {b}"]) for a, b in claims]
    for name, gap in intervals.items():
        verdicts.append(f"{name}: {100 * gap['mean']:+.1f} points, 95% interval [{100 * gap['ci95'][0]:+.1f}, "
                        f"{100 * gap['ci95'][1]:+.1f}] ({gap['n']} seeds)" if gap["n"] > 1 else
                        f"{name}: {100 * gap['mean']:+.1f} points in 1 seed (no interval over seeds; its test over the "
                        "held-out rooms is below)")
    within = {f"FedAgent - {g}": room_tests(out, runs, "FedAgent", g) for g in plain_locals + gaps}
    result["within_seed"] = {name: {str(s): t for s, t in tests.items()} for name, tests in within.items()}
    verdicts += [room_line("FedAgent", name.removeprefix("FedAgent - "), s, t)
                 for name, tests in within.items() for s, t in tests.items()]
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
            "--out", str(path), "--samples", "4", "--history-length", str(base.get("rollout.history-length", 0)),
            "--max-new-tokens", str(base.get("rollout.max-completion-length", 32)), "--seed", "0"]
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
    p.add_argument("--preset", default="cpu", help=f"{' | '.join(PRESETS)}, or the path of a run-config *.toml file")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--out", required=True, help="folder for runs, logs, tables and figures")
    p.add_argument("--local-clients", type=int, nargs="+",
                   help="table1: Local(k) baselines (cpu: 1 3; paper: 21 42 84; a preset file: 0 1)")
    p.add_argument("--compute-matched", action=argparse.BooleanOptionalAction, default=True,
                   help="table1: also the first Local(k) given the whole federation's episodes and steps a round")
    p.add_argument("--success-labels", help="heterogeneity: labels file for the hardness runs (default: made from the base model)")
    p.add_argument("--panels", nargs="+", choices=tuple(HET_VALUES), default=list(HET_VALUES),
                   help="heterogeneity: the panels to run (default: all three)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="run-config override for every run")
    p.add_argument("--num-cpus-per-client", type=int, default=1)
    p.add_argument("--num-gpus-per-client", type=float, default=0.0)
    p.add_argument("--parallel", type=int, default=1, help="on CPUs: run up to N one-learner runs (Local, Centralized) "
                   "at once, one thread each (each takes a core; default 1)")
    p.add_argument("--reuse-first-evaluation", action=argparse.BooleanOptionalAction, default=True,
                   help="a baseline takes its evaluation before round 1 from the same seed's FedAgent run")
    p.add_argument("--dry-run", action="store_true", help="print the runs without starting them")
    args = p.parse_args(argv)

    out = Path(args.out).expanduser().resolve()
    out.mkdir(parents=True, exist_ok=True)
    preset, config = resolve_preset(args.preset)
    base = config | parse_set(args.set)
    where = setting(preset, base, args.set)
    if args.protocol == "table1":
        locals_ = tuple(args.local_clients or LOCAL_CLIENTS.get(preset, FILE_PRESET_LOCAL_CLIENTS))
        bad = [k for k in locals_ if not 0 <= k < base["num-clients"]]
        if bad:
            raise SystemExit(f"--local-clients {bad}: must be partition-ids 0 .. {base['num-clients'] - 1}")
        runs = table1_runs(preset, args.seeds, base, locals_, args.compute_matched)
    elif preset not in DECENTRALIZED:
        raise SystemExit(f"--preset {args.preset}: the {args.protocol} protocol has settings for {', '.join(DECENTRALIZED)} only")
    elif args.protocol == "decentralized":
        runs = decentralized_runs(preset, args.seeds, base)
    else:
        labels = ensure_labels(out, base, args.success_labels, args.dry_run) if "hardness" in args.panels else None
        runs = heterogeneity_runs(preset, args.seeds, base, labels, tuple(args.panels))
    if args.parallel < 1:
        raise SystemExit(f"--parallel {args.parallel}: must be an integer >= 1")
    execute(runs, out, args.num_cpus_per_client, args.num_gpus_per_client, args.dry_run, args.parallel,
            args.reuse_first_evaluation)
    if args.dry_run:
        return None
    if args.protocol == "table1":
        return table1_report(out, runs, f"Table 1 protocol ({where})")
    if args.protocol == "decentralized":
        return curves_report(out, runs, "decentralized", f"Decentralized settings, Figure 3 protocol ({where})")
    return curves_report(out, runs, "heterogeneity", f"Heterogeneity, Figure 4 protocol ({where})")


if __name__ == "__main__":
    main()
