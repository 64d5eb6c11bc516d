#!/usr/bin/env python
"""The static engine's token step with eager and with compiled kernels (`rollout.kernels`), side by side in one process.

Only the token steps are timed: each run prefills the same prompts, then feeds `--steps` fixed tokens to every row
(no sampling, no stop), device synchronised around the steps. The two decoders alternate run by run, so drift in the
machine falls on both; a warm-up run of each comes first (the compiled decoder compiles there, timed apart as
`first_run_s`). Reported: each decoder's ms per token step (mean and standard error over the runs), the per-run
ratio eager / compile (mean and standard error) and a paired t-test of the two, and the largest log-prob
difference between the two decoders' last steps. On CUDA both decoders replay CUDA graphs, as the rollout does.

`--model` is any run-config model (`tiny:<env>`, `smollm2-135m-instruct`, ...), loaded as a client loads it;
`--shape` instead builds a random Qwen2.5-shaped model on the device as decode_profile.py does (no model cache
written: what a lent GPU's time allows). The decoders run in the rollout's dtype (bf16 on CUDA, fp32 on CPU).

    python benchmarks/step_kernels.py --model smollm2-135m-instruct --rows 32 --prompt-tokens 100   # CPU, minutes
    python benchmarks/step_kernels.py --shape 1.5b --rows 128 --prompt-tokens 512                  # one GPU
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch
from scipy import stats

from decode_profile import build, device_and_precision, sync
from gpu_round import SHAPE_NAMES
import raw_output
from fedagent_flwr.agent.engine.decode import StaticDecoder
from fedagent_flwr.agent.models.loading import load_agent
from fedagent_flwr.agent.engine.precision import autocast
from fedagent_flwr.agent.engine.sampling import rollout_dtype


def timed_steps(decoder: StaticDecoder, prompts: list[list[int]], fed: torch.Tensor) -> tuple[float, torch.Tensor]:
    """ms per token step over fed's columns after one prefill, and the last step's log-probs."""
    decoder.start(prompts, 0, fed.shape[1] + 1)
    sync(decoder.device)
    started = time.perf_counter()
    for t in range(fed.shape[1]):
        logits = decoder.step(fed[:, t])
    sync(decoder.device)
    return (time.perf_counter() - started) / fed.shape[1] * 1e3, logits.float().log_softmax(-1)


def mean_se(values: list[float]) -> tuple[float, float]:
    return statistics.mean(values), (statistics.stdev(values) / len(values) ** 0.5 if len(values) > 1 else 0.0)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny:gridworld")
    parser.add_argument("--env", default="gridworld", help="the environment whose tokenizer a tiny model is built with")
    parser.add_argument("--shape", choices=list(SHAPE_NAMES), help="a random model of this shape instead of --model")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--precision", default="auto", help="auto (bf16-mixed on CUDA, fp32 on CPU), fp32, bf16-mixed")
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--prompt-tokens", type=int, default=100)
    parser.add_argument("--steps", type=int, default=24, help="token steps timed per run")
    parser.add_argument("--runs", type=int, default=6, help="timed runs per decoder, alternating")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print one JSON line instead of the summary")
    args = parser.parse_args(argv)
    for name in ("rows", "prompt_tokens", "steps"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if args.runs < 2:
        parser.error(f"--runs must be at least 2 (a standard error needs two), got {args.runs}")
    device, precision = device_and_precision(parser, args.device, args.precision)
    torch.set_num_threads(args.threads)
    if args.shape:
        model, args.model = build(args.shape, device, args.seed), f"shape {args.shape}"
    else:
        model = load_agent(args.model, args.env, device.type).model.eval()
    vocab = model.get_output_embeddings().out_features
    g = torch.Generator().manual_seed(args.seed)
    # half the rows one token shorter, so the padding is in play
    prompts = [torch.randint(1, vocab, (args.prompt_tokens - i % 2,), generator=g).tolist() for i in range(args.rows)]
    fed = torch.randint(1, vocab, (args.rows, args.steps), generator=g).to(device)

    ms: dict[str, list[float]] = {"eager": [], "compile": []}
    with autocast(precision, device):
        dtype = rollout_dtype(device)
        decoders = {k: StaticDecoder(model, dtype, kernels=k) for k in ms}
        first: dict[str, float] = {}
        last: dict[str, torch.Tensor] = {}
        for k, d in decoders.items():
            started = time.perf_counter()
            timed_steps(d, prompts, fed)
            first[k] = time.perf_counter() - started
        for run in range(args.runs):
            for k, d in decoders.items():
                step_ms, last[k] = timed_steps(d, prompts, fed)
                ms[k].append(step_ms)
            print(f"run {run}: " + ", ".join(f"{k} {v[-1]:.3f} ms" for k, v in ms.items()), file=sys.stderr, flush=True)

    ratios = [a / b for a, b in zip(ms["eager"], ms["compile"])]
    result = {
        "model": args.model, "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "precision": precision, "rows": args.rows, "prompt_tokens": args.prompt_tokens, "steps": args.steps,
        "runs": args.runs, "threads": args.threads, "graphs": decoders["eager"].graphs_on,
        "first_run_s": first, "ms": ms,
        "ms_mean_se": {k: mean_se(v) for k, v in ms.items()},
        "speedup_mean_se": mean_se(ratios),
        "paired_t_p": float(stats.ttest_rel(ms["eager"], ms["compile"]).pvalue),
        "logprob_gap": float((last["eager"] - last["compile"]).abs().max()),
    }
    result["settings"] = raw_output.settings(args)  # every argument as parsed, for the raw output's file
    if args.json:
        print(json.dumps(result), flush=True)
    else:
        (e, e_se), (c, c_se), (s, s_se) = result["ms_mean_se"]["eager"], result["ms_mean_se"]["compile"], result["speedup_mean_se"]
        print(f"{args.model} on {result['device']} ({precision}{', CUDA graphs' if result['graphs'] else ''}), "
              f"{args.rows} rows, prompts of {args.prompt_tokens} tokens, {args.steps} token steps a run, {args.runs} runs each:\n"
              f"  eager kernels   {e:.3f} +- {e_se:.3f} ms per token step (first run {first['eager']:.1f} s)\n"
              f"  compiled        {c:.3f} +- {c_se:.3f} ms per token step (first run, compilation included, {first['compile']:.1f} s)\n"
              f"  speed-up {s:.3f} +- {s_se:.3f}x (mean +- SE of the per-run ratios; paired t-test p = {result['paired_t_p']:.3g}); "
              f"last step's log-prob gap {result['logprob_gap']:.2e}", flush=True)
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
