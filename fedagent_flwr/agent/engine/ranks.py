"""One client's passes shared by N ranks (torch.distributed, the model under FSDP2's fully_shard).

Every rank holds every sample; each computes a stride of them (rank::world), and FSDP2 averages the gradients over
the ranks. For the result to be one rank's over the whole batch: the loss a rank backpropagates is its share of the
whole minibatch's loss times the world size (the averaging divides it back), and every rank runs as many forward
passes as the others (each forward gathers the weights: a rank that stopped early would leave the others waiting),
so a rank short of passes runs spare ones whose loss counts zero.

Without a process group this is one rank of one, and nothing changes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Ranks:
    rank: int = 0
    world: int = 1

    @classmethod
    def current(cls) -> Ranks:
        """This process's rank and the world size where a process group is up; else one rank."""
        if dist.is_available() and dist.is_initialized():
            return cls(dist.get_rank(), dist.get_world_size())
        return cls()

    def share(self, items: Sequence) -> list:
        """This rank's stride of `items` (all of them on one rank)."""
        return list(items[self.rank :: self.world])

    def most(self, count: int) -> int:
        """The largest `count` any rank has."""
        if self.world == 1:
            return count
        value = torch.tensor([count])
        dist.all_reduce(value, op=dist.ReduceOp.MAX)
        return int(value)

    def gather(self, mine: dict) -> dict:
        """Every rank's dict merged (keys are disjoint across ranks), on every rank."""
        if self.world == 1:
            return dict(mine)
        everyone: list[dict | None] = [None] * self.world
        dist.all_gather_object(everyone, mine)
        return {k: v for part in everyone for k, v in part.items()}

    def total(self, value: float) -> float:
        """The sum of `value` over the ranks."""
        if self.world == 1:
            return value
        t = torch.tensor([value], dtype=torch.float64)
        dist.all_reduce(t)
        return float(t)
