"""A node's ranks kept across the ClientApp processes of a deployment.

flower-supernode runs each message in a ClientApp process of its own (its SuperExec starts `flwr-clientapp` per task),
so ranks started by that process would end with it, and every round would start them again and load the model anew.
In a deployment the ranks belong instead to a rank service: one process a SuperNode, started by the first ClientApp
that needs ranks, and ending when the ClientApps' parent (the SuperNode's SuperExec) ends. It keeps one RankPool
(agent/fsdp/launch.py) and answers one round at a time; a ClientApp reaches it over a Unix socket in a folder only the
node's user can enter (mode 0700), proving itself with the key in that folder (multiprocessing's HMAC handshake) and
its uid (SO_PEERCRED), and hands the weights over as files in the same folder, as a pool and its ranks do. In
simulation the Ray actor that plays a client lives through the run and keeps its pool in its own process instead.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from multiprocessing.connection import Client, Connection, Listener
from pathlib import Path
from typing import Any

import numpy as np

from fedagent_flwr.agent.fsdp.launch import PoolShape, RankFailed, RankPool, RankTarget, kept_pool, running
from fedagent_flwr.agent.fsdp.tensor_files import Streamed, mapped, write_streamed

SERVICE_PREFIX = "fedagent-rank-service-"
START_TIMEOUT_S = 120.0


def deployed() -> bool:
    """Whether this process is a ClientApp flower-supernode started for one message (Flower's own exit code asks
    the same of sys.argv[0])."""
    return Path(sys.argv[0]).name == "flwr-clientapp"


def service_folder(owner: int) -> Path:
    """The rank service's folder for the node whose ClientApps `owner` starts."""
    return Path(tempfile.gettempdir()) / f"{SERVICE_PREFIX}{os.getuid()}-{owner}"


class NodeRanks:
    """A RankPool's `run` for a ClientApp process, served by its node's rank service (started where none answers):
    the ranks, and the model each holds, outlive the process. `shape`: the pool's (launch.PoolShape)."""

    def __init__(self, shape: PoolShape, owner: int | None = None):
        self.shape = shape
        self.owner = owner or os.getppid()  # the SuperExec that starts this node's ClientApps
        self.folder = service_folder(self.owner)

    def run(self, target: RankTarget, tensors: dict[str, np.ndarray], *args: Any) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        ensure_service(self.folder, self.owner)
        sent = self.folder / f"sent-{os.getpid()}.safetensors"
        write_streamed(sent, Streamed.of(tensors))
        log = self.folder / "service.log"
        done = threading.Event()  # the ranks print into the service's log: their lines of this round shown here too
        echo = threading.Thread(target=_follow, args=(log, log.stat().st_size, done), daemon=True)
        echo.start()
        try:
            with _connect(self.folder) as conn:
                conn.send(("round", self.shape, target, args, str(sent)))
                answer = conn.recv()
        except (EOFError, OSError) as err:
            raise RankFailed(f"the node's rank service ended during the round ({type(err).__name__}); its log: {log}") from None
        finally:
            sent.unlink(missing_ok=True)  # taken by the pool when the round started
            done.set()
            echo.join(timeout=5)
        if answer[0] == "failed":
            raise RankFailed(answer[1])
        _, reply, info = answer
        out = mapped(reply)
        Path(reply).unlink()  # its pages live while `out`'s arrays do
        return out, info


def _follow(log: Path, offset: int, done: threading.Event) -> None:
    """`log`'s lines from `offset` on, printed to this process's stdout as they are written, until `done` and the end."""
    with open(log, errors="replace") as f:
        f.seek(offset)
        while True:
            line = f.readline()
            if line:
                sys.stdout.write(line)
            elif done.is_set():
                break
            else:
                time.sleep(0.2)
    sys.stdout.flush()


