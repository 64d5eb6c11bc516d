#!/usr/bin/env python
"""GRPO's update on one real epoch's agent steps, pass setting by pass setting, side by side in one process.

The run config's model is loaded as a client loads it (its base dtype, the run's LoRA adapter) and plays one epoch of
the config's rollouts on partition 0's tasks, once. Every agent step then gets a random advantage, so that every
variant trains on all of them (a real epoch keeps only the steps of groups a reward split, a number that would vary
with the sampling), and `--samples` of them are kept. Each `--variant` (run-config values over the run config, e.g.
`engine.shared-prompt-prefix=true,grpo.old-logprobs=rollout`) then times `GRPOTrainer.update` on exactly those samples from a
fresh adapter and optimizer; the variants alternate repeat by repeat, so drift in the machine falls on all of them.
The benchmark's own variant key `peft-input-cast=true` lets PEFT cast each adapter's input to the adapter's fp32, as
it did before agent/training/lora.py's keep_input_dtype (under bf16 autocast the same numbers, two copies more);
`attention=causal|math|causal-math` runs the passes' attention otherwise than the run does (ATTENTION below).
Printed per variant: the update's seconds (mean and standard error over repeats), their ratio to the first variant's
(per repeat), and, where grpo.old-logprobs = rollout, how far the rollout's log-probs lie from a training pass's (mean
absolute difference per completion token, `rollout_logprob_gap`). Unlike cpu_round.py, every variant does the same
work, so the ratio is one of speed alone; what a setting changes in what is learnt is for paired runs to show.
`--profile` then runs one micro-batch of the first variant under torch.profiler (update_profile.py's profile: the
forward and backward timed apart, the top operators, and the backward's autograd nodes by the time under them).

    python benchmarks/update_passes.py --run-config configs/smollm2-fedagent-cpu.toml --samples 96 --repeats 2 \\
        --variant engine.shared-prompt-prefix=false,grpo.old-logprobs=recompute --variant engine.shared-prompt-prefix=true \\
        --variant engine.shared-prompt-prefix=true,grpo.old-logprobs=rollout
    python benchmarks/update_passes.py --run-config configs/smollm2-fedagent-cpu.toml --samples 96 --repeats 3 \\
        --threads 1 --variant peft-input-cast=true --variant peft-input-cast=false --variant engine.training-kernels=compile

With `--json` (one JSON line) under `python benchmarks/raw_output.py run OUT.json -- ...` the result is kept with the
machine, versions and commit it ran on (benchmarks/results/README.md).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time

import numpy as np
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from envs import make_env
from fedagent_flwr.agent.engine import tokens
from fedagent_flwr.agent.models.loading import load_agent
from fedagent_flwr.agent.training.grpo import GRPOTrainer
from fedagent_flwr.agent.training.advantages import StepSample
from fedagent_flwr.agent.training.lora import attached_lora
from fedagent_flwr.config import RunConfig
from fedagent_flwr.methods.library_configs import rollout_config
from fedagent_flwr.methods.placement import place_run, process_placement, run_base_dtype
from fedagent_flwr.methods.tasks import learner_tasks

from cpu_round import read_variants, summarise, variant_parser  # the variant arguments both benchmarks take
from update_profile import format_profile, profile_micro_batch


def epoch_samples(cfg: RunConfig, agent, model, n: int, seed: int) -> list[StepSample]:
    """One epoch of `cfg`'s rollouts as GRPO plays it, every step a sample with a random advantage; the first `n`
    of them in a seeded shuffle (all if fewer)."""
    tasks = learner_tasks(cfg, 0, cfg.num_clients)
    placement = process_placement(cfg, agent, tasks, model=model)  # as a run's client resolves it
    trainer = GRPOTrainer(model, agent.tokenizer, cfg.grpo, rollout_config(cfg, placement=placement), engine=cfg.engine, placement=placement)
    rng = np.random.default_rng(seed)
    torch.manual_seed(seed)
    chosen = [tasks[i] for i in rng.choice(len(tasks), size=cfg.grpo.tasks_per_epoch, replace=True)]
    played = trainer._play(lambda: make_env(cfg.env, cfg.rollout.max_steps), chosen, rng, False)
    steps = [(s, 1.0 / max(1, sum(len(x.completion_ids) for x in t.steps))) for t in played for s in t.steps
             if s.completion_ids]
    order = rng.permutation(len(steps))[:n]
    return [StepSample(steps[i][0].prompt_ids, steps[i][0].completion_ids, float(rng.normal()), steps[i][1],
                       steps[i][0].logprobs) for i in order]


# the benchmark's own variant keys. peft-input-cast: true = PEFT casts each adapter's input to its fp32 (PEFT's
# default, which attached_lora turns off), false = as the run does. attention: how the passes' attention runs on the
# CPU, where its flash kernel's backward took 19 % of a profiled micro-batch (docs/performance.md): "mask" as the run
# does (a Llama model is handed the 4-D causal-and-padding mask), "causal" a right-padded batch handed no mask, so
# SDPA runs its causal kernel (the same numbers for every real token: model_attention_mask's docstring), "math"
# SDPA's math backend, "causal-math" both
CAST_KEY = "peft-input-cast"
ATTENTION_KEY = "attention"
ATTENTION = ("mask", "causal", "math", "causal-math")


def own_keys(variant: str) -> tuple[str, bool, str]:
    """The variant's run-config part, whether PEFT casts the adapter's input (CAST_KEY, true | false), and its
    attention (ATTENTION_KEY, one of ATTENTION)."""
    items = [i for i in variant.split(",") if i.strip()]
    values = {k: i.split("=", 1)[1].strip().lower() if "=" in i else "" for i in items
              for k in [i.split("=", 1)[0].strip()] if k in (CAST_KEY, ATTENTION_KEY)}
    if values.get(CAST_KEY, "false") not in ("true", "false"):
        raise ValueError(f"{CAST_KEY}={values[CAST_KEY]!r} is not allowed: expected true | false")
    if values.get(ATTENTION_KEY, "mask") not in ATTENTION:
        raise ValueError(f"{ATTENTION_KEY}={values[ATTENTION_KEY]!r} is not allowed: expected {' | '.join(ATTENTION)}")
    rest = ",".join(i for i in items if i.split("=", 1)[0].strip() not in (CAST_KEY, ATTENTION_KEY))
    return rest, values.get(CAST_KEY) == "true", values.get(ATTENTION_KEY, "mask")


@contextlib.contextmanager
def attention_as(kind: str):
    """The passes' attention as `kind` (ATTENTION) for the duration."""
    real = tokens.model_attention_mask

    def no_mask_when_right_padded(model, attention_mask, device, padding_mask=False):
        return None if tokens.right_padded(attention_mask) else real(model, attention_mask, device, padding_mask)

    with contextlib.ExitStack() as stack:
        if "causal" in kind:
            tokens.model_attention_mask = no_mask_when_right_padded
            stack.callback(setattr, tokens, "model_attention_mask", real)
        if "math" in kind:
            stack.enter_context(sdpa_kernel([SDPBackend.MATH]))
        yield


