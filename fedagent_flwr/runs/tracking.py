"""Experiment trackers: the run's metric rows, its config and the held-out episode texts, where researchers watch
runs (run-config `tracker`).

- none: the run folder only (metrics.jsonl, metrics.csv, the PNGs, episodes/).
- tensorboard: also `<run folder>/tensorboard/` (torch's SummaryWriter): every numeric key of every metric row
  as a scalar at step = round, the run config as text, and each evaluation's episode transcript as text.
  `tensorboard --logdir <output-dir>` shows every run side by side.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


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
        for key, value in row.items():
            if key != "round" and isinstance(value, (int, float)) and not isinstance(value, bool):
                self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def text(self, tag: str, text: str, step: int) -> None:
        self.writer.add_text(tag, "```\n" + text + "\n```", step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


def open_tracker(tracker: str, run_dir: Path) -> TensorBoardTracker | None:
    return TensorBoardTracker(run_dir) if tracker == "tensorboard" else None
