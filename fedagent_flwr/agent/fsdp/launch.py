"""Starting a client's N ranks, keeping them up between its rounds, and ending them with the client.

Each rank is an interpreter of its own started with the spawn method (CUDA cannot be forked), once per pool
(RankPool: a client process's in simulation, the node's rank service's on real SuperNodes, rank_service.py): it joins the process group once and then answers one request a round, keeping what the round's target
holds in the process (the model, loaded and sharded) for the next. A rank that fails or dies ends the others and the
pool, and the client's round raises with the failed rank's traceback, or with the signal that killed it. torchrun was
the other choice: it re-executes a script, and a ClientApp is already a process Flower or a Ray actor started, whose
ranks must end with it.

What this module does beyond starting the processes:
- a rendezvous in a private folder (a file store: no port to collide with another client's ranks on the machine);
- tensors in and out as safetensors files in that folder, written a tensor at a time and mapped where they are read
  (agent/fsdp/tensor_files.py: a 7B model's weights go through no pickle pipe, a rank holds no private copy of the sent
  ones, and rank 0 holds one gathered tensor of its reply at a time), and rank 0's other results as JSON;
- ranks that end when the client process dies: a SIGKILLed client runs no atexit hook, so each rank watches its
  parent's pid and exits when it changes, the first to see it removing the client's folder (a round's weights, in
  memory on a tmpfs); a folder still left (all ranks killed too) is removed by the next client that starts ranks;
- a deadline for the round (run-config federation.round-timeout: the server stops waiting then anyway), so a hung rank fails the
  client instead of blocking it forever, in a teardown too; every collective keeps torch's own limit (NCCL's 10
  minutes, gloo's 30) unless run-config engine.rank-timeout-s sets a shorter one;
- on a GPU, each rank's process group bound to its device (init_process_group's device_id: NCCL then connects eagerly
  and knows the device of every collective);
- the ranks' sockets on loopback (GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME = lo) unless the user names an interface:
  a client's ranks are all on its own machine;
- where the run config asks (engine.ranks-return-memory), memory a rank frees given back to the system
  (return_freed_memory), so that a CPU rank's resident memory is what its tensors hold, as the memory plan counts it.
"""

from __future__ import annotations

import ctypes
import datetime
import json
import math
import os
import queue
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

from fedagent_flwr.agent.fsdp.tensor_files import Streamed, mapped, write_streamed

# a target's tensors: whole arrays (rank 0's), or a stream every rank produces and rank 0 writes as it comes
RankTarget = Callable[..., tuple[dict[str, np.ndarray] | Streamed, dict[str, Any]]]
FOLDER_PREFIX = "fedagent-ranks-"  # a client's rank folder in the temp directory, with its pid in client.pid
MMAP_THRESHOLD = 1 << 16  # a rank's blocks of 64 KiB or more are mapped on their own (return_freed_memory)
_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter (malloc.h)


class RankFailed(RuntimeError):
    """One of a client's ranks failed (raised, or was killed); the others were ended."""


def run_ranks(world: int, backend: str, target: RankTarget, tensors: dict[str, np.ndarray], *args: Any,
              timeout_s: float | None = None) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """`target(rank, world, tensors, *args)` on `world` ranks started for this one call (a RankPool of one round)."""
    with RankPool(world, backend, timeout_s) as pool:
        return pool.run(target, tensors, *args)


