"""The evaluation before round 1 taken from another run folder (run-config key `eval.initial-evaluation`).

Runs that start from the same model with the same seed evaluate the same weights on the same held-out episodes before
round 1: a Local or Centralized baseline beside a FedAgentAvg run, or another advantage estimator from the same warm
start. With the SmolLM2 preset that evaluation is several minutes of a run on 2 cores (more with two runs side by
side), and it comes out the same every time (the same 144 episodes in the kept records of seed 2's FedAgentAvg run
and its Local's first run, benchmarks/results/2026-12-01-cpu/runs; tests/app/test_documented_runs.py). So a run may
take it from a run that already played it, but only when everything it depends on is the
same: `evaluation_identity` lists those things, each evaluation record carries its identity, and `reused_evaluation`
names the first thing that differs instead of reusing a number that belongs to another evaluation.

Why not a cache keyed by a hash: an explicit folder says in the run's own config which evaluation it took, and a
mismatch can say what differs. Not covered: the processor. The same code, weights and libraries on another CPU can
round differently (bf16 above all), so a reused evaluation is the source machine's play of the same episodes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import json
from pathlib import Path
from typing import Any

import numpy as np

import envs

EPISODES = Path("episodes") / "round-0000.json"  # the evaluation before round 1 as every run folder keeps it
IDENTITY = "identity"  # the key under which an evaluation record keeps what it depends on
SOURCE_ROOTS = (Path(__file__).resolve().parents[1] / "agent", Path(envs.__file__).resolve().parent)  # source_digest


def arrays_digest(arrays) -> str:
    """SHA-256 of an ArrayRecord's names, dtypes, shapes and bytes, in its order."""
    digest = hashlib.sha256()
    for name, array in arrays.items():
        values = np.ascontiguousarray(array.numpy())
        digest.update(f"{name}|{values.dtype.str}|{values.shape}|".encode())
        digest.update(values.tobytes())
    return digest.hexdigest()


def source_digest(roots: tuple[Path, ...] = ()) -> str:
    """SHA-256 of the Python sources that play and score an episode: the environments (envs/) and the agent
    (fedagent_flwr/agent/: prompts, parsing, rollout, sampling engines, models). An edit there may change an
    evaluation, so an evaluation is reused only under the same sources. The rest of the package (methods, strategies,
    the run config) only hands the agent values that the identity holds itself (tasks, seed, rollout settings,
    precision, weights), so an edit there leaves earlier evaluations reusable."""
    digest = hashlib.sha256()
    for root in roots or SOURCE_ROOTS:
        for path in sorted(root.rglob("*.py")):
            digest.update(f"{root.name}/{path.relative_to(root).as_posix()}|".encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()


def library_versions() -> dict[str, str]:
    out = {}
    for name in ("torch", "transformers", "peft"):
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


def evaluation_identity(*, model: str, base_fingerprint: str, weights, env: str, max_steps: int, task_ids: list[str],
                        samples_per_task: int, evaluation_seed: int, rollout, precision: str, device: str,
                        weights_dtype: str) -> dict[str, Any]:
    """Everything an evaluation's episodes depend on, as plain JSON (written into every evaluation record)."""
    return {
        "model": model,
        "base-fingerprint": base_fingerprint,
        "weights-sha256": arrays_digest(weights),
        "env": env,
        "rollout.max-steps": max_steps,
        "tasks-sha256": hashlib.sha256("\n".join(task_ids).encode()).hexdigest(),
        "tasks": len(task_ids),
        "samples-per-task": samples_per_task,
        "evaluation-seed": evaluation_seed,
        "rollout": dataclasses.asdict(rollout),
        "precision": precision,
        "device": device,
        "weights-dtype": weights_dtype,
        "libraries": library_versions(),
        "sources-sha256": source_digest(),
    }


def differences(wanted: dict[str, Any], found: dict[str, Any], prefix: str = "") -> list[str]:
    """'name: found -> wanted' for every entry that differs, nested dicts entry by entry."""
    out = []
    for key in sorted(set(wanted) | set(found)):
        a, b = wanted.get(key, "(absent)"), found.get(key, "(absent)")
        if isinstance(a, dict) and isinstance(b, dict):
            out += differences(a, b, f"{prefix}{key}.")
        elif a != b:
            out.append(f"{prefix}{key}: {b} there, {a} here")
    return out


def reused_evaluation(run_dir: str, identity: dict[str, Any]) -> tuple[dict[str, float], dict[str, Any]]:
    """The metrics and the episode record of `run_dir`'s evaluation before round 1, if it evaluated exactly what
    `identity` describes; otherwise a one-line ValueError naming the key, the folder and the first difference."""
    folder = Path(run_dir).expanduser()
    where = f"eval.initial-evaluation={run_dir!r}"
    try:
        record = json.loads((folder / EPISODES).read_text())
        rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines() if line.strip()]
    except (OSError, ValueError) as err:
        raise ValueError(f"{where}: cannot read its evaluation before round 1 ({err}); allowed: a run folder with "
                         f"{EPISODES.as_posix()} and metrics.jsonl, or empty to evaluate") from None
    if IDENTITY not in record:
        raise ValueError(f"{where}: its {EPISODES.as_posix()} records no identity (written before evaluations "
                         "recorded what they depend on); allowed: a run folder of this version, or empty to evaluate")
    found = differences(identity, record[IDENTITY])
    if found:
        more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
        raise ValueError(f"{where}: that run evaluated something else before round 1, {found[0]}{more}; allowed: a run "
                         "of the same model, initial weights, held-out episodes, evaluation settings, sources and "
                         "libraries, or empty to evaluate")
    first = [r for r in rows if r.get("round") == 0 and "eval/success_rate" in r]
    if not first:
        raise ValueError(f"{where}: its metrics.jsonl has no evaluation of round 0; allowed: a run folder whose "
                         "first evaluation finished, or empty to evaluate")
    metrics = {k[len("eval/"):]: float(v) for k, v in first[0].items() if k.startswith("eval/")}
    return metrics, record
