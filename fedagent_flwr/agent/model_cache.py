"""The cache of models built here (tiny models, random-init models of a published shape): one folder per
recipe under `$FEDAGENT_CACHE` (default ~/.cache/fedagent-flwr), built once under a file lock so that
concurrent clients never build it twice, and published by an atomic rename so that a half-built folder is
never seen. A folder counts as built when its marker file (written last) exists.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

MARKER = "recipe.json"


def default_cache_root() -> Path:
    return Path(os.environ.get("FEDAGENT_CACHE", Path.home() / ".cache" / "fedagent-flwr")).expanduser().resolve()


def build_once(target: Path, build: Callable[[Path], None]) -> Path:
    """`target`, after `build(folder)` filled it (which must write MARKER last) unless another process did."""
    if (target / MARKER).exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f"{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be building it right now
        try:
            if not (target / MARKER).exists():
                tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
                try:
                    build(tmp)
                    os.replace(tmp, target)
                finally:
                    shutil.rmtree(tmp, ignore_errors=True)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return target