def timed_update(cfg: RunConfig, agent, samples: list[StepSample], seed: int, peft_casts: bool = False,
                 attention: str = "mask") -> dict[str, float]:
    """Seconds of one GRPOTrainer.update under `cfg` on a fresh adapter (its first-step log-prob gap, if any)."""
    with attached_lora(agent.model, cfg.lora, seed=seed) as model:
        for module in model.modules():
            if peft_casts and hasattr(module, "cast_input_dtype_enabled"):
                module.cast_input_dtype_enabled = True
        placement = place_run(cfg, model=model)
        trainer = GRPOTrainer(model, agent.tokenizer, cfg.grpo, rollout_config(cfg, placement=placement), engine=cfg.engine, placement=placement)
        started = time.perf_counter()
        with attention_as(attention):
            stats = trainer.update(samples, np.random.default_rng(seed))
        seconds = time.perf_counter() - started
    out = {"update_s": seconds, "optimizer_steps": stats["optimizer_steps"], "loss": stats["loss"]}
    if "rollout_logprob_gap" in stats:
        out["rollout_logprob_gap"] = stats["rollout_logprob_gap"]
    return out


def main(argv: list[str] | None = None) -> dict:
    parser = variant_parser(__doc__)
    parser.add_argument("--samples", type=int, default=96, help="agent steps each update trains on")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--profile", action="store_true",
                        help="after the timed repeats, one micro-batch of the first variant under torch.profiler")
    parser.add_argument("--top", type=int, default=15, help="operators and backward nodes the profile lists")
    args = parser.parse_args(argv)
    try:
        own = {v: own_keys(v) for v in args.variant}
    except ValueError as err:
        parser.error(str(err))
    variants = {}
    for name in args.variant:  # read_variants reads run-config keys only: each variant's, alone
        keys = own[name][0]
        variants[name] = read_variants(parser, argparse.Namespace(**{**vars(args), "variant": [keys]}))[keys]
    casts = {v: own[v][1] for v in args.variant}
    attentions = {v: own[v][2] for v in args.variant}
    first = variants[args.variant[0]]
    if any(run_base_dtype(c) != run_base_dtype(first) for c in variants.values()):
        parser.error("every --variant must hold the base in the same dtype (the samples are played once)")
    agent = load_agent(first.model, first.env, first.device_key("client"), run_base_dtype(first))
    started = time.perf_counter()
    with attached_lora(agent.model, first.lora, seed=args.seed) as model:
        # played with the logprobs kept (the rollout keeps them at any temperature > 0), whatever a variant uses
        samples = epoch_samples(first.updated({"grpo.old-logprobs": "rollout"}), agent, model, args.samples, args.seed)
    play_s = time.perf_counter() - started
    print(f"[update_passes] played {len(samples)} samples in {play_s:.0f} s", file=sys.stderr, flush=True)
    runs: dict[str, list[dict[str, float]]] = {v: [] for v in variants}
    for repeat in range(args.repeats):
        for name, cfg in variants.items():
            runs[name].append(timed_update(cfg, agent, samples, args.seed, casts[name], attentions[name]))
            print(f"[update_passes] repeat {repeat + 1}/{args.repeats} {name}: "
                  + ", ".join(f"{k} {v:.4g}" for k, v in runs[name][-1].items()), file=sys.stderr, flush=True)
    report = {"run_config": args.run_config, "samples": len(samples), "repeats": args.repeats,
              "threads": torch.get_num_threads(), "play_s": play_s,
              "sample_tokens": float(np.mean([len(s.prompt_ids) + len(s.completion_ids) for s in samples])),
              "variants": summarise(runs, args.variant[0], lambda key: key == "update_s")}
    if args.profile:  # a fresh adapter, as each timed update has; its micro-batch's shapes were met in the repeats
        with attached_lora(agent.model, first.lora, seed=args.seed) as model:
            device = place_run(first, model=model).torch_device
            report["profile"] = profile_micro_batch(model, first, samples, device, args.top)
    if args.json:
        print(json.dumps(report))
    else:
        print(f"{args.run_config}: {report['samples']} samples of {report['sample_tokens']:.0f} tokens, {args.repeats} "
              f"repeats, {report['threads']} threads; ratio = {args.variant[0]}'s seconds / the variant's (above 1: faster)")
        for name, entry in report["variants"].items():
            (m, se), (r, rse) = entry["update_s"], entry["update_ratio"]
            gap = f"  gap {entry['rollout_logprob_gap'][0]:.2e}" if "rollout_logprob_gap" in entry else ""
            print(f"  {name:<56} update {m:.1f} +- {se:.1f} s  ({r:.2f} +- {rse:.2f}x){gap}")
        if args.profile:
            print("\n".join(format_profile(report["profile"])))
    return report


if __name__ == "__main__":
    main()
