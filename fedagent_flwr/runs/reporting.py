"""What a run leaves on disk, in `<output-dir>/<run-name>/`.

metrics.jsonl  one JSON object per logged round (train and/or eval metrics)
metrics.csv    the same rows as a table (columns = union of keys)
clients.jsonl  one JSON object per client and round: its partition-id and its own train metrics (metrics.jsonl
               holds their mean), so drift between clients can be seen; clients.png draws them, a line a client
learning_curve.png  held-out success rate (and training success) against rounds
categories.png held-out success per task category, first vs latest evaluation
checkpoints/round-NNNN/  the global model at each evaluation (safetensors, HF layout); eval.save-total-limit
               keeps the last N and the best
summary.json   initial and final held-out success, per category, timing
provenance.json  the command, commit, processor, GPUs and versions of each start (runs/provenance.py)
Every file is written to a temporary name first and renamed into place, so an
interrupted run never leaves a half-written checkpoint or table behind.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import logging
import math
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from fedagent_flwr.agent.play.progress import clock
from fedagent_flwr.atomic import atomic_write_text
from fedagent_flwr.runs.tracking import open_tracker


class RunReporter:
    def __init__(self, run_dir: Path, tracker: str = "none") -> None:
        self.run_dir = run_dir
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.rows: list[dict[str, Any]] = []
        self.client_rows: list[dict[str, Any]] = []
        self.tracker = open_tracker(tracker, run_dir)  # runs/tracking.py; None = the run folder only

    def write_config(self, config: dict[str, Any]) -> None:
        atomic_write_text(self.run_dir / "config.json", json.dumps(config, indent=2, sort_keys=True))
        if self.tracker:
            self.tracker.config(config)

    def text(self, tag: str, text: str, step: int) -> None:
        """Text for the tracker (episode transcripts); the run folder has its own copy."""
        if self.tracker:
            self.tracker.text(tag, text, step)

    def close(self) -> None:
        if self.tracker:
            self.tracker.close()

    def log(self, row: dict[str, Any]) -> None:
        self.rows.append(row)
        if self.tracker:
            self.tracker.row(row)
        atomic_write_text(self.run_dir / "metrics.jsonl", "".join(json.dumps(r, sort_keys=True) + "\n" for r in self.rows))
        columns = sorted({k for r in self.rows for k in r}, key=lambda k: (k != "round", k))
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=columns)
        writer.writeheader()
        writer.writerows(self.rows)
        atomic_write_text(self.run_dir / "metrics.csv", buf.getvalue())
        self.plot()

    def log_clients(self, server_round: int, clients: dict[int, dict[str, float]]) -> None:
        """One clients.jsonl row per client that replied in `server_round`: {"round", "client": partition-id, its
        metrics}."""
        self.client_rows += [{"round": server_round, "client": pid, **metrics} for pid, metrics in clients.items()]
        atomic_write_text(self.run_dir / "clients.jsonl", "".join(json.dumps(r, sort_keys=True) + "\n" for r in self.client_rows))
        self.plot_clients()

    CLIENT_PANELS = (("success_rate", "training success"), ("update_norm", "update norm"), ("kl", "KL to the reference"),
                     ("loss", "loss"))

    def plot_clients(self) -> None:
        """clients.png: each client's own training metrics by round, one line a client, so that clients drifting
        apart show (metrics.jsonl and the learning curve hold their mean)."""
        panels = [(key, label) for key, label in self.CLIENT_PANELS if any(key in r for r in self.client_rows)]
        if not panels:
            return
        fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3.5), squeeze=False)
        clients = sorted({r["client"] for r in self.client_rows})
        for ax, (key, label) in zip(axes[0], panels):
            for client in clients:
                pts = [(r["round"], r[key]) for r in self.client_rows if r["client"] == client and key in r]
                if pts:
                    ax.plot(*zip(*pts), marker=".", linewidth=1, label=f"client {client}")
            ax.set_xlabel("round")
            ax.set_title(label, fontsize=9)
            ax.grid(alpha=0.3)
        axes[0][0].legend(fontsize=7)
        fig.tight_layout()
        self._save(fig, "clients.png")

    def resume_clients(self, done: int) -> None:
        """The clients.jsonl rows of the rounds up to `done`, the round a resumed run continues after."""
        path = self.run_dir / "clients.jsonl"
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []
        self.client_rows = [r for r in rows if r["round"] <= done]

    def plot(self) -> None:
        evals = [(r["round"], r["eval/success_rate"], binomial_se(r["eval/success_rate"], r.get("eval/episodes", 0.0)))
                 for r in self.rows if "eval/success_rate" in r]
        trains = [(r["round"], r["train/success_rate"]) for r in self.rows if "train/success_rate" in r]
        fig, ax = plt.subplots(figsize=(6, 4))
        if evals:
            rounds, values, errors = zip(*evals)
            ax.errorbar(rounds, values, yerr=errors, marker="o", capsize=3, label="global model, held-out tasks (+- 1 s.e.)")
        if trains:
            ax.plot(*zip(*trains), marker=".", linestyle="--", label="sampled clients, training rollouts")
        categories = sorted({k.split("/", 2)[2] for r in self.rows for k in r if k.startswith("eval/success_rate/")})
        if any(c.startswith("env/") for c in categories):
            # Several environments: one line per environment and their mean (Fed-SE Table 1's
            # columns) instead of dozens of per-category lines.
            categories = [c for c in categories if c.startswith("env/")] + ["mean_over_envs"]
        for c in categories:
            pts = [(r["round"], r[f"eval/success_rate/{c}"]) for r in self.rows if f"eval/success_rate/{c}" in r]
            ax.plot(*zip(*pts), alpha=0.5, linewidth=1, label=f"held-out: {c}")
        ax.set_xlabel("round")
        ax.set_ylabel("success rate")
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        self._save(fig, "learning_curve.png")
        self.plot_categories()
        self.plot_communication()

    def plot_communication(self) -> None:
        """communication.png: megabytes the server sent to and received from clients, cumulative over rounds."""
        rows = [r for r in self.rows if "train/comm/bytes-sent-total" in r]
        if not rows:
            return
        fig, ax = plt.subplots(figsize=(6, 4))
        rounds = [r["round"] for r in rows]
        for key, label in (("sent", "server -> clients"), ("received", "clients -> server")):
            ax.plot(rounds, [r[f"train/comm/bytes-{key}-total"] / 1e6 for r in rows], marker=".", label=label)
        ax.set_xlabel("round")
        ax.set_ylabel("cumulative MB")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        self._save(fig, "communication.png")

    def plot_categories(self) -> None:
        """categories.png: held-out success per task category (or environment), first vs latest
        evaluation, and beside it the mean task score per category where the env has one (WebShop)."""
        evals = [r for r in self.rows if "eval/success_rate" in r]
        if not evals:
            return
        first, last = evals[0], evals[-1]
        panels = []
        for prefix, label in (("eval/success_rate/", "held-out success rate"), ("eval/mean_score/", "held-out mean task score")):
            names = sorted(k[len(prefix):] for k in last if k.startswith(prefix))
            if names:
                panels.append((prefix, label, names))
        if not panels:
            return
        width = max(5.0, 0.7 * len(panels[0][2]) + 2)
        fig, axes = plt.subplots(1, len(panels), figsize=(width * len(panels), 4), squeeze=False)
        for ax, (prefix, label, names) in zip(axes[0], panels):
            x = range(len(names))
            ax.bar([i - 0.2 for i in x], [first.get(prefix + n, 0.0) for n in names], width=0.4, label=f"round {first['round']}")
            ax.bar([i + 0.2 for i in x], [last[prefix + n] for n in names], width=0.4, label=f"round {last['round']}")
            ax.set_xticks(list(x), names, rotation=30, ha="right", fontsize=8)
            ax.set_ylabel(label)
            ax.set_ylim(0, 1.02)
            ax.grid(axis="y", alpha=0.3)
            ax.legend(fontsize=8)
        fig.tight_layout()
        self._save(fig, "categories.png")

    def _save(self, fig, name: str) -> None:
        fd, tmp = tempfile.mkstemp(prefix=f".{Path(name).stem}-", suffix=".png", dir=self.run_dir)
        os.close(fd)
        fig.savefig(tmp, dpi=110)
        plt.close(fig)
        os.replace(tmp, self.run_dir / name)

    def checkpoint(self, server_round: int, model, tokenizer) -> Path:
        final = self.run_dir / "checkpoints" / f"round-{server_round:04d}"
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=final.parent))
        from fedagent_flwr.agent.models.pretrained import transformers_bars_off  # here: reading a run folder needs no torch

        with transformers_bars_off():
            model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        return final

    def prune_checkpoints(self, limit: int) -> list[int]:
        """Remove the checkpoints checkpoints_kept leaves out (eval.save-total-limit); the rounds removed."""
        folder = self.run_dir / "checkpoints"
        if not limit or not folder.is_dir():
            return []
        saved = checkpoint_rounds(self.run_dir)
        success = {int(r["round"]): r["eval/success_rate"] for r in self.rows if "eval/success_rate" in r}
        removed = [r for r in saved if r not in checkpoints_kept(saved, success, limit)]
        for r in removed:
            gone = folder / f".removed-round-{r:04d}"  # renamed first: a stop mid-removal leaves no half checkpoint named as whole
            os.replace(folder / f"round-{r:04d}", gone)
            shutil.rmtree(gone)
        return removed

    def write_summary(self, summary: dict[str, Any]) -> None:
        atomic_write_text(self.run_dir / "summary.json", json.dumps(summary, indent=2, sort_keys=True))


class _TrimFlowerResults(logging.Filter):
    """Drops the parts of Flower's own log that the run's round line and summary say better: the raw metric
    dicts after every round, its "Global evaluation" headers and blank lines, and the whole history Flower dumps
    at the end (half of a short run's log). "[ROUND k/N]" stays: on a GPU a round takes minutes."""

    RAW = ("\t└──> Aggregated MetricRecord", "\t└──> MetricRecord", "Initial global evaluation results", "Global evaluation")

    def __init__(self) -> None:
        super().__init__()
        self.finished = False

    def filter(self, record: logging.LogRecord) -> bool:
        msg = str(record.msg)
        if msg.startswith("Strategy execution finished"):
            self.finished = True
        return not (self.finished or msg.startswith(self.RAW) or not msg.strip())


@contextlib.contextmanager
def trimmed_flower_log() -> Iterator[None]:
    logger, trim = logging.getLogger("flwr"), _TrimFlowerResults()
    logger.addFilter(trim)
    try:
        yield
    finally:
        logger.removeFilter(trim)


def checkpoint_rounds(run_dir: Path) -> list[int]:
    """The rounds whose checkpoint a run folder holds (checkpoints/round-NNNN/), in order."""
    folder = run_dir / "checkpoints"
    if not folder.is_dir():
        return []
    return sorted(int(d.name.removeprefix("round-")) for d in folder.iterdir() if d.is_dir() and d.name.startswith("round-"))


def checkpoints_kept(saved: list[int], success: dict[int, float], limit: int) -> set[int]:
    """The checkpoint rounds eval.save-total-limit keeps of `saved`: the last `limit`, and the one of the highest
    held-out success in `success` (the earliest of ties), as TRL keeps its best checkpoint beside the newest; all for
    limit 0."""
    if not limit:
        return set(saved)
    kept = set(sorted(saved)[-limit:])
    scored = [r for r in saved if r in success]
    if scored:
        kept.add(max(scored, key=lambda r: (success[r], -r)))
    return kept


def binomial_se(p: float, n: float) -> float:
    """Standard error of a success rate p measured on n episodes (0 when nothing was measured)."""
    return math.sqrt(p * (1 - p) / n) if n >= 1 else 0.0


def time_split(row: dict[str, Any]) -> str:
    """Where the round's time went: a client's rollout and update (the clients' mean; what a round of several
    clients on few cores takes is the elapsed time's business) and the held-out evaluation, each where the row has it."""
    parts = []
    if "train/seconds" in row and "train/rollout_seconds" in row:
        rollout = row["train/rollout_seconds"]
        parts.append(f"a client's rollout {clock(rollout)} + update {clock(max(0.0, row['train/seconds'] - rollout))}")
    if "eval/seconds" in row:
        parts.append(f"evaluation {clock(row['eval/seconds'])}")
    return ", ".join(parts)


def round_line(row: dict[str, Any], sampled: list[int] | None) -> str:
    """The console's one line per round, from the round's metric row: clients (and how many replies failed),
    training success and reward,
    held-out success with its standard error (binomial, over the evaluation's episodes) when evaluated, the rollout
    log-probs' gap where the update measured it, bytes moved, where the round's time went (time_split) and seconds
    so far."""
    parts = [f"round {int(row['round'])}"]
    if sampled:
        parts.append("clients " + ",".join(str(p) for p in sampled))
    failed = int(row.get("train/failed-replies", 0))
    if failed:  # said on the round's line: a log of OOM errors above it is easy to miss (issue 34's first Fed-SE runs)
        parts.append(f"FAILED {failed} of {failed + int(row.get('train/replies', 0))} replies, left out of the aggregate")
    if "train/success_rate" in row:
        parts.append(f"train success {row['train/success_rate']:.3f} reward {row.get('train/mean_reward', float('nan')):.2f}")
    if "eval/success_rate" in row:
        p, n = row["eval/success_rate"], row.get("eval/episodes", 1.0)
        parts.append(f"held-out {p:.3f} +- {binomial_se(p, n):.3f} ({int(n)} episodes)")
    if "train/rollout_logprob_gap_signed" in row:  # grpo.old-logprobs = rollout: how far the sampler's log-probs lay
        parts.append(f"rollout log-probs {row['train/rollout_logprob_gap_signed']:+.4f} nats a token (largest "
                     f"{row['train/rollout_logprob_gap_max']:.3f}, {100 * row['train/rollout_logprob_gap_over_001']:.1f} % "
                     f"beyond 0.01), first-step clip {100 * row['train/first_step_clip_frac']:.1f} %")
    moved = row.get("train/comm/bytes-sent-round", 0.0) + row.get("train/comm/bytes-received-round", 0.0)
    if moved:
        parts.append(f"{moved / 1e6:.1f} MB")
    split = time_split(row)
    if split:
        parts.append(split)
    parts.append(f"{row['elapsed_seconds']:.0f} s")
    return "[fedagent] " + " | ".join(parts)
