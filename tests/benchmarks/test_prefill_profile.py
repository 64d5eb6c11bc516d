"""benchmarks/prefill_profile.py runs on CPU at the tiny shape, so the GPU comparison cannot rot between GPU sessions."""

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "prefill_profile.py"


def test_tiny_profile_sets_the_shared_prefix_prefill_beside_whole_prompts():
    done = subprocess.run([sys.executable, str(SCRIPT), "--shape", "tiny", "--json", "--tasks", "3", "--group", "4",
                           "--history", "20", "--repeats", "1"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    r = json.loads(done.stdout.strip().splitlines()[-1])
    assert r["device"] == "cpu" and r["precision"] == "fp32" and r["prompts"] == 12
    whole, shared = r["variants"]["whole"], r["variants"]["shared prefixes"]
    assert whole["groups"] == 0 and shared["groups"] == 3 and shared["prefix_width"] == 26 + 74
    # 12 prompts of 100 + 10..30 tokens: whole, 12 x the longest; shared, 3 prefixes of 100 + 12 x the longest history
    assert whole["positions"] == 12 * whole["suffix_width"] and whole["suffix_width"] > 100 + 10
    assert shared["positions"] == 3 * 100 + 12 * shared["suffix_width"] and shared["suffix_width"] <= 30
    assert shared["positions"] < 0.5 * whole["positions"]
    assert whole["ms"] > 0 and shared["ms"] > 0
    assert r["logprob_gap"] < 1e-4  # fp32: the same next-token distributions either way


def test_bad_counts_are_refused_by_name():
    done = subprocess.run([sys.executable, str(SCRIPT), "--group", "0"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "--group must be at least 1, got 0" in done.stderr
