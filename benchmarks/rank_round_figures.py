"""docs/multi-gpu.md's measured figures for a client's ranks: kept between rounds (benchmarks/rank_rounds.py and the
default job's run records of 2026-12-04), their memory against the plan (benchmarks/rank_memory.py,
benchmarks/freed_memory.py, 2026-12-05), each recomputed from its raw output and written into the page by
`python scripts/write_docs.py` (tests/records regenerates them). The page's ranks-host-memory block is
fedagent_flwr/experiments/host_memory.py's."""

from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path

from fedagent_flwr.experiments.doc_blocks import Figure
from fedagent_flwr.experiments.paired_rounds import compare, compare_runs, evaluation_rounds

ROOT = Path(__file__).resolve().parents[1]
PAGE = "docs/multi-gpu.md"
KEPT = ROOT / "benchmarks" / "results" / "2026-12-04-cpu"
MEMORY = ROOT / "benchmarks" / "results" / "2026-12-05-cpu"
GATHERS, STATIC = MEMORY / "ranks-gathers", MEMORY / "ranks-static"
WORDS = ("zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
         "seventeen eighteen nineteen twenty").split()
MIB = 2 ** 20


def _json(path: Path) -> dict:
    return json.loads(path.read_text())


def _fig(name: str, text: str) -> Figure:
    return Figure(PAGE, name, text)


def _ranks(name: str, report: dict, key: str, fmt: str) -> list[Figure]:
    """One figure a rank: `name`.rank0, `name`.rank1, ..."""
    return [_fig(f"{name}.rank{i}", format(r[key], fmt)) for i, r in enumerate(report["ranks"])]


def kept_ranks() -> list[Figure]:
    """benchmarks/rank_rounds.py's later rounds on kept ranks against new ones, and each kept rank's peak."""
    report = _json(KEPT / "rank_rounds.json")
    later, rounds = report["overhead_later_rounds_s"], report["rounds"]
    walls = {v: [r["wall_s"] for r in rounds[v][1:]] for v in rounds}  # the first round of kept ranks starts them
    return [
        *(_fig(f"kept-ranks.{v}-overhead", f"{later[v]['mean']:.2f} ± {later[v]['se']:.2f}") for v in ("kept", "new")),
        *(_fig(f"kept-ranks.{v}-walls", f"{min(walls[v]):.1f}-{max(walls[v]):.1f}") for v in ("kept", "new")),
        _fig("kept-ranks.rounds", str(len(rounds["kept"]))),
        *(_fig(f"kept-ranks.peak.rank{i}", f"{mib:.0f}") for i, mib in enumerate(report["kept_rank_peak_rss_mb"])),
    ]


def default_job_on_ranks() -> list[Figure]:
    """The default job on 2 ranks a client against one rank (run records default-ranks2-s0, default-s0)."""
    one, two = KEPT / "runs" / "default-s0", KEPT / "runs" / "default-ranks2-s0"
    marks = evaluation_rounds(two)
    gain = compare(two, marks[-1], marks[0])
    against = compare_runs(two, one, marks[-1], evaluation_rounds(one)[-1])
    seconds = {r: _json(r / "summary.json")["seconds"] for r in (one, two)}
    return [
        _fig("default-ranks2.success", f"{gain['earlier_success']:.3f} -> {gain['later_success']:.3f}"),
        _fig("default-ranks2.gain", f"{gain['mean']:+.3f} ± {gain['se']:.3f}"),
        _fig("default-ranks2.gain-in-se", f"{gain['mean'] / gain['se']:.1f}"),
        _fig("default-ranks2.against-one-rank", f"{against['mean']:+.3f} ± {against['se']:.3f}"),
        _fig("default-ranks2.against-one-rank-p", f"{against['p']:.2g}"),
        _fig("default-ranks2.seconds", f"{seconds[two]:.0f}"),
        _fig("default-ranks1.seconds", f"{seconds[one]:.0f}"),
    ]


