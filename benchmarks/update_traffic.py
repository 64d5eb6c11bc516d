#!/usr/bin/env python
"""The bytes GRPO's update moves outside its matrix multiplies, operator by operator, setting by setting (CPU).

On a GPU the update of a 1.5B-shaped model spends most of its time outside the matrix multiplies (docs/gpu-measurements.md: the
tensor cores about a third of a micro-batch's device time): in element-wise and reduction kernels, whose time is the
bytes they read and write over the memory bandwidth. Those bytes do not depend on the device, so they can be counted
here: every ATen operator that one `GRPOTrainer.update` dispatches (old-policy and KL-reference passes, every
micro-batch's forward and backward, each optimizer step) is intercepted with PyTorch's TorchDispatchMode, and its
input and output tensors are summed in bytes (views, which move nothing, left out). Matrix multiplies (mm, addmm, bmm)
are counted apart, with their FLOPs, and so are the optimizer steps' operators (gradient clipping, AdamW, a working
copy's views and refresh), which scale with the steps and not the tokens; AdamW here is the CPU's loop, not the fused
kernel a GPU runs. A lookup or a gather is charged its whole input, an over-count that every variant shares.

The model is the shape's width (hidden, heads, vocabulary: the tied 151,936 x 1,536 embedding of the 1.5B shape
included) at two depths (`--layers`, default 2 and 4), so the cost of one decoder layer is the difference and the
whole shape's depth is extrapolated linearly. Samples are synthetic agent steps as update_profile.py makes them.
Each `--variant` (run-config values, e.g. `engine.param-dtype=bf16`) gets its own copy of the same model and samples.
This is a count, not a time: what the GPU makes of it is measured by update_profile.py and gpu_round.py.

    python benchmarks/update_traffic.py --variant engine.param-dtype=fp32 --variant engine.param-dtype=bf16     # 1.5B width, ~3 min
    python benchmarks/update_traffic.py --shape tiny --variant engine.param-dtype=fp32 --variant engine.param-dtype=bf16
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import sys
import time
from collections import defaultdict

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from fedagent_flwr.agent.training.grpo import GRPOTrainer
from fedagent_flwr.agent.engine.master_weights import Bf16WorkingCopy
from fedagent_flwr.agent.engine.memory import SHAPES
from fedagent_flwr.agent.models.shaped_model import environment_tokenizer, random_model, shaped_config
from fedagent_flwr.config import RunConfig
from gpu_round import PAPER_ROUND, SHAPE_NAMES, TINY
from update_profile import parse_variant, synthetic_samples
from fedagent_flwr.methods.library_configs import rollout_config
from fedagent_flwr.methods.placement import place_run

MATMULS = ("mm", "addmm", "bmm")
# operators that return a view of their input (or nothing new): no bytes move
VIEWS = frozenset({"view", "_unsafe_view", "t", "transpose", "expand", "slice", "select", "unsqueeze", "squeeze",
                   "as_strided", "permute", "reshape", "alias", "detach", "split", "split_with_sizes", "unbind",
                   "lift_fresh", "_reshape_alias", "view_as", "unflatten", "flatten", "chunk", "narrow", "expand_as",
                   "empty", "empty_like", "empty_strided", "set_", "resize_"})


def _bytes(values) -> int:
    return sum(t.numel() * t.element_size() for t in values if isinstance(t, torch.Tensor))


class TrafficCount(TorchDispatchMode):
    """Bytes in and out of every operator dispatched inside it, by operator name; FLOPs of the matrix multiplies.
    Operators dispatched while `phase` is not "passes" are summed apart, in `phases`."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: dict[str, list[float]] = defaultdict(lambda: [0, 0, 0.0])  # calls, bytes, flops
        self.phase = "passes"
        self.phases: dict[str, int] = defaultdict(int)

    @contextlib.contextmanager
    def counting_as(self, phase: str):
        before, self.phase = self.phase, phase
        try:
            yield
        finally:
            self.phase = before

    def wrap(self, fn, phase: str):
        """`fn`, its operators counted under `phase`."""
        def wrapped(*args, **kwargs):
            with self.counting_as(phase):
                return fn(*args, **kwargs)
        return wrapped

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        if name in VIEWS:
            return out
        inputs = [t for t in tree_flatten((args, kwargs or {}))[0] if isinstance(t, torch.Tensor)]
        flops = 0.0
        if name in MATMULS:
            a, b = inputs[-2], inputs[-1]
            flops = 2.0 * a.shape[0] * a.shape[1] * a.shape[2] * b.shape[2] if name == "bmm" else 2.0 * a.shape[0] * a.shape[1] * b.shape[1]
        moved = _bytes(inputs) + _bytes(tree_flatten(out)[0])
        self.phases[self.phase] += moved
        if self.phase == "passes":
            entry = self.ops[name]
            entry[0] += 1
            entry[1] += moved
            entry[2] += flops
        return out


