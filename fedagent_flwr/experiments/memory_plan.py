"""`python -m fedagent_flwr.experiments.memory_plan`: the memory plan of a run, for a model shape, without a GPU.

    python -m fedagent_flwr.experiments.memory_plan --shape qwen2.5-1.5b
    python -m fedagent_flwr.experiments.memory_plan --shape qwen2.5-7b --set grpo.finetuning=lora --set lora.r=8 \\
        --set grpo.kl-reference=base --set precision=bf16-mixed --context-tokens 2048
    python -m fedagent_flwr.experiments.memory_plan --shape qwen2.5-1.5b --run-config configs/fedagent-paper.toml \\
        --set engine.gradient-checkpointing=auto --set engine.client-memory-gb=80
    python -m fedagent_flwr.experiments.memory_plan --shape qwen2.5-7b --ranks 4 --set engine.gradient-checkpointing=true \\
        --set engine.param-dtype=fp32

The shapes are the papers' Qwen2.5 models (agent/engine/memory.py); `--set` takes any run-config key. `--device`
names the machine planned for (default cuda, whatever this machine has): every `auto` resolves as it would there
(agent/engine/placement.py), so on a CPU `--device cuda` plans what a GPU run holds, bf16-mixed and the static decode
engine's weight copy included. `--ranks N` plans each of a client's N ranks (engine.ranks-per-client: FSDP2 over the
client's GPUs). The run itself computes the same plan from its own model and prompts before round 1.
"""

from __future__ import annotations

import argparse

from fedagent_flwr.agent.engine.memory import (
    GB,
    SHAPES,
    ModelShape,
    layers_to_checkpoint,
    shape_config,
    update_activation_bytes,
)
from fedagent_flwr.agent.engine.placement import Machine
from fedagent_flwr.config import RunConfig
from fedagent_flwr.simulation import parse_overrides
from fedagent_flwr.methods.memory import host_plan, memory_plans, plan_layer_activations
from fedagent_flwr.methods.placement import memory_key_placements, place_run
from fedagent_flwr.simulation import read_run_config_file


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m fedagent_flwr.experiments.memory_plan", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", choices=sorted(SHAPES), required=True)
    p.add_argument("--run-config", default=None, metavar="FILE", help="a TOML preset (e.g. configs/fedagent-paper.toml); --set overrides it")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a run-config key")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                   help="the machine to plan for: cuda (default) = a GPU machine, cpu = one without; `auto` keys resolve as there")
    p.add_argument("--ranks", type=int, default=None, metavar="N",
                   help="plan each of a client's N ranks (the run-config key engine.ranks-per-client; default: the run config's)")
    p.add_argument("--context-tokens", type=int, default=2048, help="prompt + generated tokens of the longest step (default 2048)")
    args = p.parse_args(argv)
    try:
        preset = read_run_config_file(args.run_config) if args.run_config else {}
        overrides = parse_overrides(args.set) | ({"engine.ranks-per-client": args.ranks} if args.ranks is not None else {})
        cfg = RunConfig.from_run_config(RunConfig().to_run_config() | preset | overrides)
        machine = Machine(cuda=args.device == "cuda")  # auto keys resolve as on the machine planned for
        shape = ModelShape.of(shape_config(args.shape))
        placement, server = memory_key_placements(cfg, shape, args.context_tokens, machine)
    except ValueError as err:
        p.error(str(err))
    print(f"planned for {machine.describe()} (--device {args.device}), whatever this one has: {placement.summary()}")
    print(f"{args.shape}: {shape.parameters:,} parameters; grpo.finetuning={cfg.grpo.finetuning}, precision={placement.precision}, "
          f"engine.param-dtype={placement.param_dtype}, grpo.ppo-micro-batch-size-per-gpu={cfg.grpo.ppo_micro_batch_size_per_gpu}, "
          f"grpo.ppo-max-token-len-per-gpu={cfg.grpo.ppo_max_token_len_per_gpu}, rollout.generation-batch-size={cfg.rollout.generation_batch_size}, context {args.context_tokens} tokens")
    if placement.decode_engine == "static":
        print("the rollout decodes with the static engine, which keeps its own compute-dtype copy of the weights "
              "(counted below)")
    per_token = plan_layer_activations(cfg, shape, placement)
    print(f"a decoder layer keeps {per_token.full:,} bytes a token for backward ({per_token.kept:,} as a checkpointed "
          f"layer's input)")
    plans = memory_plans(cfg, shape, args.context_tokens, placement, server)
    for plan in plans + ((host_plan(cfg, shape),) if cfg.engine.ranks_per_client > 1 else ()):
        print(plan.table())
    client = plans[0]
    per = f"per rank ({cfg.engine.ranks_per_client} a client)" if cfg.engine.ranks_per_client > 1 else "per client"
    for gb in (24, 40, 80):
        print(f"fits a {gb} GiB GPU {per}: {'yes' if client.total <= gb * GB else 'no'}")
    if cfg.traits.grpo:  # what engine.gradient-checkpointing = auto does in this budget, whatever the key says now
        print(token_budgets(cfg, shape, args.context_tokens, cfg.engine.client_memory_gb or 80.0, machine))
        print(auto_checkpointing(cfg, shape, args.context_tokens, cfg.engine.client_memory_gb or 80.0, machine))
    return 0


