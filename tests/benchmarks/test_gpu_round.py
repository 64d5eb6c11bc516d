"""benchmarks/gpu_round.py runs on CPU at the tiny shape, so the GPU benchmark cannot rot between GPU sessions."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_round.py"
SMALL = ["--set", "tasks-per-epoch=2", "--set", "group-size=2", "--set", "max-steps=2", "--set", "max-new-tokens=16",
         "--set", "minibatch-size=4", "--set", "micro-batch-size=2"]


def _run(*extra: str) -> dict:
    done = subprocess.run([sys.executable, str(SCRIPT), "--shape", "tiny", "--json", *SMALL, *extra],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_tiny_round_reports_every_phase_with_the_plan_beside_the_peak():
    r = _run()
    assert r["episodes"] == 4 and r["agent_steps"] == 8  # a random model plays every episode to max-steps
    assert r["generated_tokens"] > 0 and r["generated_tokens_per_s"] > 0
    for phase in ("rollout_s", "logprobs_s", "update_s", "transfer_s"):
        assert r[phase] > 0, phase
    assert r["optimizer_steps"] == 2  # 8 samples, minibatch 4: the forced advantages keep every sample
    assert r["fraction_of_a_trained_tensor_moved"] > 0.99  # fp32 weights move at lr 1e-6
    assert set(r["peak_bytes"]) == {"rollout", "update", "transfer"} and min(r["peak_bytes"].values()) > 0
    assert r["plan_bytes"]["total"] > 0 and r["plan_bytes"]["weights (fp32)"] == 4 * r["parameters"]
    assert r["bytes_sent"] == 4 * r["parameters"]  # the tied head travels once


@pytest.mark.parametrize("precision", ["bf16-mixed"])
def test_tiny_lora_round_sends_the_adapter_in_bf16(precision):
    r = _run("--set", "finetuning=lora", "--set", "lora-rank=4", "--set", f"precision={precision}",
             "--set", "transfer-dtype=bf16", "--set", "gradient-checkpointing=true")
    adapter = r["plan_bytes"]["adapter (fp32)"] // 4
    assert r["bytes_sent"] == 2 * adapter > 0
    assert r["optimizer_steps"] == 2 and r["precision"] == precision
