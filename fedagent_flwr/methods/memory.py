"""A run's memory plan: the planner's inputs (agent/engine/memory.py) read from the run config and a resolved placement,
and the check before round 1 that each plan fits the memory it is given.

A plan is made for a `Placement` (precision, engine.param-dtype, decode engine, KL reference and checkpointing as resolved),
never resolving an `auto` itself: agent/engine/placement.py's place() asks `memory_plan` while it decides the rows and
the activation room (methods/placement.py passes it), and a placement for another machine (the memory plan's
`--device cuda` on a CPU) plans what a GPU run will hold.
"""

from __future__ import annotations


import torch

from fedagent_flwr.agent.engine.memory import (
    GB,
    LayerActivations,
    MemoryPlan,
    ModelShape,
    client_plan,
    device_budget,
    layer_activations,
    no_grad_pass_bytes,
    server_plan,
)
from fedagent_flwr.agent.engine.placement import Placement

from fedagent_flwr.config import RunConfig

KNOBS = ("engine.ranks-per-client (full fine-tuning's weights, gradients and AdamW state sharded over a client's GPUs, with "
         "num-gpus-per-client as many), "
         "grpo.finetuning='lora' with a small lora.r, engine.gradient-checkpointing=true, grpo.ppo-micro-batch-size-per-gpu, rollout.generation-batch-size, grpo.kl-reference='base' "
         "(with lora), precision, num-gpus-per-client (a larger GPU share), engine.server-device (e.g. cpu, to keep the server off the "
         "clients' GPU) and engine.client-memory-gb / engine.server-memory-gb")


