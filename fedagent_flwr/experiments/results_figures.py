"""The real-model tables and figures of docs/results.md and docs/notes/results-directions.md, each recomputed from the
run records it names (benchmarks/results/<day>/runs/<run>, the scripts/keep_run_records.py layout) and written between
the pages' markers by `python scripts/write_docs.py`; tests/records regenerates them and fails on any difference.

A table is a list of rows, each naming its records; a row's numbers are the paired tests of experiments/paired_rounds.py
as claims.py computes them (a run's last evaluation minus its first, paired over the held-out rooms; two runs' last
evaluations, paired over the rooms; either over seeds), or a run's summary.json and protocols.spent. The figures are
the numbers the prose around the tables quotes, from the same functions.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from fedagent_flwr.experiments.claims import (FEDAGENT_AMD, FEDSE, GIGPO, RESULTS, difference_over_seeds,
                                              gain_per_run, gains_over_seeds, runs)
from fedagent_flwr.experiments.doc_blocks import Block, Figure
from fedagent_flwr.experiments.paired_rounds import compare_runs, evaluation_rounds, run_seed, success_rounds
from fedagent_flwr.experiments.protocols import category_tests, spent

PAGE = "docs/results.md"
NOTE = "docs/notes/results-directions.md"
DIRECTIONS = ("north-east", "north-west", "south-east", "south-west")
ROOMS = 48  # the held-out rooms every evaluation plays (3 times each)


# ------------------------------------------------------------------ rows


@dataclass(frozen=True)
class Gain:
    """One run's gain (last evaluation minus first, paired over its rooms), or over seeds where several runs."""
    seed: str
    label: str
    runs: tuple[Path, ...]


@dataclass(frozen=True)
class Difference:
    """first's last evaluation minus second's, paired over the rooms (one run each) or over seeds (one run a seed)."""
    seed: str
    label: str
    first: tuple[Path, ...]
    second: tuple[Path, ...]


@dataclass(frozen=True)
class ByDirection:
    """first minus second over the held-out rooms of one goal direction (protocols.category_tests)."""
    seed: str
    label: str
    direction: str
    first: Path
    second: Path


@dataclass(frozen=True)
class Categories:
    """Held-out success (%) by goal direction after the last round (the base model's: before round 1), with what the
    run spent in training."""
    method: str
    seed: str
    run: Path
    base: bool = False


def _pm(d: dict) -> str:
    return f"{d['mean']:+.3f} ± {d['se']:.3f}"


def minutes(run: Path) -> str:
    return f"{json.loads((run / 'summary.json').read_text())['seconds'] / 60:.1f}"


def _last(run: Path) -> int:
    return evaluation_rounds(run)[-1]


def difference(first: Path, second: Path) -> dict:
    """One seed's two runs, last evaluation against last evaluation, room by room."""
    return compare_runs(first, second, _last(first), _last(second))


def _links(group: tuple[Path, ...], page: str) -> str:
    up = "../" * page.count("/")
    return ", ".join(f"[{r.relative_to(RESULTS).as_posix()}]({up}{r.relative_to(RESULTS.parents[1]).as_posix()})"
                     for r in group)


def _rooms(t: dict) -> dict:
    """t, refused unless paired over the 48 held-out rooms the tables' headers name."""
    if t["n"] != ROOMS:
        raise ValueError(f"paired over {t['n']} rooms, the table says {ROOMS}")
    return t


