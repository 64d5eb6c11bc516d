"""benchmarks/gpu_round.py runs on CPU at the tiny shape, so the GPU benchmark cannot rot between GPU sessions."""

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from envs import env_class
from benchmark_scripts import load_script
from conftest import planned
from flwr.common.config import flatten_dict  # a preset's sections as the dotted keys Flower reads

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_round.py"
SMALL = ["--set", "grpo.tasks-per-epoch=2", "--set", "grpo.num-generations=2", "--set", "rollout.max-steps=2", "--set", "rollout.max-completion-length=16",
         "--set", "grpo.mini-batch-size=4", "--set", "grpo.ppo-micro-batch-size-per-gpu=2"]


def _run(*extra: str, small: list[str] = SMALL) -> dict:
    done = subprocess.run([sys.executable, str(SCRIPT), "--shape", "tiny", "--json", *small, *extra],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_tiny_round_reports_every_phase_with_the_plan_beside_the_peak():
    r = _run()
    assert r["episodes"] == 4 and r["agent_steps"] == 8  # a random model plays every episode to rollout.max-steps
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
    assert r["decode_engine"] == "hf" and r["decode_kernels"] == "eager" and 0 < r["token_steps"] <= 2 * 16  # 2 sampler calls of at most 16 steps
    assert r["decode_ms_per_token_step"] > 0 and r["rows_per_step"] == 4
    bound = r["decode_bound"]
    assert bound["weight_bytes"] == 4 * r["parameters"] and bound["kv_bytes"] > 0
    assert bound["bound_ms"] == pytest.approx((bound["weight_bytes"] + bound["kv_bytes"]) / 3.35e12 * 1e3)
    assert "paper_rounds" not in r
    # the hf engine (auto on CPU) has no decoder start to time apart
    assert r["step_ms_per_token_step"] is None and r["prefill_positions"] == 0 and r["prefill_mfu"] == 0
    # model FLOP utilisation: unchunked log-probs run the (tied) head at every token, so every parameter counts at
    # every sample token, 3 passes to train
    assert r["logprob_passes"] >= 1 and r["peak_flops"] == 989e12
    f = r["flop_count"]
    assert f["head_scores"] == "every token" and f["body_parameters"] + f["head_parameters"] == r["parameters"]
    flops = 2 * r["parameters"] * r["sample_tokens"] * 3
    assert f["update_flops"] == flops == f["update_flops_counted_before"]
    assert r["update_tflops_per_s"] == pytest.approx(flops / r["update_s"] / 1e12, rel=0.02)
    assert r["update_mfu"] == pytest.approx(r["update_tflops_per_s"] * 1e12 / 989e12, rel=1e-6)
    assert 0 < r["logprobs_mfu"] < 1
    # the run's own settings travel with it (raw_output.py files them)
    assert r["run_config"]["rollout.max-steps"] == 2 and r["settings"]["shape"] == "tiny" and r["env"] == "webshop"
    # the prompts a paper-round estimate plays without the model come out as long as the random model's
    played = load_script("gpu_round").played_prompt_tokens(r["run_config"], "tiny", tasks=2, seed=0)
    assert played == pytest.approx(r["mean_prompt_tokens"], rel=0.05)


@pytest.mark.parametrize("precision", ["bf16-mixed"])
def test_tiny_lora_round_sends_the_adapter_in_bf16(precision):
    r = _run("--set", "grpo.finetuning=lora", "--set", "lora.r=4", "--set", f"precision={precision}",
             "--set", "federation.transfer-dtype=bf16", "--set", "engine.gradient-checkpointing=true")
    adapter = r["plan_bytes"]["adapter (fp32)"] // 4
    assert r["bytes_sent"] == 2 * adapter > 0
    assert r["optimizer_steps"] == 2 and r["precision"] == precision


@pytest.mark.slow  # a round on the static engine in a subprocess: among the default run's slowest
def test_tiny_round_on_the_static_engine_estimates_a_paper_round():
    r = _run("--decode-engine", "static", "--paper-round", "--paper-set", "grpo.tasks-per-epoch=64", "--bandwidth", "1e12",
             "--set", "engine.logprob-chunk-tokens=8")
    assert r["decode_engine"] == "static" and r["agent_steps"] == 8 and r["decode_ms_per_token_step"] > 0
    assert r["decode_bound"]["bandwidth"] == 1e12
    # its start timed apart from its token steps: the prefill, no graphs on a CPU, and what the prefill computed
    assert r["prefill_s"] > 0 and r["capture_s"] == 0 and r["graphs_captured"] == 0
    assert 0 < r["step_ms_per_token_step"] < r["decode_ms_per_token_step"]
    assert 0 < r["prefill_positions"] <= r["prefill_positions_whole"]
    assert 0 <= r["prefill_shared_fraction"] < 1 and r["prefill_mean_group_prefix"] >= 0
    # the prefill's FLOPs: the layers at every position holding a token (padding left out), the head at each distinct
    # prompt's last position, less the tiny shape's last output projection and MLP (64 x 64 and 3 x 64 x 128) at the
    # group prefixes' positions, where the prefix pass stops after the last layer's q/k/v
    assert 0 < r["body_parameters"] < r["parameters"]
    f = r["flop_count"]
    assert 0 < r["prefill_token_positions"] <= r["prefill_positions"] and 0 <= r["prefill_padding_fraction"] < 1
    flops = 2 * (f["body_parameters"] * r["prefill_token_positions"] + f["head_parameters"] * r["prefill_scored_prompts"]
                 - (64 * 64 + 3 * 64 * 128) * r["prefill_prefix_positions"])
    assert r["prefill_flops"] == flops and r["prefill_prefix_positions"] > 0
    seconds = (r["prefill_s"] - 5e-4, r["prefill_s"] + 5e-4)  # the report rounds seconds to 3 decimals
    assert flops / (seconds[1] * 989e12) <= r["prefill_mfu"] <= flops / (seconds[0] * 989e12)
    # chunked log-probs: the head at the completion tokens only, fewer FLOPs than the count before issue 54 made
    assert f["head_scores"] == "completion tokens" and f["completion_tokens"] == r["generated_tokens"]
    assert f["update_flops"] == 2 * 3 * (f["body_parameters"] * r["sample_tokens"] + f["head_parameters"] * r["generated_tokens"])
    assert f["update_flops"] < f["update_flops_counted_before"] == 2 * 3 * r["parameters"] * r["sample_tokens"]
    assert r["update_tflops_per_s"] == pytest.approx(f["update_flops"] / r["update_s"] / 1e12, rel=0.02)
    preset = flatten_dict(tomllib.loads((SCRIPT.parents[1] / "configs" / "fedagent-paper.toml").read_text()))
    preset["rollout.max-steps"] = preset["rollout.max-steps"] or env_class(preset["env"]).default_max_steps  # 0: the env's own
    assert list(r["paper_rounds"]) == ["alfworld", "webshop"] == [preset["env"], "webshop"]
    p = r["paper_rounds"]["alfworld"]
    assert p["clients"] == preset["clients-per-round"] and p["local_epochs"] == preset["grpo.local-epochs"]
    assert p["episodes_per_epoch"] == 64 * preset["grpo.num-generations"] and p["overrides"] == {"grpo.tasks-per-epoch": 64}
    batches = -(-p["episodes_per_epoch"] // preset["rollout.generation-batch-size"])
    assert p["token_steps_per_epoch"] == preset["rollout.max-steps"] * batches * preset["rollout.max-completion-length"]
    # the rollout scales with the token steps at this run's cost per step
    assert p["epoch_rollout_s"] == pytest.approx(p["token_steps_per_epoch"] * r["rollout_s"] / r["token_steps"], rel=0.01)
    assert p["client_s"] > p["local_epochs"] * p["epoch_rollout_s"]
    assert p["round_s_clients_in_turn"] == pytest.approx(p["clients"] * p["client_s"], rel=0.01)
    # ALFWorld's prompts, played by random tokens: longer than the measured WebShop round's
    assert p["mean_prompt_tokens"] > r["mean_prompt_tokens"] and "played with random tokens" in p["prompt_tokens_from"]
    w = r["paper_rounds"]["webshop"]
    assert (w["max_steps"], w["max_new_tokens"], w["episodes_per_epoch"]) == (15, 128, 64 * preset["grpo.num-generations"])
    assert {t["key"]: t["used"] for t in w["settings_unlike_preset"]}["rollout.max-steps"] == 15
    text = load_script("gpu_round").format_report(r)
    assert "ms per token step (static engine" in text and "bandwidth bound" in text and "model FLOP utilisation" in text
    assert "of which prefill" in text and "positions computed" in text and "% of their positions padding" in text
    assert "paper round on alfworld (fedagent-paper.toml, grpo.tasks-per-epoch=64" in text and "with a card each" in text
    assert "paper round on webshop (fedagent-paper.toml with webshop's settings, grpo.tasks-per-epoch=64" in text
    assert "settings the estimate used that are not the preset's:" in text


def test_auto_rollout_rows_are_resolved_as_a_client_resolves_them():
    """rollout.generation-batch-size=0: the most rows whose memory plan fits engine.client-memory-gb (here a budget between the plans
    of 24 and 25 rows, both peaking while decoding beside a small update), not an epoch's 48 episodes; the rollout runs
    at those rows and the plan printed is theirs."""
    import torch

    from envs import make_env
    from fedagent_flwr.agent.engine.memory import GB, ModelShape
    from fedagent_flwr.agent.models.shaped_model import environment_tokenizer
    from fedagent_flwr.config import RunConfig
    from fedagent_flwr.simulation import parse_overrides
    from fedagent_flwr.methods.placement import context_tokens

    gpu_round = load_script("gpu_round")
    # an update of one row a pass and 4-token log-prob chunks, so that 24 rows' rollout is the plan's peak
    values = parse_overrides(SMALL[1::2]) | {"grpo.tasks-per-epoch": 6, "grpo.num-generations": 8, "grpo.ppo-micro-batch-size-per-gpu": 1,
                                             "grpo.log-prob-micro-batch-size-per-gpu": 1, "engine.logprob-chunk-tokens": 4}
    small_update = [a for k, v in values.items() for a in ("--set", f"{k}={v}")]
    # device cpu here and in the script: on a GPU machine auto would plan for bf16 and the static decoder
    cfg = RunConfig.from_run_config(gpu_round.PAPER_ROUND | values | {"rollout.generation-batch-size": 0, "device": "cpu"})
    tokenizer = environment_tokenizer(cfg.env)
    env = make_env(cfg.env, cfg.rollout.max_steps)
    shape = ModelShape.of(gpu_round.build_model("tiny", tokenizer, torch.device("cpu"), 0).config)
    context = context_tokens(cfg, tokenizer, env, env.tasks_of_split("test")[:16])
    low, high = (planned(cfg, shape, context, rows) for rows in (24, 25))
    assert low.peak("decode") > low.peak("update")
    budget = (low.total + high.total) / 2
    r = _run("--device", "cpu", "--set", "rollout.generation-batch-size=0", "--set", f"engine.client-memory-gb={budget / GB!r}",
             small=small_update)
    assert r["rollout_rows"] == 24 and r["episodes"] == 48
    assert r["rows_per_step"] == r["rollout_rows"]  # every generate call ran at the resolved rows
    assert r["plan_bytes"]["total"] <= budget
    # no budget on a CPU: an epoch's episodes, as a client without engine.client-memory-gb plays them
    assert _run("--device", "cpu", "--set", "rollout.generation-batch-size=0")["rollout_rows"] == 4


def _measured(**over) -> dict:
    """A fabricated measured round: what paper_round reads. 10,000 sample tokens of which 2,000 completions, on a
    shape of 1,000 body and 100 head parameters with chunked log-probs; 2 log-prob passes, full training."""
    flops = {"body_parameters": 1000, "head_parameters": 100, "head_scores": "completion tokens", "update_passes": 3.0,
             "logprob_passes": 2}
    flops["update_flops"] = 2 * 3.0 * (1000 * 10_000 + 100 * 2_000)
    flops["logprob_flops"] = 2 * 2 * (1000 * 10_000 + 100 * 2_000)
    return {"rollout_rows": 128, "mean_prompt_tokens": 180.0, "rollout_s": 10.0, "token_steps": 1000,
            "logprobs_s": 1.0, "update_s": 2.0, "sample_tokens": 10_000, "transfer_s": 1.0, "env": "webshop",
            "device": "NVIDIA H100 80GB HBM3", "flop_count": flops} | over


def test_a_paper_round_with_auto_rows_takes_the_measured_rows_and_says_when_the_preset_differs():
    gpu_round = load_script("gpu_round")
    measured = _measured(rollout_rows=256)
    preset = flatten_dict(tomllib.loads(gpu_round.PAPER_PRESET.read_text()))
    preset["rollout.max-steps"] = preset["rollout.max-steps"] or env_class(preset["env"]).default_max_steps  # 0: the env's own
    p = gpu_round.paper_round(measured, {"grpo.tasks-per-epoch": 64, "rollout.generation-batch-size": 0})
    assert p["rollout_batch_size"] == 256 and p["rollout_rows_as_measured"]
    assert p["token_steps_per_epoch"] == preset["rollout.max-steps"] * 2 * preset["rollout.max-completion-length"]  # 512 episodes, 2 calls
    assert p["epoch_rollout_s"] == pytest.approx(p["token_steps_per_epoch"] * 10.0 / 1000, abs=0.1)
    rows = {t["key"]: t for t in p["settings_unlike_preset"]}
    assert rows["rollout.generation-batch-size"]["used"] == 256 and "auto" in rows["rollout.generation-batch-size"]["from"]
    # the preset's own rows (128) against a run measured at 256: the estimate says its step cost is assumed
    p = gpu_round.paper_round(measured, {"grpo.tasks-per-epoch": 64})
    assert p["rollout_batch_size"] == preset["rollout.generation-batch-size"] != 256 and not p["rollout_rows_as_measured"]
    report = {**measured, "paper_rounds": {"alfworld": p}}
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


def _tiny_config(tied: bool):
    from transformers import AutoConfig

    return AutoConfig.for_model("qwen2", hidden_size=8, intermediate_size=16, num_attention_heads=2,
                                num_key_value_heads=1, num_hidden_layers=1, vocab_size=10, tie_word_embeddings=tied)


@pytest.mark.parametrize("tied", [True, False])
def test_model_flops_count_the_head_only_at_the_positions_it_scores(tied):
    """By hand, a Qwen2 of hidden 8, MLP 16, 2 query heads of 4 and 1 KV head, 1 layer, vocabulary 10. The layer:
    q 8 x 8 + 8 bias, k and v 8 x 4 + 4 each, o 8 x 8, MLP 3 x 8 x 16, two norms of 8: 608; the final norm 8; so
    the body is 616. The head is 10 x 8 = 80, the input embedding another 80 when untied (a lookup: no FLOPs).
    Two samples: prompts of 5 and 2 tokens, completions of 3 and 4: 14 tokens, 7 of them completions."""
    from fedagent_flwr.agent.training.advantages import StepSample

    gpu_round = load_script("gpu_round")
    config = _tiny_config(tied)
    assert gpu_round.FlopShape.of(config) == gpu_round.FlopShape(body=616, head=80)
    samples = [StepSample([1] * 5, [2] * 3, 1.0), StepSample([1] * 2, [2] * 4, -1.0)]
    # chunked: the body at 14 positions, the head at the 7 it scores; 3 passes to train, 2 for LoRA or 2 log-prob passes
    assert gpu_round.sample_flops(config, samples, 1024, 3.0) == 2 * 3 * (616 * 14 + 80 * 7) == 55_104
    assert gpu_round.sample_flops(config, samples, 1024, 2.0) == 2 * 2 * (616 * 14 + 80 * 7) == 36_736
    # unchunked: full logits, the head at all 14 positions
    assert gpu_round.sample_flops(config, samples, 0, 3.0) == 2 * 3 * (616 + 80) * 14 == 58_464
    # the count before issue 54 (2 x every parameter x every token x passes) made more of both:
    parameters = 696 if tied else 776
    assert gpu_round.ModelShape.of(config).parameters == parameters
    before = 2 * parameters * 14 * 3
    assert before > gpu_round.sample_flops(config, samples, 1024, 3.0)
    assert (before > gpu_round.sample_flops(config, samples, 0, 3.0)) is not tied  # tied and unchunked: the same


def test_a_paper_round_scales_the_passes_by_their_flops_at_the_estimates_own_lengths():
    """ALFWorld's round at 300-token prompts and 512 new tokens, from a run measured at 180 + 128 tokens: the update
    and log-prob times scale by the model FLOPs of the estimate's samples (head at the completion tokens)."""
    gpu_round = load_script("gpu_round")
    preset = flatten_dict(tomllib.loads(gpu_round.PAPER_PRESET.read_text()))
    preset["rollout.max-steps"] = preset["rollout.max-steps"] or env_class(preset["env"]).default_max_steps  # 0: the env's own
    p = gpu_round.paper_round(_measured(), env="alfworld", prompt_tokens=300.0)
    samples = preset["grpo.tasks-per-epoch"] * preset["grpo.num-generations"] * preset["rollout.max-steps"]  # 8 x 8 x 50 = 3,200
    per_sample = 2 * (1000 * (300 + 512) + 100 * 512)  # one forward-equivalent pass
    assert p["samples_per_epoch"] == samples and p["mean_prompt_tokens"] == 300.0 and p["logprob_passes_per_epoch"] == 2
    assert p["epoch_update_s"] == pytest.approx(samples * per_sample * 3 * 2.0 / _measured()["flop_count"]["update_flops"], abs=0.1)
    assert p["epoch_logprobs_s"] == pytest.approx(samples * per_sample * 2 * 1.0 / _measured()["flop_count"]["logprob_flops"], abs=0.1)
    # one minibatch and no KL: no log-prob pass
    p = gpu_round.paper_round(_measured(), {"grpo.mini-batch-size": 10**6, "grpo.beta": 0.0}, prompt_tokens=300.0)
    assert p["logprob_passes_per_epoch"] == 0 and p["epoch_logprobs_s"] == 0


def test_a_paper_round_on_each_environment_tables_the_settings_it_used_that_are_not_the_presets():
    """The preset is ALFWorld's; WebShop's round takes WebShop's steps and answer budget (no WebShop preset exists);
    both take --paper-set's values and the measured run's timing settings, and each says so, key by key."""
    gpu_round = load_script("gpu_round")
    preset = flatten_dict(tomllib.loads(gpu_round.PAPER_PRESET.read_text()))
    preset["rollout.max-steps"] = preset["rollout.max-steps"] or env_class(preset["env"]).default_max_steps  # 0: the env's own
    assert preset["env"] == "alfworld" and gpu_round.paper_envs() == ["alfworld", "webshop"]
    timing = gpu_round.resolved_settings(preset, "cuda")
    # the preset's engine.param-dtype and precision "auto" are the bf16 working copy under bf16-mixed on a GPU
    assert (timing["engine.param-dtype"], timing["precision"], timing["rollout.name"]) == ("bf16", "bf16-mixed", "static")
    same = gpu_round.paper_round(_measured(env="alfworld", timing_settings=timing), prompt_tokens=300.0)
    assert same["settings_unlike_preset"] == []
    fast = timing | {"engine.gradient-checkpointing": False, "grpo.ppo-micro-batch-size-per-gpu": 32}
    measured = _measured(timing_settings=fast)
    rounds = {env: gpu_round.paper_round(measured, {"grpo.tasks-per-epoch": 64}, env=env, prompt_tokens=300.0)
              for env in gpu_round.paper_envs()}
    table = {env: {t["key"]: (t["preset"], t["used"], t["from"]) for t in p["settings_unlike_preset"]}
             for env, p in rounds.items()}
    timed = "the measured run (its phases were timed at it)"
    common = {"grpo.tasks-per-epoch": (8, 64, "--paper-set"),
              "engine.gradient-checkpointing": (True, False, timed), "grpo.ppo-micro-batch-size-per-gpu": (16, 32, timed)}
    assert table["alfworld"] == common | {"env": ("alfworld", "webshop", table["alfworld"]["env"][2])}
    assert "timed on webshop, priced alfworld's counts" in table["alfworld"]["env"][2]
    no_preset = "webshop's settings: no webshop preset exists (fedagent-paper.toml is alfworld's)"
    assert table["webshop"] == common | {"env": ("alfworld", "webshop", no_preset), "rollout.max-steps": (50, 15, no_preset),
                                         "rollout.max-completion-length": (512, 128, no_preset)}
    assert (rounds["webshop"]["max_steps"], rounds["alfworld"]["max_steps"]) == (15, 50)
    # a --paper-set value for a key the phases were timed at cannot change the times: the table says so
    p = gpu_round.paper_round(measured, {"grpo.ppo-micro-batch-size-per-gpu": 8}, prompt_tokens=300.0)
    assert [t["from"] for t in p["settings_unlike_preset"] if t["key"] == "grpo.ppo-micro-batch-size-per-gpu"] == [
        timed + "; --paper-set grpo.ppo-micro-batch-size-per-gpu=8 not applied: no phase was timed at it"]
    # on a CPU the preset's auto is fp32 and the hf engine
    on_cpu = gpu_round.paper_round(_measured(env="alfworld", device="cpu", timing_settings=timing), prompt_tokens=300.0)
    assert {t["key"]: t["preset"] for t in on_cpu["settings_unlike_preset"]} == {
        "precision": "fp32", "engine.param-dtype": "fp32", "rollout.name": "hf"}
    text = gpu_round.format_report(_with_report_fields({**measured, "flop_count": measured["flop_count"],
                                                        "paper_rounds": rounds}))
    assert "paper round on webshop (fedagent-paper.toml with webshop's settings, grpo.tasks-per-epoch=64" in text
    assert "settings the estimate used that are not the preset's:" in text
    assert any(line.split()[:3] == ["rollout.max-completion-length", "512", "128"] for line in text.splitlines())
    assert any(line.split()[:3] == ["engine.gradient-checkpointing", "true", "false"] for line in text.splitlines())


def test_auto_checkpointing_in_a_round_checkpoints_by_the_client_budget():
    """engine.gradient-checkpointing=auto: with no memory known every layer is checkpointed; with a budget far above the
    plan none is (the tiny round's micro-batches fit whole), and the report says what share was."""
    r = _run("--device", "cpu", "--set", "engine.gradient-checkpointing=auto")
    assert r["gradient_checkpointing"] == "auto" and r["checkpointed_layers"] == 1.0
    roomy = _run("--device", "cpu", "--set", "engine.gradient-checkpointing=auto", "--set", "engine.client-memory-gb=64")
    assert roomy["checkpointed_layers"] == 0.0 and roomy["optimizer_steps"] == 2
    text = load_script("gpu_round").format_report(roomy)
    assert "gradient checkpointing auto (0% of layer passes checkpointed)" in text


def test_a_round_with_token_budgets_runs_one_pass_a_minibatch_and_says_so():
    r = _run("--set", "grpo.ppo-max-token-len-per-gpu=100000", "--set", "grpo.log-prob-max-token-len-per-gpu=100000")
    assert (r["update_micro_batches"], r["logprob_micro_batches"], r["optimizer_steps"]) == (2, 2, 2)
    assert r["timing_settings"]["grpo.ppo-max-token-len-per-gpu"] == 100000
    assert "2 forward/backward passes, the largest" in load_script("gpu_round").format_report(r)


def test_an_environment_not_installed_leaves_its_paper_round_out_and_keeps_the_measured_round():
    """A lent GPU machine has no alfworld package (2026-12-05: the whole round's result was lost to it): that
    environment's estimate is marked skipped with the reason, the others are estimated, and the report says which."""
    import concurrent.futures

    gpu_round = load_script("gpu_round")
    missing, played = concurrent.futures.Future(), concurrent.futures.Future()
    missing.set_exception(ImportError("the 'alfworld' environment needs the alfworld and textworld[pddl] packages"))
    played.set_result(300.0)
    measured = _measured()
    rounds = gpu_round.paper_rounds(measured, {"alfworld": (missing, {}, "tiny", 0), "webshop": (played, {}, "tiny", 0)},
                                    {"grpo.tasks-per-epoch": 64})
    assert rounds["alfworld"] == {"skipped": "the 'alfworld' environment needs the alfworld and textworld[pddl] packages"}
    assert rounds["webshop"] == gpu_round.paper_round(measured, {"grpo.tasks-per-epoch": 64}, env="webshop", prompt_tokens=300.0)
    text = gpu_round.format_report(_with_report_fields({**measured, "paper_rounds": rounds}))
    assert "paper round, alfworld: not estimated (the 'alfworld' environment needs" in text
    assert "paper round on webshop (" in text
