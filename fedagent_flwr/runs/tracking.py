"""Experiment trackers: the run's metric rows, its config and the held-out episode texts, where researchers watch
runs (run-config `tracker`). One class per backend, each with the same four methods (`Tracker`).

- none: the run folder only (metrics.jsonl, metrics.csv, the PNGs, episodes/).
- tensorboard: also `<run folder>/tensorboard/` (torch's SummaryWriter): every numeric key of every metric row
  as a scalar at step = round, the run config as text, and each evaluation's episode transcript as text.
  `tensorboard --logdir <output-dir>` shows every run side by side.
- wandb: the same to a Weights & Biases run named after the run folder (the extra `pip install -e ".[wandb]"`):
  the metrics at step = round, the run config as the run's config, the transcripts as HTML text. wandb's own
  variables apply: WANDB_MODE (online when logged in; `WANDB_MODE=offline` needs no account, `wandb sync`
  uploads later), WANDB_PROJECT (default fedagent-flwr), WANDB_DIR (default the run folder: `<run folder>/wandb/`).
"""

from __future__ import annotations

import html
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol


class Tracker(Protocol):
    def config(self, config: dict[str, Any]) -> None: ...
    def row(self, row: dict[str, Any]) -> None: ...
    def text(self, tag: str, text: str, step: int) -> None: ...
    def close(self) -> None: ...


def numeric_scalars(row: dict[str, Any]) -> dict[str, float]:
    """A metric row's numeric values by key; `round` is their step, not a value, and a bool is not a number."""
    return {k: v for k, v in row.items()
            if k != "round" and isinstance(v, (int, float)) and not isinstance(v, bool)}


class TensorBoardTracker:
    def __init__(self, run_dir: Path) -> None:
        from torch.utils.tensorboard import (
            SummaryWriter,  # here: only runs that ask for it pay for the import
        )

        self.writer = SummaryWriter(log_dir=str(run_dir / "tensorboard"))

    def config(self, config: dict[str, Any]) -> None:
        # Markdown code block: TensorBoard renders text as Markdown.
        self.writer.add_text("config", "```\n" + json.dumps(config, indent=2, sort_keys=True) + "\n```", 0)
        self.writer.flush()

    def row(self, row: dict[str, Any]) -> None:
        step = int(row["round"])
        for key, value in numeric_scalars(row).items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def text(self, tag: str, text: str, step: int) -> None:
        self.writer.add_text(tag, "```\n" + text + "\n```", step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbTracker:
    def __init__(self, run_dir: Path) -> None:
        import wandb  # here: an optional extra, imported only by runs that ask for it

        self.wandb = wandb
        self.run = wandb.init(
            project=os.environ.get("WANDB_PROJECT", "fedagent-flwr"),
            dir=os.environ.get("WANDB_DIR", str(run_dir)),  # wandb adds its own wandb/ below it
            name=run_dir.name,
            # A run of its own even when one process runs several federations (experiments, tests) or an
            # earlier one failed before close(): never log into another run's history.
            reinit="create_new",
        )

    def config(self, config: dict[str, Any]) -> None:
        self.run.config.update(config)

    def row(self, row: dict[str, Any]) -> None:
        self.run.log(numeric_scalars(row), step=int(row["round"]))

    def text(self, tag: str, text: str, step: int) -> None:
        # <pre>: the UI's HTML panel keeps the transcript's lines and spacing as written.
        self.run.log({tag: self.wandb.Html("<pre>" + html.escape(text) + "</pre>")}, step=step)

    def close(self) -> None:
        self.run.finish()


BACKENDS: dict[str, Callable[[Path], Tracker]] = {"tensorboard": TensorBoardTracker, "wandb": WandbTracker}


def open_tracker(tracker: str, run_dir: Path) -> Tracker | None:
    return BACKENDS[tracker](run_dir) if tracker != "none" else None