def rank_memory() -> list[Figure]:
    """benchmarks/rank_memory.py's rounds in ranks-gathers/ and benchmarks/freed_memory.py's timing."""
    outputs = {n: _json(GATHERS / f"rank_memory.{n}.json")
               for n in ("smollm2-lora", "smollm2-lora.default", "tiny", "tiny.default")}
    commits = {o["raw_output"]["git"]["commit"] for o in outputs.values()}
    if len(commits) != 1:  # the page names one commit for the four
        raise ValueError(f"{GATHERS}: the outputs are of {len(commits)} commits")
    kept, returned = outputs["smollm2-lora.default"], outputs["smollm2-lora"]
    tiny, tiny_kept = outputs["tiny"], outputs["tiny.default"]
    freed = _json(MEMORY / "freed_memory.smollm2-lora.json")
    with_key, default = freed["variants"]["65536"], freed["variants"]["0"]
    code_pages = sorted(r["round_mib"] - r["private_mib"] for r in tiny["ranks"])
    return [
        _fig("rank-memory.commit", commits.pop()[:7]),
        *_ranks("smollm2-kept.peak", kept, "round_mib", ".0f"),
        *_ranks("smollm2-kept.over-own-plan", kept, "over_own_plan", ".2f"),
        _fig("smollm2-kept.own-plan", f"{kept['ranks'][0]['own_plan_mib']:.0f}"),
        *_ranks("smollm2-returned.peak", returned, "round_mib", ".0f"),
        *_ranks("smollm2-returned.over-own-plan", returned, "over_own_plan", ".2f"),
        *_ranks("smollm2-returned.over-plan", returned, "over_plan", ".2f"),
        _fig("smollm2-returned.plan", f"{returned['plan_mib']:.0f}"),
        *_ranks("smollm2-returned.private", returned, "private_mib", ".0f"),
        *_ranks("smollm2-returned.private-over-own-plan", returned, "private_over_own_plan", ".2f"),
        _fig("freed.seconds-returned", f"{with_key['seconds_mean']:.1f}"),
        _fig("freed.seconds-default", f"{default['seconds_mean']:.1f}"),
        _fig("freed.time-ratio", f"{with_key['time_ratio_mean']:.2f} ± {with_key['time_ratio_se']:.2f}"),
        _fig("freed.repeats", str(freed["raw_output"]["settings"]["arguments"]["repeats"])),
        *_ranks("tiny-returned.peak", tiny, "round_mib", ".0f"),
        *_ranks("tiny-returned.over-own-plan", tiny, "over_own_plan", ".2f"),
        *_ranks("tiny-returned.own-plan", tiny, "own_plan_mib", ".0f"),
        *_ranks("tiny-returned.private", tiny, "private_mib", ".0f"),
        *_ranks("tiny-returned.private-over-own-plan", tiny, "private_over_own_plan", ".2f"),
        _fig("tiny-returned.code-pages", f"{code_pages[0]:.0f}-{code_pages[-1]:.0f}"),
        *_ranks("tiny-kept.peak", tiny_kept, "round_mib", ".0f"),
    ]


def pass_checks() -> list[Figure]:
    """How many configurations tests/agent/test_pass_memory.py checks the planner's pass rows in, as words."""
    spec = importlib.util.spec_from_file_location("test_pass_memory", ROOT / "tests" / "agent" / "test_pass_memory.py")
    checks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(checks)
    return [_fig("pass-checks.training", WORDS[len(checks.CASES)]),
            _fig("pass-checks.no-grad", WORDS[len(checks.NO_GRAD_CASES)])]


def static_rollout() -> list[Figure]:
    """benchmarks/rank_memory.py's rollout on 2 ranks with hf and the static engine (ranks-static/), and what the plan
    of the outputs' commit counted for its decode phase."""
    hf, static = (_json(STATIC / f"rank_memory.smollm2-full-bf16.{e}.json") for e in ("hf", "static"))
    plans = {e: report["ranks"][0]["own_plan"] for e, report in (("hf", hf), ("static", static))}
    copies = plans["static"]["autocast bf16 weight copies"]
    return [
        *(_fig(f"static-rollout.{e}.rank{i}", f"{r['private_segments_mib']['rollout']:.0f}")
          for e, report in (("hf", hf), ("static", static)) for i, r in enumerate(report["ranks"])),
        *(_fig(f"static-rollout.{e}-decode-plan", f"{plans[e]['decode peak'] / MIB:.0f}") for e in ("hf", "static")),
        _fig("static-rollout.autocast-copies", f"{copies / MIB:.0f}"),
        _fig("static-rollout.static-decode-plan-without-copies",
             f"{(plans['static']['decode peak'] - copies) / MIB:.0f}"),
    ]


def doc_parts() -> list[Figure]:
    return kept_ranks() + default_job_on_ranks() + rank_memory() + pass_checks() + static_rollout()


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    for part in doc_parts():  # written into the page by scripts/write_docs.py
        print(f"{part.name}: {part.text}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
