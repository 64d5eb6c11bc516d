#!/usr/bin/env python
"""A prefill's last-position head, two ways side by side in one call: transformers' `logits_to_keep=1` (a strided
[batch, 1, hidden] view of the hidden states) against the index tensor the rollout passes (agent/engine/tokens.py
last_logits_only: a contiguous copy). With a frozen model (the base under a LoRA adapter) torch's matmul meets the
strided view by expanding the head's weight to [batch, hidden, vocab] and copying it; this measures what that costs
in one forward on the CPU over a preset's model, LoRA attached as a client attaches it, in the precision the
preset resolves to there.

    python benchmarks/raw_output.py run OUT.json -- python benchmarks/prefill_head.py \
        --run-config configs/smollm2-fedagent-cpu.toml --rows 32 --tokens 196 --json

Each way runs `--repeats` times, alternating, after one warm-up each; the report gives every time, the medians and
their ratio, the repeat-by-repeat ratio's mean and standard error, and the largest difference between the two ways' logits (the same product, summed in another order).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fedagent_flwr.agent.engine.precision import autocast  # noqa: E402
from fedagent_flwr.agent.engine.tokens import last_logits_only  # noqa: E402
from fedagent_flwr.agent.models.loading import load_agent  # noqa: E402
from fedagent_flwr.agent.training.lora import attached_lora  # noqa: E402

from fedagent_flwr.config import RunConfig  # noqa: E402
from fedagent_flwr.methods.placement import place_run, run_base_dtype  # noqa: E402
from fedagent_flwr.simulation import parse_overrides, read_run_config_file  # noqa: E402


def measure(model, ids: torch.Tensor, precision: str, repeats: int) -> dict:
    ways = {"logits_to_keep=1": {"logits_to_keep": 1}, "index tensor": last_logits_only(model)}
    times: dict[str, list[float]] = {name: [] for name in ways}
    logits = {}
    with torch.no_grad(), autocast(precision, ids.device):
        for name, kwargs in ways.items():  # warm-up, and the logits compared
            logits[name] = model(input_ids=ids, use_cache=True, **kwargs).logits.float()
        for _ in range(repeats):
            for name, kwargs in ways.items():
                started = time.perf_counter()
                model(input_ids=ids, use_cache=True, **kwargs)
                times[name].append(time.perf_counter() - started)
    medians = {name: statistics.median(t) for name, t in times.items()}
    a, b = logits.values()
    per_repeat = [x / y for x, y in zip(times["logits_to_keep=1"], times["index tensor"])]  # each pair ran back to back
    spread = statistics.stdev(per_repeat) / len(per_repeat) ** 0.5 if len(per_repeat) > 1 else float("nan")
    return {"seconds": times, "median_seconds": medians,
            "ratio_strided_over_index": medians["logits_to_keep=1"] / medians["index tensor"],
            "ratio_per_repeat": [statistics.mean(per_repeat), spread],
            "max_logit_difference": float((a - b).abs().max())}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run-config", metavar="FILE", help="a preset TOML of run-config keys (default: the defaults)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a run-config value over it")
    parser.add_argument("--rows", type=int, default=32, help="prompts prefilled at once")
    parser.add_argument("--tokens", type=int, default=196, help="tokens a prompt (the SmolLM2 preset's mean: 196)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: a simulated client's one CPU)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    for name in ("rows", "tokens", "repeats", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1, got {getattr(args, name)}")
    try:
        preset = read_run_config_file(args.run_config) if args.run_config else {}
        cfg = RunConfig.from_run_config(RunConfig().to_run_config() | preset | parse_overrides(args.set) | {"device": "cpu"})
    except ValueError as err:
        parser.error(str(err))
    torch.set_num_threads(args.threads)
    precision = place_run(cfg).precision  # what auto resolves to on this CPU
    agent = load_agent(cfg.model, cfg.env, "cpu", run_base_dtype(cfg))
    vocab = agent.model.config.vocab_size
    ids = torch.randint(3, vocab, (args.rows, args.tokens), generator=torch.Generator().manual_seed(0))
    with attached_lora(agent.model, cfg.lora, seed=cfg.seed) as model:  # the base frozen, as on a client
        model.eval()
        report = {"model": cfg.model, "precision": precision, "rows": args.rows, "tokens": args.tokens,
                  "threads": args.threads, "repeats": args.repeats,
                  "head_weight_requires_grad": model.get_output_embeddings().weight.requires_grad,
                  **measure(model, ids, precision, args.repeats)}
    medians = report["median_seconds"]
    print(f"prefill of {args.rows} x {args.tokens} tokens ({cfg.model}, {precision}, {args.threads} thread(s)): "
          f"logits_to_keep=1 {medians['logits_to_keep=1']:.3f} s, index tensor {medians['index tensor']:.3f} s "
          f"(median of {args.repeats}; {report['ratio_strided_over_index']:.2f}x), logits differ by at most "
          f"{report['max_logit_difference']:.3g}", file=sys.stderr if args.json else sys.stdout)
    if args.json:
        print(json.dumps(report))
    return report


if __name__ == "__main__":
    main()
