"""Files written whole or not at all (a temporary file in the same folder, then a rename), and their checksums."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any


def atomic_write_text(path: Path, text: str) -> None:
    """Write to a temporary file in the same folder, then rename: readers never see half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}-", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())  # the rename must not reach the disk before the bytes do
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json_atomic(path: Path, payload: Any) -> None:
    atomic_write_text(path, json.dumps(payload, indent=1, sort_keys=True))


def file_sha256(path: Path) -> str:
    """The SHA-256 of a file, read in blocks (model weights are gigabytes)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def unwritable_reason(folder: Path) -> str | None:
    """Why this process could not create run folders under `folder` (its nearest existing ancestor decides), or None."""
    existing = folder
    while not existing.exists():
        if existing.parent == existing:
            return "no part of it exists"
        existing = existing.parent
    if not existing.is_dir():
        return f"{existing} is a file"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"{existing} is not writable"
    # os.access answers from permission bits, and root passes those everywhere (/proc, /sys, a read-only mount):
    # make and remove a folder where the first missing part (or a run folder) would go, as the run will.
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".fedagent-write-check-", dir=existing))
    except OSError as err:
        return f"cannot create a folder in {existing}: {err.strerror or err}"
    return None