def ensure_service(folder: Path, owner: int) -> None:
    """The rank service of `folder` answering, started here where it does not (one starter at a time: a lock)."""
    folder.mkdir(mode=0o700, exist_ok=True)
    _check_private(folder)
    with open(folder / "start.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _answers(folder):
            return
        key = folder / "authkey"
        partial = folder / ".authkey"
        partial.write_bytes(secrets.token_bytes(32))
        partial.chmod(0o600)
        os.replace(partial, key)
        with open(folder / "service.log", "ab") as log:
            process = subprocess.Popen([sys.executable, "-m", __name__, str(folder), str(owner)], stdin=subprocess.DEVNULL,
                                       stdout=log, stderr=subprocess.STDOUT, start_new_session=True, close_fds=True)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not _answers(folder):
            if process.poll() is not None or time.monotonic() > deadline:
                tail = (folder / "service.log").read_text(errors="replace")[-2000:]
                raise RankFailed(f"the node's rank service did not start (exit code {process.poll()}): {tail}")
            time.sleep(0.2)


def _check_private(folder: Path) -> None:
    st = folder.stat()
    if st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise RankFailed(f"the rank service's folder {folder} is not this user's alone (owner uid {st.st_uid}, mode "
                         f"{st.st_mode & 0o777:o}): remove it, or set TMPDIR to a folder of this user's")


@contextlib.contextmanager
def _connect(folder: Path):
    conn = Client(str(folder / "socket"), "AF_UNIX", authkey=(folder / "authkey").read_bytes())
    try:
        yield conn
    finally:
        conn.close()


def _answers(folder: Path) -> bool:
    try:
        with _connect(folder) as conn:
            conn.send(("ping",))
            return conn.recv()[0] == "pong"
    except (OSError, EOFError, ValueError):  # no socket, no one listening, a half-written key
        return False


def peer_uid(conn: Connection) -> int:
    """The uid of the process at the other end of a Unix socket connection (SO_PEERCRED: pid, uid, gid)."""
    with socket.socket(fileno=os.dup(conn.fileno())) as sock:
        _, uid, _ = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
    return uid


def serve(folder: Path, owner: int) -> None:
    """The service's life: answer pings and rounds until `owner` ends (or SIGTERM), then end the ranks and remove the
    folder."""
    pools: list[RankPool] = []

    def end(*_: object) -> None:
        for pool in pools:
            with contextlib.suppress(Exception):
                pool.close()
        shutil.rmtree(folder, ignore_errors=True)
        os._exit(0)

    signal.signal(signal.SIGTERM, end)
    threading.Thread(target=_watch_owner, args=(owner, end), daemon=True).start()
    (folder / "socket").unlink(missing_ok=True)  # a service before this one that was killed left it
    listener = Listener(str(folder / "socket"), "AF_UNIX", authkey=(folder / "authkey").read_bytes())
    print(f"[rank-service] pid {os.getpid()} serving {folder} for the ClientApps of process {owner}", flush=True)
    while True:
        try:
            conn = listener.accept()  # the key's handshake: a wrong key raises here
        except Exception as err:
            print(f"[rank-service] refused a connection: {type(err).__name__}: {err}", flush=True)
            continue
        with conn:
            if peer_uid(conn) != os.getuid():
                print("[rank-service] refused a connection from another user", flush=True)
                continue
            try:
                request = conn.recv()
                if request[0] == "ping":
                    conn.send(("pong", os.getpid()))
                    continue
                _, shape, target, args, sent = request
                try:
                    pool = kept_pool(pools, shape)
                    reply, info = pool.run_file(target, Path(sent), *args)
                    conn.send(("ok", str(reply), info))
                except Exception as err:  # the round's failure is the client's to report; the service goes on
                    conn.send(("failed", str(err)))
            except (EOFError, OSError) as err:  # the client went away mid-round
                print(f"[rank-service] a client left: {type(err).__name__}", flush=True)


def _watch_owner(owner: int, end) -> None:
    while running(owner):
        time.sleep(1.0)
    end()


if __name__ == "__main__":
    serve(Path(sys.argv[1]), int(sys.argv[2]))
