"""benchmarks/gpu_round.py runs on CPU at the tiny shape, so the GPU benchmark cannot rot between GPU sessions."""

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from benchmark_scripts import load_script

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
    # decode speed beside the bandwidth bound: fp32 on CPU, so 4 bytes a weight (the tied head read once)
    assert r["decode_engine"] == "auto" and 0 < r["token_steps"] <= 2 * 16  # 2 sampler calls of at most 16 steps
    assert r["decode_ms_per_token_step"] > 0 and r["rows_per_step"] == 4
    bound = r["decode_bound"]
    assert bound["weight_bytes"] == 4 * r["parameters"] and bound["kv_bytes"] > 0
    assert bound["bound_ms"] == pytest.approx((bound["weight_bytes"] + bound["kv_bytes"]) / 3.35e12 * 1e3)
    assert "paper_round" not in r
    # model FLOP utilisation: 2 x parameters x sample tokens per forward pass; full training counts 3 passes
    assert r["logprob_passes"] >= 1 and r["peak_flops"] == 989e12
    flops = 2 * r["parameters"] * r["sample_tokens"] * 3
    assert r["update_tflops_per_s"] == pytest.approx(flops / r["update_s"] / 1e12, rel=0.02)
    assert r["update_mfu"] == pytest.approx(r["update_tflops_per_s"] * 1e12 / 989e12, rel=1e-6)
    assert 0 < r["logprobs_mfu"] < 1


@pytest.mark.parametrize("precision", ["bf16-mixed"])
def test_tiny_lora_round_sends_the_adapter_in_bf16(precision):
    r = _run("--set", "finetuning=lora", "--set", "lora-rank=4", "--set", f"precision={precision}",
             "--set", "transfer-dtype=bf16", "--set", "gradient-checkpointing=true")
    adapter = r["plan_bytes"]["adapter (fp32)"] // 4
    assert r["bytes_sent"] == 2 * adapter > 0
    assert r["optimizer_steps"] == 2 and r["precision"] == precision


def test_tiny_round_on_the_static_engine_estimates_a_paper_round():
    r = _run("--decode-engine", "static", "--paper-round", "--paper-set", "tasks-per-epoch=64", "--bandwidth", "1e12")
    assert r["decode_engine"] == "static" and r["agent_steps"] == 8 and r["decode_ms_per_token_step"] > 0
    assert r["decode_bound"]["bandwidth"] == 1e12
    preset = tomllib.loads((SCRIPT.parents[1] / "configs" / "fedagent-paper.toml").read_text())
    p = r["paper_round"]
    assert p["clients"] == preset["clients-per-round"] and p["local_epochs"] == preset["local-epochs"]
    assert p["episodes_per_epoch"] == 64 * preset["group-size"] and p["overrides"] == {"tasks-per-epoch": 64}
    batches = -(-p["episodes_per_epoch"] // preset["rollout-batch-size"])
    assert p["token_steps_per_epoch"] == preset["max-steps"] * batches * preset["max-new-tokens"]
    # the rollout scales with the token steps at this run's cost per step
    assert p["epoch_rollout_s"] == pytest.approx(p["token_steps_per_epoch"] * r["rollout_s"] / r["token_steps"], rel=0.01)
    assert p["client_s"] > p["local_epochs"] * p["epoch_rollout_s"]
    assert p["round_s_clients_in_turn"] == pytest.approx(p["clients"] * p["client_s"], rel=0.01)
    text = load_script("gpu_round").format_report(r)
    assert "ms per token step (static engine" in text and "bandwidth bound" in text and "model FLOP utilisation" in text
    assert "paper round (fedagent-paper.toml, tasks-per-epoch=64" in text and "with a card each" in text
