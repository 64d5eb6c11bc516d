#!/usr/bin/env python
"""The raw output a GPU number is cited from: a benchmark's result JSON with where, when and how it ran.

`run` runs a benchmark (or a test run) as a child process, passes its stderr and its other stdout lines through,
and writes its last stdout line that is a JSON object (the benchmark's `--json` result) to a file, with a
`raw_output` section first:

- card: the GPU's name, memory and driver (nvidia-smi), or name "cpu" and driver null on a machine without one;
- software: Python; torch and the CUDA and cuDNN it was built with (null on a CPU build); transformers, peft, and
  flwr, numpy and liger-kernel where installed;
- git: the commit and whether the tree had uncommitted changes, with `git status --porcelain`'s lines. A lent machine
  receives the working tree without .git: there the variables FEDAGENT_GIT_COMMIT and FEDAGENT_GIT_DIRTY, set where
  the call starts, stand in (`"from"` says which), and without them the commit is "unknown";
- command: the command line exactly as run; environment: the variables that change what a stage runs (SHAPE,
  ROUND_SET, ...); settings: the benchmark's parsed arguments (its result's `settings`) and run-config values (its
  `run_config`), moved here from the result;
- started_utc, finished_utc, wall_s (the command's), rc; times: every time the result holds, by its path, in the
  unit its key names (is_time: a last word `s`, seconds, or a word `ms`, milliseconds: each phase's time and
  the rest; gpu_round's paper_rounds are estimates and left out); where the command printed no JSON object,
  stdout_tail: its last lines (a test run's summary).

benchmarks/gpu_checks.sh runs every stage through it, into benchmarks/results/<UTC date>-<card slug>/ (`folder`).

    python benchmarks/raw_output.py folder benchmarks/results    # benchmarks/results/2026-12-01-h100-80gb-hbm3
    python benchmarks/raw_output.py card                         # one line: card, memory, driver, CUDA, versions
    python benchmarks/raw_output.py run OUT.json [--stage NAME] -- python benchmarks/gpu_round.py --shape 1.5b --json
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from collections import deque
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# the variables gpu_checks.sh and the benchmarks read, which change what a command runs
ENVIRONMENT = ("SHAPE", "ROUND_SET", "CUDA_VISIBLE_DEVICES", "TORCH_LOGS", "PYTHONPATH", "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION")
PACKAGES = ("transformers", "peft", "flwr", "numpy", "liger-kernel")
# result keys whose times are estimates, not measurements
ESTIMATES = ("paper_rounds",)
TAIL_LINES = 20


def utc_now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def card() -> dict:
    """The first GPU nvidia-smi lists (name, memory in MiB, driver, how many cards), or a CPU machine's stand-in."""
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            done = subprocess.run([smi, "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader,nounits"],
                                  capture_output=True, text=True, timeout=60)
            lines = [line for line in done.stdout.splitlines() if line.strip()]
            if done.returncode == 0 and lines:
                name, memory, driver = (cell.strip() for cell in lines[0].split(","))
                return {"name": name, "memory_mib": int(float(memory)), "driver": driver, "count": len(lines)}
        except (OSError, subprocess.SubprocessError, ValueError):
            pass
    return {"name": "cpu", "memory_mib": None, "driver": None, "count": 0}


def slug(name: str) -> str:
    """A card's name as a folder name: lower case, words joined by '-', the vendor left out
    ("NVIDIA H100 80GB HBM3" -> "h100-80gb-hbm3")."""
    words = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    return re.sub(r"^nvidia-", "", words) or "unknown"


def folder(root: str | Path, when: datetime.datetime | None = None) -> Path:
    """Where a session's raw outputs go: <root>/<UTC date>-<card slug>, or on a machine without a GPU
    <root>/<UTC date>-<processor slug> (`amd-epyc-avx512bf16`: the model and its widest bf16 kernel, as
    agent/engine/cpu_rates.py's Processor.slug() names it), since CPU timings compare only within one processor."""
    when = when or datetime.datetime.now(datetime.timezone.utc)
    name = card()["name"]
    if name == "cpu":
        from fedagent_flwr.agent.engine.cpu_rates import this_processor

        return Path(root) / f"{when:%Y-%m-%d}-{this_processor().slug()}"
    return Path(root) / f"{when:%Y-%m-%d}-{slug(name)}"


def software() -> dict:
    try:
        import torch
    except ImportError:
        versions: dict = {"torch": None, "cuda": None, "cudnn": None}
    else:
        cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
        versions = {"torch": torch.__version__, "cuda": torch.version.cuda, "cudnn": cudnn}
    versions = {"python": platform.python_version()} | versions
    for package in PACKAGES:
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            versions[package] = None
    return versions


def git_state(repo: Path = REPO) -> dict:
    """The commit the tree is at, and whether it has uncommitted changes: from git where the tree has its .git, else
    from FEDAGENT_GIT_COMMIT and FEDAGENT_GIT_DIRTY (0, false or no: clean; anything else, such as a count of changed
    files: dirty)."""
    if (repo / ".git").exists() and shutil.which("git"):
        try:
            head = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=60)
            # --no-optional-locks: reading the state never takes the index lock others may be using
            status = subprocess.run(["git", "--no-optional-locks", "-C", str(repo), "status", "--porcelain"],
                                    capture_output=True, text=True, timeout=60)
            if head.returncode == 0 and status.returncode == 0:
                changed = status.stdout.splitlines()
                return {"commit": head.stdout.strip(), "dirty": bool(changed), "changed": changed, "from": "git"}
        except (OSError, subprocess.SubprocessError):
            pass
    commit, dirty = os.environ.get("FEDAGENT_GIT_COMMIT"), os.environ.get("FEDAGENT_GIT_DIRTY")
    return {"commit": commit or "unknown",
            "dirty": None if dirty is None else dirty.strip().lower() not in ("0", "false", "no", ""), "changed": None,
            "from": "FEDAGENT_GIT_COMMIT and FEDAGENT_GIT_DIRTY" if commit else "no .git here and no FEDAGENT_GIT_COMMIT"}