def count_update(cfg: RunConfig, config, tokenizer, samples, seed: int) -> dict:
    # the previous count's model and trainer sit in a reference cycle (the wrapped optimizer step): collect them, or
    # two 1.5B-width models with their AdamW states and logits outgrow a 24 GiB machine
    gc.collect()
    model = random_model(config, "cpu", seed)
    placement = place_run(cfg)
    trainer = GRPOTrainer(model, tokenizer, cfg.grpo, rollout_config(cfg, placement=placement), engine=cfg.engine, placement=placement)
    counter = TrafficCount()
    # the optimizer's share (gradient clipping, AdamW, the working copy's views and refresh) is counted apart: it
    # scales with the optimizer steps, the passes with the tokens
    trainer.optimizer.step = counter.wrap(trainer.optimizer.step, "optimizer")
    patches = [(torch.nn.utils, "clip_grad_norm_"), (Bf16WorkingCopy, "master_view"), (Bf16WorkingCopy, "refresh")]
    kept = [getattr(owner, name) for owner, name in patches]
    for (owner, name), fn in zip(patches, kept):
        setattr(owner, name, counter.wrap(fn, "optimizer"))
    started = time.perf_counter()
    try:
        with counter:
            stats = trainer.update(samples, np.random.default_rng(seed))
    finally:
        for (owner, name), fn in zip(patches, kept):
            setattr(owner, name, fn)
    ops = {k: {"calls": int(v[0]), "bytes": int(v[1]), "flops": v[2]} for k, v in counter.ops.items()}
    return {"seconds": round(time.perf_counter() - started, 1), "optimizer_steps": int(stats["optimizer_steps"]),
            "optimizer_bytes": counter.phases["optimizer"],
            "other_bytes": sum(o["bytes"] for k, o in ops.items() if k not in MATMULS),
            "matmul_bytes": sum(o["bytes"] for k, o in ops.items() if k in MATMULS),
            "matmul_flops": sum(o["flops"] for o in ops.values()), "ops": ops}


def extrapolate(shallow: dict, deep: dict, layers: tuple[int, int], depth: int) -> dict:
    """Linear in the number of layers: the per-layer cost is the difference over the two depths."""
    (a, b), span = layers, layers[1] - layers[0]
    out = {}
    for key in ("other_bytes", "matmul_bytes", "matmul_flops", "optimizer_bytes"):
        per_layer = (deep[key] - shallow[key]) / span
        out[key] = shallow[key] + per_layer * (depth - a)
        out[f"{key}_per_layer"] = per_layer
    out["per_layer_ops"] = sorted(((k, (deep["ops"][k]["bytes"] - shallow["ops"].get(k, {"bytes": 0})["bytes"]) / span)
                                   for k in deep["ops"] if k not in MATMULS), key=lambda kv: -kv[1])[:8]
    return out


