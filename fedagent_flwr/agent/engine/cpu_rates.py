"""How fast this processor multiplies a model's matrices in fp32 and in bf16, measured at start-up and cached.

Why measure: no one precision is right on every CPU. With torch 2.13 a bf16 matmul runs many times slower than fp32
on a processor with AVX2 only, and several times faster on one with AVX-512 bf16 or AMX (docs/performance.md). The
processor's name and flags do not say which kernel torch will take, so
placement.py's `auto` asks the processor itself: one timed matmul of the run's own shape (a model's MLP projection,
[rows x hidden] @ [hidden x intermediate]) in each dtype.

The probe is bounded: both dtypes run at the same rows, which start small and grow only while the slower call stays
short, and a call that alone exceeds the time bound is not repeated. Its result is kept
in a JSON file per processor (name, ISA flags, torch version) and shape, so a run's processes - the server, each
client, the warm start - read one measurement and resolve `auto` alike.
"""

from __future__ import annotations

import hashlib
import json
import platform
import re
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from fedagent_flwr.atomic import write_json_atomic

PROBE_ROWS = 2048  # an update micro-batch's or a prefill's tokens: where the compute-bound phases spend their time
START_ROWS = 16
CALL_BOUND_S = 0.05  # rows grow while the slower dtype's call would stay under this; a call over it is timed once
REPEATS = 3  # best of, for a call under the bound
CACHE_FILE = "cpu-matmul-rates.json"
DTYPES = (torch.float32, torch.bfloat16)


@dataclass(frozen=True)
class Processor:
    name: str  # /proc/cpuinfo's model name (platform.processor() elsewhere)
    flags: str  # the ISA flags that decide a bf16 kernel, space-separated (empty where unknown)

    def describe(self) -> str:
        return f"{self.name} ({self.flags or 'ISA flags unknown'})"

    def slug(self) -> str:
        """The processor as a folder name: its model without vendor marks, clock or "CPU", and the widest bf16 kernel
        its flags allow ("AMD EPYC" with avx512_bf16 -> "amd-epyc-avx512bf16"; a Xeon with AMX -> "...-amx")."""
        name = re.sub(r"\((r|tm)\)|\bcpu\b|@.*$|\b\d+-core processor\b|\bprocessor\b", " ", self.name.lower())
        words = re.sub(r"[^a-z0-9]+", "-", name).strip("-") or "cpu"
        flags = set(self.flags.split())
        isa = next((tag for flag, tag in (("amx_tile", "amx"), ("avx512_bf16", "avx512bf16"), ("avx512f", "avx512"),
                                          ("avx2", "avx2"), ("sve", "sve"), ("asimd", "neon")) if flag in flags), "")
        return f"{words}-{isa}" if isa else words


# The flags that decide which bf16 kernel oneDNN can take: AMX tiles, AVX-512 bf16, AVX-512, AVX2.
BF16_FLAGS = ("amx_bf16", "amx_tile", "avx512_bf16", "avx512f", "avx2", "asimd", "sve", "bf16")


def this_processor(cpuinfo: Path = Path("/proc/cpuinfo")) -> Processor:
    name, flags = platform.processor() or platform.machine(), set()
    if cpuinfo.is_file():
        for line in cpuinfo.read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            key = key.strip().lower()
            if key == "model name" and value.strip():
                name = value.strip()
            elif key in ("flags", "features"):  # x86, Arm
                flags |= set(value.split())
    return Processor(name, " ".join(f for f in BF16_FLAGS if f in flags))


@dataclass(frozen=True)
class MatmulRates:
    """GFLOP/s of [rows x hidden] @ [hidden x intermediate] in fp32 and in bf16 on one processor."""

    fp32: float
    bf16: float
    rows: int
    hidden: int
    intermediate: int
    threads: int  # the probe's: 1
    processor: str
    seconds: float  # what the probe took

    @property
    def bf16_speedup(self) -> float:
        return self.bf16 / self.fp32

    def describe(self) -> str:
        return (f"bf16 {self.bf16:.1f} GFLOP/s against fp32 {self.fp32:.1f} ({self.bf16_speedup:.2f}x) on "
                f"{self.processor}, {self.rows}x{self.hidden}x{self.intermediate} on {self.threads} thread"
                f"{'s' if self.threads != 1 else ''}")


