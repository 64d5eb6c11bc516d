"""Client-distribution figures of a partition, in the manner of FedAgentGym's Appendix B.

    python -m partitions.plots --partition preference --omega 0.1 --out DIR
    python -m partitions.plots --partition coverage --xi 256 --out DIR
    python -m partitions.plots --partition hardness --xi 1 --out DIR --tasks tasks.csv

One PNG per call, DIR/<partition>_<parameter>.png: every client's tasks as bars
stacked by category, the histogram of client sizes, each category's share across
clients against its global share, and (when the table has success labels) the
histogram of client success shares. The task table is a CSV, JSON (a list of
records) or JSON Lines file with columns id, category and optionally success
(true/false); without --tasks a synthetic table is used (see --num-tasks).
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

import numpy as np
from datasets import Dataset

from . import PARTITIONS, make_partitioner, partition_params

DEFAULT_PARTITION_SIZE = 100  # the paper's Table 1 client size
_TRUE, _FALSE = {"true", "1", "yes", "t", "y"}, {"false", "0", "no", "f", "n"}


def synthetic_tasks(num_tasks: int, num_categories: int, seed: int) -> Dataset:
    """Tasks in categories of geometrically falling size (ratio 0.7), each category with its own success rate.

    Success rates fall linearly from 0.7 (largest category) to 0.1 (smallest), so
    categories differ in difficulty as real environments' task types do.
    """
    if num_categories < 1 or num_tasks < num_categories:
        raise ValueError(f"need num_tasks >= num_categories >= 1, got {num_tasks} tasks, {num_categories} categories")
    weights = 0.7 ** np.arange(num_categories)
    sizes = np.floor(num_tasks * weights / weights.sum()).astype(int)
    sizes = np.maximum(sizes, 1)
    sizes[0] += num_tasks - sizes.sum()
    rates = np.linspace(0.7, 0.1, num_categories) if num_categories > 1 else np.array([0.5])
    rng = np.random.default_rng(seed)
    categories = np.repeat([f"category {i}" for i in range(num_categories)], sizes)
    return Dataset.from_dict(
        {
            "id": [f"task-{i}" for i in range(num_tasks)],
            "category": categories.tolist(),
            "success": (rng.random(num_tasks) < np.repeat(rates, sizes)).tolist(),
        }
    )


def _as_bool(value: object, where: str) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ValueError(f"{where}: success must be true/false (or 1/0, yes/no), got {value!r}")


def load_tasks(path: str | Path) -> Dataset:
    """A task table from CSV, JSON (list of records) or JSON Lines with columns id, category[, success]."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"task table {path} does not exist")
    suffix = path.suffix.lower()
    if suffix == ".csv":
        with path.open(newline="") as f:
            records = list(csv.DictReader(f))
    elif suffix == ".json":
        records = json.loads(path.read_text())
        if not isinstance(records, list):
            raise ValueError(f"{path}: a JSON task table must be a list of records")
    elif suffix == ".jsonl":
        records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    else:
        raise ValueError(f"{path}: task table must be .csv, .json or .jsonl, got {suffix or 'no suffix'}")
    if not records:
        raise ValueError(f"{path}: the task table is empty")
    for i, rec in enumerate(records):
        if not isinstance(rec, dict) or "id" not in rec or "category" not in rec:
            raise ValueError(f"{path}: record {i} lacks an 'id' or 'category' field: {rec!r}")
    columns = {"id": [str(r["id"]) for r in records], "category": [str(r["category"]) for r in records]}
    if any("success" in r for r in records):
        columns["success"] = [_as_bool(r.get("success"), f"{path} record {i}") for i, r in enumerate(records)]
    return Dataset.from_dict(columns)


def _tag(partition: str, params: dict) -> str:
    key = {"preference": "omega", "coverage": "xi", "hardness": "xi"}.get(partition, "partition_size")
    return f"{partition}_{key}-{params[key]:g}" if key in params else partition


