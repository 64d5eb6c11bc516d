"""docs/deployment.md's figures for ranks kept between rounds, recomputed from their raw output and run records."""

import json
from pathlib import Path

from fedagent_flwr.experiments.paired_rounds import compare, compare_runs, evaluation_rounds

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results" / "2026-12-04-cpu"


def page() -> str:
    return " ".join((ROOT / "docs" / "deployment.md").read_text().split())


def test_the_start_up_saved_by_kept_ranks_is_quoted_from_its_raw_output():
    report = json.loads((RESULTS / "rank_rounds.json").read_text())
    later, rounds = report["overhead_later_rounds_s"], report["rounds"]
    walls = {v: [r["wall_s"] for r in rounds[v][1:]] for v in rounds}
    assert (f"a later round spent {later['kept']['mean']:.2f} ± {later['kept']['se']:.2f} s outside training on kept "
            f"ranks against {later['new']['mean']:.2f} ± {later['new']['se']:.2f} s on ranks started anew, and took "
            f"{min(walls['kept']):.1f}-{max(walls['kept']):.1f} s against {min(walls['new']):.1f}-{max(walls['new']):.1f} s "
            f"({len(rounds['kept'])} rounds each, alternating") in page()
    peak = report["kept_rank_peak_rss_mb"]
    assert f"peak resident memory of the kept ranks {peak[0]:.0f} and {peak[1]:.0f} MiB" in page()


def test_the_default_job_on_two_ranks_is_quoted_from_its_records():
    one, two = RESULTS / "runs" / "default-s0", RESULTS / "runs" / "default-ranks2-s0"
    marks = evaluation_rounds(two)
    gain = compare(two, marks[-1], marks[0])
    against = compare_runs(two, one, marks[-1], evaluation_rounds(one)[-1])
    minutes = {r: json.loads((r / "summary.json").read_text())["seconds"] for r in (one, two)}
    assert (f"{gain['earlier_success']:.3f} -> {gain['later_success']:.3f} ({gain['mean']:+.3f} ± {gain['se']:.3f}, "
            f"{gain['mean'] / gain['se']:.1f} SE)") in page()
    assert f"against one rank's last evaluation {against['mean']:+.3f} ± {against['se']:.3f} (p {against['p']:.2g})" in page()
    assert f"{minutes[two]:.0f} s against {minutes[one]:.0f} s" in page()


def test_the_ranks_memory_against_their_plan_is_quoted_from_its_raw_output():
    report = json.loads((RESULTS / "rank_memory.tiny.json").read_text())
    ranks = report["ranks"]
    base = [f"{r['baseline_mib']:.0f}" for r in ranks]
    assert (f"less what it held before any model ({base[0]} and {base[1]} MiB: the interpreter, torch, transformers) was "
            f"{ranks[0]['round_mib']:.0f} MiB on rank 0 and {ranks[1]['round_mib']:.0f} MiB on rank 1, against a plan "
            f"of {report['plan_mib']:.0f} MiB a rank: not within 15 %") in page()
    assert max(abs(r["over_plan"] - 1) for r in ranks) > 0.15  # what "not within 15 %" says
    assert report["raw_output"]["settings"]["arguments"]["run_config"] == {"ranks-per-client": 2}  # the default job on 2 ranks


def test_a_smollm2_lora_rounds_memory_against_its_plan_is_quoted_from_its_raw_output():
    report = json.loads((RESULTS / "rank_memory.smollm2-lora.json").read_text())
    ranks = report["ranks"]
    assert (f"{ranks[0]['round_mib']:.0f} and {ranks[1]['round_mib']:.0f} MiB against a plan of "
            f"{report['plan_mib']:.0f} MiB a rank ({ranks[0]['over_plan']:.2f}x and {ranks[1]['over_plan']:.2f}x), "
            "not within 15 % either") in page()
    assert min(r["over_plan"] for r in ranks) > 1.15
    arguments = report["raw_output"]["settings"]["arguments"]
    assert arguments["finetuning"] == "lora" and arguments["run_config"]["tasks-per-epoch"] == 2