def _cells(row, page: str) -> list[str]:
    if isinstance(row, Gain):
        if len(row.runs) == 1:
            (run,) = row.runs
            t = _rooms(gain_per_run(run))
            return [row.seed, row.label, f"{t['earlier_success']:.3f} -> {t['later_success']:.3f}", _pm(t),
                    f"{t['mean'] / t['se']:.2f}", f"{t['p']:.2g}", minutes(run), _links(row.runs, page)]
        t = gains_over_seeds(list(row.runs))
        return [row.seed, row.label, "", _pm(t), "", f"{t['p']:.2g}", "", _links(row.runs, page)]
    if isinstance(row, Difference):
        t = (_rooms(difference(row.first[0], row.second[0])) if len(row.first) == 1
             else difference_over_seeds(list(row.first), list(row.second)))
        return [row.seed, row.label, _pm(t), f"{t['p']:.2g}",
                _links(row.first, page) + "; " + _links(row.second, page)]
    if isinstance(row, ByDirection):
        t = category_tests(row.first, row.second)[row.direction]
        return [row.seed, row.label, row.direction, f"{t['n']}", _pm(t), f"{t['p']:.2g}",
                _links((row.first,), page) + "; " + _links((row.second,), page)]
    summary = json.loads((row.run / "summary.json").read_text())
    success = summary["initial" if row.base else "final"]
    used = {"episodes": 0.0, "optimizer_steps": 0.0} if row.base else spent(row.run)
    return [row.method, row.seed, *(f"{100 * success[f'success_rate/{d}']:.1f}" for d in DIRECTIONS),
            f"{100 * success['success_rate']:.1f}", f"{used['episodes']:.0f}", f"{used['optimizer_steps']:.0f}",
            _links((row.run,), page)]


HEADERS = {
    Gain: f"| seed | {{label}} | held-out before -> after | gain, paired over {ROOMS} rooms | gain / SE | p | minutes "
          "| records |",
    Difference: f"| seed | first minus second | difference, paired over {ROOMS} rooms | p | records (first; second) |",
    ByDirection: "| seed | first minus second | direction | rooms | difference, paired over the direction's rooms | p "
                 "| records (first; second) |",
    Categories: "| method | seed | " + " | ".join(DIRECTIONS) + " | overall | episodes | steps | records |",
}


def table(rows: list, page: str, label: str = "machine") -> tuple[str, ...]:
    """The Markdown table of `rows` (all of one kind), every number recomputed from the records each row names."""
    header = HEADERS[type(rows[0])].format(label=label)
    rule = "| " + " | ".join("---" for _ in range(header.count("|") - 1)) + " |"
    return (header, rule, *("|" + "|".join(f" {c} " if c else " " for c in _cells(r, page)) + "|" for r in rows))


# ------------------------------------------------------------------ the runs


def _seeds(paths: list[Path]) -> str:
    seeds = [run_seed(p) for p in paths]
    return f"{min(seeds)}-{max(seeds)}, over seeds"


def each(arm: list[Path], label=None) -> list[Gain]:
    """Each run's own gain; `label` names its second column (default: its machine and day)."""
    return [Gain(str(run_seed(r)), label or machine(r), (r,)) for r in arm]


def each_and_over(arm: list[Path], label: str | None = None) -> list[Gain]:
    """Each run's own gain, then the arm's over its seeds (one run a seed)."""
    return [*each(arm, label), Gain(_seeds(arm), label or "AMD EPYC", tuple(arm))]


def differences(label: str, first: list[Path], second: list[Path]) -> list[Difference]:
    """Each seed's first minus second, then over the seeds (the runs paired in order, one a seed)."""
    return [*(Difference(str(run_seed(a)), label, (a,), (b,)) for a, b in zip(first, second, strict=True)),
            Difference(_seeds(first), label, tuple(first), tuple(second))]


def fedse_runs(kind: str, seeds=(0, 1, 2)) -> list[Path]:
    return runs(*(f"2026-12-06-cpu/runs/fedse-{kind}-s{s}-amd" for s in seeds))


FEDSE_EAGER = fedse_runs("eager", range(5))
FEDSE_SDPA = fedse_runs("bf16-base")
FEDSE_MIXED = fedse_runs("bf16-mixed")
FEDSE_FP32 = runs("2026-12-06-cpu/runs/fedse-preset-s0-amd", "2026-12-05-cpu/runs/fedse-preset-s1-amd",
                  "2026-12-05-cpu/runs/fedse-preset-s2-amd")
UNIFORM = {name: runs(*(f"2026-12-01-cpu/runs/{name}-s{s}" for s in (1, 2)))
           for name in ("fedagent-preset", "local1", "central")}
