#!/usr/bin/env python
"""Where GRPO's log-prob and update passes spend their time, and their model FLOP utilisation, setting by setting.

The model is a Qwen2.5-shaped random model built as gpu_round.py builds it (`--shape`). The samples are synthetic
agent steps of the lengths a paper-settings round produces: prompts of `--prompt-tokens` on average (spread uniformly
over +-50%, so micro-batches carry padding as real ones do) and `--completion-tokens` each, with random advantages, so
every sample trains. Each `--variant` (run-config values over gpu_round's paper settings, e.g. `grpo.ppo-micro-batch-size-per-gpu=32`;
the benchmark's own keys: `cudnn-attention=true` lets the passes use cuDNN's fused attention, which agent/engine/attention.py
keeps out of them; and the trainer's diagnostic switches (agent/engine/passes.py PassSwitches):
`host-waits=true` makes the host wait for the device around every micro-batch's forward, as the passes did before
they queued all their micro-batches; `fused-adamw=false` steps with PyTorch's default AdamW instead of its fused
kernel, which the trainer takes on a GPU; `padding-mask=true` hands a Qwen model the 4-D padding mask that
right-padded batches now go without) gets a fresh GRPOTrainer on the same model and its own samples,
and is timed over one call of `GRPOTrainer.update` (its old-policy and KL-reference passes timed apart, as gpu_round
does). The variants' samples differ only in their lengths' remainder modulo the number of variants, so no variant
reuses a shape another has met: shape-dependent setup (cuDNN's plans, autotuning) is paid by each, as in a round.
Printed per variant: seconds and MFU of the no-grad log-prob passes and of the update, the share of computed tokens
that are padding, the peak memory (CUDA allocator), and the share of layer passes checkpointed (engine.gradient-checkpointing
true: all; auto: as many as the room the plan leaves in engine.client-memory-gb, or else in the card's free memory, needs)
and the update's forward/backward passes (micro-batches; `grpo.ppo-max-token-len-per-gpu` cuts them by padded tokens, each pass
as full as that allows). `--profile` adds, for the first variant, one micro-batch's
forward and backward under torch.profiler: CPU time against device time (is the host the bottleneck?) and the top
operators. A variant with `engine.training-kernels=compile` or `=liger` (agent/engine/kernels.py) is warmed up on its own before it
is timed, so its compile is reported apart (`warmup_s`, per kernel choice) and not counted in its passes; Liger
patches the model for good, so its variants come last.

    python benchmarks/update_profile.py --shape tiny                        # CPU, seconds
    python benchmarks/update_profile.py --shape 1.5b --variant grpo.ppo-micro-batch-size-per-gpu=8 --variant grpo.ppo-micro-batch-size-per-gpu=32
    python benchmarks/update_profile.py --shape 1.5b --variant grpo.ppo-micro-batch-size-per-gpu=16 \
        --variant grpo.ppo-micro-batch-size-per-gpu=16,host-waits=true
    python benchmarks/update_profile.py --shape 1.5b --variant grpo.ppo-micro-batch-size-per-gpu=16 \
        --variant grpo.ppo-max-token-len-per-gpu=16384,engine.gradient-checkpointing=auto
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from collections import defaultdict

import numpy as np
import torch
from torch._dynamo.utils import counters

from fedagent_flwr.agent.engine import attention
from fedagent_flwr.agent.engine.passes import PassSwitches
from fedagent_flwr.agent.training.grpo import GRPOTrainer
from fedagent_flwr.agent.training.advantages import StepSample
from fedagent_flwr.agent.engine.micro_batches import by_length, micro_batches
from fedagent_flwr.agent.engine.kernels import training_kernels
from fedagent_flwr.agent.engine.memory import (
    ACTIVATIONS_ROW,
    GB,
    NO_GRAD_ROW,
    UPDATE,
    ModelShape,
    layers_to_checkpoint,
    update_activation_bytes,
)
from fedagent_flwr.agent.models.pretrained import pick_device
from fedagent_flwr.agent.engine.precision import autocast, base_dtype
from fedagent_flwr.agent.models.shaped_model import environment_tokenizer
from fedagent_flwr.agent.engine.tokens import collate, completion_logprobs
from fedagent_flwr.config import GRPOSection, RunConfig
from fedagent_flwr.simulation import parse_overrides
from fedagent_flwr.methods.memory import memory_budget
from decode_profile import LAUNCH_NAMES, device_us
from gpu_round import H100_BF16_FLOPS, PAPER_ROUND, SHAPE_NAMES, build_model, recorded_passes, sample_flops, timed_method
from fedagent_flwr.methods.memory import memory_plan, plan_layer_activations, plan_no_grad_pass_bytes
from fedagent_flwr.methods.placement import place_run
from fedagent_flwr.methods.library_configs import rollout_config


def synthetic_samples(n: int, prompt_tokens: int, completion_tokens: int, vocab: int, rng: np.random.Generator,
                      residue: int = 0, modulus: int = 1) -> list[StepSample]:
    """n samples, prompts uniform over +-50% of `prompt_tokens`, each prompt's length = residue (mod modulus)."""
    lo, hi = max(1, prompt_tokens // 2), max(1, prompt_tokens * 3 // 2)
    samples = []
    for _ in range(n):
        length = int(rng.integers(lo, hi + 1))
        length += (residue - length - completion_tokens) % modulus  # the sample's total length: residue mod modulus
        samples.append(StepSample(rng.integers(1, vocab, length).tolist(), rng.integers(1, vocab, completion_tokens).tolist(),
                                  float(rng.standard_normal())))
    return samples


# the benchmark's own variant key: true = the passes may use cuDNN's attention (attention.py's module switch, which the
# rollout's passes read too: no PassSwitches field)
CUDNN_KEY = "cudnn-attention"
# the benchmark's own variant key: true = the host waits for the device before and after every micro-batch's
# log-prob forward, as the passes did before they queued all their micro-batches (docs/gpu.md); the next forward's
# wait also meets the end of the backward before it. Measures what such waits cost, side by side.
WAITS_KEY = "host-waits"
# the benchmark's own variant key: false = AdamW without its fused kernel (PyTorch's default, a loop over tensor lists
# on a GPU), what the update ran before the trainer's AdamW (agent/engine/passes.py adamw) chose the fused kernel on a GPU
FUSED_KEY = "fused-adamw"
# the benchmark's own variant key: true = right-padded batches reach a Qwen model with the 4-D causal-and-padding mask
# (the memory-efficient attention kernel, the mask kept per head), as they did before they went without one (the mask
# mapping of agent/engine/tokens.py: the causal kernel)
MASK_KEY = "padding-mask"
OWN_KEYS = (CUDNN_KEY, WAITS_KEY, FUSED_KEY, MASK_KEY)
# the own keys that are the trainer's diagnostic switches (agent/engine/passes.py PassSwitches), by the field each sets
SWITCHES = {WAITS_KEY: "host_waits", FUSED_KEY: "fused_adamw", MASK_KEY: "padding_mask"}


def parse_variant(text: str) -> dict:
    """Run-config values and the benchmark's own keys (OWN_KEYS, each true|false), comma-separated."""
    items = text.split(",")
    own = [i for i in items if i.split("=", 1)[0].strip() in OWN_KEYS]
    values = parse_overrides([i for i in items if i not in own])
    for item in own:
        key = item.split("=", 1)[0].strip()
        flag = item.split("=", 1)[1].strip().lower() if "=" in item else ""
        if flag not in ("true", "false"):
            raise ValueError(f"{key}={flag!r} is not allowed: expected true | false")
        values[key] = flag == "true"
    return values


def switches(variant: dict) -> dict[str, bool]:
    """The PassSwitches fields a variant's own keys set (SWITCHES), for the trainer's `switches`."""
    return {field: variant[key] for key, field in SWITCHES.items() if key in variant}


# how torch.profiler names the backward's nodes (each a function of autograd's graph)
AUTOGRAD_NODE = "autograd::engine::evaluate_function: "


def update_micro_batches(samples: list[StepSample], grpo: GRPOSection) -> list[list[int]]:
    """The micro-batches the trainer would cut the samples into taken as one minibatch, in this order or by length
    (grpo.ppo-micro-batch-size-per-gpu rows, or grpo.ppo-max-token-len-per-gpu padded tokens): the profiled micro-batch is the first of them."""
    order = list(range(len(samples)))
    if grpo.group_by_length:
        order = by_length(order, [s.length for s in samples])
    return micro_batches(order, [s.length for s in samples], grpo.ppo_micro_batch_size_per_gpu, grpo.ppo_max_token_len_per_gpu)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def measure(model, tokenizer, cfg: RunConfig, samples: list[StepSample], device: torch.device, seed: int,
            peak_flops: float, config_switches: dict[str, bool] | None = None) -> dict:
    """One variant timed; `config_switches`: the trainer's diagnostic switches (switches())."""
    # The previous variant's trainer (AdamW moments, KL reference copy) sits in a reference cycle (timed_method wraps
    # its own bound method): collect it, or every variant after the first measures its peak on top of ~19 GiB of it.
    gc.collect()
    graphs = counters["stats"]["unique_graphs"]
    placement = client_placement(model, cfg, samples, device)
    trainer = GRPOTrainer(model, tokenizer, cfg.grpo, rollout_config(cfg, placement=placement), engine=cfg.engine,
                          placement=placement, switches=PassSwitches(**(config_switches or {})))
    clock: dict[str, float] = defaultdict(float)
    timed_method(trainer, "_logprobs", clock)
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    sync(device)
    started = time.perf_counter()
    with recorded_passes() as passes:
        stats = trainer.update(samples, np.random.default_rng(seed))
        sync(device)
    passes_all, passes_run = passes, passes[True]
    total = time.perf_counter() - started
    grpo = trainer.config
    tokens = sum(len(s.prompt_ids) + len(s.completion_ids) for s in samples)
    computed = sum(rows * width for rows, width in passes_run)  # padding included
    update_s = max(total - clock["_logprobs"], 1e-9)
    passes = clock["_logprobs_calls"]
    lora = cfg.grpo.finetuning == "lora"
    result = {
        "variant": {}, "micro_batch_size": grpo.ppo_micro_batch_size_per_gpu, "micro_batch_tokens": grpo.ppo_max_token_len_per_gpu,
        "micro_batches": len(passes_run), "largest_pass_tokens": max(rows * width for rows, width in passes_run),
        "samples": len(samples), "tokens": tokens,
        "padding_share": 1 - tokens / computed if computed else 0.0,
        "logprob_passes": int(passes), "logprobs_s": round(clock["_logprobs"], 3), "update_s": round(update_s, 3),
        "optimizer_steps": int(stats["optimizer_steps"]),
        "logprobs_mfu": sample_flops(model.config, samples, cfg.engine.logprob_chunk_tokens, passes) / max(clock["_logprobs"], 1e-9) / peak_flops if passes else 0.0,
        "update_mfu": sample_flops(model.config, samples, cfg.engine.logprob_chunk_tokens, 2.0 if lora else 3.0) / update_s / peak_flops,
        "peak_bytes": int(torch.cuda.max_memory_allocated()) if device.type == "cuda" else None,
        # the memory plan's count of that peak, at the passes as run (planned_peak): the check of the plan on a card
        "planned_peak_bytes": planned_peak(model, cfg, samples, device, {k: list(v) for k, v in passes_all.items()}),
        # graphs torch.compile made during this call: 0 once warmed up, unless a shape forced a recompile
        "compiled_graphs": int(counters["stats"]["unique_graphs"] - graphs),
        # the share of layer passes that kept only their input and recomputed (1 = every layer; 0 = none)
        "checkpointed_layers": stats.get("checkpointed_layers", 0.0),
    }
    del trainer
    return result


def client_placement(model, cfg: RunConfig, samples: list[StepSample], device: torch.device):
    """The placement a client would resolve for these samples: the plan at their longest context, in the budget a client
    would have on `device` (it counts the rollout's KV cache and decoder copy, which this benchmark does not hold: a
    margin for engine.gradient-checkpointing=auto's room)."""
    return place_run(cfg, model=model, shape=ModelShape.of(model.config), context_tokens=max(s.length for s in samples),
                     budget_bytes=memory_budget(cfg, device))


def auto_plan(model, cfg: RunConfig, samples: list[StepSample], device: torch.device) -> dict | None:
    """What the memory plan decided for a engine.gradient-checkpointing=auto variant, so that a peak (or an out-of-memory) can be
    set beside it: the budget, the room it left the activations, and at the largest pass the trainer cuts from these
    samples the layers checkpointed and the activations planned; the plan's rows too (it counts a rollout's KV cache
    and decoder copy, which this benchmark does not hold). None for other variants or without a known budget."""
    shape, placement = ModelShape.of(model.config), client_placement(model, cfg, samples, device)
    room = placement.activation_room_bytes
    if room is None:
        return None
    largest = max(len(micro) * max(len(samples[i].prompt_ids) + len(samples[i].completion_ids) for i in micro)
                  for micro in update_micro_batches(samples, cfg.grpo))
    per_token = plan_layer_activations(cfg, shape, placement)
    layers = layers_to_checkpoint(shape, largest, room, per_token)
    plan = memory_plan(cfg, shape, placement.context_tokens, placement, placement.rollout_rows).as_dict()
    return {"budget_bytes": int(memory_budget(cfg, device)), "room_bytes": int(room), "largest_pass_tokens": largest,
            "layers": layers, "activation_bytes": update_activation_bytes(shape, largest, layers, per_token),
            "plan_bytes": {k: int(v) for k, v in plan.items()}}


def planned_peak(model, cfg: RunConfig, samples: list[StepSample], device: torch.device,
                 passes: dict[bool, list[tuple[int, int]]] | None = None) -> int:
    """The memory plan's count of what this benchmark's update holds at its peak: the client plan's update peak, with
    the activations of the largest passes as run (the update's with the layers checkpointed as the run decides them:
    none, every layer, or auto's k), or the largest no-grad pass's peak where that holds more. `passes`: the [rows, width] of the
    passes as run (gpu_round.recorded_passes); None for the ones the trainer would cut from all samples as one
    minibatch (a variant that ran out of memory). Set beside the measured peak, it checks the plan's count on a card."""
    shape, placement = ModelShape.of(model.config), client_placement(model, cfg, samples, device)
    plan = memory_plan(cfg, shape, placement.context_tokens, placement, placement.rollout_rows).as_dict()
    per_token = plan_layer_activations(cfg, shape, placement)
    grpo = cfg.grpo
    if passes is None:
        order = by_length(list(range(len(samples))), [s.length for s in samples]) if grpo.group_by_length else list(range(len(samples)))
        width = lambda micro: max(len(samples[i].prompt_ids) + len(samples[i].completion_ids) for i in micro)  # noqa: E731
        passes = {True: [(len(m), width(m)) for m in update_micro_batches(samples, grpo)],
                  False: [(len(m), width(m)) for m in micro_batches(order, [s.length for s in samples], grpo.log_prob_rows(),
                                                                     grpo.log_prob_max_token_len_per_gpu)]}
    update = max(rows * width for rows, width in passes[True])
    logprob = max((rows * width for rows, width in passes[False]), default=0)
    if placement.gradient_checkpointing == "fitted":  # within the room the placement left (auto without one: True)
        layers = layers_to_checkpoint(shape, update, placement.activation_room_bytes, per_token)
    else:
        layers = shape.layers if placement.gradient_checkpointing else 0
    activations = update_activation_bytes(shape, update, layers, per_token)
    scoring = plan_no_grad_pass_bytes(cfg, shape, placement, logprob)  # runs before the update's passes, not beside
    held = plan[f"{UPDATE} peak"] - plan[ACTIVATIONS_ROW] - plan[NO_GRAD_ROW]
    return int(held + max(activations, scoring - plan["training logits"]))


def profile_micro_batch(model, cfg: RunConfig, samples: list[StepSample], device: torch.device, top: int) -> dict:
    """One micro-batch's forward (completion log-probs) and backward under torch.profiler; the forward and the backward
    also timed apart (wall, unprofiled), and the backward's autograd nodes ranked by the CPU time spent under them
    (each node's own op and the kernels it calls: which part of the layer's backward costs most)."""
    grpo, placement = cfg.grpo, place_run(cfg)
    batch = collate([(samples[i].prompt_ids, samples[i].completion_ids) for i in update_micro_batches(samples, grpo)[0]], 0)
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)

    def once() -> tuple[float, float]:
        started = time.perf_counter()
        with autocast(placement.precision, device), training_kernels(model, cfg.engine.training_kernels):
            logprobs, mask = completion_logprobs(model, batch, 1.0, cfg.engine.logprob_chunk_tokens)
        loss = logprobs.sum() / mask.sum()
        sync(device)
        forward = time.perf_counter() - started
        loss.backward()
        model.zero_grad(set_to_none=True)
        sync(device)
        return forward, time.perf_counter() - started - forward

    once()  # warm-up
    forward, backward = once()
    with torch.profiler.profile(activities=activities) as prof:
        once()
    events = prof.key_averages()
    rows = sorted(events, key=lambda e: -(device_us(e) if device.type == "cuda" else e.self_cpu_time_total))[:top]
    nodes = sorted((e for e in events if e.key.startswith(AUTOGRAD_NODE)), key=lambda e: -e.cpu_time_total)[:top]
    launches = sum(e.count for e in events if e.key in LAUNCH_NAMES)
    forward_ms, backward_ms = forward * 1e3, backward * 1e3
    return {"rows": len(batch["input_ids"]), "tokens": batch["input_ids"].numel(), "wall_ms": forward_ms + backward_ms,
            "forward_ms": forward_ms, "backward_ms": backward_ms,
            "self_cpu_ms": sum(e.self_cpu_time_total for e in events) / 1e3,
            "self_device_ms": sum(device_us(e) for e in events) / 1e3 if device.type == "cuda" else None,
            "kernel_launches": launches if device.type == "cuda" else None,
            "aten_calls": sum(e.count for e in events if e.key.startswith("aten::")),
            "top": [{"op": e.key, "calls": e.count, "self_cpu_ms": e.self_cpu_time_total / 1e3,
                     "self_device_ms": device_us(e) / 1e3 if device.type == "cuda" else None} for e in rows],
            "backward_nodes": [{"node": e.key[len(AUTOGRAD_NODE):], "calls": e.count, "cpu_ms": e.cpu_time_total / 1e3}
                               for e in nodes]}


