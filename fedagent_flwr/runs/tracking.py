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
- mlflow: the same to an MLflow run named after the run folder (the extra `pip install -e ".[mlflow]"`): the metrics
  at step = round, the run config as params, each transcript as the artifact `<tag>/round-NNNN.txt`. The store is
  `sqlite:///<run folder>/mlflow.db` with artifacts in `<run folder>/mlflow-artifacts/`, or MLFLOW_TRACKING_URI
  when set (a server, or one database for several runs); MLFLOW_EXPERIMENT_NAME (default fedagent-flwr). Reading
  the store needs only the extra (`MlflowClient(tracking_uri=...)`); its web UI needs the full `pip install mlflow`.
"""

from __future__ import annotations

import html
import json
import os
import time
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


class MlflowTracker:
    def __init__(self, run_dir: Path) -> None:
        # here: an optional extra, imported only by runs that ask for it
        from mlflow.entities import Metric, Param
        from mlflow.exceptions import MlflowException
        from mlflow.tracking import MlflowClient
        from mlflow.utils.file_utils import path_to_local_sqlite_uri

        self.Metric, self.Param = Metric, Param
        # SQLite, not a file store: mlflow 3 refuses `file:` stores unless MLFLOW_ALLOW_FILE_STORE=true (the file
        # backend is in maintenance mode), while SQLite is its default local store and needs no server.
        local = not os.environ.get("MLFLOW_TRACKING_URI")
        # MLflow's own spelling of the path: SQLAlchemy 2.1 URL-decodes it (a % in output-dir), older ones don't.
        uri = path_to_local_sqlite_uri(run_dir / "mlflow.db") if local else None  # None: MLflow reads the variable
        self.client = MlflowClient(tracking_uri=uri)
        name = os.environ.get("MLFLOW_EXPERIMENT_NAME", "fedagent-flwr")
        experiment = self.client.get_experiment_by_name(name)
        if experiment is None:
            # Local: artifacts beside the database (MLflow's default root is ./mlruns of the working directory);
            # a shared store keeps its own artifact root.
            where = (run_dir.resolve() / "mlflow-artifacts").as_uri() if local else None
            try:
                experiment_id = self.client.create_experiment(name, artifact_location=where)
            except MlflowException:  # another run sharing the store created it first
                experiment = self.client.get_experiment_by_name(name)
                if experiment is None:
                    raise
                experiment_id = experiment.experiment_id
        else:
            experiment_id = experiment.experiment_id
        self.run_id = self.client.create_run(experiment_id, run_name=run_dir.name).info.run_id

    def config(self, config: dict[str, Any]) -> None:
        # Params, not a dict artifact: every key is searchable and comparable across runs in MLflow, and the run
        # config fits its limits (values of at most 6000 characters; ~130 keys, sent 100 a request, the most a
        # tracking server takes). Strings as written, other values as config.json spells them (true, not True).
        params = [self.Param(key, value if isinstance(value, str) else json.dumps(value))
                  for key, value in sorted(config.items())]
        for start in range(0, len(params), 100):
            self.client.log_batch(self.run_id, params=params[start:start + 100])

    def row(self, row: dict[str, Any]) -> None:
        now, step = int(time.time() * 1000), int(row["round"])
        metrics = [self.Metric(key, float(value), now, step) for key, value in numeric_scalars(row).items()]
        if metrics:
            self.client.log_batch(self.run_id, metrics=metrics)

    def text(self, tag: str, text: str, step: int) -> None:
        self.client.log_text(self.run_id, text, f"{tag}/round-{step:04d}.txt")  # the run folder's episodes/ names

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


BACKENDS: dict[str, Callable[[Path], Tracker]] = {"tensorboard": TensorBoardTracker, "wandb": WandbTracker,
                                                  "mlflow": MlflowTracker}


def open_tracker(tracker: str, run_dir: Path) -> Tracker | None:
    return BACKENDS[tracker](run_dir) if tracker != "none" else None
