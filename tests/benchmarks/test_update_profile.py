"""benchmarks/update_profile.py runs on CPU at the tiny shape, so the GPU benchmark cannot rot between GPU sessions."""

import json
import subprocess
import sys
import weakref
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from benchmark_scripts import load_script
from conftest import planned
from fedagent_flwr.methods.memory import plan_layer_activations
from fedagent_flwr.methods.placement import place_run

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "update_profile.py"


def test_tiny_profile_reports_every_variant_and_one_profiled_micro_batch():
    done = subprocess.run([sys.executable, str(SCRIPT), "--shape", "tiny", "--json", "--profile", "--samples", "12",
                           "--variant", "grpo.ppo-micro-batch-size-per-gpu=2,cudnn-attention=true",
                           "--variant", "grpo.ppo-micro-batch-size-per-gpu=4,grpo.log-prob-micro-batch-size-per-gpu=12,grpo.group-by-length=true",
                           "--variant", "grpo.ppo-micro-batch-size-per-gpu=4,engine.gradient-checkpointing=true",
                           "--variant", "grpo.ppo-micro-batch-size-per-gpu=4,engine.gradient-checkpointing=auto,engine.client-memory-gb=64",
                           "--variant", "grpo.ppo-micro-batch-size-per-gpu=2,grpo.ppo-max-token-len-per-gpu=100000,host-waits=true,fused-adamw=false,"
                                        "padding-mask=true"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    r = json.loads(done.stdout.strip().splitlines()[-1])
    assert r["device"] == "cpu" and r["samples"] == 12
    first, second, every, auto, tokens = r["variants"]
    assert first["variant"] == {"grpo.ppo-micro-batch-size-per-gpu": 2, "cudnn-attention": True} and first["micro_batch_size"] == 2
    # auto with far more memory than the tiny plan: no layer needs checkpointing
    assert (first["checkpointed_layers"], every["checkpointed_layers"], auto["checkpointed_layers"]) == (0.0, 1.0, 0.0)
    # what the plan decided is reported beside it (auto variants only): 64 GiB, less the update's other rows
    planned = auto["auto_plan"]
    assert first["auto_plan"] is None and every["auto_plan"] is None
    assert planned["budget_bytes"] == 64 * 2**30 and planned["layers"] == 0
    assert planned["room_bytes"] == planned["budget_bytes"] - (planned["plan_bytes"]["update peak"]
                                                              - planned["plan_bytes"]["activations of a micro-batch"])
    assert 0 < planned["activation_bytes"] < planned["room_bytes"] and planned["largest_pass_tokens"] > 0
    assert "auto plans 0 of" in done.stderr
    # the plan's count of each variant's peak: every layer checkpointed holds less than the same passes kept whole
    assert all(v["planned_peak_bytes"] > 0 for v in r["variants"])
    assert every["planned_peak_bytes"] < auto["planned_peak_bytes"]
    # passes cut by rows (12 samples in 2s), or by a token budget all 12 fit in
    assert (first["micro_batches"], tokens["micro_batches"]) == (6, 1)
    for v in (first, second, every, auto, tokens):
        # 12 samples, minibatch 64: one minibatch, so only the KL reference's pass runs apart from the update
        assert v["logprob_passes"] == 1 and v["optimizer_steps"] == 1
        assert v["logprobs_s"] > 0 and v["update_s"] > 0 and v["logprobs_mfu"] > 0 and v["update_mfu"] > 0
        assert 0 <= v["padding_share"] < 1 and v["peak_bytes"] is None  # no CUDA allocator on a CPU
    assert second["padding_share"] < first["padding_share"] or second["padding_share"] < 0.2  # grouped by length
    p = r["profile"]
    assert p["rows"] == 2 and p["tokens"] > 2 and p["aten_calls"] > 0 and p["self_device_ms"] is None
    assert any(e["op"] == "aten::mm" for e in p["top"]) or any(e["op"] == "aten::addmm" for e in p["top"])
    # the forward and backward timed apart; the backward's nodes are autograd's (a matmul's among them)
    assert p["forward_ms"] > 0 and p["backward_ms"] > 0 and p["wall_ms"] == p["forward_ms"] + p["backward_ms"]
    assert all(n["calls"] > 0 and n["cpu_ms"] >= 0 for n in p["backward_nodes"])
    assert any(n["node"].startswith(("MmBackward", "AddmmBackward")) for n in p["backward_nodes"])
    text = load_script("update_profile").format_report(r)
    assert "grpo.ppo-micro-batch-size-per-gpu=2,cudnn-attention=True" in text and "one micro-batch of 2 rows" in text and "plan GiB" in text
    assert "the backward's autograd nodes" in text and p["backward_nodes"][0]["node"][:50] in text


def test_the_variants_never_share_a_shape_and_a_bad_key_is_refused():
    up = load_script("update_profile")
    sets = [up.synthetic_samples(64, 40, 8, 500, np.random.default_rng(0), i, 3) for i in range(3)]
    lengths = [{len(s.prompt_ids) + len(s.completion_ids) for s in samples} for samples in sets]
    assert all(length % 3 == i for i, ls in enumerate(lengths) for length in ls)
    assert not (lengths[0] & lengths[1]) and not (lengths[1] & lengths[2])
    means = [np.mean([len(s.prompt_ids) for s in samples]) for samples in sets]
    assert max(means) - min(means) < 5  # the same distribution, shifted by less than the modulus
    assert up.parse_variant("grpo.ppo-micro-batch-size-per-gpu=4,cudnn-attention=false") == {"grpo.ppo-micro-batch-size-per-gpu": 4, "cudnn-attention": False}
    with pytest.raises(ValueError, match="cudnn-attention='maybe' is not allowed"):
        up.parse_variant("cudnn-attention=maybe")
    assert up.parse_variant("host-waits=true,grpo.ppo-micro-batch-size-per-gpu=16") == {"grpo.ppo-micro-batch-size-per-gpu": 16, "host-waits": True}
    with pytest.raises(ValueError, match="host-waits='' is not allowed"):
        up.parse_variant("host-waits")
    with pytest.raises(ValueError):
        up.parse_variant("micro-batch-sizes=4")


def test_a_measured_trainer_does_not_outlive_its_variant(tiny_lm, maze_tokenizer, monkeypatch):
    """timed_method wraps the trainer's own method, a reference cycle: without a collection the next variant measured
    its peak on top of the last one's AdamW moments and KL reference (on an H100: 60.5 GiB where 43.1 was its own)."""
    import torch

    from fedagent_flwr.config import RunConfig

    up = load_script("update_profile")
    trainers = []
    real = up.GRPOTrainer

    def recording(*args, **kwargs):
        trainer = real(*args, **kwargs)
        trainers.append(weakref.ref(trainer))
        return trainer

    monkeypatch.setattr(up, "GRPOTrainer", recording)
    cfg = RunConfig.from_run_config(up.PAPER_ROUND | {"grpo.ppo-micro-batch-size-per-gpu": 2, "device": "cpu"})
    samples = up.synthetic_samples(4, 6, 3, tiny_lm.config.vocab_size, np.random.default_rng(0))
    up.measure(tiny_lm, maze_tokenizer, cfg, samples, torch.device("cpu"), 0, 1e12)
    up.measure(tiny_lm, maze_tokenizer, cfg, samples, torch.device("cpu"), 0, 1e12)
    assert trainers[0]() is None  # collected when the second variant started


def test_the_diagnostic_keys_set_the_measured_trainers_config_switches(tiny_lm, maze_tokenizer, monkeypatch):
    """host-waits, fused-adamw and padding-mask reach the measured trainer as its diagnostic switches (PassSwitches) (what
    each switch does: tests/agent/test_passes.py); a variant without them, and the warm-up, run the defaults."""
    import torch

    from fedagent_flwr.config import RunConfig

    up = load_script("update_profile")
    variant = up.parse_variant("grpo.ppo-micro-batch-size-per-gpu=2,host-waits=true,fused-adamw=false,padding-mask=true,cudnn-attention=true")
    assert variant == {"grpo.ppo-micro-batch-size-per-gpu": 2, "host-waits": True, "fused-adamw": False, "padding-mask": True,
                       "cudnn-attention": True}
    assert up.switches(variant) == {"host_waits": True, "fused_adamw": False, "padding_mask": True}
    assert up.switches({"grpo.ppo-micro-batch-size-per-gpu": 2}) == {}
    configs = []
    real = up.GRPOTrainer
    monkeypatch.setattr(up, "GRPOTrainer", lambda *a, switches, **kw: configs.append(switches) or real(*a, switches=switches, **kw))
    cfg = RunConfig.from_run_config(up.PAPER_ROUND | {"grpo.ppo-micro-batch-size-per-gpu": 2, "device": "cpu"})
    samples = up.synthetic_samples(4, 6, 3, tiny_lm.config.vocab_size, np.random.default_rng(0))
    up.measure(tiny_lm, maze_tokenizer, cfg, samples, torch.device("cpu"), 0, 1e12, up.switches(variant))
    up.measure(tiny_lm, maze_tokenizer, cfg, samples, torch.device("cpu"), 0, 1e12)
    switched, plain = configs
    assert (switched.host_waits, switched.fused_adamw, switched.padding_mask) == (True, False, True)
    assert (plain.host_waits, plain.fused_adamw, plain.padding_mask) == (False, True, False)
    assert replace(switched, host_waits=False, fused_adamw=True, padding_mask=False) == plain


def test_a_variant_that_fails_is_reported_and_the_others_still_are(monkeypatch, capsys):
    """One variant that breaks (on an H100, a checkpointing error in one of nine) must not take the measured ones with
    it: the run goes on and the result says which variant failed and why."""
    up = load_script("update_profile")
    real = up.measure

    def breaks_at_three_rows(model, tokenizer, cfg, samples, *args):
        if cfg.grpo.ppo_micro_batch_size_per_gpu == 3 and len(samples) > 4:  # the variant itself, not the warm-up
            raise RuntimeError("recomputed values differ\nsecond line")
        return real(model, tokenizer, cfg, samples, *args)

    monkeypatch.setattr(up, "measure", breaks_at_three_rows)
    r = up.main(["--shape", "tiny", "--samples", "8", "--variant", "grpo.ppo-micro-batch-size-per-gpu=2",
                 "--variant", "grpo.ppo-micro-batch-size-per-gpu=3", "--variant", "grpo.ppo-micro-batch-size-per-gpu=4"])
    first, failed, last = r["variants"]
    assert failed == {"variant": {"grpo.ppo-micro-batch-size-per-gpu": 3}, "failed": "RuntimeError: recomputed values differ"}
    assert first["micro_batch_size"] == 2 and last["micro_batch_size"] == 4 and last["update_s"] > 0
    assert "failed: RuntimeError: recomputed values differ" in capsys.readouterr().out


def test_the_planned_peak_is_the_plans_rows_an_update_holds_with_the_activations_of_its_largest_passes(tiny_lm):
    """planned_peak: the client plan's update peak less its own activations and no-grad rows, plus the activations of
    the passes as run: the largest update pass's with its checkpointed layers, or the largest no-grad pass's peak (less
    the update's logits, which it never runs beside) where that is more."""
    from fedagent_flwr.agent.engine.memory import ModelShape, update_activation_bytes
    from fedagent_flwr.config import RunConfig
    from fedagent_flwr.methods.memory import plan_no_grad_pass_bytes

    up = load_script("update_profile")
    samples = up.synthetic_samples(8, 20, 6, 50, np.random.default_rng(0))
    shape = ModelShape.of(tiny_lm.config)
    cfg = RunConfig.from_run_config({"device": "cpu", "grpo.ppo-micro-batch-size-per-gpu": 2, "rollout.generation-batch-size": 8})
    context = max(len(s.prompt_ids) + len(s.completion_ids) for s in samples)
    plan = planned(cfg, shape, context, 8).as_dict()
    held = plan["update peak"] - plan["activations of a micro-batch"] - plan["no-grad passes beyond the update's"]
    per = plan_layer_activations(cfg, shape, place_run(cfg))
    passes = {True: [(2, 30), (2, 28)], False: [(2, 30)]}
    assert up.planned_peak(tiny_lm, cfg, samples, torch.device("cpu"), passes) == held + update_activation_bytes(shape, 60, 0, per)
    # every layer checkpointed: their inputs and one layer's set, unless the no-grad pass of 40 rows holds more
    every = RunConfig.from_run_config({"device": "cpu", "grpo.ppo-micro-batch-size-per-gpu": 2, "rollout.generation-batch-size": 8, "engine.gradient-checkpointing": True})
    assert up.planned_peak(tiny_lm, every, samples, torch.device("cpu"), passes) == held + update_activation_bytes(shape, 60, shape.layers, per)
    wide = {True: [(2, 30)], False: [(40, 30)]}
    scoring = plan_no_grad_pass_bytes(every, shape, place_run(every), 1200)
    assert scoring - plan["training logits"] > update_activation_bytes(shape, 60, shape.layers, per)
    assert up.planned_peak(tiny_lm, every, samples, torch.device("cpu"), wide) == held + scoring - plan["training logits"]
    # without passes: those the trainer would cut, two rows of the longest samples first
    assert up.planned_peak(tiny_lm, cfg, samples, torch.device("cpu")) == held + update_activation_bytes(shape, 2 * context, 0, per)
