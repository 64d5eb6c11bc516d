#!/usr/bin/env python
"""The static engine's prefill of a rollout-shaped batch, two ways side by side in one process: each group's shared
prefix computed once (agent/engine/prefill_plan.py, what the rollout runs) and every distinct prompt whole (before).

The batch: `--tasks` tasks x `--group` episodes, every prompt the same system text (`--system` tokens), then its
task's text (`--task`), then a history of its own (uniform in [history / 2, 3 history / 2] tokens). The defaults
follow the issue-35 round (`gpu_round.py --shape 1.5b --set grpo.tasks-per-epoch=16 --set grpo.num-generations=8`): 16 x 8
episodes; a task's episodes share 100 tokens, the mean group prefix that gpu_round printed for its WebShop prompts
on CPU (`--shape tiny ... --set rollout.max-completion-length=16 --decode-engine static`); on an H100 those prompts averaged about
180 tokens (history 80; docs/gpu.md). A later turn's batch, that is: on the first turn a group's prompts are identical and are
prefilled once anyway.

Per variant: the positions the prefill computes (padding included), the best ms of `--repeats` timed starts after a
warm-up (device synchronised), and the largest difference of the next-token log-probs between the two variants.
The model is a random Qwen2.5-shaped one (decode_profile.build), its decoder in the rollout's dtype (bf16 on CUDA).

    python benchmarks/prefill_profile.py --shape tiny      # CPU, seconds
    python benchmarks/prefill_profile.py --shape 1.5b      # one GPU
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time

import torch

from decode_profile import build, device_and_precision, sync
from fedagent_flwr.agent.engine.decode import StaticDecoder
from fedagent_flwr.agent.engine.precision import autocast
from fedagent_flwr.agent.engine.sampling import rollout_dtype
from gpu_round import SHAPE_NAMES
import raw_output


def rollout_prompts(tasks: int, group: int, system: int, task: int, history: int, vocab: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)

    def tokens(n: int) -> list[int]:
        return [rng.randrange(1, vocab) for _ in range(n)]

    common = tokens(system)
    prompts = []
    for _ in range(tasks):
        shared = common + tokens(task)
        prompts += [shared + tokens(rng.randint(max(history // 2, 1), max(3 * history // 2, 1))) for _ in range(group)]
    return prompts


def measure(decoder: StaticDecoder, prompts: list[list[int]], device: torch.device, repeats: int):
    decoder.start(prompts, 0, 1)  # warm-up: the cache's allocation, kernels' first calls
    best = float("inf")
    for _ in range(repeats):
        sync(device)
        started = time.perf_counter()
        logits = decoder.start(prompts, 0, 1)
        sync(device)
        best = min(best, time.perf_counter() - started)
    plan = decoder.last_plan
    return logits.float().log_softmax(-1), {
        "ms": best * 1e3, "positions": plan.cost, "groups": len(plan.prefixes),
        "prefix_width": plan.prefix_width, "suffix_width": plan.suffix_width}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", choices=list(SHAPE_NAMES), default="tiny")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--precision", default="auto", help="auto (bf16-mixed on CUDA, fp32 on CPU), fp32, bf16-mixed")
    parser.add_argument("--tasks", type=int, default=16)
    parser.add_argument("--group", type=int, default=8, help="episodes a task (GRPO's G)")
    parser.add_argument("--system", type=int, default=26, help="tokens every prompt opens with")
    parser.add_argument("--task", type=int, default=74, help="tokens of a task's own text")
    parser.add_argument("--history", type=int, default=80, help="an episode's own tokens, on average")
    parser.add_argument("--repeats", type=int, default=3, help="timed starts per variant; the best counts")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print one JSON line instead of the table")
    args = parser.parse_args(argv)
    device, precision = device_and_precision(parser, args.device, args.precision)
    for key in ("tasks", "group", "history", "repeats"):
        if getattr(args, key) < 1:
            parser.error(f"--{key} must be at least 1, got {getattr(args, key)}")

    model = build(args.shape, device, args.seed)
    prompts = rollout_prompts(args.tasks, args.group, args.system, args.task, args.history,
                              model.config.vocab_size, args.seed)
    variants = {}
    with autocast(precision, device):
        dtype = rollout_dtype(device)
        logprobs = {}
        for name, share in (("whole", False), ("shared prefixes", True)):
            decoder = StaticDecoder(model, dtype, cuda_graphs=False, share_prefixes=share)
            logprobs[name], variants[name] = measure(decoder, prompts, device, args.repeats)
            del decoder
    gap = (logprobs["whole"] - logprobs["shared prefixes"]).abs().max().item()
    result = {"shape": args.shape, "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "precision": precision, "prompts": len(prompts), "prompt_tokens": sum(len(p) for p in prompts),
              "tasks": args.tasks, "group": args.group, "system": args.system, "task": args.task,
              "history": args.history, "variants": variants, "logprob_gap": gap,
              "speedup": variants["whole"]["ms"] / variants["shared prefixes"]["ms"]}
    result["settings"] = raw_output.settings(args)  # every argument as parsed, for the raw output's file
    if args.json:
        print(json.dumps(result), flush=True)
    else:
        print(f"prefill of {len(prompts)} prompts ({args.tasks} tasks x {args.group}; {result['prompt_tokens']:,} tokens) "
              f"on the {args.shape} shape, {result['device']}, {precision}:")
        for name, v in variants.items():
            print(f"  {name:16s} {v['ms']:9.2f} ms  {v['positions']:,} positions computed "
                  f"({v['groups']} prefix groups, prefix width {v['prefix_width']}, suffix width {v['suffix_width']})")
        print(f"  speed-up {result['speedup']:.2f}x; largest next-token log-prob difference {gap:.2e}")
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