SEED2_AGAIN = RESULTS / "2026-12-05-cpu/runs/fedagent-preset-s2-amd"
AMX = {"fedagent": runs("2026-12-04-cpu/runs/fedagent-preset-s0-amx", "2026-12-05-cpu/runs/fedagent-preset-s1-amx"),
       "fedse": runs("2026-12-05-cpu/runs/fedse-preset-s0-amx")}


def machine(run: Path) -> str:
    """The processor a run's folder says it ran on (the -amx suffix: the Xeon; else the AMD EPYC), and its day."""
    day = run.relative_to(RESULTS).parts[0].removesuffix("-cpu")
    return f"Intel Xeon with AMX ({day})" if run.name.endswith("-amx") else f"AMD EPYC ({day})"


# the directions split (issue 70): one arm a method, seeds 0-2
def arm(name: str) -> list[Path]:
    return runs(*(f"2026-12-04-cpu/table1-directions/runs/table1-{name}-s{s}" for s in (0, 1, 2)))


METHODS = {"fedagent": "FedAgentAvg", "local0": "Local (client 0: north-east)",
           "local1": "Local (client 1: south-west)", "centralized": "Centralized (all 32 rooms)",
           "local0-matched": "Local (client 0), compute-matched"}
AGAINST = {"local0": METHODS["local0"], "local1": METHODS["local1"], "centralized": "Centralized",
           "local0-matched": METHODS["local0-matched"]}


def direction_tables() -> dict[str, tuple[str, list, str]]:
    """The lab note's tables: {name: (page, rows, label of the second column)}."""
    fed = arm("fedagent")
    categories = [Categories(METHODS[m] if not base else "base model (before training)", str(s),
                             arm(m if not base else "fedagent")[s], base)
                  for s in range(3) for m, base in [*((m, False) for m in METHODS), ("fedagent", True)]]
    diffs = [d for m, label in AGAINST.items() for d in differences(f"FedAgentAvg - {label}", fed, arm(m))]
    by_direction = [ByDirection(str(s), f"FedAgentAvg - {METHODS[m]}", d, fed[s], arm(m)[s])
                    for m in AGAINST for s in range(3) for d in DIRECTIONS]
    gains = [g for m, label in METHODS.items() for g in each_and_over(arm(m), label)]
    return {"directions-categories": (NOTE, categories, ""), "directions-differences": (NOTE, diffs, ""),
            "directions-by-direction": (NOTE, by_direction, ""), "directions-gains": (NOTE, gains, "method")}


def tables() -> dict[str, tuple[str, list, str]]:
    """Every generated table: {name: (page, rows, label of the second column)}."""
    on_page = {
        "fedagent-preset-gains": [*each(FEDAGENT_AMD + AMX["fedagent"] + [SEED2_AGAIN]),
                                  Gain(_seeds(FEDAGENT_AMD), "AMD EPYC", tuple(FEDAGENT_AMD))],
        "uniform-differences": [*differences("FedAgentAvg - Local (client 1)", UNIFORM["fedagent-preset"],
                                             UNIFORM["local1"]),
                                *differences("FedAgentAvg - Centralized", UNIFORM["fedagent-preset"],
                                             UNIFORM["central"])],
        "gigpo-differences": differences("GiGPO - GRPO", GIGPO, FEDAGENT_AMD),
        "gigpo-gains": each(GIGPO),
        "fedse-eager-gains": [*each(FEDSE_EAGER), Gain(_seeds(FEDSE), "AMD EPYC", tuple(FEDSE)),
                              Gain(_seeds(FEDSE_EAGER), "AMD EPYC", tuple(FEDSE_EAGER))],
        "fedse-sdpa-gains": each_and_over(FEDSE_SDPA),
        "fedse-eager-sdpa": differences("eager - sdpa", FEDSE, FEDSE_SDPA),
        "fedse-mixed-gains": each_and_over(FEDSE_MIXED),
        "fedse-base-mixed": differences("bf16-base - bf16-mixed", FEDSE_SDPA, FEDSE_MIXED),
        "fedse-fp32-gains": [*each(AMX["fedse"] + FEDSE_FP32), Gain(_seeds(FEDSE_FP32), "AMD EPYC", tuple(FEDSE_FP32))],
        "fedse-mixed-fp32": differences("bf16-mixed - fp32", FEDSE_MIXED, FEDSE_FP32),
        "fedse-fedagent": differences("Fed-SE - FedAgentAvg", FEDSE_SDPA, FEDAGENT_AMD),
        "fedse-eager-fedagent": differences("Fed-SE (eager) - FedAgentAvg", FEDSE, FEDAGENT_AMD),
    }
    return {name: (PAGE, rows, "machine") for name, rows in on_page.items()} | direction_tables()


