"""Starting a client's N ranks, and ending them with the client.

Each rank is a fresh interpreter started by torch.multiprocessing (`start_processes` with the spawn method, what
`torch.multiprocessing.spawn` runs: CUDA cannot be forked). Its join ends every other rank as soon as one fails and
raises with the failed rank's traceback, or with the signal that killed it. torchrun was the other choice: it
re-executes a script, and a ClientApp is already a process Flower or a Ray actor started, whose ranks must end with it.

What this module adds to torch's launcher:
- a rendezvous in a private folder (a file store: no port to collide with another client's ranks on the machine);
- tensors in and out as safetensors files in that folder (a 7B model's weights do not go through a pickle pipe), and
  rank 0's other results as JSON;
- ranks that end when the client process dies: a SIGKILLed client runs no atexit hook, so each rank watches its
  parent's pid and exits when it changes; the folder it leaves (the whole weights, in memory on a tmpfs) is removed
  by the next client that starts ranks on the machine;
- a deadline (run-config rank-timeout-s) for the round and for every collective, so a hung rank fails the client
  instead of blocking it for gloo's 30 or NCCL's 10 minutes, or forever in a teardown;
- the ranks' sockets on loopback (GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME = lo) unless the user names an interface:
  a client's ranks are all on its own machine.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

RankTarget = Callable[..., tuple[dict[str, np.ndarray], dict[str, Any]]]
FOLDER_PREFIX = "fedagent-ranks-"  # a client's rank folder in the temp directory, with its pid in client.pid


class RankFailed(RuntimeError):
    """One of a client's ranks failed (raised, or was killed); the others were ended."""


def run_ranks(world: int, backend: str, target: RankTarget, tensors: dict[str, np.ndarray], *args: Any,
              timeout_s: float | None = None) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """`target(rank, world, tensors, *args)` on `world` ranks in one process group (`backend`: gloo or nccl); rank 0's
    return value, (tensors, JSON-able info). `args` travel pickled; `tensors` once through a file every rank maps."""
    from safetensors.numpy import load_file, save_file

    remove_orphaned_folders()
    with tempfile.TemporaryDirectory(prefix=FOLDER_PREFIX) as folder:
        Path(folder, "client.pid").write_text(str(os.getpid()))
        save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, os.path.join(folder, "in.safetensors"))
        context = mp.start_processes(_rank_main, args=(world, backend, folder, os.getpid(), target, args, timeout_s),
                                     nprocs=world, join=False, daemon=True, start_method="spawn")
        started = time.monotonic()
        try:
            while not context.join(timeout=1.0):
                if timeout_s is not None and time.monotonic() - started > timeout_s:
                    raise RankFailed(f"the client's {world} ranks did not finish in {timeout_s:g} s")
        except (mp.ProcessRaisedException, mp.ProcessExitedException):
            exitcodes = [p.exitcode for p in context.processes]  # torch's join has sent the survivors SIGTERM
            _end(context.processes)  # every rank reaped before their error files are read
            raise _first_failure(Path(folder), exitcodes) from None
        finally:
            _end(context.processes)
        out = Path(folder)
        return load_file(str(out / "out.safetensors")), json.loads((out / "out.json").read_text())


def remove_orphaned_folders(root: str | Path | None = None) -> list[Path]:
    """Remove the rank folders (in `root`, default the temp directory) whose client is no longer running: a SIGKILLed
    client cleans nothing up. A folder whose client.pid is not yet written (a client starting) is left. Returns what
    was removed."""
    removed = []
    for folder in Path(root or tempfile.gettempdir()).glob(FOLDER_PREFIX + "*"):
        try:
            pid = int((folder / "client.pid").read_text())
        except (OSError, ValueError):
            continue
        if not _running(pid):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _first_failure(folder: Path, exitcodes: list[int | None]) -> RankFailed:
    """The failure that ended the ranks. When one rank fails, the others fail too, in the next collective, with a lost
    connection: a rank killed by a signal is the cause (but SIGTERM, which torch's join sends the survivors), or else
    the rank that raised first."""
    world = len(exitcodes)
    for rank, code in enumerate(exitcodes):
        if code is not None and code < 0 and -code != signal.SIGTERM:
            return RankFailed(f"rank {rank} of the client's {world} died (signal {signal.Signals(-code).name}); "
                              "the other ranks were ended")
    raised = []
    for f in folder.glob("error-*.txt"):
        when, _, text = f.read_text(errors="replace").partition("\n")
        try:
            raised.append((float(when), int(f.stem.split("-")[1]), text))
        except ValueError:  # not as the rank writes it (it writes whole files): still the rank's, last in time
            raised.append((math.inf, int(f.stem.split("-")[1]), when + text))
    if not raised:
        return RankFailed(f"the client's {world} ranks ended with exit codes {exitcodes}")
    _, rank, traceback_text = min(raised)
    last = (traceback_text.strip().splitlines() or ["(its error file is empty)"])[-1]
    return RankFailed(f"rank {rank} of the client's {world} failed: {last}\n{traceback_text}")