def format_profile(p: dict) -> list[str]:
    """profile_micro_batch's result as lines: the split, the top operators, the backward's costliest nodes."""
    device = "" if p["self_device_ms"] is None else f", self device time {p['self_device_ms']:.1f} ms, " \
                                                     f"{p['kernel_launches']:,} kernel launches"
    lines = [f"one micro-batch of {p['rows']} rows ({p['tokens']:,} padded tokens) forward + backward: wall {p['wall_ms']:.1f} ms"
             f" (forward {p['forward_ms']:.1f}, backward {p['backward_ms']:.1f}), self CPU time {p['self_cpu_ms']:.1f} ms "
             f"(profiled){device}, {p['aten_calls']:,} aten calls; operators by self time:"]
    for e in p["top"]:
        dev = "" if e["self_device_ms"] is None else f" {e['self_device_ms']:9.2f} ms device"
        lines.append(f"    {e['op'][:50]:50s} {e['calls']:7,d} calls {e['self_cpu_ms']:9.2f} ms CPU{dev}")
    lines.append("  the backward's autograd nodes by CPU time under them:")
    lines += [f"    {e['node'][:50]:50s} {e['calls']:7,d} calls {e['cpu_ms']:9.2f} ms CPU" for e in p["backward_nodes"]]
    return lines