class RankPool:
    """A client's `world` ranks, started once and kept up between rounds: each round's `run` hands every rank its
    request, and the ranks keep whatever their targets hold in the process (the model loaded and sharded) for the next.
    A round costs no new interpreters, no torch import and no process group. A rank that fails or is killed ends the
    others and the pool (RankFailed; the next `run` raises it again: start a new pool); `close` ends them all.
    `mmap_threshold`: the bytes from which each rank's C library maps a block on its own (return_freed_memory;
    run-config engine.ranks-return-memory); 0 leaves glibc's own moving threshold (benchmarks/freed_memory.py compares them)."""

    def __init__(self, world: int, backend: str, timeout_s: float | None = None, mmap_threshold: int = 0,
                 collective_timeout_s: float | None = None):
        self.world, self.backend, self.timeout_s, self.mmap_threshold = world, backend, timeout_s, mmap_threshold
        self.collective_timeout_s = collective_timeout_s
        remove_orphaned_folders()
        self.folder = Path(tempfile.mkdtemp(prefix=FOLDER_PREFIX))
        (self.folder / "client.pid").write_text(str(os.getpid()))
        context = mp.get_context("spawn")  # CUDA cannot be forked
        self._requests = [context.SimpleQueue() for _ in range(world)]
        self._done = context.Queue()
        self._rounds = 0
        self.failure: RankFailed | None = None
        self.processes = [context.Process(target=_rank_serve, daemon=True,
                                          args=(rank, world, backend, str(self.folder), os.getpid(),
                                                collective_timeout_s, mmap_threshold, self._requests[rank], self._done))
                          for rank in range(world)]
        for p in self.processes:
            p.start()

    @property
    def shape(self) -> PoolShape:
        return self.world, self.backend, self.timeout_s, self.mmap_threshold, self.collective_timeout_s

    @property
    def alive(self) -> bool:
        return self.failure is None and all(p.exitcode is None for p in self.processes)

    def run(self, target: RankTarget, tensors: dict[str, np.ndarray], *args: Any) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """`target(rank, world, tensors, *args)` on every rank; rank 0's return value, (tensors, JSON-able info).
        `args` travel pickled; `tensors` once through a file every rank maps, and the tensors returned through one this
        process maps (a Streamed return is written as each tensor comes)."""
        self._check_alive()  # an ended pool's folder is gone: nothing to write the tensors into
        sent = self.folder / f"sent-{self._rounds + 1}.safetensors"
        write_streamed(sent, Streamed.of(tensors))
        reply, info = self.run_file(target, sent, *args)
        out = mapped(reply)
        reply.unlink()  # its pages live while `out`'s arrays do
        return out, info

    def run_file(self, target: RankTarget, sent: Path, *args: Any) -> tuple[Path, dict[str, Any]]:
        """`run` with the sent tensors in the safetensors file `sent` (taken: moved into the ranks' folder, removed when
        read), the reply's tensors left in the returned file for the caller to read and remove (a client process
        reached through the node's rank service: agent/fsdp/rank_service.py)."""
        self._check_alive()
        for stale in self.folder.glob("out-*.safetensors"):  # a reply its caller died before reading
            stale.unlink(missing_ok=True)
        self._rounds += 1
        number, started = self._rounds, time.monotonic()
        os.replace(sent, self.folder / f"in-{number}.safetensors")
        for requests in self._requests:
            requests.put((number, target, args))
        while True:
            try:
                if self._done.get(timeout=1.0) == number:
                    break
            except queue.Empty:
                pass
            exitcodes = [p.exitcode for p in self.processes]  # before the survivors are ended (SIGTERM is no cause)
            if any(code is not None for code in exitcodes):
                _end(self.processes)  # every rank reaped before their error files are read
                self._fail(_first_failure(self.folder, exitcodes))
            if self.timeout_s is not None and time.monotonic() - started > self.timeout_s:
                self._fail(RankFailed(f"the client's {self.world} ranks did not finish in {self.timeout_s:g} s"))
        (self.folder / f"in-{number}.safetensors").unlink(missing_ok=True)  # rank 0 removes it before its reply
        info = json.loads((self.folder / f"out-{number}.json").read_text())
        (self.folder / f"out-{number}.json").unlink()
        return self.folder / f"out-{number}.safetensors", info | {"rank_pids": [p.pid for p in self.processes]}

    def _check_alive(self) -> None:
        if not self.alive:
            raise self.failure or RankFailed(f"the client's {self.world} ranks have ended")

    def _fail(self, failure: RankFailed) -> None:
        self.failure = failure
        self.close()
        raise failure

    def close(self) -> None:
        """Every rank asked to end, given 5 s, then ended; the folder removed."""
        if any(p.is_alive() for p in self.processes) and self.failure is None:
            for requests in self._requests:
                requests.put(None)
            deadline = time.monotonic() + 5
            for p in self.processes:
                p.join(timeout=max(0.0, deadline - time.monotonic()))
        _end(self.processes)
        shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self) -> RankPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# what tells one pool from another: (world, backend, timeout_s, mmap_threshold, collective_timeout_s)
PoolShape = tuple[int, str, "float | None", int, "float | None"]


def kept_pool(pools: list[RankPool], shape: PoolShape) -> RankPool:
    """The pool in `pools` (at most one) where it still runs with `shape`, else a new one of that shape, any other
    ended first (its memory free before the new ranks load)."""
    if pools and pools[0].alive and pools[0].shape == shape:
        return pools[0]
    while pools:
        pools.pop().close()
    pools.append(RankPool(*shape[:4], collective_timeout_s=shape[4]))
    return pools[0]


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
        if not running(pid):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed


def running(pid: int) -> bool:
    """Whether process `pid` exists (another user's counts)."""
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


def _watch_parent(parent: int, folder: str) -> None:
    while True:
        if os.getppid() != parent:  # the client died; nobody will collect this rank's result
            # the first rank to see it takes the client's folder (the weights) with it: another rank may first end
            # through a lost connection, and a rank that still writes its error file there then finds no folder
            shutil.rmtree(folder, ignore_errors=True)
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