def _end(processes) -> None:
    """Every rank still running is ended (SIGTERM, then SIGKILL after 5 s) and reaped."""
    for p in processes:
        if p.is_alive():
            p.terminate()
    deadline = time.monotonic() + 5
    for p in processes:
        p.join(timeout=max(0.0, deadline - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join()


def _watch_parent(parent: int) -> None:
    while True:
        if os.getppid() != parent:  # the client died; nobody will collect this rank's result
            os._exit(1)
        time.sleep(0.5)


def loopback_bootstrap() -> None:
    """The ranks' sockets on the loopback interface, unless the user named one: a client's ranks share its machine,
    and the interface the host name resolves to may be firewalled or absent."""
    names = {name for _, name in socket.if_nameindex()}
    loopback = next((name for name in ("lo", "lo0") if name in names), None)
    for variable in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
        if loopback and not os.environ.get(variable):
            os.environ[variable] = loopback


def _rank_main(rank: int, world: int, backend: str, folder: str, parent: int, target: RankTarget, args: tuple,
               timeout_s: float | None = None) -> None:
    from safetensors.numpy import load_file, save_file

    threading.Thread(target=_watch_parent, args=(parent,), daemon=True).start()
    loopback_bootstrap()
    deadline = {} if timeout_s is None else {"timeout": datetime.timedelta(seconds=timeout_s)}  # every collective's
    dist.init_process_group(backend, init_method=f"file://{folder}/rendezvous", rank=rank, world_size=world, **deadline)
    try:
        try:
            tensors, info = target(rank, world, load_file(os.path.join(folder, "in.safetensors")), *args)
        except BaseException:  # when it failed, and why: the launcher names the first rank that failed
            # written whole (a temporary name, then renamed): a rank killed while writing leaves no half file
            partial = Path(folder, f".error-{rank}.txt")
            partial.write_text(f"{time.time()!r}\n{traceback.format_exc()}")
            os.replace(partial, Path(folder, f"error-{rank}.txt"))
            raise
        if rank == 0:
            save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, os.path.join(folder, "out.safetensors"))
            Path(folder, "out.json").write_text(json.dumps(info))
        dist.barrier()  # rank 0 has written: the others may end
    except BaseException:
        dist.destroy_process_group()
        raise
    end_rank()


def end_rank() -> None:
    """A rank's end once its results are written: the process group destroyed, then the process left at once
    (os._exit(0)) rather than through the interpreter's shutdown. At that shutdown C++ objects the group's threads still
    reach are destroyed in no set order, and a rank that had finished its work sometimes aborted there ("terminate called
    without an active exception", SIGABRT; a two-rank test in CI, stops 63 and 73), which fails the client's round."""
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def rank_device(device: torch.device, rank: int) -> torch.device:
    """The device rank `rank` computes on: its own card of the client's visible ones, or the CPU."""
    if device.type == "cuda":
        if torch.cuda.device_count() <= rank:
            raise RankFailed(f"rank {rank} needs a CUDA device of its own, and {torch.cuda.device_count()} are visible "
                             "(ranks-per-client = the GPUs each client gets: --num-gpus-per-client)")
        torch.cuda.set_device(rank)
        return torch.device("cuda", rank)
    return torch.device("cpu")


def backend_for(device: torch.device) -> str:
    """The process group's backend for ranks computing on `device`. CUDA ranks still run collectives on CPU tensors
    (Ranks.total's sums, all_gather_object's pickles), which plain "nccl" does not serve: gloo takes those."""
    return "cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo"
