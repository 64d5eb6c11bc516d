"""A run's memory plan: the planner's inputs (agent/engine/memory.py) read from the run config, the rollout rows that
`rollout-batch-size = 0` resolves to, the room `gradient-checkpointing = auto` leaves the update's activations, and
the check before round 1 that each plan fits the memory it is given.

Every function takes the `Machine` it plans for (default: this process's), so `python -m
fedagent_flwr.experiments.memory_plan --device cuda` on a CPU plans what a GPU run will hold. Precision, param-dtype
and the decode engine come from the run's placement (agent/engine/placement.py), never decided here.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from envs import Task, make_env
from fedagent_flwr.agent.engine.memory import (
    ACTIVATIONS_ROW,
    GB,
    LayerActivations,
    MemoryPlan,
    ModelShape,
    client_plan,
    device_budget,
    layer_activations,
    server_plan,
)
from fedagent_flwr.agent.engine.placement import Machine
from fedagent_flwr.agent.models.loading import Agent
from fedagent_flwr.agent.play.prompts import build_prompt
from fedagent_flwr.agent.play.rollout import PromptEncoder
from fedagent_flwr.config import RunConfig
from fedagent_flwr.methods.library_configs import rollout_config

KNOBS = ("ranks-per-client (full fine-tuning's weights, gradients and AdamW state sharded over a client's GPUs, with "
         "num-gpus-per-client as many), "
         "finetuning='lora' with a small lora-rank, gradient-checkpointing=true, micro-batch-size, rollout-batch-size, kl-reference='base' "
         "(with lora), precision, num-gpus-per-client (a larger GPU share), server-device (e.g. cpu, to keep the server off the "
         "clients' GPU) and client-memory-gb / server-memory-gb")


def memory_plans(cfg: RunConfig, shape: ModelShape, context_tokens: int, rollout_rows: int | None = None,
                 machine: Machine | None = None) -> tuple[MemoryPlan, MemoryPlan]:
    """(each client's, the server's) memory plan for a model of this shape on `machine`, with `rollout_rows` rows in a
    generate call (default: rollout-batch-size, auto resolved against client-memory-gb and server-memory-gb each)."""
    if rollout_rows is None and not cfg.rollout_batch_size:
        client_rows = plan_rollout_rows(cfg, shape, context_tokens, cfg.client_memory_gb * GB, "client", machine)
        server_rows = plan_rollout_rows(cfg, shape, context_tokens, cfg.server_memory_gb * GB, "server", machine)
        return (memory_plans(cfg, shape, context_tokens, client_rows, machine)[0],
                memory_plans(cfg, shape, context_tokens, server_rows, machine)[1])
    rows = rollout_rows if rollout_rows is not None else cfg.rollout_batch_size
    client, server = cfg.placement("client", machine), cfg.placement("server", machine)
    grpo = cfg.traits.grpo
    common = dict(finetuning="lora" if cfg.traits.experience_buffer else cfg.finetuning,  # Fed-SE: SFT of a LoRA adapter
                  lora_rank=cfg.lora_rank, lora_targets=cfg.lora_spec().target_modules)
    client_bytes = client_plan(
        shape, **common, precision=client.precision, kl_beta=cfg.kl_beta if grpo else 0.0,
        kl_reference=cfg.placement().kl_reference,
        gradient_checkpointing=cfg.gradient_checkpointing in (True, "auto") and grpo,
        micro_batch_size=cfg.micro_batch_size if grpo else cfg.fedse_sft_micro_batch_size or cfg.fedse_sft_batch_size,
        micro_batch_tokens=cfg.micro_batch_tokens if grpo else 0, rollout_batch_size=rows, context_tokens=context_tokens,
        logprob_chunk_tokens=cfg.logprob_chunk_tokens if grpo else 0,
        logprob_micro_batch_size=(cfg.logprob_micro_batch_size or cfg.micro_batch_size) if grpo else 0,
        logprob_micro_batch_tokens=cfg.logprob_micro_batch_tokens if grpo else 0,
        static_decoder=client.decode_engine == "static", cuda_graphs=client.on_cuda, param_dtype=client.param_dtype,
        ranks=cfg.ranks_per_client)
    server_bytes = server_plan(shape, **common, precision=server.precision, eval_batch_size=rows,
                               context_tokens=context_tokens, static_decoder=server.decode_engine == "static",
                               cuda_graphs=server.on_cuda)
    return client_bytes, server_bytes


def plan_rollout_rows(cfg: RunConfig, shape: ModelShape, context_tokens: int, budget_bytes: float | None,
                      who: str = "client", machine: Machine | None = None) -> int:
    """rollout-batch-size with 0 = auto resolved by the placement: the most rows (up to an epoch's episodes) whose
    plan (`who`'s: client or server) fits `budget_bytes`; with no budget known, an epoch's episodes."""
    index = 0 if who == "client" else 1
    plan_for = lambda rows: memory_plans(cfg, shape, context_tokens, rows, machine)[index]
    return cfg.placement(who, machine, plan_for=plan_for, budget_bytes=budget_bytes).rollout_rows


def plan_layer_activations(cfg: RunConfig, shape: ModelShape, machine: Machine | None = None) -> LayerActivations:
    """What a decoder layer of a client's training passes keeps for backward per token (memory.layer_activations):
    this run's precision and param-dtype, and its adapter's targets where a LoRA adapter learns."""
    placement = cfg.placement("client", machine)
    lora = cfg.finetuning == "lora" or cfg.traits.experience_buffer
    lora_args = (cfg.lora_spec().target_modules, cfg.lora_rank) if lora else ()
    return layer_activations(shape, placement.precision, placement.param_dtype, *lora_args)


def plan_activation_room(cfg: RunConfig, shape: ModelShape, context_tokens: int, rollout_rows: int,
                         budget_bytes: float | None, machine: Machine | None = None) -> float | None:
    """Bytes the update's activations may take under gradient-checkpointing='auto': `budget_bytes` less every other
    row of the client's plan (which counts the rollout's KV cache too, though the update runs after it is freed: a
    margin). None where checkpointing is not auto or no budget is known: then every layer is checkpointed."""
    if cfg.gradient_checkpointing != "auto" or not budget_bytes:
        return None
    plan = memory_plans(cfg, shape, context_tokens, rollout_rows, machine)[0]
    return budget_bytes - (plan.total - plan.as_dict()[ACTIVATIONS_ROW])


def memory_budget(cfg: RunConfig, device: torch.device, who: str = "client") -> float | None:
    """Bytes `who` (client or server) may plan with: client-memory-gb (server-memory-gb) where given, or else the
    GPU memory free now (memory.device_budget; None on a CPU)."""
    return (cfg.client_memory_gb if who == "client" else cfg.server_memory_gb) * GB or device_budget(device)


def context_tokens(cfg: RunConfig, tokenizer, env, tasks: Sequence[Task]) -> int:
    """An estimate of the longest context of the run's episodes, for the memory plan: the longest first-step
    prompt over up to 16 held-out tasks, once more for every step of history shown, plus the generated tokens."""
    encoder, lengths = PromptEncoder(tokenizer), []
    for task in list(tasks)[:16]:
        observation, _ = env.reset(task)
        lengths.append(len(encoder(build_prompt(env, observation, [], 0, template=cfg.prompt_template))))
    return max(lengths, default=0) * (1 + cfg.history_length) + rollout_config(cfg).max_new_tokens


def rollout_rows(cfg: RunConfig, agent: Agent, tasks: Sequence[Task], who: str = "client") -> int:
    """rollout-batch-size for this process and its loaded agent, with 0 = auto resolved against client-memory-gb
    (server-memory-gb), or else the GPU memory free now (memory.device_budget)."""
    if cfg.rollout_batch_size:
        return cfg.rollout_batch_size
    context = context_tokens(cfg, agent.tokenizer, make_env(cfg.env, cfg.max_steps), tasks)
    return plan_rollout_rows(cfg, ModelShape.of(agent.model.config), context, memory_budget(cfg, agent.device, who), who)


def activation_room(cfg: RunConfig, agent: Agent, tasks: Sequence[Task], rows: int) -> float | None:
    """What the update's activations may take under gradient-checkpointing='auto' (plan_activation_room), with the
    client's budget as rollout_rows finds it; None otherwise (every layer checkpointed, or none)."""
    if cfg.gradient_checkpointing != "auto":
        return None
    context = context_tokens(cfg, agent.tokenizer, make_env(cfg.env, cfg.max_steps), tasks)
    return plan_activation_room(cfg, ModelShape.of(agent.model.config), context, rows, memory_budget(cfg, agent.device))


def check_memory(plans, client_gb: float, server_gb: float) -> None:
    """Raise before round 1 when a plan exceeds the memory it is given (0 GiB = not checked)."""
    problems = [f"{plan.who} needs about {plan.total / GB:.1f} GiB but {key}={gb:g}"
                for plan, gb, key in zip(plans, (client_gb, server_gb), ("client-memory-gb", "server-memory-gb"))
                if gb and plan.total > gb * GB]
    if problems:
        raise ValueError("the memory plan does not fit: " + "; ".join(problems) + "\n"
                         + "\n".join(plan.table() for plan in plans) + f"\nknobs: {KNOBS}")