def _seconds_per_call(rows: int, hidden: int, intermediate: int, dtype: torch.dtype) -> float:
    """The fastest of a few timed calls (one, where a call alone exceeds CALL_BOUND_S)."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(rows, hidden, generator=generator).to(dtype)
    w = torch.randn(hidden, intermediate, generator=generator).to(dtype)
    torch.matmul(x[:START_ROWS], w)  # the kernel's first-call set-up stays out of the timing
    best = float("inf")
    for _ in range(REPEATS):
        started = time.perf_counter()
        torch.matmul(x, w)
        best = min(best, time.perf_counter() - started)
        if best > CALL_BOUND_S:
            break
    return best


def measure(hidden: int, intermediate: int, processor: Processor | None = None,
            max_rows: int = PROBE_ROWS) -> MatmulRates:
    """Time the shape in fp32 and in bf16 at the same rows, growing 4x from START_ROWS while the slower call stays
    under CALL_BOUND_S / 4, up to max_rows: where bf16 crawls (AVX2) it is timed at few rows, and the probe stays
    within a few hundred milliseconds on any processor."""
    started, threads = time.perf_counter(), torch.get_num_threads()
    rows = START_ROWS
    # One thread: the ratio is what decides, and one core's rate does not depend on what else the machine runs (the
    # server probes while Ray starts; here two threads beside a busy run measured under a third of one thread's rate).
    torch.set_num_threads(1)
    try:
        with torch.inference_mode():
            fp32_s, bf16_s = (_seconds_per_call(rows, hidden, intermediate, dtype) for dtype in DTYPES)
            while rows < max_rows and max(fp32_s, bf16_s) * 4 < CALL_BOUND_S:
                rows = min(rows * 4, max_rows)
                fp32_s, bf16_s = (_seconds_per_call(rows, hidden, intermediate, dtype) for dtype in DTYPES)
    finally:
        torch.set_num_threads(threads)
    gflop = 2 * rows * hidden * intermediate / 1e9
    return MatmulRates(fp32=gflop / fp32_s, bf16=gflop / bf16_s, rows=rows, hidden=hidden, intermediate=intermediate,
                       threads=1, processor=(processor or this_processor()).describe(),
                       seconds=time.perf_counter() - started)


def cache_key(processor: Processor, hidden: int, intermediate: int) -> str:
    """One measurement per processor model, ISA flags, torch build and shape (measured on one thread, whatever the
    process runs with, so the server and its clients resolve `auto` alike)."""
    ident = json.dumps([processor.name, processor.flags, torch.__version__, hidden, intermediate])
    return hashlib.sha256(ident.encode()).hexdigest()[:16]


def cached_rates(hidden: int, intermediate: int, cache_dir: Path | None, processor: Processor | None = None) -> MatmulRates:
    """The rates from cache_dir's file, measured and added there first if absent (cache_dir None: measured, not kept).
    The first measurement written is the one every process takes: one that finds an entry written while it measured
    takes that entry, so the server and the clients never decide on two measurements."""
    processor = processor or this_processor()
    key = cache_key(processor, hidden, intermediate)
    path = None if cache_dir is None else Path(cache_dir) / CACHE_FILE
    entries = _read(path)
    if key in entries:
        try:
            return MatmulRates(**entries[key])
        except TypeError:  # an entry of another layout: measured again
            pass
    rates = measure(hidden, intermediate, processor)
    if path is not None:
        entries = _read(path)
        if key in entries:
            try:
                return MatmulRates(**entries[key])
            except TypeError:
                pass
        write_json_atomic(path, entries | {key: asdict(rates)})
    return rates


def _read(path: Path | None) -> dict:
    if path is None or not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):  # a damaged cache is measured again, never trusted
        return {}
    return data if isinstance(data, dict) else {}
