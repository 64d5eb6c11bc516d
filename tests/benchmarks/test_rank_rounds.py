"""docs/multi-gpu.md's figures for ranks kept between rounds, recomputed from their raw output and run records."""

import json
from pathlib import Path

import pytest

from fedagent_flwr.experiments.paired_rounds import compare, compare_runs, evaluation_rounds

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results" / "2026-12-04-cpu"


def page() -> str:
    return " ".join((ROOT / "docs" / "multi-gpu.md").read_text().split())


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


MEMORY = ROOT / "benchmarks" / "results" / "2026-12-05-cpu"
RANKS = MEMORY / "ranks-gathers"  # rank_memory.py at the commit the page names


def _memory(name: str, folder: Path = RANKS) -> dict:
    return json.loads((folder / name).read_text())


def _both(report: dict, key: str, fmt: str) -> tuple[str, str]:
    return tuple(format(r[key], fmt) for r in report["ranks"])


def test_the_rank_memory_outputs_are_of_the_commit_the_page_names():
    for name in ("smollm2-lora", "smollm2-lora.default", "tiny", "tiny.default"):
        git = _memory(f"rank_memory.{name}.json")["raw_output"]["git"]
        assert not git["dirty"] and f"2026-12-05, commit {git['commit'][:7]};" in page()


def test_a_smollm2_lora_rounds_memory_against_its_plans_is_quoted_from_its_raw_outputs():
    kept, returned = _memory("rank_memory.smollm2-lora.default.json"), _memory("rank_memory.smollm2-lora.json")
    peaks, over = _both(kept, "round_mib", ".0f"), _both(kept, "over_own_plan", ".2f")
    assert (f"peaked at {peaks[0]} and {peaks[1]} MiB, {over[0]}x and {over[1]}x its own plan of "
            f"{kept['ranks'][0]['own_plan_mib']:.0f} MiB") in page()
    peaks, over, run, private, private_over = (_both(returned, k, f) for k, f in (
        ("round_mib", ".0f"), ("over_own_plan", ".2f"), ("over_plan", ".2f"), ("private_mib", ".0f"),
        ("private_over_own_plan", ".2f")))
    assert (f"process: {peaks[0]} and {peaks[1]} MiB, {over[0]}x and {over[1]}x its own plan ({run[0]}x and {run[1]}x "
            f"the run's plan of {returned['plan_mib']:.0f} MiB), private {private[0]} and {private[1]} MiB, "
            f"{private_over[0]}x and {private_over[1]}x: within 15 % on both ranks") in page()
    assert max(r["over_own_plan"] for r in returned["ranks"]) <= 1.15  # what the text says, resident memory too
    for report, returns in ((kept, False), (returned, True)):
        config = report["raw_output"]["settings"]["arguments"]["run_config"]
        assert config["finetuning"] == "lora" and config["tasks-per-epoch"] == 2
        assert config.get("ranks-return-memory", False) is returns
    assert kept["ranks"][0]["own_plan"] == returned["ranks"][0]["own_plan"]  # the same round planned alike


def test_what_returning_freed_memory_costs_is_quoted_from_its_raw_output():
    report = _memory("freed_memory.smollm2-lora.json", MEMORY)
    returned, default = report["variants"]["65536"], report["variants"]["0"]
    repeats = report["raw_output"]["settings"]["arguments"]["repeats"]
    assert (f"took {returned['seconds_mean']:.1f} s against {default['seconds_mean']:.1f} s, "
            f"{returned['time_ratio_mean']:.2f} ± {returned['time_ratio_se']:.2f}x as long ({repeats} repeats each") in page()
    assert len(returned["seconds"]) == len(default["seconds"]) == repeats


