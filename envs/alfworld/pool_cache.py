"""On-disk cache of generated game pools, keyed by a hash of the generator settings.

One gzip'd JSON file per settings hash under ~/.cache/fedagent-flwr/alfworld/
(or $XDG_CACHE_HOME/fedagent-flwr/alfworld/). It is written to a temporary file in the
same folder and renamed into place, so a reader never sees half a file and two
processes generating at once both end with a complete one.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Callable


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "fedagent-flwr" / "alfworld"


def settings_key(settings: dict[str, Any]) -> str:
    blob = json.dumps(settings, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:16]


def pool_path(settings: dict[str, Any], cache_dir: Path | None = None) -> Path:
    return Path(cache_dir or default_cache_dir()) / f"games-{settings_key(settings)}.json.gz"


def _read(path: Path, settings: dict[str, Any]) -> list[dict[str, Any]] | None:
    try:
        with gzip.open(path, "rt", encoding="utf-8") as f:
            payload = json.load(f)
    except (OSError, EOFError, ValueError):
        return None  # missing or damaged: generate again
    if payload.get("settings") != settings:
        return None
    return payload["games"]


def _write_atomically(path: Path, payload: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as raw, gzip.open(raw, "wt", encoding="utf-8") as f:
            json.dump(payload, f)
        os.chmod(tmp, 0o644)  # mkstemp makes it private; the cache is an ordinary file
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def load_or_generate(
    settings: dict[str, Any], generate: Callable[[], list[dict[str, Any]]], cache_dir: Path | None = None
) -> list[dict[str, Any]]:
    """The cached pool for `settings`, generating and storing it on a miss."""
    path = pool_path(settings, cache_dir)
    games = _read(path, settings)
    if games is None:
        games = generate()
        _write_atomically(path, {"settings": settings, "games": games})
    return games
