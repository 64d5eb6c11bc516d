"""Success labels of a task pool, the input of HardnessPartition: reading the file and checking it fits.

The file is written by `python -m fedagent_flwr.experiments.success_labels` (task id -> true/false
under "labels", the env under "env").
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path


def load_labels(path: str | Path, env: str, tasks: Sequence) -> list[bool]:
    """The success label of each of `tasks` (in order) from a success-label file; raises on a mismatch."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise ValueError(f"partition.success-labels={str(path)!r}: no such file (write one with `python -m fedagent_flwr.experiments.success_labels`)")
    try:
        data = json.loads(path.read_text())
        labels = data["labels"]
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise ValueError(f"partition.success-labels={str(path)!r} is not a success-label file ({exc})") from None
    if not isinstance(labels, dict):
        raise ValueError(f"partition.success-labels={str(path)!r} is not a success-label file (\"labels\" must map task ids to "
                         f"true/false, found a {type(labels).__name__})")
    if data.get("env") != env:
        raise ValueError(f"partition.success-labels={str(path)!r} labels env {data.get('env')!r}, but the run's env is {env!r}")
    missing = [t.id for t in tasks if t.id not in labels]
    if missing:
        raise ValueError(f"partition.success-labels={str(path)!r} has no label for {len(missing)} task(s), e.g. {missing[:3]}")
    bad = [t.id for t in tasks if not isinstance(labels[t.id], bool)]
    if bad:
        raise ValueError(f"partition.success-labels={str(path)!r}: labels must be true/false, e.g. task {bad[0]!r} has {labels[bad[0]]!r}")
    return [labels[t.id] for t in tasks]


def label_file_problem(path: str | Path, env: str) -> str | None:
    """Why a success-label file does not fit env's train split (what load_labels would raise), or None."""
    from envs import make_env  # here: only a check reads the train split

    try:
        load_labels(path, env, make_env(env).tasks_of_split("train"))
    except ValueError as err:
        return str(err)
    return None