def test_the_tiny_models_ranks_against_their_plans_are_quoted_from_their_raw_outputs():
    returned, kept = _memory("rank_memory.tiny.json"), _memory("rank_memory.tiny.default.json")
    for i, r in enumerate(returned["ranks"]):
        assert (f"rank {i} {r['round_mib']:.0f} MiB, {r['over_own_plan']:.2f}x its own plan of {r['own_plan_mib']:.0f} "
                f"MiB, private {r['private_mib']:.0f} MiB, {r['private_over_own_plan']:.2f}x") in page()
    files = sorted(r["round_mib"] - r["private_mib"] for r in returned["ranks"])
    assert f"the {files[0]:.0f}-{files[-1]:.0f} MiB of code pages" in page()
    # what the text says: private memory within 15 % on both ranks, resident memory not
    assert max(r["private_over_own_plan"] for r in returned["ranks"]) <= 1.15 < max(r["over_own_plan"] for r in returned["ranks"])
    assert returned["ranks"][1]["ran"]["update_rows"] == 0  # rank 1 ran spare update passes only
    peaks = _both(kept, "round_mib", ".0f")
    assert f"Without the key the tiny model's ranks peaked at {peaks[0]} and {peaks[1]} MiB" in page()


def test_the_static_engines_rollout_on_ranks_is_quoted_from_its_raw_outputs():
    hf, static = (_memory(f"rank_memory.smollm2-full-bf16.{e}.json", MEMORY / "ranks-static") for e in ("hf", "static"))
    rollout = [[f"{r['private_segments_mib']['rollout']:.0f}" for r in report["ranks"]] for report in (hf, static)]
    plans = [report["ranks"][0]["own_plan"] for report in (hf, static)]
    assert (f"a rank's rollout peaked at {rollout[0][0]} and {rollout[0][1]} MiB of private memory decoding with hf, "
            f"{rollout[1][0]} and {rollout[1][1]} MiB with the static engine, both under the plan's decode phase "
            f"as it stood ({plans[0]['decode peak'] / 2**20:.0f} and {plans[1]['decode peak'] / 2**20:.0f} MiB), which then "
            f"counted autocast's bf16 copies of every weight ({plans[1]['autocast bf16 weight copies'] / 2**20:.0f} MiB "
            f"here) for the static engine too; without them its decode phase plans "
            f"{(plans[1]['decode peak'] - plans[1]['autocast bf16 weight copies']) / 2**20:.0f} MiB") in page()
    for report, engine in ((hf, "hf"), (static, "static")):
        config = report["raw_output"]["settings"]["arguments"]["run_config"]
        assert config["decode-engine"] == engine and config["finetuning"] == "full" and config["precision"] == "bf16-mixed"
    assert max(r["private_segments_mib"]["rollout"] for r in static["ranks"]) < min(
        r["private_segments_mib"]["rollout"] for r in hf["ranks"])  # what the text implies


def test_the_pass_by_pass_check_the_page_names_has_the_cases_it_counts():
    import importlib.util
    import re

    spec = importlib.util.spec_from_file_location("test_pass_memory", ROOT / "tests" / "agent" / "test_pass_memory.py")
    test_pass_memory = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(test_pass_memory)

    words = {"eight": 8, "nine": 9, "ten": 10, "fifteen": 15, "sixteen": 16, "seventeen": 17}
    training = re.search(r"against its update rows, within 5 % in (\w+) configurations", page()).group(1)
    assert words[training] == len(test_pass_memory.CASES)
    no_grad = re.search(r"under the plan where attention is, in (\w+) configurations", page()).group(1)
    assert words[no_grad] == len(test_pass_memory.NO_GRAD_CASES)


@pytest.mark.slow  # two rounds on new ranks per variant: about a minute
def test_freed_memory_runs_both_variants_on_the_default_job_and_says_which_held_less():
    import subprocess
    import sys

    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "freed_memory.py"), "--repeats", "2", "--json"],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    default, returned = report["variants"]["0"], report["variants"]["65536"]
    assert len(default["seconds"]) == len(returned["seconds"]) == 2 and default["time_ratio_mean"] == 1.0
    assert max(returned["peak_mib_mean"]) < max(default["peak_mib_mean"])  # rank 0: what giving memory back is for