def token_budgets(cfg: RunConfig, shape: ModelShape, context: int, budget_gb: float, machine: Machine | None = None) -> str:
    """The largest grpo.ppo-max-token-len-per-gpu whose pass keeps every activation, and with every layer checkpointed, in the room
    the rest of the plan leaves in `budget_gb` (the update's activations grow linearly with a pass's tokens)."""
    # the room is the same whatever checkpointing says: every row of the plan but the activations
    placement = place_run(cfg.updated({"engine.gradient-checkpointing": "auto"}), "client", machine, shape=shape,
                          context_tokens=context, budget_bytes=budget_gb * GB)
    room = placement.activation_room_bytes
    per_token = plan_layer_activations(cfg, shape, placement)
    whole, every = (max(0, int(room // update_activation_bytes(shape, 1, k, per_token))) for k in (0, shape.layers))
    return (f"in {budget_gb:g} GiB ({room / GB:.1f} GiB left to the update's activations) a pass keeps every activation up to "
            f"{whole:,} padded tokens and up to {every:,} with every layer checkpointed (grpo.ppo-max-token-len-per-gpu = {whole:,} or "
            f"less checkpoints nothing)")


def auto_checkpointing(cfg: RunConfig, shape: ModelShape, context: int, budget_gb: float,
                       machine: Machine | None = None) -> str:
    """What engine.gradient-checkpointing='auto' would do in `budget_gb`: the layers a micro-batch checkpoints, by width."""
    placement = place_run(cfg.updated({"engine.gradient-checkpointing": "auto"}), "client", machine, shape=shape,
                          context_tokens=context, budget_bytes=budget_gb * GB)
    room = placement.activation_room_bytes
    widths = sorted({w for w in (256, 512, 1024) if w < context} | {context})
    # rows a pass holds at each width: grpo.ppo-micro-batch-size-per-gpu, or as many as grpo.ppo-max-token-len-per-gpu allows (one at least, a
    # minibatch at most)
    if cfg.grpo.ppo_max_token_len_per_gpu:
        rows = [min(cfg.grpo.mini_batch_size, max(1, cfg.grpo.ppo_max_token_len_per_gpu // w)) for w in widths]
        who = f"pass of at most {cfg.grpo.ppo_max_token_len_per_gpu:,} padded tokens (grpo.ppo-max-token-len-per-gpu)"
    else:
        rows = [cfg.grpo.ppo_micro_batch_size_per_gpu] * len(widths)
        who = f"micro-batch of {cfg.grpo.ppo_micro_batch_size_per_gpu} rows"
    per_token = plan_layer_activations(cfg, shape, placement)
    layers = [layers_to_checkpoint(shape, n * w, room, per_token) for n, w in zip(rows, widths)]
    return (f"engine.gradient-checkpointing=auto in {budget_gb:g} GiB ({room / GB:.1f} GiB left to the update's activations): a "
            f"{who} checkpoints " + ", ".join(
                f"{k} of {shape.layers} layers at {w} tokens" + (f" ({n} rows)" if cfg.grpo.ppo_max_token_len_per_gpu else "")
                for k, w, n in zip(layers, widths, rows)))


if __name__ == "__main__":
    raise SystemExit(main())
