"""The syntax of run-config `resilience.fault-injection` and the plan it parses to: which clients fail on purpose, and how
(fedagent_flwr/faults.py injects the faults; its docstring gives the syntax)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

FAULT_KINDS = ("raise", "timeout", "malformed", "nan")
FAULT_SYNTAX = "empty, or <kind>[+<kind>...]:partition=<k> or <kind>[+<kind>...]:prob=<q> with kinds " + " | ".join(FAULT_KINDS)


@dataclass(frozen=True)
class FaultPlan:
    kinds: tuple[str, ...]
    partition: int | None = None  # exactly one of partition / prob is set
    prob: float | None = None

    @classmethod
    def parse(cls, spec: str) -> FaultPlan | None:
        """None for an empty spec; ValueError naming the key and the syntax for a bad one."""
        spec = spec.strip()
        if not spec:
            return None
        bad = ValueError(f"resilience.fault-injection={spec!r} is not allowed: expected {FAULT_SYNTAX}")
        kinds_part, sep, target = spec.partition(":")
        kinds = tuple(k.strip() for k in kinds_part.split("+"))
        if not sep or not all(k in FAULT_KINDS for k in kinds):
            raise bad
        name, eq, value = target.partition("=")
        try:
            if eq and name.strip() == "partition" and int(value) >= 0:
                return cls(kinds, partition=int(value))
            if eq and name.strip() == "prob" and 0.0 <= float(value) <= 1.0:
                return cls(kinds, prob=float(value))
        except ValueError:
            pass
        raise bad

    def fault_for(self, seed: int, server_round: int, partition_id: int) -> str | None:
        """The fault this client injects this round, or None."""
        if self.partition is not None:
            hit = partition_id == self.partition
        else:  # a draw of its own, so the rollouts' RNG streams are the same with and without injection
            u = np.random.default_rng([abs(seed), server_round, partition_id, 0xFA17]).random()
            hit = u < self.prob
        return self.kinds[(server_round - 1) % len(self.kinds)] if hit else None
