"""benchmarks/update_passes.py times a tiny preset's update under two pass settings on the same samples, so the
comparison cannot rot."""

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "update_passes.py"
PRESET = Path(__file__).resolve().parents[2] / "configs" / "fedagent-cpu.toml"


def test_the_update_is_timed_on_the_same_samples_under_each_pass_setting():
    # minibatches of 8: more than one optimizer step, so the old-policy log-probs are needed
    variants = ["minibatch-size=8,old-logprobs=recompute", "minibatch-size=8,shared-prompt-prefix=true,old-logprobs=rollout"]
    done = subprocess.run([sys.executable, str(SCRIPT), "--run-config", str(PRESET), "--samples", "24", "--repeats", "2",
                           "--threads", "1", "--json"] + [a for v in variants for a in ("--variant", v)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert list(report["variants"]) == variants and report["samples"] == 24
    for name, entry in report["variants"].items():
        seconds, se = entry["update_s"]
        assert seconds > 0 and se >= 0 and entry["optimizer_steps"][0] >= 1, name
    assert report["variants"][variants[0]]["update_ratio"] == [1.0, 0.0]  # the first variant is the reference
    assert "rollout_logprob_gap" not in report["variants"][variants[0]]
    # fp32 tiny model: the rollout's log-probs are a training pass's up to rounding
    assert 0 <= report["variants"][variants[1]]["rollout_logprob_gap"][0] < 1e-3
    bad = subprocess.run([sys.executable, str(SCRIPT), "--run-config", str(PRESET), "--variant", "old-logprobs=sampler"],
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode != 0 and "old-logprobs" in bad.stderr and "[update_passes] played" not in bad.stderr


def test_profile_splits_one_micro_batch_of_the_first_variant():
    done = subprocess.run([sys.executable, str(SCRIPT), "--run-config", str(PRESET), "--samples", "8", "--repeats", "1",
                           "--threads", "1", "--variant", "micro-batch-size=2", "--profile", "--top", "5"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "one micro-batch of 2 rows" in done.stdout and "the backward's autograd nodes" in done.stdout
    nodes = done.stdout.split("the backward's autograd nodes")[1].strip().splitlines()[1:]
    assert len(nodes) == 5 and any("MmBackward" in line for line in nodes)
