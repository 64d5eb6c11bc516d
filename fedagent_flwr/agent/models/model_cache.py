"""The cache of models built here (tiny models, random-init models of a published shape): one folder per
recipe under `$FEDAGENT_CACHE` (default ~/.cache/fedagent-flwr), built once under a file lock so that
concurrent clients never build it twice, and published by an atomic rename so that a half-built folder is
never seen. A folder counts as built when its marker file exists and its files match the sizes and SHA-256
sums recorded in checksums.json when it was built; a truncated, overwritten or partial folder is built again.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from fedagent_flwr.atomic import atomic_write_text, file_sha256

MARKER = "recipe.json"
CHECKSUMS = "checksums.json"  # written by build_once after the build: size, mtime and SHA-256 of every file


def default_cache_root() -> Path:
    return Path(os.environ.get("FEDAGENT_CACHE", Path.home() / ".cache" / "fedagent-flwr")).expanduser().resolve()


def build_once(target: Path, build: Callable[[Path], None], what: str = "a model", force: bool = False) -> Path:
    """`target`, after `build(folder)` filled it (which must write MARKER last) unless another process did.

    A build can take from seconds to an hour (WebShop's tiny model: about an hour on 2 cores), so it says
    on stderr when it starts and how long it took: a first run must not look hung. A folder whose files no
    longer match their checksums, or a partial folder, is removed and built again, never loaded. `force`
    builds again even an intact folder, which stays in place until the new build replaces it (a failed
    rebuild leaves it as it was)."""
    if not force and _usable(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f"{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be building it right now
        try:
            usable = _usable(target, report=not force)
            if force or not usable:
                if target.exists() and not usable:
                    shutil.rmtree(target)
                tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
                started = time.time()
                verb = "rebuilding" if usable else "building"
                print(f"[fedagent] {verb} {what} into {target} (once; later runs reuse it) ...", file=sys.stderr, flush=True)
                try:
                    build(tmp)
                    write_checksums(tmp)
                    _publish(tmp, target)
                    print(f"[fedagent] built {what} in {time.time() - started:.0f} s", file=sys.stderr, flush=True)
                finally:
                    shutil.rmtree(tmp, ignore_errors=True)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return target


def is_built(target: Path) -> bool:
    """Whether `target` holds a complete, intact build (what build_once would return without building)."""
    return _usable(target)


def _publish(folder: Path, target: Path) -> None:
    """Rename `folder` to `target`. A folder already there (a forced rebuild) is first renamed aside and removed
    after, so `target` is at every moment absent or a complete build, never a mix of the two."""
    if not target.exists():
        os.replace(folder, target)
        return
    old = Path(tempfile.mkdtemp(prefix=f".{target.name}-old-", dir=target.parent))
    os.replace(target, old)  # onto an empty directory: allowed by rename(2)
    try:
        os.replace(folder, target)
    except OSError:
        os.replace(old, target)  # put the previous build back rather than leave nothing
        raise
    shutil.rmtree(old, ignore_errors=True)


def _usable(target: Path, report: bool = False) -> bool:
    if not (target / MARKER).exists():
        if report and target.exists():
            print(f"[fedagent] {target} is a partial build (no {MARKER}); building it again", file=sys.stderr, flush=True)
        return False
    if not (target / CHECKSUMS).exists():  # built before checksums were kept: trusted then, recorded now
        write_checksums(target)
        return True
    problem = damage(target)
    if problem and report:
        print(f"[fedagent] {problem}; building {target} again", file=sys.stderr, flush=True)
    return problem is None




def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.name != CHECKSUMS)


def write_checksums(folder: Path) -> None:
    """Record each file's size, modification time and SHA-256 in CHECKSUMS."""
    table = {}
    for path in _files(folder):
        st = path.stat()
        table[path.relative_to(folder).as_posix()] = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": file_sha256(path)}
    atomic_write_text(folder / CHECKSUMS, json.dumps(table, indent=1, sort_keys=True))


def damage(folder: Path) -> str | None:
    """What is wrong with a built folder, naming the file, or None. A file whose size and modification time are as
    recorded is taken as intact (re-hashing gigabytes of weights at every load would cost more than a load);
    any other is hashed."""
    try:
        table = json.loads((folder / CHECKSUMS).read_text())
    except (OSError, ValueError) as err:
        return f"{folder / CHECKSUMS} is unreadable ({type(err).__name__})"
    for name, want in table.items():
        path = folder / name
        try:
            st = path.stat()
        except OSError:
            return f"{path} is missing"
        if st.st_size != want["size"]:
            return f"{path} has {st.st_size} bytes, {want['size']} were written"
        if st.st_mtime_ns != want["mtime_ns"] and file_sha256(path) != want["sha256"]:
            return f"{path} was changed after it was built (SHA-256 differs)"
    return None