def format_report(r: dict) -> str:
    lines = [f"update traffic: {r['shape']} width, {r['samples']} samples of ~{r['prompt_tokens']} prompt + "
             f"{r['completion_tokens']} completion tokens, micro-batches of {r['micro_batch_size']}; counted at "
             f"{r['layers'][0]} and {r['layers'][1]} layers, extrapolated to {r['depth']} (CPU, operator by operator)",
             "  the passes (log-prob passes, every micro-batch's forward and backward):",
             f"  {'variant':40s} {'outside matmuls GB':>19s} {'per layer':>10s} {'matmuls GB':>11s} {'TFLOP':>7s}"
             f" {'optimizer steps GB':>19s}"]
    for v in r["variants"]:
        e = v["extrapolated"]
        name = ",".join(f"{k}={x}" for k, x in v["variant"].items()) or "(paper settings)"
        lines.append(f"  {name:40s} {e['other_bytes'] / 1e9:19.2f} {e['other_bytes_per_layer'] / 1e9:10.3f} "
                     f"{e['matmul_bytes'] / 1e9:11.2f} {e['matmul_flops'] / 1e12:7.2f} {e['optimizer_bytes'] / 1e9:19.2f}")
        lines.append("      per layer, largest: " + ", ".join(f"{k} {b / 1e9:.3f}" for k, b in e["per_layer_ops"][:5]))
    first = r["variants"][0]["extrapolated"]["other_bytes"]
    for v in r["variants"][1:]:
        ratio = v["extrapolated"]["other_bytes"] / first
        lines.append(f"  {','.join(f'{k}={x}' for k, x in v['variant'].items())}: {ratio:.3f} x the first variant's bytes "
                     "outside matmuls in the passes")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", choices=list(SHAPE_NAMES), default="1.5b")
    parser.add_argument("--layers", type=int, nargs=2, default=(2, 4), help="the two depths counted (default 2 4)")
    parser.add_argument("--variant", action="append", default=[], help="run-config values, comma-separated")
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--micro-batch-size", type=int, default=4)
    parser.add_argument("--prompt-tokens", type=int, default=180)
    parser.add_argument("--completion-tokens", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if not 1 <= args.layers[0] < args.layers[1]:
        parser.error(f"--layers {args.layers[0]} {args.layers[1]}: expected two depths, 1 <= first < second")
    # the paper's round at bf16 compute on a CPU, one minibatch per update (so no old-policy pass: the KL reference's)
    base = PAPER_ROUND | {"device": "cpu", "precision": "bf16-mixed", "grpo.ppo-micro-batch-size-per-gpu": args.micro_batch_size,
                          "grpo.log-prob-micro-batch-size-per-gpu": args.micro_batch_size, "grpo.mini-batch-size": args.samples,
                          "engine.logprob-chunk-tokens": 1024, "grpo.group-by-length": True}
    try:
        variants = [parse_variant(v) for v in args.variant] or [{}]
        configs = [RunConfig.from_run_config(base | v) for v in variants]
    except ValueError as err:
        parser.error(str(err))
    tokenizer = environment_tokenizer(configs[0].env)
    name = SHAPE_NAMES[args.shape]
    width = SHAPES[name] if name else TINY | {"vocab_size": len(tokenizer)}
    depth = width["num_hidden_layers"]
    samples = synthetic_samples(args.samples, args.prompt_tokens, args.completion_tokens,
                                width.get("vocab_size", len(tokenizer)), np.random.default_rng(args.seed))
    result = {"shape": args.shape, "layers": list(args.layers), "depth": depth, "samples": args.samples,
              "prompt_tokens": args.prompt_tokens, "completion_tokens": args.completion_tokens,
              "micro_batch_size": args.micro_batch_size, "variants": []}
    for v, cfg in zip(variants, configs):
        counts = []
        for layers in args.layers:
            config = shaped_config(name or "", tokenizer, **(width | {"num_hidden_layers": layers}))
            counts.append(count_update(cfg, config, tokenizer, samples, args.seed))
            print(f"{v or '(paper settings)'} at {layers} layers: {counts[-1]['other_bytes'] / 1e9:.2f} GB outside "
                  f"matmuls ({counts[-1]['seconds']} s)", file=sys.stderr, flush=True)
        result["variants"].append({"variant": v, "counted": counts,
                                   "extrapolated": extrapolate(counts[0], counts[1], tuple(args.layers), depth)})
    print(json.dumps(result) if args.json else format_report(result), flush=True)
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