def plot_partition(table: Dataset, clients: list[np.ndarray], title: str, path: Path) -> dict:
    """Draw the figure to `path`; return the summary numbers it shows."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    categories = np.asarray(table["category"])
    names = sorted(set(categories.tolist()))
    counts = np.array([[np.sum(categories[c] == n) for n in names] for c in clients])
    sizes = counts.sum(axis=1)
    shares = counts / np.maximum(sizes, 1)[:, None]
    global_share = np.array([np.mean(categories == n) for n in names])
    success = np.asarray(table["success"], dtype=bool) if "success" in table.column_names else None

    fig = plt.figure(figsize=(13, 7.5), layout="constrained")
    grid = fig.add_gridspec(2, 3, height_ratios=(1.1, 1))
    colours = plt.get_cmap("tab10" if len(names) <= 10 else "tab20")(np.arange(len(names)) % 20)

    ax = fig.add_subplot(grid[0, :])
    x = np.arange(len(clients))
    bottom = np.zeros(len(clients))
    for j, name in enumerate(names):
        ax.bar(x, counts[:, j], bottom=bottom, width=0.9, color=colours[j], label=name, linewidth=0)
        bottom += counts[:, j]
    if success is not None:
        solved = [int(success[c].sum()) for c in clients]
        ax.plot(x, solved, linestyle="none", marker="_", markersize=7, color="k", label="successful tasks")
    ax.set(xlabel="client", ylabel="tasks", xlim=(-0.7, len(clients) - 0.3), title="tasks per client by category")
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.005, 1.0), title="category")

    ax = fig.add_subplot(grid[1, 0])
    # Equal sizes (preference, hardness) get one bar one task wide rather than a stretched axis.
    bins = np.arange(sizes.min() - 0.5, sizes.max() + 1.5) if np.ptp(sizes) < 30 else 30
    ax.hist(sizes, bins=bins, color="tab:gray")
    if np.ptp(sizes) < 30:
        ax.set_xlim(sizes.min() - 15, sizes.max() + 15)
    ax.axvline(sizes.mean(), color="k", linestyle="--", label=f"mean {sizes.mean():.1f}")
    ax.set(xlabel="tasks per client", ylabel="clients", title=f"client sizes (std {sizes.std():.1f})")
    ax.legend(fontsize="small")

    ax = fig.add_subplot(grid[1, 1])
    box = ax.boxplot(shares, patch_artist=True, widths=0.6, showfliers=False)
    for patch, colour in zip(box["boxes"], colours):
        patch.set_facecolor(colour)
    ax.scatter(np.arange(1, len(names) + 1), global_share, marker="D", color="k", zorder=3, label="pool share")
    ax.set_xticks(np.arange(1, len(names) + 1), [n if len(n) <= 10 else n[:9] + "." for n in names], rotation=30)
    ax.set(ylabel="share of client's tasks", title="category share across clients")
    ax.legend(fontsize="small")

    summary = {
        "clients": len(clients),
        "size_mean": float(sizes.mean()),
        "size_std": float(sizes.std()),
        "size_min": int(sizes.min()),
        "size_max": int(sizes.max()),
        "mix_spread": float(shares.var(axis=0).sum()),
    }
    ax = fig.add_subplot(grid[1, 2])
    if success is not None:
        rate = np.array([success[c].mean() if len(c) else 0.0 for c in clients])
        ax.hist(rate, bins=np.linspace(0, 1, 21), color="tab:green")
        ax.axvline(success.mean(), color="k", linestyle="--", label=f"pool {success.mean():.2f}")
        ax.set(xlabel="successful share of client's tasks", ylabel="clients", title=f"success share (std {rate.std():.3f})")
        ax.legend(fontsize="small")
        summary["success_share_mean"] = float(rate.mean())
        summary["success_share_std"] = float(rate.std())
    else:
        ax.axis("off")
        ax.text(0.5, 0.5, "no success labels in the task table", ha="center", va="center")

    fig.suptitle(title)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return summary


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m partitions.plots", description=__doc__.split("\n\n")[0])
    ap.add_argument("--partition", required=True, choices=PARTITIONS)
    ap.add_argument("--out", required=True, type=Path, help="folder for the PNG")
    ap.add_argument("--tasks", type=Path, help="task table (.csv, .json, .jsonl): id, category[, success]")
    ap.add_argument("--num-tasks", type=int, default=1000, help="synthetic table size (without --tasks)")
    ap.add_argument("--num-categories", type=int, default=6, help="synthetic table categories (without --tasks)")
    ap.add_argument("--table-seed", type=int, default=0, help="synthetic table's success labels")
    ap.add_argument("--num-partitions", type=int, default=100, help="clients (paper: 100)")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--partition-size", type=int, help=f"L, tasks per client (default {DEFAULT_PARTITION_SIZE})")
    ap.add_argument("--omega", type=float, help="preference noise scale")
    ap.add_argument("--mix", choices=("gaussian", "dirichlet"), help="preference mix draw")
    ap.add_argument("--xi", type=float, help="coverage / hardness Beta dispersion")
    ap.add_argument("--r", type=float, help="average replicas per (successful) task")
    for bound in ("size_min", "size_max", "success_min", "success_max"):
        ap.add_argument(f"--{bound.replace('_', '-')}", dest=bound, type=int)
    for centre in ("size_avg", "success_avg"):
        ap.add_argument(f"--{centre.replace('_', '-')}", dest=centre, type=float)
    return ap


def main(argv: list[str] | None = None) -> dict:
    ap = _parser()
    args = ap.parse_args(argv)
    given = {
        name: getattr(args, name)
        for name in ("partition_size", "omega", "mix", "xi", "r", "size_min", "size_avg", "size_max",
                     "success_min", "success_avg", "success_max")
        if getattr(args, name) is not None
    }
    required, _ = partition_params(args.partition)
    if "partition_size" in required:
        given.setdefault("partition_size", DEFAULT_PARTITION_SIZE)
    try:
        table = load_tasks(args.tasks) if args.tasks else synthetic_tasks(args.num_tasks, args.num_categories, args.table_seed)
        partitioner = make_partitioner(args.partition, args.num_partitions, args.seed, **given)
        partitioner.dataset = table
        clients = partitioner.assign(table)
    except ValueError as err:
        ap.error(str(err))
    source = args.tasks.name if args.tasks else f"synthetic table, {len(table)} tasks"
    settings = ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in given.items())
    title = f"{args.partition} partition ({settings}): {args.num_partitions} clients, seed {args.seed}; {source}"
    path = args.out / f"{_tag(args.partition, given)}.png"
    summary = plot_partition(table, clients, title, path)
    print(json.dumps({"figure": str(path), **summary}))
    return summary


if __name__ == "__main__":
    main()