def return_freed_memory(threshold: int = MMAP_THRESHOLD) -> bool:
    """Blocks of `threshold` bytes or more mapped on their own, so that a freed tensor's memory goes back to the
    system. glibc raises its threshold each time such a block is freed (up to 32 MiB), after which a rank's
    activations and KV cache come from its heap, where what they free stays resident and fragments: CPU ranks then
    peaked far above what their tensors held (docs/multi-gpu.md, benchmarks/rank_memory.py). A fixed threshold ends
    that, at the cost of faulting in each large block anew (benchmarks/freed_memory.py). False where the C library
    is not glibc (nothing done)."""
    try:
        return bool(ctypes.CDLL(None).mallopt(_M_MMAP_THRESHOLD, threshold))
    except (OSError, AttributeError):
        return False


def group_options(rank: int, backend: str, collective_timeout_s: float | None) -> dict[str, Any]:
    """init_process_group's options for `rank`: a collective's timeout where one is set (else torch's own per backend),
    and where NCCL runs, the rank's GPU (rank r computes on the client's r-th visible GPU)."""
    options: dict[str, Any] = {}
    if collective_timeout_s:
        options["timeout"] = datetime.timedelta(seconds=collective_timeout_s)
    if "nccl" in backend:
        options["device_id"] = torch.device("cuda", rank)
    return options


def _rank_serve(rank: int, world: int, backend: str, folder: str, parent: int, collective_timeout_s: float | None,
                mmap_threshold: int, requests, done) -> None:
    """A rank's life: the process group joined once, then each request (round number, target, args) answered until
    None; rank 0 writes the round's results and says so once every rank has finished it."""
    threading.Thread(target=_watch_parent, args=(parent, folder), daemon=True).start()
    loopback_bootstrap()
    if mmap_threshold:
        return_freed_memory(mmap_threshold)
    dist.init_process_group(backend, init_method=f"file://{folder}/rendezvous", rank=rank, world_size=world,
                            **group_options(rank, backend, collective_timeout_s))
    try:
        while (request := requests.get()) is not None:
            number, target, args = request
            try:
                _answer(rank, world, folder, number, target, args)
            except BaseException:  # when it failed, and why: the launcher names the first rank that failed
                # written whole (a temporary name, then renamed): a rank killed while writing leaves no half file
                partial = Path(folder, f".error-{rank}.txt")
                partial.write_text(f"{time.time()!r}\n{traceback.format_exc()}")
                os.replace(partial, Path(folder, f"error-{rank}.txt"))
                raise
            dist.barrier()  # every rank has finished the round: the next request finds them all waiting
            if rank == 0:
                done.put(number)
    except BaseException:  # its traceback printed, the rank ends at once: the client ends the others
        traceback.print_exc()
        end_rank(1, destroy=False)
    end_rank()


def _answer(rank: int, world: int, folder: str, number: int, target: RankTarget, args: tuple) -> None:
    """One request: the target run on the sent weights (mapped), then its tensors written by rank 0, a stream's
    gathered by every rank in turn and written as each comes, and its info."""
    tensors, info = target(rank, world, mapped(os.path.join(folder, f"in-{number}.safetensors")), *args)
    streamed = tensors if isinstance(tensors, Streamed) else Streamed.of(tensors if rank == 0 else {})
    dist.barrier()  # every rank has returned, dropping its map of the sent weights: their file can go
    if rank == 0:
        Path(folder, f"in-{number}.safetensors").unlink(missing_ok=True)  # the reply takes its room, not both
        write_streamed(os.path.join(folder, f"out-{number}.safetensors"), streamed)
        Path(folder, f"out-{number}.json").write_text(json.dumps(info))
    else:
        streamed.drain()


def end_rank(code: int = 0, destroy: bool = True) -> None:
    """A rank's end: the process group destroyed (not after a failure: its peers may never answer), then the process
    left at once (os._exit) rather than through the interpreter's shutdown. At that shutdown C++ objects the group's
    threads still reach are destroyed in no set order, and a rank that had finished its work sometimes aborted there
    ("terminate called without an active exception", SIGABRT; a two-rank test in CI, stops 63 and 73), which fails the
    client's round; and a LoRA rank hung there forever, closing its held adapter block (PEFT's unload starts a tqdm
    thread, which a shutting-down interpreter never starts)."""
    if destroy:
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def rank_device(device: torch.device, rank: int) -> torch.device:
    """The device rank `rank` computes on: its own card of the client's visible ones, or the CPU."""
    if device.type == "cuda":
        if torch.cuda.device_count() <= rank:
            raise RankFailed(f"rank {rank} needs a CUDA device of its own, and {torch.cuda.device_count()} are visible "
                             "(engine.ranks-per-client = the GPUs each client gets: --num-gpus-per-client)")
        torch.cuda.set_device(rank)
        return torch.device("cuda", rank)
    return torch.device("cpu")


def backend_for(device: torch.device) -> str:
    """The process group's backend for ranks computing on `device`. CUDA ranks still run collectives on CPU tensors
    (Ranks.total's sums, all_gather_object's pickles), which plain "nccl" does not serve: gloo takes those."""
    return "cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo"
