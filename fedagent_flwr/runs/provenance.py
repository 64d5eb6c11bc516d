"""A run folder's provenance.json: what made the run, machine-readable, so its records need no prose beside them.

    {"command": "python run_simulation.py --seed 1 ...",   # null where the run was not started by run_simulation.py
     "commit": "c4ec82a...", "dirty": false,               # the app's git commit, where known ("unknown" else)
     "processor": "AMD EPYC (avx512_bf16 avx512f avx2)", "processor_slug": "amd-epyc-avx512bf16",
     "gpus": ["NVIDIA H100 80GB HBM3"], "software": {"python": ..., "torch": ..., "flwr": ...},
     "started_utc": "2026-12-08T01:02:03Z",
     "resumed": [{...the same fields, for each later start with resume=true}]}

The server writes it when the run starts (the machine it names is the server's: in a simulation, every client's too).
scripts/keep_run_records.py copies it with the run's records and adds the wall time from summary.json."""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import os
import platform
import shutil
import subprocess
from pathlib import Path
from typing import Any

from fedagent_flwr.atomic import atomic_write_text

FILE = "provenance.json"
COMMAND_ENV = "FEDAGENT_RUN_COMMAND"  # set by run_simulation.py for the processes it starts
COMMIT_ENV, DIRTY_ENV = "FEDAGENT_GIT_COMMIT", "FEDAGENT_GIT_DIRTY"  # as benchmarks/raw_output.py reads them
PACKAGES = ("torch", "transformers", "peft", "trl", "flwr", "ray", "numpy")


def git_state(folder: Path) -> tuple[str, bool | None]:
    """(commit, dirty) of the git tree holding `folder`; ("unknown", None) where there is none."""
    try:
        head = subprocess.run(["git", "-C", str(folder), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        status = subprocess.run(["git", "-C", str(folder), "status", "--porcelain"], capture_output=True, text=True,
                                timeout=30)
    except (OSError, subprocess.SubprocessError):
        return "unknown", None
    if head.returncode != 0:
        return "unknown", None
    return head.stdout.strip(), bool(status.stdout.strip())


def _commit() -> tuple[str, bool | None]:
    if os.environ.get(COMMIT_ENV):
        return os.environ[COMMIT_ENV], os.environ.get(DIRTY_ENV, "").lower() not in ("", "0", "false", "no")
    return git_state(Path(__file__).resolve().parent)  # Flower may run the app from an unpacked copy: then "unknown"


def _gpus() -> list[str]:
    """The GPUs' names from nvidia-smi (no CUDA context in the server's process); none without one."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return []
    try:
        done = subprocess.run([smi, "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in done.stdout.splitlines() if line.strip()] if done.returncode == 0 else []


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def this_start() -> dict[str, Any]:
    from fedagent_flwr.agent.engine.cpu_rates import this_processor  # torch: not for run_simulation.py's import

    commit, dirty = _commit()
    processor = this_processor()
    return {"command": os.environ.get(COMMAND_ENV) or None, "commit": commit, "dirty": dirty,
            "processor": processor.describe(), "processor_slug": processor.slug(), "gpus": _gpus(),
            "software": {"python": platform.python_version()} | {p: _version(p) for p in PACKAGES},
            "started_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}


def record_start(run_dir: Path, resumed: bool) -> dict[str, Any]:
    """Write provenance.json for a run starting in `run_dir`; a resumed run adds its start to the file's "resumed"."""
    path = run_dir / FILE
    start = this_start()
    if resumed and path.is_file():
        record = json.loads(path.read_text())
        record["resumed"] = record.get("resumed", []) + [start]
    else:
        record = start | {"resumed": []}
    atomic_write_text(path, json.dumps(record, indent=2) + "\n")
    return record