def settings(args: argparse.Namespace) -> dict:
    """A benchmark's parsed arguments, defaults included, as JSON values (anything else as its text)."""
    def plain(value):
        if value is None or isinstance(value, (bool, int, float, str)):
            return value
        if isinstance(value, (list, tuple)):
            return [plain(v) for v in value]
        return str(value)
    return {k: plain(v) for k, v in vars(args).items()}


def is_time(key) -> bool:
    """A key that names a time, by the project's habit: a last word `s` (seconds) or a word `ms` (milliseconds)
    ("update_s", "ms", "decode_ms_per_token_step"), not a rate ("tokens_per_s")."""
    if not isinstance(key, str):
        return False
    words = key.split("_")
    return (words[-1] == "s" and words[-2:-1] != ["per"]) or "ms" in words


def phase_times(result, path: str = "", timed: bool = False) -> dict[str, float]:
    """Every number under a key that names a time, by its dotted path, in the unit its key names ("update_s",
    "variants.0.update_s", "first_run_s.eager", "variants.whole.ms", "engines.1.ms_per_token_step")."""
    items = result.items() if isinstance(result, dict) else enumerate(result) if isinstance(result, list) else ()
    times: dict[str, float] = {}
    for key, value in items:
        here = f"{path}{key}"
        if not path and key in ESTIMATES:
            continue
        inside = timed or is_time(key)
        if isinstance(value, (dict, list)):
            times |= phase_times(value, here + ".", inside)
        elif inside and isinstance(value, (int, float)) and not isinstance(value, bool):
            times[here] = value
    return times


def provenance(command: list[str], stage: str | None = None) -> dict:
    """Where, with what and from which commit a command ran (the times and result are added by `record`)."""
    return {"stage": stage, "card": card(), "software": software(), "git": git_state(), "command": command,
            "environment": {k: os.environ[k] for k in ENVIRONMENT if k in os.environ}}


def record(result: dict | None, command: list[str], started_utc: str, wall_s: float, rc: int,
           stage: str | None = None, stdout_tail: list[str] | None = None) -> dict:
    """The file's content: `raw_output` first, then the result's own keys (so that readers of the benchmark's JSON,
    such as fastest_variant.py, read the file as they read the benchmark's output)."""
    result = dict(result or {})
    raw = provenance(command, stage)
    raw["settings"] = {"arguments": result.pop("settings", None), "run_config": result.pop("run_config", None)}
    raw |= {"started_utc": started_utc, "finished_utc": utc_now(), "wall_s": round(wall_s, 3), "rc": rc,
            "times": phase_times(result)}
    if not result:
        raw["result"] = "none: the command printed no JSON object"
        raw["stdout_tail"] = stdout_tail or []
    return {"raw_output": raw} | result


def run(path: Path, command: list[str], stage: str | None = None) -> int:
    """Run `command`, pass its output through, and write `record`'s content to `path`; returns its exit status."""
    started, started_utc = time.perf_counter(), utc_now()
    result, tail = None, deque(maxlen=TAIL_LINES)
    try:
        child = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)  # stderr goes where ours goes
    except OSError as err:
        print(f"raw_output.py: {err}", file=sys.stderr)
        rc, tail = 127, deque([str(err)])
    else:
        for line in child.stdout:
            parsed = None
            if line.lstrip().startswith("{"):
                try:
                    parsed = json.loads(line)
                except ValueError:
                    pass
            if isinstance(parsed, dict):
                result = parsed
                text = line.strip()  # the whole object goes to the file; the log gets its start
                print(text[:700] + (" ..." if len(text) > 700 else ""), flush=True)
            else:
                tail.append(line.rstrip("\n"))
                print(line, end="", flush=True)
        rc = child.wait()
    content = record(result, command, started_utc, time.perf_counter() - started, rc, stage, list(tail))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(content, indent=1) + "\n")
    print(f"wrote {path} (rc {rc}, {content['raw_output']['wall_s']:.1f} s)", flush=True)
    return rc


def card_line() -> str:
    c, s = card(), software()
    memory = f"{c['memory_mib']:,} MiB" if c["memory_mib"] else "no GPU memory"
    return (f"{c['name']}, {memory}, driver {c['driver']}, CUDA {s['cuda']}, cuDNN {s['cudnn']}; python {s['python']}, "
            + ", ".join(f"{k} {s[k]}" for k in ("torch", *PACKAGES)))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    command = []
    if "--" in argv:
        at = argv.index("--")
        argv, command = argv[:at], argv[at + 1:]
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="what", required=True)
    where = sub.add_parser("folder", help="print <root>/<UTC date>-<card slug>")
    where.add_argument("root", nargs="?", default=str(REPO / "benchmarks" / "results"))
    sub.add_parser("card", help="print the card, its driver, CUDA and the packages' versions on one line")
    runs = sub.add_parser("run", help="run the command after -- and write its raw output to PATH")
    runs.add_argument("path", type=Path)
    runs.add_argument("--stage", help="the gpu_checks.sh stage it belongs to")
    args = parser.parse_args(argv)
    if args.what == "folder":
        print(folder(args.root))
    elif args.what == "card":
        print(card_line())
    else:
        if not command:
            parser.error("run needs a command after --")
        return run(args.path, command, args.stage)
    return 0


if __name__ == "__main__":
    sys.exit(main())
