"""benchmarks/update_passes.py times a tiny preset's update under two pass settings on the same samples, so the
comparison cannot rot."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "update_passes.py"
PRESET = Path(__file__).resolve().parents[2] / "configs" / "fedagent-cpu.toml"


def test_the_update_is_timed_on_the_same_samples_under_each_pass_setting():
    # minibatches of 8: more than one optimizer step, so the old-policy log-probs are needed
    variants = ["grpo.mini-batch-size=8,grpo.old-logprobs=recompute", "grpo.mini-batch-size=8,engine.shared-prompt-prefix=true,grpo.old-logprobs=rollout"]
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
    bad = subprocess.run([sys.executable, str(SCRIPT), "--run-config", str(PRESET), "--variant", "grpo.old-logprobs=sampler"],
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode != 0 and "grpo.old-logprobs" in bad.stderr and "[update_passes] played" not in bad.stderr


def test_profile_splits_one_micro_batch_of_the_first_variant():
    done = subprocess.run([sys.executable, str(SCRIPT), "--run-config", str(PRESET), "--samples", "8", "--repeats", "1",
                           "--threads", "1", "--variant", "grpo.ppo-micro-batch-size-per-gpu=2", "--profile", "--top", "5"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "one micro-batch of 2 rows" in done.stdout and "the backward's autograd nodes" in done.stdout
    nodes = done.stdout.split("the backward's autograd nodes")[1].strip().splitlines()[1:]
    assert len(nodes) == 5 and any("MmBackward" in line for line in nodes)


def test_the_attention_variants_run_the_same_update_otherwise():
    """attention=causal hands a right-padded batch no mask (the numbers every real token gets stay the run's),
    attention=math runs SDPA's math backend: both train on the same samples to the same loss, up to rounding."""
    import torch

    from benchmark_scripts import load_script
    from fedagent_flwr.agent.engine import tokens

    update_passes = load_script("update_passes")
    assert update_passes.own_keys("grpo.ppo-micro-batch-size-per-gpu=2,attention=causal-math") == ("grpo.ppo-micro-batch-size-per-gpu=2", False, "causal-math")
    right = torch.tensor([[1, 1, 1], [1, 1, 0]])
    real = tokens.model_attention_mask
    with update_passes.attention_as("causal"):
        assert tokens.model_attention_mask is not real
        assert tokens.model_attention_mask(None, right, torch.device("cpu")) is None
    assert tokens.model_attention_mask is real and real.__name__ == "model_attention_mask"
    variants = ["grpo.ppo-micro-batch-size-per-gpu=4", "grpo.ppo-micro-batch-size-per-gpu=4,attention=causal", "grpo.ppo-micro-batch-size-per-gpu=4,attention=math"]
    done = subprocess.run([sys.executable, str(SCRIPT), "--run-config", str(PRESET), "--samples", "16", "--repeats", "1",
                           "--threads", "1", "--json"] + [a for v in variants for a in ("--variant", v)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    losses = [entry["loss"][0] for entry in json.loads(done.stdout.strip().splitlines()[-1])["variants"].values()]
    assert losses[1] == pytest.approx(losses[0], rel=1e-4, abs=1e-6) and losses[2] == pytest.approx(losses[0], rel=1e-3, abs=1e-5)
    bad = subprocess.run([sys.executable, str(SCRIPT), "--run-config", str(PRESET), "--variant", "attention=flash"],
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode != 0 and "attention='flash' is not allowed: expected mask | causal | math | causal-math" in bad.stderr