def format_report(r: dict) -> str:
    lines = [f"update profile: shape {r['shape']} ({r['parameters'] / 1e6:,.1f}M parameters) on {r['device']}, "
             f"{r['samples']} samples of ~{r['prompt_tokens']} prompt + {r['completion_tokens']} completion tokens, "
             f"MFU against {r['peak_flops'] / 1e12:,.0f} TFLOP/s",
             f"  {'variant':72s} {'log-probs s':>11s} {'MFU':>6s} {'update s':>9s} {'MFU':>6s} {'padding':>8s} {'peak GiB':>9s}"
             f" {'plan GiB':>9s} {'ckpt':>5s} {'passes':>6s}"]
    # each variant named by what it does not share with every other: the shared values are printed once, below
    shared = {k: x for k, x in r["variants"][0]["variant"].items()
              if len(r["variants"]) > 1 and all(v["variant"].get(k, object()) == x for v in r["variants"])}
    for v in r["variants"]:
        name = ",".join(f"{k}={x}" for k, x in v["variant"].items() if k not in shared) or (
            "(the shared settings)" if shared else "(paper settings)")
        if len(name) > 72:
            name = "..." + name[-69:]
        plan = f"{v['planned_peak_bytes'] / GB:.2f}" if v.get("planned_peak_bytes") else "-"
        if v.get("out_of_memory") or v.get("failed"):
            what = "out of memory" if v.get("out_of_memory") else "failed: " + v["failed"][:60]
            lines.append(f"  {name:72s} {what:58s} {plan:>9s}" if v.get("out_of_memory") else f"  {name:72s} {what}")
            continue
        peak = "-" if v["peak_bytes"] is None else f"{v['peak_bytes'] / GB:.2f}"
        lines.append(f"  {name:72s} {v['logprobs_s']:11.2f} {100 * v['logprobs_mfu']:5.1f}% {v['update_s']:9.2f} "
                     f"{100 * v['update_mfu']:5.1f}% {100 * v['padding_share']:7.1f}% {peak:>9s} {plan:>9s} "
                     f"{100 * v.get('checkpointed_layers', 0.0):4.0f}% {v.get('micro_batches', 0):6d}")
    if shared:
        lines.append("  every variant: " + ",".join(f"{k}={x}" for k, x in shared.items()))
    if r.get("warmup_s"):
        lines.append("  warm-up seconds by engine.training-kernels (compile included): "
                     + ", ".join(f"{k} {x:.1f}" for k, x in r["warmup_s"].items())
                     + "; graphs compiled while timed: " + ", ".join(str(v.get("compiled_graphs", "-")) for v in r["variants"]))
    if r.get("profile"):
        lines += format_profile(r["profile"])
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", choices=list(SHAPE_NAMES), default="tiny")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a run-config value over gpu_round's paper settings, for every variant (repeatable)")
    parser.add_argument("--variant", action="append", default=[], metavar="KEY=VALUE[,KEY=VALUE]",
                        help="one measured setting (repeatable); none: the paper settings alone")
    parser.add_argument("--samples", type=int, help="agent steps (default 128 on CUDA, 16 on CPU)")
    parser.add_argument("--prompt-tokens", type=int, help="mean prompt length (default 256 on CUDA, 32 on CPU)")
    parser.add_argument("--completion-tokens", type=int, help="completion length (default 128 on CUDA, 8 on CPU)")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--peak-flops", type=float, default=H100_BF16_FLOPS)
    parser.add_argument("--profile", action="store_true", help="profile one micro-batch of the first variant")
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    try:
        device = pick_device(args.device)
        base = PAPER_ROUND | parse_overrides(args.set) | {"device": args.device}
        variants = [parse_variant(v) for v in args.variant] or [{}]
        configs = [RunConfig.from_run_config(base | {k: x for k, x in v.items() if k not in OWN_KEYS}) for v in variants]
    except ValueError as err:
        parser.error(str(err))
    kernels = [c.engine.training_kernels for c in configs]
    first_liger = kernels.index("liger") if "liger" in kernels else len(kernels)
    if any(k != "liger" for k in kernels[first_liger:]):
        parser.error("--variant: engine.training-kernels=liger patches the model for good; list the liger variants last")
    cuda = device.type == "cuda"
    n = args.samples or (128 if cuda else 16)
    prompt = args.prompt_tokens or (256 if cuda else 32)
    completion = args.completion_tokens or (128 if cuda else 8)

    tokenizer = environment_tokenizer(configs[0].env)
    model = build_model(args.shape, tokenizer, device, args.seed)
    if base_dtype(configs[0].precision) != torch.float32:  # precision=bf16-base set: the base as a run loads it
        model.to(base_dtype(configs[0].precision))
    vocab = model.config.vocab_size
    # the warm-up's lengths are far below the variants', so it meets none of their shapes
    warm = synthetic_samples(4, 8, 4, vocab, np.random.default_rng(args.seed + 1))
    sets = [synthetic_samples(n, prompt, completion, vocab, np.random.default_rng(args.seed), i, len(variants))
            for i in range(len(variants))]
    result = {"shape": args.shape, "device": torch.cuda.get_device_name(device) if cuda else "cpu",
              "parameters": ModelShape.of(model.config).parameters, "samples": n, "prompt_tokens": prompt,
              "completion_tokens": completion, "peak_flops": args.peak_flops, "variants": []}
    if configs[0].grpo.finetuning == "lora":
        parser.error("update_profile measures full fine-tuning (gpu_round.py measures LoRA)")
    # warm-up: cuBLAS handles, allocator pools, autotuning, on a few samples; and per kernel choice its compile
    warmed: dict[str, float] = {}

    def warm_up(cfg: RunConfig) -> None:
        if cfg.engine.training_kernels not in warmed:
            started = time.perf_counter()
            measure(model, tokenizer, cfg, warm, device, args.seed, args.peak_flops)
            warmed[cfg.engine.training_kernels] = round(time.perf_counter() - started, 2)

    result["warmup_s"] = warmed
    warm_up(configs[0])
    if args.profile:  # on the first variant's samples: the micro-batch's shape is met once before it is profiled
        attention.AVOID_CUDNN = not variants[0].get(CUDNN_KEY, False)
        result["profile"] = profile_micro_batch(model, configs[0], sets[0], device, args.top)
    for v, cfg, samples in zip(variants, configs, sets):
        attention.AVOID_CUDNN = not v.get(CUDNN_KEY, False)
        planned = auto_plan(model, cfg, samples, device)
        if planned:
            print(f"{v}: auto plans {planned['layers']} of {model.config.num_hidden_layers} layers checkpointed at "
                  f"{planned['largest_pass_tokens']} tokens, {planned['activation_bytes'] / GB:.1f} GiB of activations in "
                  f"a room of {planned['room_bytes'] / GB:.1f} GiB (budget {planned['budget_bytes'] / GB:.1f} GiB)",
                  file=sys.stderr, flush=True)
        try:
            warm_up(cfg)
            r = measure(model, tokenizer, cfg, samples, device, args.seed, args.peak_flops, switches(v))
        except torch.OutOfMemoryError as err:  # a variant too big for the card: say so, measure the rest
            model.zero_grad(set_to_none=True)
            gc.collect()
            print(f"{v}: out of memory ({str(err).splitlines()[0][:120]})", file=sys.stderr, flush=True)
            result["variants"].append({"variant": v, "out_of_memory": True, "auto_plan": planned,
                                       "planned_peak_bytes": planned_peak(model, cfg, samples, device)})
            continue
        except Exception as err:  # a variant that cannot run here (a missing package, a bug): the others still count
            model.zero_grad(set_to_none=True)
            failure = f"{type(err).__name__}: {(str(err).strip().splitlines() or [''])[0][:200]}"
            print(f"{v}: failed ({failure})", file=sys.stderr, flush=True)
            result["variants"].append({"variant": v, "failed": failure})
            continue
        r["variant"] = v
        r["auto_plan"] = planned
        result["variants"].append(r)
        print(f"{v or '(paper settings)'}: log-probs {r['logprobs_s']:.2f} s ({100 * r['logprobs_mfu']:.1f}% MFU), "
              f"update {r['update_s']:.2f} s ({100 * r['update_mfu']:.1f}% MFU)", file=sys.stderr, flush=True)
    print(json.dumps(result) if args.json else format_report(result), flush=True)
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
