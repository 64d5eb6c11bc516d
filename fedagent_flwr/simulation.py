"""Run the Flower app in simulation from the command line (`python run_simulation.py` or `python -m fedagent_flwr.simulation`).

Every run-config key is a flag named as the key (`--clients-per-round 3`, `--grpo.num-generations 8`; a key's
old flat name is refused naming its new one), `--num-clients` also sets the number of simulated SuperNodes, and
`--num-cpus-per-client` / `--num-gpus-per-client` become Ray's client resources.
Under the hood this is `flwr run <app> --run-config ... --federation-config ...`,
so a run started here is the same app a deployment runs. Each run gets a local
SuperLink of its own (free ports, a private FLWR_HOME), and every process started
under it is stopped at the end: on success, failure, Ctrl-C or a timeout's SIGTERM.

    python run_simulation.py --strategy fedagent-avg --env maze --num-clients 4 --clients-per-round 2
    python run_simulation.py --run-config configs/fedagent-cpu.toml --seed 1

`--app DIR` names the app folder (the one with pyproject.toml) when this runs from an installed
package rather than a checkout.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from flwr.common.config import parse_config_args

from fedagent_flwr.agent.engine.memory import GB
from fedagent_flwr.config import RENAMED, SECTIONS, RunConfig
from fedagent_flwr.deployment import free_port
from fedagent_flwr.runs import provenance
from fedagent_flwr.runs.preflight import preflight
from fedagent_flwr.runs.run_folder import check_run_folder

PROJECT_DIR = Path(__file__).resolve().parents[1]  # the checkout this package sits in (editable install)
# A simulation's seconds to round 1: about START_S, plus NODE_S a simulated SuperNode (its registration, the handshake,
# its partition), as benchmarks/federation_start.py measured them on a 2-core AMD EPYC: 49.2 s at 1,000 SuperNodes and
# 74.6 s at 4,000 (benchmarks/results/2026-12-07-cpu/federation_start.large.amd.json). A federation whose SuperNodes
# alone would take more than LARGE_START_S is announced with its estimate before it starts.
START_S, NODE_S, LARGE_START_S = 41.0, 0.0085, 60.0


class OneLineParser(argparse.ArgumentParser):
    def error(self, message: str):  # one line and exit 2, as a refused run config: no usage line above it
        self.exit(2, f"{self.prog}: error: {message} (--help lists the keys)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                           usage="%(prog)s [--run-config FILE] [--<run-config-key> VALUE ...] [--num-cpus-per-client N] ...")
    parser.add_argument("--run-config", dest="run_config_file", default=None, metavar="FILE",
                        help="a TOML file of run-config keys (e.g. configs/fedagent-cpu.toml); flags given here override it")
    groups = {None: parser.add_argument_group("top-level keys", "The everyday keys.")}
    for section in SECTIONS:  # --help lists the keys under the config section that owns them
        groups[section] = parser.add_argument_group(f"{section.NAME}.* keys", section.__doc__.splitlines()[0])
    for key, f, section in RunConfig.keys():  # a flag a key, named as the key: --grpo.num-generations 8
        groups[section].add_argument("--" + key, dest=key, default=None, metavar=type(f.default).__name__.upper(), help=f"{f.metadata['doc']} (default "
                                     f"{f.default!r}; {f.metadata['allowed']})",
                                     type=_flag_type(type(f.default), f.metadata["words"], f.metadata["per_env"]))
    sim = parser.add_argument_group("simulation resources")
    sim.add_argument("--app", type=Path, default=PROJECT_DIR, help="the Flower app folder (default: this checkout)")
    sim.add_argument("--num-cpus-per-client", type=int, default=1, help="Ray CPUs per client (integer >= 1; default 1)")
    sim.add_argument("--num-gpus-per-client", type=float, default=0.0, help="Ray GPUs per client, fractions allowed (default 0)")
    sim.add_argument("--keep-superlink", action="store_true", help="leave the local SuperLink running after the run")
    sim.add_argument("--dry-run", action="store_true", help="print the flwr command and exit")
    return parser


def _flag_type(kind: type, words: tuple[str, ...], per_env: bool = False):
    """A flag's argparse type: its key's type, also taking the words the key allows (engine.gradient-checkpointing's auto), and
    for a per-environment key its text ("babyai=20,webshop=10"; the run config checks it)."""
    plain = _bool if kind is bool else kind
    if not words and not per_env:
        return plain

    def typed(text: str):
        return text if text in words or (per_env and "=" in text) else plain(text)
    typed.__name__ = plain.__name__  # argparse names the type in its error message
    return typed


def _bool(text: str) -> bool:
    """argparse's type=bool would read 'false' as True."""
    if text.lower() in ("true", "1", "yes"):
        return True
    if text.lower() in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def share_of_card(gpus_per_client: float, client_memory_gb: float, card_bytes: int) -> float:
    """engine.client-memory-gb for clients that share one card (0 < --num-gpus-per-client < 1) where none is given: their
    share of the card's memory, rounded down to 0.1 GiB. Without it each would size its rollout rows and checkpointing
    by the memory free at the moment it starts, which its neighbours are about to take. 0 = leave it as it is."""
    if not 0 < gpus_per_client < 1 or client_memory_gb:
        return 0.0
    return math.floor(gpus_per_client * card_bytes / GB * 10) / 10


def renamed_flag(argv: list[str]) -> str | None:
    """The refusal of the first flag that is a key's old name (config/renames.py), naming its new flag; else None."""
    for arg in argv:
        name = arg.removeprefix("--").partition("=")[0]
        if arg.startswith("--") and name in RENAMED:
            return f"--{name} is a key's old name: write --{RENAMED[name]} (docs/renamed-keys.md lists every renamed key)"
    return None


def run_provenance(argv: list[str], app: Path, env: dict[str, str]) -> dict[str, str]:
    """The variables runs/provenance.py reads in the server: this command as typed, and the app's git commit unless
    the caller set one (a machine that received the tree without .git)."""
    prog = "run_simulation.py" if Path(sys.argv[0]).name == "run_simulation.py" else "-m fedagent_flwr.simulation"
    out = {provenance.COMMAND_ENV: f"python {prog} {shlex.join(argv)}".rstrip()}
    if not env.get(provenance.COMMIT_ENV):
        commit, dirty = provenance.git_state(app.resolve())
        out |= {provenance.COMMIT_ENV: commit, provenance.DIRTY_ENV: "1" if dirty else "0"}
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if old := renamed_flag(argv):
        return refuse(old)
    args = build_parser().parse_args(argv)
    try:
        overrides = read_run_config_file(args.run_config_file) if args.run_config_file else {}
    except ValueError as err:
        return refuse(str(err))
    for key, _, _ in RunConfig.keys():
        if (value := getattr(args, key)) is not None:
            overrides[key] = value
    for key in ("output-dir", "partition.success-labels", "eval.initial-evaluation"):  # relative to where you run this
        value = overrides.get(key)
        if isinstance(value, str) and value and not value.startswith("~"):  # "" or a wrong type: RunConfig refuses it
            overrides[key] = str(Path(value).resolve())
    try:  # fail here, in one line, before Ray starts
        cfg = RunConfig.from_run_config(RunConfig().to_run_config() | overrides)
        check_run_folder(cfg.output_path, cfg.run_name, cfg.resume)
        preflight(cfg, "simulation")  # every role runs on this machine: all it needs of it, before Ray starts
    except ValueError as err:
        return refuse(str(err))
    if args.num_cpus_per_client < 1:
        return refuse(f"--num-cpus-per-client={args.num_cpus_per_client} is not allowed: expected an integer >= 1")
    if args.num_gpus_per_client < 0:
        return refuse(f"--num-gpus-per-client={args.num_gpus_per_client:g} is not allowed: expected a number >= 0")
    if cfg.engine.ranks_per_client > 1 and args.num_gpus_per_client > 0 and args.num_gpus_per_client != cfg.engine.ranks_per_client:
        return refuse(f"--num-gpus-per-client={args.num_gpus_per_client:g} but engine.ranks-per-client={cfg.engine.ranks_per_client}: "
                      f"each rank computes on a GPU of its own; give --num-gpus-per-client {cfg.engine.ranks_per_client} (or 0 "
                      "for ranks on the CPU)")
    if args.num_gpus_per_client > 0:
        import torch

        if not torch.cuda.is_available():
            return refuse(f"--num-gpus-per-client={args.num_gpus_per_client:g} but no CUDA GPU is visible on this machine")
        share = share_of_card(args.num_gpus_per_client, cfg.engine.client_memory_gb, torch.cuda.get_device_properties(0).total_memory)
        if share:  # clients that share a card plan with their share of it, not with what is free when each starts
            overrides["engine.client-memory-gb"] = share
            print(f"run_simulation.py: engine.client-memory-gb={share:g} (--num-gpus-per-client {args.num_gpus_per_client:g} of a "
                  f"{torch.cuda.get_device_properties(0).total_memory / GB:.1f} GiB card)", flush=True)
    if str(overrides.get("device", "")).startswith("cuda"):
        import torch

        if not torch.cuda.is_available():  # else every client fails at its first message, after Ray started
            return refuse(f"--device={overrides['device']} but no CUDA GPU is visible on this machine; use --device cpu "
                          "or auto")

    num_nodes = overrides.get("num-clients") or 2
    if num_nodes * NODE_S > LARGE_START_S:  # else a large federation sits for minutes without a word
        print(f"[run_simulation] {num_nodes:,} simulated SuperNodes: about {(START_S + num_nodes * NODE_S) / 60:.0f} "
              f"minutes before round 1 (on a 2-core AMD EPYC: {START_S:.0f} s and {NODE_S * 1000:.1f} ms a SuperNode; "
              "benchmarks/federation_start.py measures this machine)", flush=True)
    run_config = " ".join(f"{k}={toml_value(v)}" for k, v in overrides.items())
    federation = (f"num-supernodes={num_nodes} client-resources-num-cpus={args.num_cpus_per_client} "
                  f"client-resources-num-gpus={args.num_gpus_per_client}")
    cmd = ["flwr", "run", str(args.app.resolve()), "--stream", "--federation-config", federation]
    if run_config:
        cmd += ["--run-config", run_config]
    print("$ " + shlex.join(cmd), flush=True)
    if args.dry_run:
        return 0

    env = os.environ.copy()
    env.setdefault("FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION", "1")  # else flwr reinstalls deps (GBs of torch)
    env.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    env |= run_provenance(argv, args.app, env)  # the server's provenance.json names this command and the app's commit
    # `flwr run` starts a local SuperLink on a fixed port and leaves it running for whoever comes next: another
    # user's run would land on it, and stopping it would stop theirs. Unless told otherwise (the port variables,
    # or --keep-superlink), this run gets a SuperLink of its own: free ports, a private FLWR_HOME, and at the end
    # every process that carries that FLWR_HOME (the SuperLink, the simulation process, Ray) is stopped.
    private = None
    if not args.keep_superlink and "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT" not in env:
        private = tempfile.mkdtemp(prefix="fedagent-flwr-home-")
        env.update(FLWR_HOME=private, FLWR_LOCAL_SUPERLINK_HTTP_API_PORT=str(free_port()),
                   FLWR_LOCAL_CONTROL_API_PORT=str(free_port()))
        print(f"[run_simulation] a local SuperLink of this run's own on port {env['FLWR_LOCAL_SUPERLINK_HTTP_API_PORT']} "
              f"(FLWR_HOME={private}), stopped at the end", flush=True)
    port = env.get("FLWR_LOCAL_SUPERLINK_HTTP_API_PORT", "39091")
    before = superlink_pids(port)
    previous_term = signal.signal(signal.SIGTERM, _interrupt)  # a timeout's SIGTERM cleans up like Ctrl-C
    try:
        # `flwr run --stream` exits 0 even when the ServerApp failed; its last words name summary.json.
        summary = None
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
        try:
            for line in proc.stdout:
                print(line, end="", flush=True)
                if "; summary: " in line:
                    summary = Path(line.rsplit("; summary: ", 1)[1].strip())
            proc.wait()
        except BaseException:
            # Stopped (Ctrl-C, a timeout's SIGTERM): `with Popen` would wait for `flwr run` with no limit before the
            # clean-up below (a stopped job was still alive after 120 s in the isolation test, on a busy machine);
            # give it the same grace as the processes it started.
            stop({proc.pid})
            raise
        finally:
            proc.stdout.close()
        if proc.returncode != 0:
            return proc.returncode
        if summary is None or not summary.exists():
            print("the run ended without writing summary.json; the ServerApp failed (see its log above)",
                  file=sys.stderr, flush=True)
            return 1
        return 0
    except KeyboardInterrupt as stopped:  # its processes are stopped below; a traceback would say nothing more
        signum = signal.SIGTERM if isinstance(stopped, Terminated) else signal.SIGINT
        print(f"[run_simulation] stopped by {signum.name}: the run folder keeps every round completed (a run with a "
              "run-name continues from its last with --resume)", file=sys.stderr, flush=True)
        return 128 + signum
    finally:
        signal.signal(signal.SIGTERM, previous_term)
        if private is not None:
            stop(processes_of(private))
            shutil.rmtree(private, ignore_errors=True)
        elif not args.keep_superlink:
            # The SuperLink's own children (its SuperExec, flwr-simulation, Ray) sit in other process groups and
            # outlive it once it is gone: take the whole tree while it still hangs together.
            stop(with_descendants(superlink_pids(port) - before))


def refuse(reason: str) -> int:
    """Bad input, said in one line before anything starts; exit status 2, as argparse's own refusals."""
    print(f"run_simulation.py: {reason}", file=sys.stderr, flush=True)
    return 2


class Terminated(KeyboardInterrupt):
    """SIGTERM (what `timeout` and schedulers send), stopped as Ctrl-C is."""


def _interrupt(signum, frame) -> None:
    raise Terminated


def processes_of(flwr_home: str) -> set[int]:
    """PIDs of the processes started under this FLWR_HOME (they inherit it: SuperLink, flwr-simulation, Ray)."""
    marker = f"FLWR_HOME={flwr_home}".encode()
    pids = set()
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if marker in (proc / "environ").read_bytes().split(b"\0"):
                pids.add(int(proc.name))
        except (OSError, ValueError):
            continue
    return pids - {os.getpid()}


def with_descendants(pids: set[int]) -> set[int]:
    """`pids` and every process below them (Linux /proc; `pids` alone elsewhere)."""
    children: dict[int, list[int]] = {}
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            ppid = int((proc / "stat").read_text().rsplit(") ", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(proc.name))
    found, todo = set(pids), list(pids)
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def stop(pids: set[int], grace: float = 10.0) -> None:
    """SIGTERM, then SIGKILL for what is still alive after `grace` seconds."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.time() + grace
    while pids and time.time() < deadline:
        pids = {pid for pid in pids if Path(f"/proc/{pid}").exists() and not _zombie(pid)}
        time.sleep(0.2)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1].startswith("Z")
    except (OSError, IndexError):
        return True


def superlink_pids(port: str) -> set[int]:
    """PIDs of running flower-superlink processes on `port` (Linux /proc; empty elsewhere), so a run on its own
    port never stops the SuperLink of another run on another port."""
    port = f"--port {port} ".encode()
    pids = set()
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        if b"flower-superlink" in cmdline and port in cmdline + b" ":
            pids.add(int(proc.name))
    return pids


def read_run_config_file(path: str) -> dict:
    """Run-config keys from a TOML file, read by Flower's own parser (as `flwr run --run-config FILE` reads it)."""
    file = Path(path).expanduser()
    if not file.is_file() or file.suffix != ".toml":  # Flower reads any other file as key=value text: silently nothing
        problem = "is a folder" if file.is_dir() else "is not named *.toml" if file.exists() else "no such file"
        raise ValueError(f"--run-config {path}: {problem}; expected a TOML file of run-config keys")
    try:
        flat = parse_config_args([str(file)])
    except ValueError as err:  # tomllib/tomli decode errors and UnicodeDecodeError are ValueErrors
        # tomli's message gives a line number, not the key: quote the line (the last one at the end of the document)
        lines = file.read_text(errors="replace").splitlines()
        line = lines[min(err.lineno, len(lines)) - 1] if getattr(err, "lineno", None) and lines else ""
        raise ValueError(f"--run-config {path}: not valid TOML ({err})" + (f" in {line[:80]!r}" if line else "")) from None
    except OSError as err:
        raise ValueError(f"--run-config {path}: cannot be read ({err.strerror or err})") from None
    if renamed := sorted(set(flat) & set(RENAMED)):
        raise ValueError(f"--run-config {path}: {renamed[0]} is a key's old name: write {RENAMED[renamed[0]]} "
                         "(docs/renamed-keys.md lists every renamed key)")
    unknown = sorted(set(flat) - set(RunConfig().to_run_config()))
    if unknown:
        raise ValueError(f"--run-config {path}: unknown run-config key(s) {unknown}")
    if not flat:  # a truncated or wrong file would run every default
        raise ValueError(f"--run-config {path}: holds no run-config keys")
    return flat


def parse_overrides(items: list[str]) -> dict[str, Any]:
    """Run-config values from KEY=VALUE texts (the experiment commands' --set), each typed as its key's default."""
    known = {key: f for key, f, _ in RunConfig.keys()}
    out = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if key in RENAMED:
            raise ValueError(f"--set {item!r}: {key} is a key's old name: write {RENAMED[key]}")
        if not sep or key not in known:
            raise ValueError(f"--set {item!r}: expected key=value with a run-config key (e.g. grpo.learning-rate=1e-5)")
        if key in out:  # the later would silently win
            raise ValueError(f"--set {item!r}: {key} is already set")
        kind, words = type(known[key].default), known[key].metadata["words"]
        if kind is bool and raw not in words:  # strict: a word it does not know is an error, never quietly false
            if raw.lower() not in ("1", "true", "yes", "0", "false", "no"):
                raise ValueError(f"--set {item!r}: {key} takes true | false" + "".join(f" | {w}" for w in words))
            out[key] = raw.lower() in ("1", "true", "yes")
            continue
        try:  # the flag's own type: its words and per-environment text kept as text (the run config checks them)
            out[key] = _flag_type(kind, words, known[key].metadata["per_env"])(raw)
        except ValueError:
            raise ValueError(f"--set {item!r}: {key} takes a {kind.__name__}") from None
    return out


def toml_value(value: Any) -> str:
    """One value as TOML, for pyproject's table and for `flwr run --run-config "k=v ..."` alike.

    Strings are TOML basic strings ("...", with escapes), which Flower's key=value parser reads.
    """
    if isinstance(value, bool):  # TOML spells them lower-case
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return repr(value)


if __name__ == "__main__":
    sys.exit(main())
