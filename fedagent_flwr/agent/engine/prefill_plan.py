"""Which prompt tokens a batched prefill computes once for several prompts: the static engine's prefix sharing.

Why: a rollout batch's prompts repeat themselves. Every prompt opens with the same instructions, and the G
episodes of a GRPO group also share their task's text, which only their histories follow. In the WebShop round
of `benchmarks/gpu_round.py` (tiny shape, history 2, 16 new tokens a step; docs/gpu-measurements.md) the group prefixes held
45 % of the distinct prompts' tokens, and a prefill that computes each group's prefix once and every prompt's own
suffix on top of it computed 38 % fewer positions than one of whole prompts.

A plan puts each distinct prompt in at most one group; a group's prefix is the longest prefix all its members
share, always leaving each member at least one token of its own (the second pass gives the next-token logits).
The KV cache keeps the layout of a prefill of whole prompts (each row's prompt left-padded to the longest), so
the token steps read what they read before: the prefix pass writes a group's keys and values into the columns
its prefix takes in each member's row, and the second pass writes the rest of each prompt after them, attending
to the prefix there (agent/engine/decode.py).

The cost a plan is judged by is what the two passes compute, padding included (a padded position costs what a
real one does): groups x the longest prefix + prompts x the longest suffix. Sorted, prompts with common prefixes
stand side by side, and each run of neighbours sharing at least t tokens is a candidate group; every t that some
neighbours share gives a plan (a small t: few groups with short prefixes; a large one: many with long ones), and
the cheapest is taken, or none where prefilling every prompt whole costs no more.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

# Below this many tokens a prefix is not worth a pass (the hf engine's threshold for its shared prefix).
MIN_SHARED = 8


@dataclass(frozen=True)
class PrefillPlan:
    """`prefixes[g]`: group g's shared tokens; `group_of[j]`: prompt j's group, or -1 when it is prefilled whole."""

    prompts: tuple[tuple[int, ...], ...]
    prefixes: tuple[tuple[int, ...], ...]
    group_of: tuple[int, ...]

    @classmethod
    def whole(cls, prompts: Sequence[Sequence[int]]) -> "PrefillPlan":
        """Every prompt prefilled whole, in one pass."""
        prompts = tuple(tuple(p) for p in prompts)
        return cls(prompts, (), (-1,) * len(prompts))

    def shared(self, j: int) -> int:
        """How many of prompt j's first tokens come from its group's prefix pass."""
        g = self.group_of[j]
        return len(self.prefixes[g]) if g >= 0 else 0

    @property
    def prefix_width(self) -> int:
        return max((len(p) for p in self.prefixes), default=0)

    @property
    def suffix_width(self) -> int:
        return max(len(p) - self.shared(j) for j, p in enumerate(self.prompts))

    @property
    def cost(self) -> int:
        """Positions the two passes compute, padding included."""
        return len(self.prefixes) * self.prefix_width + len(self.prompts) * self.suffix_width


def _common(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def _cut(prompts: tuple, order: list[int], shared: list[int], at_least: int) -> PrefillPlan:
    """The plan that cuts the sorted prompts wherever neighbours share fewer than `at_least` tokens: a run of two
    or more is a group with the prefix all its members share; the prompts left alone form one group with theirs
    (if that is at least MIN_SHARED tokens; else they are prefilled whole)."""
    runs, lengths = [[order[0]]], [0]
    for j, s in zip(order[1:], shared):
        if s >= at_least:
            lengths[-1] = s if len(runs[-1]) == 1 else min(lengths[-1], s)
            runs[-1].append(j)
        else:
            runs.append([j])
            lengths.append(0)
    groups = [(r, k) for r, k in zip(runs, lengths) if len(r) > 1]
    alone = [r[0] for r in runs if len(r) == 1]
    if len(alone) > 1:  # sorted, so what the first and last share, all share
        first, last = prompts[alone[0]], prompts[alone[-1]]
        groups.append((alone, min(_common(first, last), min(len(prompts[j]) for j in alone) - 1)))
    group_of = [-1] * len(prompts)
    prefixes: list[tuple[int, ...]] = []
    for members, length in groups:
        if length < MIN_SHARED:
            continue
        for j in members:
            group_of[j] = len(prefixes)
        prefixes.append(prompts[members[0]][:length])
    return PrefillPlan(prompts, tuple(prefixes), tuple(group_of))


def plan_prefill(prompts: Sequence[Sequence[int]]) -> PrefillPlan:
    """The cheapest plan (module docstring) for these distinct, non-empty prompts."""
    best = PrefillPlan.whole(prompts)
    prompts = best.prompts
    if len(prompts) < 2:
        return best
    order = sorted(range(len(prompts)), key=lambda j: prompts[j])  # prompts with common prefixes side by side
    # what each prompt shares with its neighbour in that order, each keeping a token of its own
    shared = [min(_common(prompts[a], prompts[b]), len(prompts[a]) - 1, len(prompts[b]) - 1)
              for a, b in zip(order, order[1:])]
    for at_least in sorted({s for s in shared if s >= MIN_SHARED}):
        plan = _cut(prompts, order, shared, at_least)
        if plan.cost < best.cost:
            best = plan
    return best
