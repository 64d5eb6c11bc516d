"""benchmarks/decode_profile.py runs on CPU at the tiny shape, so the GPU profile cannot rot between GPU sessions."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from benchmark_scripts import load_script

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "decode_profile.py"


def test_tiny_profile_reports_both_engines_beside_the_bound():
    done = subprocess.run([sys.executable, str(SCRIPT), "--shape", "tiny", "--json", "--threads", "1", "--batch", "8",
                           "--prompt-tokens", "24", "--new-tokens", "6", "--repeats", "1", "--compile"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    r = json.loads(done.stdout.strip().splitlines()[-1])
    assert r["device"] == "cpu" and r["precision"] == "fp32" and r["value_bytes"] == 4
    assert [e["engine"] for e in r["engines"]] == ["hf", "static", "static-compile"]
    for e in r["engines"]:
        assert e["ms_per_token_step"] > 0 and e["aten_calls_per_step"] > 0
        assert e["kernel_launches_per_step"] is None  # no kernels to launch on a CPU
        assert e["ops"]["aten::mm"]["calls"] > 0
    # the static engine keeps its cache in place: no torch.cat on the KV cache per layer, as the hf engine does
    static = r["engines"][1]
    assert static["ops"].get("aten::index_copy_", {}).get("calls", 0) >= 2 * 2  # 2 layers x (k, v)
    # the bound: the tiny shape's weights (tied head read once) and 8 rows' KV cache, 2 layers x 2 KV heads x 16
    b = r["bound"]
    assert b["weight_bytes"] == 4 * r["parameters"]
    assert b["kv_bytes"] == int(8 * r["context_tokens"] * 2 * 2 * 2 * 16 * 4)
    assert b["bound_ms"] == pytest.approx((b["weight_bytes"] + b["kv_bytes"]) / b["bandwidth"] * 1e3)
    assert r["context_tokens"] == pytest.approx(23.5 + 2.5)  # prompts of 24 and 23 tokens, then 5 fed tokens / 2
    assert r["first_token_logprob_gap"] < 1e-4  # fp32: the static engine is the transformers forward
    assert r["replay_logprob_gap"] < 1e-4 and "bucketed" in r["replay_gap_between"]
    # rollout.kernels=compile: the same numbers from fewer operator calls (each layer half's element-wise work fused)
    assert r["compile_logprob_gap"] < 1e-4 and r["compile_check_s"] > 0
    assert r["engines"][2]["aten_calls_per_step"] < 0.8 * static["aten_calls_per_step"]

    module = load_script("decode_profile")
    text = module.format_report(r)
    assert "bandwidth bound" in text and "self CPU us per step" in text and "static-compile" in text
    assert "rollout.kernels=compile vs eager kernels" in text


def test_a_run_configs_model_is_profiled_with_its_adapter_attached():
    """--run-config: the run's model as its client loads it, its LoRA adapter attached (Fed-SE explores with one)."""
    from fedagent_flwr.agent.engine.memory import ModelShape
    from fedagent_flwr.agent.models.loading import load_agent
    
    from fedagent_flwr.config import RunConfig
    from fedagent_flwr.simulation import read_run_config_file

    preset = Path(__file__).resolve().parents[2] / "configs" / "fedse-cpu.toml"
    # precision set: under auto this spawned process would measure its processor (agent/engine/cpu_rates.py)
    done = subprocess.run([sys.executable, str(SCRIPT), "--run-config", str(preset), "--set", "precision=fp32", "--json", "--threads", "1",
                           "--batch", "4", "--prompt-tokens", "20", "--new-tokens", "3", "--repeats", "1",
                           "--profile-tokens", "0"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    r = json.loads(done.stdout.strip().splitlines()[-1])
    cfg = RunConfig.from_run_config(RunConfig().to_run_config() | read_run_config_file(str(preset)))
    base = load_agent(cfg.model, cfg.env, "cpu").model
    adapter = ModelShape.of(base.config).lora_parameters(cfg.lora.r, cfg.lora.targets)
    assert r["shape"] == cfg.model and r["precision"] == "fp32"
    assert r["parameters"] == sum(p.numel() for p in base.parameters()) + adapter > adapter > 0
    assert [e["engine"] for e in r["engines"]] == ["hf", "static"]
    assert r["first_token_logprob_gap"] < 1e-4  # B = 0: the adapter adds nothing, merged or not

    bad = subprocess.run([sys.executable, str(SCRIPT), "--run-config", str(preset), "--precision", "fp32"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "--set precision=" in bad.stderr
