"""Checkpoint and resume of the server: the run's full state after every round, in checked, plain formats.

`<run folder>/state/` holds the state after the last complete round r, `<run folder>/state.previous/` the
one before it:

  arrays.safetensors  the global arrays after round r (bit-exact)
  server.json         round r, the strategy's state (federation.client-sampling RNG, sampled clients, failures,
                      per-round metrics, ...), the server's torch / numpy / random RNG states, the metric
                      rows and evaluation history (runs/state_codec.py: JSON, nothing that runs code on load)
  config.json         the run config the state belongs to
  manifest.json       the SHA-256 of each file above, written last

A new state is written to a temporary folder and swapped in with renames, so a run killed at any moment
leaves a complete `state/` or `state.previous/` (or both). Before anything is loaded, every file is checked
against the manifest; a damaged or missing file makes the resume fall back to the previous generation, with
a message naming the file, and re-run that round (the rounds replay exactly). `resume=true` (with the same
run-name) continues with round r + 1: same round numbers (clients seed their rollouts by round), same
sampling RNG, same weights, so the rest of the run is what it would have been.

Clients of FedAgentAvg keep no state between rounds (they start every round from the global weights with a
fresh optimizer, seeded by seed, round and partition), so the server's state is the whole federation's state.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy
from safetensors.numpy import load_file, save_file

from fedagent_flwr.atomic import file_sha256
from fedagent_flwr.config import RunConfig, current_keys
from fedagent_flwr.runs.state_codec import decode, encode
from strategies.transfer import array_view

STATE_DIR = "state"
PREVIOUS_DIR = "state.previous"
FORMAT = 2  # 1 was a pickle (server.pkl) and an npz, which this version does not read
FILES = ("arrays.safetensors", "server.json", "config.json")
MANIFEST = "manifest.json"
# Keys that may change when a run is resumed; any other difference is an error.
RESUMABLE_CHANGES = ("num-server-rounds", "resume", "federation.round-timeout", "resilience.fault-injection")
# Strategy attributes that belong to this run's federation, not to the training state:
# node ids are new after a restart, the global arrays come from arrays.safetensors, and
# _screened_out is emptied within the round that fills it.
_SKIP = ("node_of_partition", "_global", "_screened_out")


@dataclass
class ServerState:
    server_round: int
    arrays: ArrayRecord
    strategy: dict[str, Any]
    rows: list[dict[str, Any]]
    history: dict[int, dict[str, float]]
    rng: dict[str, Any]


def strategy_state(strategy: Strategy) -> dict[str, Any]:
    return {k: v for k, v in vars(strategy).items() if k not in _SKIP}


def load_strategy_state(strategy: Strategy, state: dict[str, Any]) -> None:
    missing = sorted(set(strategy_state(strategy)) - set(state))
    if missing:
        raise ValueError(f"saved state of {type(strategy).__name__} lacks {missing}: it was written by other code")
    for key, value in state.items():
        setattr(strategy, key, value)


def _rng_states() -> dict[str, Any]:
    return {"torch": torch.get_rng_state().numpy().tobytes(), "numpy": np.random.get_state(), "random": random.getstate()}


def _set_rng_states(states: dict[str, Any]) -> None:
    torch.set_rng_state(torch.from_numpy(np.frombuffer(states["torch"], dtype=np.uint8).copy()))
    np.random.set_state(states["numpy"])
    random.setstate(states["random"])




def _write(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def save_state(run_dir: Path, config: dict[str, Any], server_round: int, arrays: ArrayRecord, strategy: Strategy,
               rows: list[dict[str, Any]], history: dict[int, dict[str, float]]) -> Path:
    """Make `<run_dir>/state` the state after `server_round` and keep the one it replaces as `state.previous`."""
    payload = encode({"format": FORMAT, "server_round": server_round, "array_order": list(arrays.keys()),
                      "strategy": strategy_state(strategy), "rows": rows, "history": history, "rng": _rng_states()})
    tmp = Path(tempfile.mkdtemp(prefix=".state-", dir=run_dir))
    try:
        # Views, not copies: a 0.5B model's state is gigabytes.
        save_file({k: np.ascontiguousarray(array_view(arrays[k])) for k in arrays}, str(tmp / "arrays.safetensors"))
        _write(tmp / "server.json", json.dumps(payload).encode())
        _write(tmp / "config.json", json.dumps(config, indent=2, sort_keys=True).encode())
        manifest = {"format": FORMAT, "server_round": server_round, "sha256": {name: file_sha256(tmp / name) for name in FILES}}
        _write(tmp / MANIFEST, json.dumps(manifest, indent=2).encode())
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    final, previous = run_dir / STATE_DIR, run_dir / PREVIOUS_DIR
    # Every moment between these renames leaves a complete state/ or state.previous/.
    if final.exists():
        if previous.exists():
            shutil.rmtree(previous)
        os.replace(final, previous)
    os.replace(tmp, final)
    return final


class DamagedState(ValueError):
    """A state folder that fails its checks; the message names the file."""


def _verified(folder: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(manifest, saved config) of a state folder whose every file matches its manifest; DamagedState if not."""
    if (folder / "server.pkl").exists() and not (folder / MANIFEST).exists():
        raise DamagedState(f"{folder / 'server.pkl'} was written by an older fedagent-flwr (a pickle), which this "
                           "version does not load; finish that run with the version that started it")
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
        expected = manifest["sha256"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise DamagedState(f"{folder / MANIFEST} is missing or unreadable ({type(err).__name__})") from None
    if manifest.get("format") != FORMAT:
        raise DamagedState(f"{folder / MANIFEST} has format {manifest.get('format')!r}; this version reads format {FORMAT}")
    for name in FILES:
        try:
            actual = file_sha256(folder / name)
        except OSError:
            raise DamagedState(f"{folder / name} is missing") from None
        if actual != expected.get(name):
            raise DamagedState(f"{folder / name} is damaged (its SHA-256 differs from {folder / MANIFEST})")
    return manifest, json.loads((folder / "config.json").read_text())


def _read(folder: Path) -> ServerState:
    payload = decode(json.loads((folder / "server.json").read_text()))
    tensors = load_file(str(folder / "arrays.safetensors"))
    arrays = ArrayRecord({k: Array(tensors[k]) for k in payload["array_order"]})
    return ServerState(payload["server_round"], arrays, payload["strategy"], payload["rows"], payload["history"],
                       payload["rng"])


def read_state(run_dir: Path) -> tuple[ServerState, dict[str, Any]]:
    """The newest state of `run_dir` that passes its checks, and the config saved with it. Runs before any model
    is loaded. Falls back to `state.previous/` (saying which file was damaged); ValueError when neither is usable."""
    problems = []
    for name in (STATE_DIR, PREVIOUS_DIR):
        folder = run_dir / name
        if not folder.exists():
            problems.append(f"{folder} does not exist")
            continue
        try:
            manifest, saved_config = _verified(folder)
        except DamagedState as err:
            problems.append(str(err))
            continue
        if problems and (run_dir / STATE_DIR).exists():
            print(f"[fedagent] {problems[0]}; resuming from {folder} (round {manifest['server_round']}) instead",
                  flush=True)
        return _read(folder), current_keys(saved_config)  # a run saved before the renames: its keys as named now
    if not any((run_dir / name).exists() for name in (STATE_DIR, PREVIOUS_DIR)):
        raise ValueError(f"resume=true but {run_dir} holds no saved state (expected {run_dir / STATE_DIR}); "
                         "start the run without resume, or set run-name to the run to continue")
    raise ValueError("resume=true but no saved state of " + str(run_dir) + " is usable: " + "; ".join(problems))


def check_resumable_config(saved: dict[str, Any], config: dict[str, Any], ignore: Iterable[str] = ()) -> None:
    """ValueError naming every key that differs from the saved run's config (beyond RESUMABLE_CHANGES)."""
    defaults = RunConfig().to_run_config()
    skip = set(RESUMABLE_CHANGES) | set(ignore)
    changed = sorted(k for k in set(saved) | set(config)
                     if k not in skip and saved.get(k) != config.get(k)
                     # a key added to the code since the run was saved, left at its default, changes nothing
                     and not (k not in saved and k in defaults and config.get(k) == defaults[k]))
    if changed:
        diffs = ", ".join(f"{k}: saved {saved.get(k)!r} vs now {config.get(k)!r}" for k in changed)
        raise ValueError(f"resume=true: the run config differs from the saved run's ({diffs}); only "
                         f"{', '.join(RESUMABLE_CHANGES)} may change when resuming")


def load_state(run_dir: Path, config: dict[str, Any]) -> ServerState:
    """The last usable state of `run_dir`; ValueError if there is none or the config changed."""
    state, saved = read_state(run_dir)
    check_resumable_config(saved, config)
    return state


def saved_round(run_dir: Path) -> int | None:
    """The round of the last complete state in `run_dir`, or None (for monitoring a run from outside)."""
    for name in (STATE_DIR, PREVIOUS_DIR):
        try:
            return int(json.loads((run_dir / name / MANIFEST).read_text())["server_round"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return None


def restore(state: ServerState, strategy: Strategy) -> None:
    load_strategy_state(strategy, state.strategy)
    _set_rng_states(state.rng)


class ResumedStrategy(Strategy):
    """Runs `inner` from round `offset` + 1 on: Flower's start() counts rounds from 1, the clients must not.

    Flower's own loop (Strategy.start) is kept; only the round numbers the inner
    strategy and evaluate_fn see are shifted, and round 0's evaluation (done
    before the interruption) is skipped.
    """

    def __init__(self, inner: Strategy, offset: int) -> None:
        self.inner, self.offset = inner, offset

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid) -> Iterable[Message]:
        return self.inner.configure_train(server_round + self.offset, arrays, config, grid)

    def aggregate_train(self, server_round: int, replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        return self.inner.aggregate_train(server_round + self.offset, replies)

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid) -> Iterable[Message]:
        return self.inner.configure_evaluate(server_round + self.offset, arrays, config, grid)

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        return self.inner.aggregate_evaluate(server_round + self.offset, replies)

    def summary(self) -> None:
        self.inner.summary()

    def start(self, *, num_rounds: int, evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None,
              **kwargs):
        def shifted(server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
            return None if server_round == 0 else evaluate_fn(server_round + self.offset, arrays)

        return super().start(num_rounds=num_rounds - self.offset, evaluate_fn=shifted if evaluate_fn else None, **kwargs)


def resumable(strategy: Strategy, offset: int) -> Strategy:
    """The strategy to start: itself for a fresh run, shifted by `offset` rounds for a resumed one."""
    return ResumedStrategy(strategy, offset) if offset else strategy
