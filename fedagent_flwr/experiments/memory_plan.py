"""`python -m fedagent_flwr.experiments.memory_plan`: the memory plan of a run, for a model shape, without a GPU.

    python -m fedagent_flwr.experiments.memory_plan --shape qwen2.5-1.5b
    python -m fedagent_flwr.experiments.memory_plan --shape qwen2.5-7b --set finetuning=lora --set lora-rank=8 \\
        --set kl-reference=base --set precision=bf16-mixed --context-tokens 2048

The shapes are the papers' Qwen2.5 models (agent/memory.py); `--set` takes any run-config key. The run
itself computes the same plan from its own model and prompts before round 1 (docs/gpu.md).
"""

from __future__ import annotations

import argparse

from fedagent_flwr.agent.memory import GB, SHAPES, ModelShape, shape_config
from fedagent_flwr.config import RunConfig, parse_overrides


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m fedagent_flwr.experiments.memory_plan", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", choices=sorted(SHAPES), required=True)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a run-config key")
    p.add_argument("--context-tokens", type=int, default=2048, help="prompt + generated tokens of the longest step (default 2048)")
    args = p.parse_args(argv)
    try:
        overrides = parse_overrides(args.set)
    except ValueError as err:
        p.error(str(err))
    cfg = RunConfig.from_run_config(RunConfig().to_run_config() | {"precision": "bf16-mixed"} | overrides)
    shape = ModelShape.of(shape_config(args.shape))
    print(f"{args.shape}: {shape.parameters:,} parameters; finetuning={cfg.finetuning}, precision={cfg.resolved_precision()}, "
          f"micro-batch-size={cfg.micro_batch_size}, rollout-batch-size={cfg.rollout_batch_size}, context {args.context_tokens} tokens")
    for plan in cfg.memory_plans(shape, args.context_tokens):
        print(plan.table())
    client = cfg.memory_plans(shape, args.context_tokens)[0]
    for gb in (24, 40, 80):
        print(f"fits a {gb} GiB GPU per client: {'yes' if client.total <= gb * GB else 'no'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
