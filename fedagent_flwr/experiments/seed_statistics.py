"""Summaries over seeds for the protocol tables: each method's mean ± standard error, and the paired
comparison behind every ordering a table claims.

Two methods run with the same seeds share the seed's partition, task draws and evaluation seed, so their
per-seed difference is what to test: a paired t-test (scipy.stats.ttest_rel), and the mean difference with
its standard error and 95% t-interval. An ordering is reported as holding only when the difference has the
claimed sign and p < ALPHA; otherwise the verdict says "not shown", whatever the means say.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
from scipy import stats as scipy_stats

ALPHA = 0.05


def success_by_task(outcomes) -> dict[str, float]:
    """Each task's success rate from (task id, won) pairs: the unit a paired test over tasks pairs up."""
    wins: dict[str, list[bool]] = {}
    for task, won in outcomes:
        wins.setdefault(task, []).append(bool(won))
    return {task: sum(w) / len(w) for task, w in wins.items()}


def paired_difference(a: Mapping[int, float], b: Mapping[int, float]) -> dict[str, Any]:
    """a - b over the seeds both have: mean, standard error, 95% interval, two-sided paired t-test p-value."""
    seeds = sorted(a.keys() & b.keys())
    diff = np.array([a[s] - b[s] for s in seeds], dtype=float)
    n = len(diff)
    out: dict[str, Any] = {"seeds": seeds, "n": n, "mean": float(diff.mean()) if n else math.nan,
                           "se": math.nan, "ci95": [math.nan, math.nan], "p": math.nan}
    if n < 2:
        return out
    se = float(diff.std(ddof=1) / math.sqrt(n))
    half = float(scipy_stats.t.ppf(0.975, n - 1)) * se
    out.update(se=se, ci95=[out["mean"] - half, out["mean"] + half])
    # Identical differences in every seed leave the t statistic undefined: no spread, so nothing to test.
    if not no_spread(se, out["mean"]):
        out["p"] = float(scipy_stats.ttest_rel([a[s] for s in seeds], [b[s] for s in seeds]).pvalue)
    else:
        out["p"] = 0.0 if out["mean"] != 0 else 1.0
    return out


def no_spread(se: float, mean: float) -> bool:
    """The same difference in every seed (to rounding): a t-test has nothing to weigh it against."""
    return se <= 1e-12 * max(1.0, abs(mean))


def ordering(better: str, worse: str, comparison: Mapping[str, Any]) -> str:
    """One line: does `better` beat `worse`? "holds" only for a positive difference with p < ALPHA, tested against
    its spread over seeds."""
    mean, se, p, n = comparison["mean"], comparison["se"], comparison["p"], comparison["n"]
    if n < 2:  # no spread over seeds to test against: say so rather than print a test of nothing
        return f"{better} above {worse}: not shown (difference {100 * mean:+.1f} points in {n} seed; no test over seeds)"
    if no_spread(se, mean):  # with few seeds of a discrete success rate, a coincidence, not a certainty
        return (f"{better} above {worse}: not shown (difference {100 * mean:+.1f} points in each of {n} seeds: no "
                "spread over seeds to test it against)")
    holds = mean > 0 and p < ALPHA
    return (f"{better} above {worse}: {'holds' if holds else 'not shown'} (difference {100 * mean:+.1f} ± "
            f"{100 * se:.1f} points, paired t-test p = {p:.3f}, {n} seeds)")


def stats(values: list[float]) -> dict[str, Any]:
    """Mean, standard deviation and standard error (over seeds) of one table cell, with the values themselves."""
    arr = np.asarray(values, dtype=float)
    std = float(arr.std(ddof=1)) if len(arr) > 1 else math.nan
    return {"mean": float(arr.mean()), "std": std, "se": std / math.sqrt(len(arr)) if len(arr) > 1 else math.nan,
            "n": len(arr), "values": [float(v) for v in arr]}


def cell(s: dict[str, Any]) -> str:
    """A table cell in percent: "57.4 ± 3.7" (the mean alone for a single seed)."""
    return f"{100 * s['mean']:.1f} ± {100 * s['se']:.1f}" if s["n"] > 1 else f"{100 * s['mean']:.1f}"
