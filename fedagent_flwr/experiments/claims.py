"""The verdict table of the README and of docs/results.md's opening, each row recomputed from its run records
(benchmarks/results/) and written between the pages' markers by `python scripts/write_docs.py`; tests/records regenerates both and fails on any
difference.

A claim names its records and how its effect is computed (experiments/paired_rounds.py: a run's last evaluation
minus its first, paired over the held-out rooms; or two methods' last evaluations, paired over seeds), and its
verdict follows from the tests: "holds" where the effect is positive with p < 0.05 (in every run, for per-run claims),
"below it" where negative with p < 0.05, else "not shown".
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from fedagent_flwr.experiments.doc_blocks import Block, Figure
from fedagent_flwr.experiments.paired_rounds import compare, evaluation_rounds, over_seeds, success_rounds
from fedagent_flwr.experiments.matched_table1 import OPPOSITE, held_categories, on_rooms

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
README = ROOT / "README.md"
ALPHA = 0.05


def runs(*names: str) -> list[Path]:
    return [RESULTS / name for name in names]


FEDAGENT_AMD = runs("2026-12-02-cpu/runs/fedagent-preset-s0", "2026-12-01-cpu/runs/fedagent-preset-s1",
                    "2026-12-01-cpu/runs/fedagent-preset-s2")
FEDAGENT_AMX = runs("2026-12-04-cpu/runs/fedagent-preset-s0-amx")
FEDSE = runs(*(f"2026-12-06-cpu/runs/fedse-eager-s{s}-amd" for s in (0, 1, 2)))
GIGPO = runs("2026-12-02-cpu/runs/gigpo-s0", "2026-12-01-cpu/runs/gigpo-s1", "2026-12-01-cpu/runs/gigpo-s2")
UNIFORM_FED = runs("2026-12-01-cpu/runs/fedagent-preset-s1", "2026-12-01-cpu/runs/fedagent-preset-s2")
UNIFORM_LOCAL = runs("2026-12-01-cpu/runs/local1-s1", "2026-12-01-cpu/runs/local1-s2")
UNIFORM_CENTRAL = runs("2026-12-01-cpu/runs/central-s1", "2026-12-01-cpu/runs/central-s2")


# Issue 93: the FedAgentAvg preset with its frozen base in fp32 against bf16-base, the same seeds on one AMD EPYC.
PRECISION_FP32 = runs("2026-12-07-cpu/runs/fedagent-fp32-s0-amd", "2026-12-08-amd-epyc-avx512bf16/runs/fedagent-fp32-s1-amd",
                      "2026-12-07-cpu/runs/fedagent-fp32-s2-amd")
PRECISION_BF16 = runs("2026-12-07-cpu/runs/fedagent-bf16-s0-amd", "2026-12-07-cpu/runs/fedagent-bf16-s1-amd",
                      "2026-12-05-cpu/runs/fedagent-preset-s2-amd")


def directions(arm: str) -> list[Path]:
    return runs(*(f"2026-12-04-cpu/table1-directions/runs/table1-{arm}-s{s}" for s in (0, 1, 2)))


# ------------------------------------------------------------------ effects


def _last(run: Path) -> float:
    s = success_rounds(run)
    return s[max(s)]


def gain_per_run(run: Path) -> dict:
    """A run's last evaluation minus its first, paired over the held-out rooms."""
    rounds = evaluation_rounds(run)
    return compare(run, rounds[-1], rounds[0])


def gains_over_seeds(arm: list[Path]) -> dict:
    """Each run's last held-out success against its first, one pair a seed."""
    pairs = []
    for run in arm:
        s = success_rounds(run)
        pairs.append((s[max(s)], s[min(s)]))
    return over_seeds(pairs)


def difference_over_seeds(first: list[Path], second: list[Path]) -> dict:
    """first's last held-out success minus second's, one pair a seed."""
    return over_seeds([(_last(a), _last(b)) for a, b in zip(first, second, strict=True)])


def unseen_change_over_seeds(locals_: list[Path], fed: list[Path]) -> dict:
    """A Local's last success minus the base model's (its seed's first evaluation) on the rooms of the directions its
    client does not hold."""
    pairs = []
    for local, f in zip(locals_, fed, strict=True):
        unseen = set(OPPOSITE) - held_categories(local)
        first = evaluation_rounds(f)[0]
        pairs.append((on_rooms(local, unseen), on_rooms(f, unseen, first)))
    return over_seeds(pairs)


# ------------------------------------------------------------------ cells


def pm(d: dict) -> str:
    return f"{d['mean']:+.3f} ± {d['se']:.3f}"


def verdict(tests: list[dict]) -> str:
    if all(t["mean"] > 0 and t["p"] < ALPHA for t in tests):
        return "holds" if len(tests) == 1 else "holds in every run"
    if len(tests) == 1 and tests[0]["mean"] < 0 and tests[0]["p"] < ALPHA:
        return "below it"
    return "not shown"


@dataclass(frozen=True)
class Claim:
    text: str
    cells: Callable[[], tuple[str, str]]  # (effect, verdict) from the records
    records: tuple[Path, ...] = ()  # every run folder the cells read
    in_readme: bool = True  # the README's table keeps the claims a newcomer weighs; docs/results.md has them all


