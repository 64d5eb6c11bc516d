"""benchmarks/gpu_round.py runs on CPU at the tiny shape, so the GPU benchmark cannot rot between GPU sessions."""

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from benchmark_scripts import load_script
from fedagent_flwr.methods.memory import memory_plans

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
    # passes of 2 rows: 2 a minibatch in the update; 4 in each of the old-policy and KL-reference sweeps
    assert (r["update_micro_batches"], r["logprob_micro_batches"]) == (4, 8) and r["largest_update_pass_tokens"] > 2
    # every pass pads its rows to its longest; samples of one episode differ in length, so some padding is computed
    assert 0 < r["update_padding_fraction"] < 0.5 and 0 < r["logprob_padding_fraction"] < 0.5
    assert r["adamw_fused"] is False  # the fused kernel on a GPU only
    assert r["fraction_of_a_trained_tensor_moved"] > 0.99  # fp32 weights move at lr 1e-6
    assert set(r["peak_bytes"]) == {"rollout", "update", "transfer"} and min(r["peak_bytes"].values()) > 0
    assert r["plan_bytes"]["total"] > 0 and r["plan_bytes"]["weights (fp32)"] == 4 * r["parameters"]
    assert r["bytes_sent"] == 4 * r["parameters"]  # the tied head travels once
    # decode speed beside the bandwidth bound: fp32 on CPU, so 4 bytes a weight (the tied head read once)
    assert r["decode_engine"] == "auto" and r["decode_kernels"] == "eager" and 0 < r["token_steps"] <= 2 * 16  # 2 sampler calls of at most 16 steps
    assert r["decode_ms_per_token_step"] > 0 and r["rows_per_step"] == 4
    bound = r["decode_bound"]
    assert bound["weight_bytes"] == 4 * r["parameters"] and bound["kv_bytes"] > 0
    assert bound["bound_ms"] == pytest.approx((bound["weight_bytes"] + bound["kv_bytes"]) / 3.35e12 * 1e3)
    assert "paper_round" not in r
    # the hf engine (auto on CPU) has no decoder start to time apart
    assert r["step_ms_per_token_step"] is None and r["prefill_positions"] == 0 and r["prefill_mfu"] == 0
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
    # its start timed apart from its token steps: the prefill, no graphs on a CPU, and what the prefill computed
    assert r["prefill_s"] > 0 and r["capture_s"] == 0 and r["graphs_captured"] == 0
    assert 0 < r["step_ms_per_token_step"] < r["decode_ms_per_token_step"]
    assert 0 < r["prefill_positions"] <= r["prefill_positions_whole"]
    assert 0 <= r["prefill_shared_fraction"] < 1 and r["prefill_mean_group_prefix"] >= 0
    # the prefill's FLOPs: every position through the layers (the tied embedding and head matrix left out)
    assert 0 < r["body_parameters"] < r["parameters"]
    flops = 2 * r["body_parameters"] * r["prefill_positions"]
    seconds = (r["prefill_s"] - 5e-4, r["prefill_s"] + 5e-4)  # the report rounds seconds to 3 decimals
    assert flops / (seconds[1] * 989e12) <= r["prefill_mfu"] <= flops / (seconds[0] * 989e12)
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
    assert "of which prefill" in text and "positions computed" in text and "% of their positions padding" in text
    assert "paper round (fedagent-paper.toml, tasks-per-epoch=64" in text and "with a card each" in text


