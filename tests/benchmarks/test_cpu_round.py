"""benchmarks/cpu_round.py runs a tiny preset's round under two settings, so the CPU comparison cannot rot."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "cpu_round.py"
PRESET = Path(__file__).resolve().parents[2] / "configs" / "fedagent-cpu.toml"


@pytest.mark.slow  # four client rounds and evaluations in a subprocess: among the default run's slowest
def test_a_tiny_round_is_timed_phase_by_phase_under_each_setting():
    done = subprocess.run([sys.executable, str(SCRIPT), "--run-config", str(PRESET), "--variant", "precision=fp32",
                           "--variant", "precision=bf16-mixed,rollout.name=static", "--repeats", "2",
                           "--eval-tasks", "2", "--threads", "1", "--json"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert list(report["variants"]) == ["precision=fp32", "precision=bf16-mixed,rollout.name=static"]
    for name, entry in report["variants"].items():
        for phase in ("rollout", "update", "eval"):
            seconds, se = entry[f"{phase}_s"]
            assert seconds > 0 and se >= 0, (name, phase)
        assert 0 <= entry["eval_success"][0] <= 1
        for key in ("rollout_ms_per_token", "update_ms_per_sample", "eval_ms_per_token"):
            assert entry[key][0] > 0 and entry[key + "_ratio"][0] > 0, (name, key)
    assert report["variants"]["precision=fp32"]["update_ratio"] == [1.0, 0.0]  # the first variant is the reference
    # a bad value is refused by its key before any round runs
    bad = subprocess.run([sys.executable, str(SCRIPT), "--run-config", str(PRESET), "--variant", "precision=fp16"],
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode != 0 and "precision" in bad.stderr and "[cpu_round] repeat" not in bad.stderr


def test_eval_only_times_the_held_out_play_alone_under_each_decode_engine():
    """--eval-only: no client round, the evaluation of the model as loaded, each engine; on a fp32 CPU model both
    engines draw the same tokens (tests/agent/test_decode.py), so they play the same episodes to the same success."""
    done = subprocess.run([sys.executable, str(SCRIPT), "--run-config", str(PRESET), "--variant", "rollout.name=hf",
                           "--variant", "rollout.name=static,grpo.old-logprobs=recompute", "--repeats", "1", "--eval-only",
                           "--eval-tasks", "2", "--threads", "1", "--json"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    hf, static = report["variants"].values()
    assert report["eval_only"] and set(hf) == {"eval_s", "eval_ms_per_token", "eval_success", "eval_ratio",
                                               "eval_ms_per_token_ratio"}
    assert hf["eval_s"][0] > 0 and static["eval_s"][0] > 0 and hf["eval_success"] == static["eval_success"]


def test_a_variant_names_the_threads_it_runs_on():
    """`threads=N` in a variant: the evaluation on one core against both, as the run's server has them, side by side."""
    done = subprocess.run([sys.executable, str(SCRIPT), "--run-config", str(PRESET), "--variant", "threads=1",
                           "--variant", "threads=2,rollout.name=hf", "--repeats", "1", "--eval-only", "--eval-tasks", "1",
                           "--threads", "1", "--json"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["threads"] == 1 and report["variant_threads"] == {"threads=1": 1, "threads=2,rollout.name=hf": 2}
    assert all(v["eval_s"][0] > 0 for v in report["variants"].values())
    bad = subprocess.run([sys.executable, str(SCRIPT), "--run-config", str(PRESET), "--variant", "threads=0"],
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "threads='0' is not allowed" in bad.stderr