def _per_run() -> tuple[str, str]:
    amd, amx = [gain_per_run(r) for r in FEDAGENT_AMD], [gain_per_run(r) for r in FEDAGENT_AMX]
    effect = (", ".join(f"{t['mean']:+.3f}" for t in amd) + " (" + ", ".join(f"{t['mean'] / t['se']:.2f}" for t in amd)
              + " SE); " + ", ".join(f"{t['mean']:+.3f}" for t in amx))
    return effect, verdict(amd + amx)


def _fedse() -> tuple[str, str]:
    tests = [gain_per_run(r) for r in FEDSE]
    return (", ".join(f"{t['mean']:+.3f}" for t in tests) + " (" + ", ".join(f"{t['mean'] / t['se']:.2f}" for t in tests)
            + " SE)"), verdict(tests).replace("every run", "every seed")


def _pair(*tests: dict, extra: str = "") -> tuple[str, str]:
    verdicts = {verdict([t]) for t in tests}
    return "; ".join(pm(t) for t in tests) + extra, verdicts.pop() if len(verdicts) == 1 else "mixed"


CLAIMS = [
    Claim("the FedAgentAvg preset gains, seeds 0-2 on an AMD EPYC; seed 0 on a Xeon with AMX", _per_run,
          (*FEDAGENT_AMD, *FEDAGENT_AMX)),
    Claim("the Fed-SE preset gains, seeds 0-2", _fedse, tuple(FEDSE)),
    Claim("Fed-SE above FedAgentAvg; GiGPO above GRPO",
          lambda: _pair(difference_over_seeds(FEDSE, FEDAGENT_AMD), difference_over_seeds(GIGPO, FEDAGENT_AMD)),
          (*FEDSE, *GIGPO, *FEDAGENT_AMD)),
    Claim("FedAgentAvg above Local(1) and Centralized, uniform split, seeds 1-2",
          lambda: _pair(difference_over_seeds(UNIFORM_FED, UNIFORM_LOCAL), difference_over_seeds(UNIFORM_FED, UNIFORM_CENTRAL)),
          (*UNIFORM_FED, *UNIFORM_LOCAL, *UNIFORM_CENTRAL)),
    Claim("one goal direction a client (`configs/smollm2-fedagent-directions-cpu.toml`, seeds 0-2): FedAgentAvg gains",
          lambda: _pair(gains_over_seeds(directions("fedagent"))), tuple(directions("fedagent"))),
    Claim("there, FedAgentAvg above each Local; above Centralized",
          lambda: _pair(difference_over_seeds(directions("fedagent"), directions("local0")),
                        difference_over_seeds(directions("fedagent"), directions("local1")),
                        difference_over_seeds(directions("fedagent"), directions("centralized"))),
          tuple(directions("fedagent") + directions("local0") + directions("local1") + directions("centralized"))),
    Claim("there, FedAgentAvg minus a Local given the federation's episodes (budgets unequal: issue 95)",
          lambda: _pair(t := difference_over_seeds(directions("fedagent"), directions("local0-matched")),
                        extra=f" (p {t['p']:.2g})"), tuple(directions("fedagent") + directions("local0-matched"))),
    Claim("there, each Local on the directions it never saw, minus the base model",
          lambda: _pair(unseen_change_over_seeds(directions("local0"), directions("fedagent")),
                        unseen_change_over_seeds(directions("local1"), directions("fedagent"))),
          tuple(directions("local0") + directions("local1") + directions("fedagent"))),
    Claim("the FedAgentAvg preset with its base in fp32 above bf16-base, seeds 0-2 on an AMD EPYC",
          lambda: _pair(t := difference_over_seeds(PRECISION_FP32, PRECISION_BF16), extra=f" (p {t['p']:.2g})"),
          (*PRECISION_FP32, *PRECISION_BF16), in_readme=False),
]


RESULTS_MD = ROOT / "docs" / "results.md"


def table(with_records: bool = False) -> list[str]:
    """The claims as a Markdown table; `with_records`: a column linking each run folder read (docs/results.md's)."""
    lines = ["| claim (held-out success after round 3) | effect | verdict |" + (" records |" if with_records else ""),
             "| --- | --- | --- |" + (" --- |" if with_records else "")]
    for claim in (c for c in CLAIMS if with_records or c.in_readme):
        effect, said = claim.cells()
        links = ", ".join(f"[{r.parent.parent.name}/{r.name}](../{r.relative_to(ROOT).as_posix()})" for r in claim.records)
        lines.append(f"| {claim.text} | {effect} | {said} |" + (f" {links} |" if with_records else ""))
    return lines


def precision_sentence() -> str:
    """docs/performance.md's word on issue 93: fp32 against bf16-base over the seeds, and the verdict."""
    t = difference_over_seeds(PRECISION_FP32, PRECISION_BF16)
    return f"{pm(t)} (p {t['p']:.2g}, seeds 0-2): {verdict([t])}"


def doc_parts() -> list[Block | Figure]:
    """The verdict table of the README and, with its records linked, of docs/results.md; the precision figure of
    docs/performance.md (scripts/write_docs.py)."""
    return [Block("README.md", "claims", tuple(table())),
            Block("docs/results.md", "claims", tuple(table(with_records=True))),
            Figure("docs/performance.md", "precision-fp32-minus-bf16", precision_sentence())]


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args(argv)
    print("\n".join(table()))  # written into the pages by scripts/write_docs.py
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