def folders(row) -> tuple[Path, ...]:
    """The run folders one row reads."""
    if isinstance(row, Gain):
        return row.runs
    if isinstance(row, Difference):
        return row.first + row.second
    if isinstance(row, ByDirection):
        return row.first, row.second
    return (row.run,)


# ------------------------------------------------------------------ figures


def gain_over_se(run: Path) -> float:
    t = gain_per_run(run)
    return t["mean"] / t["se"]


def _by_direction(other: str, seed: int, direction: str) -> dict:
    return category_tests(arm("fedagent")[seed], arm(other)[seed])[direction]


def _first_success(run: Path) -> str:
    s = success_rounds(run)
    return f"{s[min(s)]:.3f}"


def _episodes_before_round_1(run: Path) -> str:
    return f"{len(json.loads((run / 'episodes' / 'round-0000.json').read_text())['episodes'])}"


def _span(values: list[str]) -> str:
    return f"{min(values, key=float)}-{max(values, key=float)}"


def figures() -> list[Figure]:
    out = []

    def fig(page: str, name: str, text: str) -> None:
        out.append(Figure(page, name, text))

    # FedAgentAvg: seed 2 repeated on one processor kind
    fig(PAGE, "seed2-repeat-minutes-first", minutes(FEDAGENT_AMD[2]))
    fig(PAGE, "seed2-repeat-minutes-again", minutes(SEED2_AGAIN))
    # GiGPO against GRPO: each one's weakest seed
    fig(PAGE, "grpo-weakest-se", f"{min(gain_over_se(r) for r in FEDAGENT_AMD):.2f}")
    fig(PAGE, "gigpo-weakest-se", f"{min(gain_over_se(r) for r in GIGPO):.2f}")
    # Fed-SE: its precision, attention and the comparison with FedAgentAvg
    t = difference_over_seeds(FEDSE_SDPA, FEDSE_MIXED)
    fig(PAGE, "fedse-base-minus-mixed", _pm(t))
    fig(PAGE, "fedse-base-minus-mixed-p", f"{t['p']:.2g}")
    fig(PAGE, "fedse-base-s0-minutes", minutes(FEDSE_SDPA[0]))
    fig(PAGE, "fedse-mixed-s0-minutes", minutes(FEDSE_MIXED[0]))
    fig(PAGE, "fedse-fedagent-start-episodes", _episodes_before_round_1(FEDSE_SDPA[2]))
    t = difference_over_seeds(FEDSE, FEDSE_SDPA)
    fig(PAGE, "fedse-eager-minus-sdpa", _pm(t))
    fig(PAGE, "fedse-eager-minus-sdpa-p", f"{t['p']:.2g}")
    fig(PAGE, "fedse-fedagent-episodes", _episodes_before_round_1(FEDAGENT_AMD[2]))
    t = difference_over_seeds(FEDSE_SDPA, FEDAGENT_AMD)
    fig(PAGE, "fedse-minus-fedagent", _pm(t))
    fig(PAGE, "fedse-minus-fedagent-p", f"{t['p']:.2g}")
    fig(PAGE, "fedse-minutes", _span([minutes(r) for r in FEDSE_SDPA]))
    fig(PAGE, "fedagent-minutes", _span([minutes(r) for r in FEDAGENT_AMD]))
    t = difference_over_seeds(FEDSE, FEDAGENT_AMD)
    fig(PAGE, "fedse-eager-minus-fedagent", _pm(t))
    fig(PAGE, "fedse-eager-minus-fedagent-p", f"{t['p']:.2g}")
    # the directions split: what seeds 0-2 say (results.md), and the runs' setting (the lab note)
    for s in range(3):
        fig(PAGE, f"local0-north-east-lead-s{s}", f"{-_by_direction('local0', s, 'north-east')['mean']:.3f}")
        fig(PAGE, f"local0-south-west-lag-s{s}", f"{_by_direction('local0', s, 'south-west')['mean']:.3f}")
        fig(PAGE, f"matched-north-east-lead-s{s}", f"{-_by_direction('local0-matched', s, 'north-east')['mean']:.3f}")
        fig(PAGE, f"matched-lead-s{s}", f"{-difference(arm('fedagent')[s], arm('local0-matched')[s])['mean']:.3f}")
        t = gain_per_run(arm("fedagent")[s])
        fig(PAGE, f"directions-fedagent-gain-s{s}", f"{t['mean']:+.3f}")
        fig(PAGE, f"directions-fedagent-gain-se-s{s}", f"{t['mean'] / t['se']:.2f}")
    fig(PAGE, "local0-north-east-lead-p-s2", f"{_by_direction('local0', 2, 'north-east')['p']:.2g}")
    t = _by_direction("local1", 2, "south-west")
    fig(PAGE, "local1-south-west-lead-s2", f"{-t['mean']:.3f}")
    fig(PAGE, "local1-south-west-lead-p-s2", f"{t['p']:.2g}")
    for s in (0, 1):
        fig(PAGE, f"local1-north-west-lag-s{s}", f"{_by_direction('local1', s, 'north-west')['mean']:.3f}")
    fig(PAGE, "local1-south-east-lag-s2", f"{_by_direction('local1', 2, 'south-east')['mean']:.3f}")
    fig(PAGE, "local1-north-east-lag-s2", f"{_by_direction('local1', 2, 'north-east')['mean']:.3f}")
    t = difference(arm("fedagent")[2], arm("local1")[2])
    fig(PAGE, "fedagent-minus-local1-s2", _pm(t))
    fig(PAGE, "fedagent-minus-local1-p-s2", f"{t['p']:.2g}")
    for other in ("local0", "local1", "centralized", "local0-matched"):
        t = difference_over_seeds(arm("fedagent"), arm(other))
        fig(PAGE, f"fedagent-minus-{other}", _pm(t))
        fig(PAGE, f"fedagent-minus-{other}-p", f"{t['p']:.2g}")
    for s in (0, 2):
        fig(PAGE, f"fedagent-minus-centralized-p-s{s}",
            f"{difference(arm('fedagent')[s], arm('centralized')[s])['p']:.2g}")
    fig(PAGE, "centralized-loss-s2", f"{-gain_per_run(arm('centralized')[2])['mean']:.3f}")
    fig(PAGE, "federation-episodes", f"{spent(arm('local0-matched')[0])['episodes']:.0f}")
    t = gains_over_seeds(arm("fedagent"))
    fig(PAGE, "directions-fedagent-gain", _pm(t))
    fig(PAGE, "directions-fedagent-gain-p", f"{t['p']:.2g}")
    for s in (0, 2):
        fig(NOTE, f"fedagent-minutes-s{s}", minutes(arm("fedagent")[s]))
    for d in DIRECTIONS:  # held-out rooms of each direction
        fig(NOTE, f"rooms-{d}", f"{_by_direction('local0', 0, d)['n']}")
    fig(NOTE, "seed2-first-two-threads", _first_success(arm("fedagent")[2]))
    fig(NOTE, "seed2-first-one-thread", _first_success(arm("local0")[2]))
    return out


def doc_parts() -> list[Block | Figure]:
    """The tables of docs/results.md's real-model part and of its lab note on the directions split, and the figures of
    the prose around them (scripts/write_docs.py)."""
    blocks = [Block(page, name, table(rows, page, label or "machine"))
              for name, (page, rows, label) in tables().items()]
    return [*blocks, *figures()]