def memory_plan(cfg: RunConfig, shape: ModelShape, context_tokens: int, placement: Placement, rollout_rows: int,
                role: str = "client") -> MemoryPlan:
    """`role`'s (client or server) memory plan for a model of this shape placed as `placement`, with `rollout_rows`
    rows in a generate call."""
    grpo = cfg.traits.grpo
    common = dict(finetuning="lora" if cfg.traits.experience_buffer else cfg.grpo.finetuning,  # Fed-SE: SFT of a LoRA adapter
                  lora_rank=cfg.lora.r, lora_targets=cfg.lora.targets, precision=placement.precision,
                  context_tokens=context_tokens, static_decoder=placement.decode_engine == "static",
                  cuda_graphs=placement.on_cuda)
    if role == "server":
        return server_plan(shape, **common, eval_batch_size=rollout_rows)
    if grpo:  # a generate call holds at most the episodes its process plays: an epoch's, or on N ranks a rank's groups
        rollout_rows = min(rollout_rows, -(-cfg.grpo.tasks_per_epoch // cfg.engine.ranks_per_client) * cfg.grpo.num_generations)
    return client_plan(
        shape, **common, kl_beta=cfg.grpo.beta if grpo else 0.0, kl_reference=placement.kl_reference,
        gradient_checkpointing=placement.gradient_checkpointing in (True, "fitted"),
        micro_batch_size=cfg.grpo.ppo_micro_batch_size_per_gpu if grpo else cfg.fedse.sft_micro_batch_size or cfg.fedse.sft_batch_size,
        micro_batch_tokens=cfg.grpo.ppo_max_token_len_per_gpu if grpo else 0, rollout_batch_size=rollout_rows,
        logprob_chunk_tokens=cfg.engine.logprob_chunk_tokens if grpo else 0,
        logprob_micro_batch_size=(cfg.grpo.log_prob_micro_batch_size_per_gpu or cfg.grpo.ppo_micro_batch_size_per_gpu) if grpo else 0,
        logprob_micro_batch_tokens=cfg.grpo.log_prob_max_token_len_per_gpu if grpo else 0, param_dtype=placement.param_dtype,
        ranks=cfg.engine.ranks_per_client, eager_attention=cfg.engine.attn_implementation == "eager")


def host_plan(cfg: RunConfig, shape: ModelShape) -> MemoryPlan:
    """What a client whose round runs on ranks (engine.ranks-per-client > 1) holds in host memory beyond its ranks' own
    plans, in its process and on rank 0 (agent/fsdp/launch.py, tensor_files.py): the weights the server sent, as
    Flower's message holds them (and decoded to fp32 when they travel in bf16); the round's file in the rank folder,
    the sent weights and then the reply, one at a time (rank 0 removes the first before it writes the second): memory
    where the folder is on a tmpfs, the page cache's (reclaimable) on a disk; rank 0's one whole weight at a time,
    gathered to write the reply, beside the collective's buffer of as many bytes (benchmarks/reply_memory.py measured
    twice the largest weight on CPU ranks); the reply in Flower's record (and encoded in bf16 to travel); with a single-learner
    baseline's kept optimizer (baseline.optimizer = 'keep'), AdamW's state in the node's context and its working copy,
    which travel in the files too. Counted all at once, an upper bound: the gathered weight is gone before the reply's
    record is built."""
    lora = cfg.grpo.finetuning == "lora" or cfg.traits.experience_buffer
    targets = cfg.lora.targets
    if lora:
        weights = shape.lora_parameters(cfg.lora.r, targets) * 4
        largest = max((cfg.lora.r * max(i, o) for name, i, o in shape.linear_shapes
                       if targets == "all-linear" or name.rsplit(".", 1)[-1] in targets), default=0) * 4
    else:
        weights = shape.parameters * 4  # fp32 on the way out, whatever the model's dtype (bf16 has no numpy dtype)
        largest = max(shape.vocab * shape.hidden, shape.intermediate * shape.hidden) * 4
    optimizer = 2 * weights if cfg.baseline.name != "none" and cfg.baseline.optimizer == "keep" else 0
    bf16 = cfg.federation.transfer_dtype == "bf16"
    rows = [("sent weights, Flower's message" + (" (bf16)" if bf16 else ""), weights // 2 if bf16 else weights),
            *([("sent weights decoded to fp32", weights)] if bf16 else []),
            ("round file: the sent weights, then the reply", weights + optimizer),
            ("rank 0: a weight gathered, and its buffer", 2 * largest),
            ("the reply, Flower's record", weights),
            *([("the reply encoded in bf16", weights // 2)] if bf16 else []),
            *([("AdamW state kept, and its working copy", 2 * optimizer)] if optimizer else [])]
    return MemoryPlan(f"a client's host memory beside its {cfg.engine.ranks_per_client} ranks", tuple(rows))


def memory_plans(cfg: RunConfig, shape: ModelShape, context_tokens: int, client: Placement,
                 server: Placement) -> tuple[MemoryPlan, MemoryPlan]:
    """(each client's, the server's) memory plan, each at the rows its placement resolved."""
    return (memory_plan(cfg, shape, context_tokens, client, client.rollout_rows, "client"),
            memory_plan(cfg, shape, context_tokens, server, server.rollout_rows, "server"))


def _adapter(cfg: RunConfig) -> tuple:
    """(targets, rank) of the adapter a client's passes train (Fed-SE's SFT trains one too), else ()."""
    lora = cfg.grpo.finetuning == "lora" or cfg.traits.experience_buffer
    return (cfg.lora.targets, cfg.lora.r) if lora else ()


def plan_layer_activations(cfg: RunConfig, shape: ModelShape, placement: Placement) -> LayerActivations:
    """What a decoder layer of a client's training passes keeps for backward per token (memory.layer_activations):
    the placement's precision and engine.param-dtype, and its adapter's targets where a LoRA adapter learns."""
    return layer_activations(shape, placement.precision, placement.param_dtype, *_adapter(cfg))


def plan_no_grad_pass_bytes(cfg: RunConfig, shape: ModelShape, placement: Placement, tokens: int) -> int:
    """The most a client's no-grad log-prob pass over `tokens` padded positions holds at once (memory.no_grad_pass_bytes),
    with the run's log-prob chunk, the placement's precision and engine.param-dtype, and its adapter's targets."""
    chunk = cfg.engine.logprob_chunk_tokens
    return no_grad_pass_bytes(shape, tokens, min(chunk, tokens) if chunk > 0 else tokens, placement.precision,
                              placement.param_dtype, *_adapter(cfg))


def memory_budget(cfg: RunConfig, device: torch.device, who: str = "client") -> float | None:
    """Bytes `who` (client or server) may plan with: engine.client-memory-gb (engine.server-memory-gb) where given, or else the
    GPU memory free now (memory.device_budget; None on a CPU)."""
    return (cfg.engine.client_memory_gb if who == "client" else cfg.engine.server_memory_gb) * GB or device_budget(device)


def check_memory(plans, client_gb: float, server_gb: float) -> None:
    """Raise before round 1 when a plan exceeds the memory it is given (0 GiB = not checked)."""
    problems = [f"{plan.who} needs about {plan.total / GB:.1f} GiB but {key}={gb:g}"
                for plan, gb, key in zip(plans, (client_gb, server_gb), ("engine.client-memory-gb", "engine.server-memory-gb"))
                if gb and plan.total > gb * GB]
    if problems:
        raise ValueError("the memory plan does not fit: " + "; ".join(problems) + "\n"
                         + "\n".join(plan.table() for plan in plans) + f"\nknobs: {KNOBS}")
