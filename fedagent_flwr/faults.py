"""Fault injection: make chosen clients fail on purpose, to test that rounds survive it.

Run-config `resilience.fault-injection` (empty = off) is `<kinds>:<target>`:

  kinds   one of raise | timeout | malformed | nan, or several joined by `+`,
          used in turn by round (round r uses kinds[(r - 1) % len(kinds)])
  target  partition=<k>   partition k fails in every round it is sampled
          prob=<q>        each sampled client fails with probability q, drawn
                          from (seed, round, partition-id) so reruns fail alike

  raise      the ClientApp raises: the reply is an error message
  timeout    the ClientApp sleeps federation.round-timeout + 30 s first: its reply is late
  malformed  the reply's arrays miss one tensor and carry one of the wrong shape
  nan        the reply's arrays are NaN

e.g. `resilience.fault-injection="raise+malformed+nan:partition=0"`. The injection sits in
the ClientApp only; the server treats these replies like real failures.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
from flwr.app import Array, ArrayRecord, Context, Message

from fedagent_flwr.config.fault_plan import FaultPlan

TIMEOUT_GRACE_S = 30.0


class InjectedFault(RuntimeError):
    """Raised by a client on purpose (resilience.fault-injection=raise:...)."""


def before_training(kind: str | None, round_timeout: float) -> None:
    """Raise or stall as the fault asks; nothing for the faults that corrupt the reply."""
    if kind == "raise":
        raise InjectedFault("resilience.fault-injection: this client raises on purpose")
    if kind == "timeout":
        time.sleep(round_timeout + TIMEOUT_GRACE_S)


def corrupt_reply(kind: str | None, arrays: ArrayRecord) -> ArrayRecord:
    """The reply's arrays as the fault leaves them (unchanged without a corrupting fault)."""
    if kind not in ("malformed", "nan"):
        return arrays
    keys = list(arrays.keys())
    out = ArrayRecord()
    for i, key in enumerate(keys):
        a = arrays[key].numpy()
        if kind == "nan" and a.dtype.kind == "f":
            a = np.full_like(a, np.nan)
        elif kind == "malformed" and i == 0:
            continue  # one tensor missing
        elif kind == "malformed" and i == 1:
            a = np.zeros(a.shape + (2,), dtype=a.dtype)  # one of the wrong shape
        out[key] = Array(np.ascontiguousarray(a))
    return out


def train_with_faults(handler: Callable[[Message, Context], Message], msg: Message, context: Context,
                      plan: FaultPlan | None, seed: int, round_timeout: float) -> Message:
    """Run a ClientApp train handler with run-config `resilience.fault-injection` in effect (`plan` None: just the handler)."""
    config = msg.content.config_records.get("config")
    if plan is None or config is None or "server-round" not in config:
        return handler(msg, context)
    partition_id = int(context.node_config["partition-id"])
    kind = plan.fault_for(seed, int(config["server-round"]), partition_id)
    before_training(kind, round_timeout)
    reply = handler(msg, context)
    if kind in ("malformed", "nan") and not reply.has_error():
        for name in list(reply.content.array_records):
            reply.content[name] = corrupt_reply(kind, reply.content.array_records[name])
    return reply
