"""The cache of models built here (tiny models, random-init models of a published shape): one folder per
recipe under `$FEDAGENT_CACHE` (default ~/.cache/fedagent-flwr), built once under a file lock so that
concurrent clients never build it twice, and published by an atomic rename so that a half-built folder is
never seen. A folder counts as built when its marker file (written last) exists.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

MARKER = "recipe.json"


def default_cache_root() -> Path:
    return Path(os.environ.get("FEDAGENT_CACHE", Path.home() / ".cache" / "fedagent-flwr")).expanduser().resolve()


def build_once(target: Path, build: Callable[[Path], None], what: str = "a model") -> Path:
    """`target`, after `build(folder)` filled it (which must write MARKER last) unless another process did.

    A build can take from seconds to an hour (WebShop's tiny model: about an hour on 2 cores), so it says
    on stderr when it starts and how long it took: a first run must not look hung."""
    if (target / MARKER).exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f"{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be building it right now
        try:
            if not (target / MARKER).exists():
                tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
                started = time.time()
                print(f"[fedagent] building {what} into {target} (once; later runs reuse it) ...", file=sys.stderr, flush=True)
                try:
                    build(tmp)
                    os.replace(tmp, target)
                    print(f"[fedagent] built {what} in {time.time() - started:.0f} s", file=sys.stderr, flush=True)
                finally:
                    shutil.rmtree(tmp, ignore_errors=True)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return target
