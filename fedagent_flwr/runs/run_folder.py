"""Which folder a run writes to, decided before any work starts, so that no run ever writes over another; and the
run config a run folder recorded, read back.

- A new run with a `run-name` gets `<output-dir>/<run-name>/`, which must not hold anything yet: an existing
  run is continued with `resume=true`, never restarted in place.
- A new run without a name gets `<env>-<strategy>-<timestamp>/`, with `-2`, `-3`, ... when two runs start
  within the same second.
- A resumed run's folder must exist (its state is checked by runs/resume.py before any model is loaded), and
  nothing in it changes until the resume is accepted.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

from fedagent_flwr.config import RunConfig, current_keys


def check_run_folder(output_dir: Path, run_name: str, resume: bool) -> None:
    """ValueError naming the key when a run with this name and resume flag would be refused; creates nothing."""
    folder = output_dir / run_name
    if resume and not folder.is_dir():
        raise ValueError(f"resume=true but run-name={run_name!r} names no run: {folder} does not exist "
                         "(nothing was created)")
    if not resume and run_name and folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        raise ValueError(f"run-name={run_name!r} is not allowed: {folder} already holds a run; set resume=true "
                         "to continue it, or choose another run-name (nothing is overwritten)")


def claim_run_folder(output_dir: Path, run_name: str, resume: bool, label: str) -> Path:
    """The run's folder: created for a new run, checked for a resumed one; ValueError naming the key if refused."""
    check_run_folder(output_dir, run_name, resume)
    if resume:
        return output_dir / run_name
    output_dir.mkdir(parents=True, exist_ok=True)
    if run_name:
        folder = output_dir / run_name
        folder.mkdir(exist_ok=True)
        return folder
    stem = f"{label}-{datetime.now():%Y%m%d-%H%M%S}"
    for n in range(1, 1000):
        folder = output_dir / (stem if n == 1 else f"{stem}-{n}")
        try:
            folder.mkdir()  # atomic: of two runs starting together, one gets each name
            return folder
        except FileExistsError:
            continue
    raise ValueError(f"output-dir={str(output_dir)!r}: 999 runs named {stem}* exist; set run-name")


# Keys that say where a run was, not what it ran: a kept record writes them as placeholders (<runs>).
PLACE_KEYS = ("output-dir", "run-name", "resume", "eval.initial-evaluation", "fedse.buffer-dir")


def recorded_run_config(run_dir: Path) -> RunConfig:
    """The run config a run folder recorded in config.json: old key names read as today's, the run's facts
    (model-source, ...) and PLACE_KEYS left out, so a kept record reads on any machine."""
    keys = {name for name, _, _ in RunConfig.keys()} - set(PLACE_KEYS)
    saved = current_keys(json.loads((run_dir / "config.json").read_text()))
    return RunConfig.from_run_config({k: v for k, v in saved.items() if k in keys})