def test_auto_rollout_rows_are_resolved_as_a_client_resolves_them():
    """rollout-batch-size=0: the most rows whose memory plan fits client-memory-gb (here a budget between the plans
    of 1 and 4 rows), not an epoch's episodes; the rollout runs at those rows and the plan printed is theirs."""
    import torch

    from envs import make_env
    from fedagent_flwr.agent.engine.memory import GB, ModelShape
    from fedagent_flwr.agent.models.shaped_model import environment_tokenizer
    from fedagent_flwr.config import RunConfig
    from fedagent_flwr.simulation import parse_overrides
    from fedagent_flwr.methods.memory import context_tokens

    gpu_round = load_script("gpu_round")
    # device cpu here and in the script: on a GPU machine auto would plan for bf16 and the static decoder
    cfg = RunConfig.from_run_config(gpu_round.PAPER_ROUND | parse_overrides(SMALL[1::2])
                                    | {"rollout-batch-size": 0, "device": "cpu"})
    tokenizer = environment_tokenizer(cfg.env)
    env = make_env(cfg.env, cfg.max_steps)
    shape = ModelShape.of(gpu_round.build_model("tiny", tokenizer, torch.device("cpu"), 0).config)
    context = context_tokens(cfg, tokenizer, env, env.tasks_of_split("test")[:16])
    one, four = (memory_plans(cfg, shape, context, rows)[0].total for rows in (1, 4))
    budget = (one + four) / 2
    r = _run("--device", "cpu", "--set", "rollout-batch-size=0", "--set", f"client-memory-gb={budget / GB!r}")
    assert 1 <= r["rollout_rows"] < 4 == r["episodes"]
    assert r["rows_per_step"] == r["rollout_rows"]  # every generate call ran at the resolved rows
    assert r["plan_bytes"]["total"] <= budget
    # no budget on a CPU: an epoch's episodes, as a client without client-memory-gb plays them
    assert _run("--device", "cpu", "--set", "rollout-batch-size=0")["rollout_rows"] == 4


def test_a_paper_round_with_auto_rows_takes_the_measured_rows_and_says_when_the_preset_differs():
    gpu_round = load_script("gpu_round")
    measured = {"rollout_rows": 256, "mean_prompt_tokens": 180.0, "rollout_s": 10.0, "token_steps": 1000,
                "logprobs_s": 1.0, "update_s": 2.0, "sample_tokens": 10_000, "transfer_s": 1.0}
    preset = tomllib.loads(gpu_round.PAPER_PRESET.read_text())
    p = gpu_round.paper_round(measured, {"tasks-per-epoch": 64, "rollout-batch-size": 0})
    assert p["rollout_batch_size"] == 256 and p["rollout_rows_as_measured"]
    assert p["token_steps_per_epoch"] == preset["max-steps"] * 2 * preset["max-new-tokens"]  # 512 episodes, 2 calls
    assert p["epoch_rollout_s"] == pytest.approx(p["token_steps_per_epoch"] * 10.0 / 1000, abs=0.1)
    # the preset's own rows (128) against a run measured at 256: the estimate says its step cost is assumed
    p = gpu_round.paper_round(measured, {"tasks-per-epoch": 64})
    assert p["rollout_batch_size"] == preset["rollout-batch-size"] != 256 and not p["rollout_rows_as_measured"]
    report = {**measured, "paper_round": p}
    assert "is not the measured one (256)" in gpu_round.format_report(_with_report_fields(report))


def _with_report_fields(r: dict) -> dict:
    """A measured round's other fields, so format_report can print a fabricated one."""
    return {"plan_bytes": {"total": 1}, "peak_bytes": {"update": 1}, "shape": "tiny", "parameters": 1, "device": "cpu",
            "finetuning": "full", "precision": "fp32", "gradient_checkpointing": False, "checkpointed_layers": 0.0,
            "transfer_dtype": "fp32",
            "episodes": 512, "agent_steps": 1, "generated_tokens": 1, "generated_tokens_per_s": 1.0,
            "optimizer_steps": 1, "grad_norm": 1.0, "fraction_of_a_trained_tensor_moved": 1.0, "bytes_sent": 1,
            "wire_bytes_sent": 1, "peak_bytes_measured_by": "cuda allocator", "peak_flops": 1.0, "update_mfu": 0.1,
            "update_tflops_per_s": 1.0, "logprobs_mfu": 0.1, "logprobs_tflops_per_s": 1.0, "logprob_passes": 1,
            "update_micro_batches": 1, "logprob_micro_batches": 1, "largest_update_pass_tokens": 1,
            "update_padding_fraction": 0.0, "logprob_padding_fraction": 0.0,
            "decode_ms_per_token_step": 1.0, "decode_engine": "static", "rows_per_step": 1.0,
            "rollout_ms_per_token_step": 1.0, "context_tokens": 1.0,
            "decode_bound": {"bound_ms": 1.0, "weight_bytes": 1, "kv_bytes": 1, "bandwidth": 1.0}} | r


