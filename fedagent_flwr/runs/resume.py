"""Checkpoint and resume of the server: the run's full state after every round, written atomically.

`<run folder>/state/` holds one complete state, replaced after every round:

  arrays.npz   the global arrays after round r (bit-exact, any dtype numpy has)
  server.pkl   round r, the strategy's state (client-sampling RNG, sampled
               clients, failures, per-round metrics, ...), the server's torch /
               numpy / random RNG states, the metric rows and evaluation history
  config.json  the run config the state belongs to

A new state is written to a temporary folder and swapped in with renames, so a
run killed at any moment leaves either the previous or the new state, never a
mix. `resume=true` (with the same run-name) loads it and continues with round
r + 1: same round numbers (clients seed their rollouts by round), same sampling
RNG, same weights, so the rest of the run is what it would have been.

Clients of FedAgentAvg keep no state between rounds (they start every round
from the global weights with a fresh optimizer, seeded by seed, round and
partition), so the server's state is the whole federation's state. The
strategy's state is pickled: the file is written and read by the same server,
inside its own run folder.
"""

from __future__ import annotations

import json
import os
import pickle
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

from fedagent_flwr.config import RunConfig
from strategies.transfer import array_view

STATE_DIR = "state"
# Keys that may change when a run is resumed; any other difference is an error.
RESUMABLE_CHANGES = ("num-server-rounds", "resume", "round-timeout", "fault-injection")
# Strategy attributes that belong to this run's federation, not to the training state:
# node ids are new after a restart, the global arrays come from arrays.npz, and
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
    return {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "random": random.getstate()}


def _set_rng_states(states: dict[str, Any]) -> None:
    torch.set_rng_state(states["torch"])
    np.random.set_state(states["numpy"])
    random.setstate(states["random"])


def save_state(run_dir: Path, config: dict[str, Any], server_round: int, arrays: ArrayRecord, strategy: Strategy,
               rows: list[dict[str, Any]], history: dict[int, dict[str, float]]) -> Path:
    """Replace `<run_dir>/state` by the state after `server_round`, atomically."""
    final = run_dir / STATE_DIR
    tmp = Path(tempfile.mkdtemp(prefix=".state-", dir=run_dir))
    np.savez(tmp / "arrays.npz", **{k: array_view(arrays[k]) for k in arrays.keys()})  # views: no second copy in memory
    payload = {"server_round": server_round, "strategy": strategy_state(strategy), "rows": rows, "history": history,
               "rng": _rng_states()}
    with open(tmp / "server.pkl", "wb") as f:
        pickle.dump(payload, f, protocol=pickle.HIGHEST_PROTOCOL)
        f.flush()
        os.fsync(f.fileno())
    (tmp / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
    # Swap: the old state moves aside before the new one takes its name, so one of
    # the two is always complete; load_state falls back to the aside copy.
    old = run_dir / ".state-old"
    if old.exists():
        shutil.rmtree(old)
    if final.exists():
        os.replace(final, old)
    os.replace(tmp, final)
    if old.exists():
        shutil.rmtree(old)
    return final


def load_state(run_dir: Path, config: dict[str, Any]) -> ServerState:
    """The last complete state of `run_dir`; ValueError if there is none or the config changed."""
    folder = run_dir / STATE_DIR
    if not (folder / "server.pkl").exists() and (run_dir / ".state-old" / "server.pkl").exists():
        folder = run_dir / ".state-old"  # killed between the two renames of save_state
    if not (folder / "server.pkl").exists():
        raise ValueError(f"resume=true but {run_dir} holds no saved state (expected {run_dir / STATE_DIR}); "
                         "start the run without resume, or set run-name to the run to continue")
    saved = json.loads((folder / "config.json").read_text())
    defaults = RunConfig().to_run_config()
    changed = sorted(k for k in set(saved) | set(config)
                     if k not in RESUMABLE_CHANGES and saved.get(k) != config.get(k)
                     # a key added to the code since the run was saved, left at its default, changes nothing
                     and not (k not in saved and k in defaults and config.get(k) == defaults[k]))
    if changed:
        diffs = ", ".join(f"{k}: saved {saved.get(k)!r} vs now {config.get(k)!r}" for k in changed)
        raise ValueError(f"resume=true: the run config differs from the saved run's ({diffs}); only "
                         f"{', '.join(RESUMABLE_CHANGES)} may change when resuming")
    with open(folder / "server.pkl", "rb") as f:
        payload = pickle.load(f)
    with np.load(folder / "arrays.npz") as npz:
        arrays = ArrayRecord({k: Array(np.ascontiguousarray(npz[k])) for k in npz.files})
    return ServerState(payload["server_round"], arrays, payload["strategy"], payload["rows"], payload["history"],
                       payload["rng"])


def saved_round(run_dir: Path) -> int | None:
    """The round of the last complete state in `run_dir`, or None (for monitoring a run from outside)."""
    for folder in (run_dir / STATE_DIR, run_dir / ".state-old"):
        try:
            with open(folder / "server.pkl", "rb") as f:
                return int(pickle.load(f)["server_round"])
        except (OSError, EOFError, pickle.UnpicklingError, KeyError):
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