def test_auto_checkpointing_in_a_round_checkpoints_by_the_client_budget():
    """gradient-checkpointing=auto: with no memory known every layer is checkpointed; with a budget far above the
    plan none is (the tiny round's micro-batches fit whole), and the report says what share was."""
    r = _run("--device", "cpu", "--set", "gradient-checkpointing=auto")
    assert r["gradient_checkpointing"] == "auto" and r["checkpointed_layers"] == 1.0
    roomy = _run("--device", "cpu", "--set", "gradient-checkpointing=auto", "--set", "client-memory-gb=64")
    assert roomy["checkpointed_layers"] == 0.0 and roomy["optimizer_steps"] == 2
    text = load_script("gpu_round").format_report(roomy)
    assert "gradient checkpointing auto (0% of layer passes checkpointed)" in text


def test_a_round_with_token_budgets_runs_one_pass_a_minibatch_and_says_so():
    r = _run("--set", "micro-batch-tokens=100000", "--set", "logprob-micro-batch-tokens=100000")
    assert (r["update_micro_batches"], r["logprob_micro_batches"], r["optimizer_steps"]) == (2, 2, 2)
    assert r["update_settings"]["micro-batch-tokens"] == 100000
    assert "2 forward/backward passes, the largest" in load_script("gpu_round").format_report(r)


def test_a_paper_round_says_which_update_settings_it_was_not_measured_at():
    """The estimate scales the measured log-prob and update times; where the measured run's settings for them differ
    from the preset's (the round benchmark's fast settings keep every activation; the preset checkpoints), it says so."""
    gpu_round = load_script("gpu_round")
    preset = tomllib.loads(gpu_round.PAPER_PRESET.read_text())
    settings = {k: preset[k] for k in gpu_round.UPDATE_KEYS if k in preset}
    measured = {"rollout_rows": 128, "mean_prompt_tokens": 180.0, "rollout_s": 10.0, "token_steps": 1000,
                "logprobs_s": 1.0, "update_s": 2.0, "sample_tokens": 10_000, "transfer_s": 1.0}
    # the preset's param-dtype = "auto" is the bf16 working copy on a GPU and fp32 on a CPU; a round reports what ran
    assert settings["param-dtype"] == "auto"
    settings["param-dtype"] = "bf16"
    same = gpu_round.paper_round({**measured, "device": "NVIDIA H100 80GB HBM3", "update_settings": settings})
    assert same["update_settings_unlike_preset"] == {}
    on_cpu = gpu_round.paper_round({**measured, "device": "cpu", "update_settings": settings})
    assert on_cpu["update_settings_unlike_preset"] == {"param-dtype": {"measured": "bf16", "preset": "fp32"}}
    measured["device"] = "NVIDIA H100 80GB HBM3"
    fast = {**settings, "gradient-checkpointing": False, "micro-batch-size": 16}
    p = gpu_round.paper_round({**measured, "update_settings": fast})
    assert p["update_settings_unlike_preset"] == {
        "gradient-checkpointing": {"measured": False, "preset": preset["gradient-checkpointing"]},
        "micro-batch-size": {"measured": 16, "preset": preset["micro-batch-size"]}}
    text = gpu_round.format_report(_with_report_fields({**measured, "paper_round": p}))
    assert (f"timed at settings the preset does not have: gradient-checkpointing false (preset "
            f"{str(preset['gradient-checkpointing']).lower()}), micro-batch-size 16 (preset {preset['micro-batch-size']})") in text
