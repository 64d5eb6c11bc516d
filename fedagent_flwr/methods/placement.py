"""A process's placement: the run config's `auto` keys resolved once, by agent/engine/placement.py's `place()`, with
the memory plan that decides the rollout rows and the room of the update's activations, then passed alone to what the
process builds (library configs, trainer, evaluator).

Whether a run config is valid does not depend on the machine that checks it (fedagent_flwr/config); what it needs of
the machine is checked by the preflight (runs/preflight.py); whether its resolved `auto` values can run here:
`check_placement` says so at start-up, before round 1, in one line naming the key (the server's prepare and every
client's round call `place_run`, which checks).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

import torch

from envs import Task, make_env
from fedagent_flwr.agent.engine.cpu_rates import MatmulRates, cached_rates
from fedagent_flwr.agent.engine.memory import GB, ModelShape
from fedagent_flwr.agent.engine.placement import Machine, Placement, place, resolve_device
from fedagent_flwr.agent.engine.precision import base_dtype
from fedagent_flwr.agent.models.loading import Agent
from fedagent_flwr.agent.models.model_cache import default_cache_root
from fedagent_flwr.agent.models.pretrained import model_dims
from fedagent_flwr.agent.play.prompts import build_prompt, new_tokens
from fedagent_flwr.agent.play.rollout import PromptEncoder
from fedagent_flwr.config import RunConfig
from fedagent_flwr.config.choices import BF16_PRECISIONS
from fedagent_flwr.methods.memory import memory_budget, memory_plan


def place_run(cfg: RunConfig, role: str = "client", machine: Machine | None = None, model: torch.nn.Module | None = None,
              shape: ModelShape | None = None, context_tokens: int = 0, budget_bytes: float | None = None) -> Placement:
    """Every `auto` of this run resolved for `role` (client, or server: engine.server-device) on `machine` (default: this
    process's). With the model's `shape` and the longest `context_tokens`, the rows and the activation room are planned
    in `budget_bytes` (None or 0: no budget known, an epoch's rows and every layer checkpointed under auto)."""
    grpo_client = role == "client" and cfg.traits.grpo  # only a GRPO client's update checkpoints
    plan_for = None if shape is None else (lambda p, rows: memory_plan(cfg, shape, context_tokens, p, rows, role))
    # auto lets the processor decide only where the clients' device is stated as cpu: under device='auto' a server
    # cannot know its clients' hardware (a deployment's may have GPUs, whose base is fp32), so auto stays fp32 there
    adapter_only = cfg.adapter_only() and cfg.device == "cpu"
    if role == "server" and adapter_only:
        # the server holds the base the clients hold (their fingerprints must agree): bf16 exactly where theirs is
        adapter_only = place_run(cfg, "client", machine, shape=shape).precision == "bf16-base"
    on_cpu = not resolve_device(cfg.device_key(role), machine).startswith("cuda")
    # measured where the precision has a choice to make (auto over an adapter) or a bf16 setting to check; not
    # otherwise, so a full fine-tune under auto (the tiny default job) stays fp32 with nothing measured
    measure = on_cpu and (adapter_only or cfg.precision in BF16_PRECISIONS)
    placement = place(device=cfg.device_key(role), precision=cfg.precision, param_dtype=cfg.engine.param_dtype,
                      decode_engine=cfg.rollout.name, kl_reference=cfg.grpo.kl_reference,
                      gradient_checkpointing=cfg.engine.gradient_checkpointing if grpo_client else False,
                      single_learner=cfg.baseline.name != "none", full_grpo=cfg.grpo.finetuning == "full" and cfg.traits.grpo,
                      machine=machine, model=model, rollout_batch_size=cfg.rollout.generation_batch_size,
                      max_rows=cfg.epoch_episodes(), plan_for=plan_for, budget_bytes=budget_bytes,
                      context_tokens=context_tokens, adapter_only=adapter_only,
                      cpu_rates=run_cpu_rates(cfg, shape) if measure else None)
    check_placement(cfg, placement, role)
    return placement


def run_base_dtype(cfg: RunConfig, machine: Machine | None = None) -> torch.dtype:
    """The dtype every process of the run loads the base model in: bf16 where the clients' precision resolves to
    bf16-base, so the server's base and the clients' agree (their fingerprints do); decided before the model loads."""
    return base_dtype(place_run(cfg, "client", machine).precision)


def run_cpu_rates(cfg: RunConfig, shape: ModelShape | None = None) -> MatmulRates | None:
    """This processor's fp32 and bf16 rates for the run model's MLP matmul (agent/engine/cpu_rates.py), from the model
    cache's record of them or measured once; None where the model's shape cannot be read (nothing measured: auto
    stays fp32)."""
    return _rates(shape.hidden, shape.intermediate) if shape is not None else model_rates(cfg.model, cfg.env)


def model_rates(model: str, env: str) -> MatmulRates | None:
    """run_cpu_rates for a model name (a run-config `model`, a folder or a run's adapter folder) and env."""
    try:
        hidden, intermediate = _dims(model, env)
    except (OSError, ValueError):  # e.g. a hub id on a machine offline: its load reports it in its own words
        return None
    return _rates(hidden, intermediate)


@lru_cache(maxsize=8)
def _dims(model: str, env: str) -> tuple[int, int]:
    return model_dims(model, env)


@lru_cache(maxsize=8)
def _rates(hidden: int, intermediate: int) -> MatmulRates:
    return cached_rates(hidden, intermediate, default_cache_root())


def memory_key_placements(cfg: RunConfig, shape: ModelShape, context_tokens: int,
                          machine: Machine | None = None) -> tuple[Placement, Placement]:
    """(client, server) placements with each role's rows planned in its memory key (engine.client-memory-gb,
    engine.server-memory-gb; 0: an epoch's rows), as the memory plan checked before round 1 plans them."""
    client, server = (place_run(cfg, role, machine, shape=shape, context_tokens=context_tokens, budget_bytes=gb * GB)
                      for role, gb in (("client", cfg.engine.client_memory_gb), ("server", cfg.engine.server_memory_gb)))
    return client, server


def process_placement(cfg: RunConfig, agent: Agent, tasks: Sequence[Task], role: str = "client",
                      model: torch.nn.Module | None = None) -> Placement:
    """This process's placement, with its agent loaded: the context estimated once over `tasks`, rows and activation
    room planned in engine.client-memory-gb (engine.server-memory-gb), or else the GPU memory free now; the engine checked against
    `model` (default: the agent's)."""
    context = context_tokens(cfg, agent.tokenizer, make_env(cfg.env, cfg.rollout.max_steps), tasks)
    return place_run(cfg, role, model=model if model is not None else agent.model, shape=ModelShape.of(agent.model.config),
                     context_tokens=context, budget_bytes=memory_budget(cfg, agent.device, role))


def context_tokens(cfg: RunConfig, tokenizer, env, tasks: Sequence[Task]) -> int:
    """An estimate of the longest context of the run's episodes, for the memory plan: the longest first-step
    prompt over up to 16 tasks, once more for every step of history shown, plus the generated tokens; at most
    rollout.max-context-tokens where the prompts are cut to it."""
    encoder, lengths = PromptEncoder(tokenizer), []
    for task in list(tasks)[:16]:
        observation, _ = env.reset(task)
        lengths.append(len(encoder(build_prompt(env, observation, [], 0, template=cfg.rollout.prompt_template))))
    estimate = max(lengths, default=0) * (1 + cfg.rollout.history_length) + new_tokens(cfg)
    return min(estimate, cfg.rollout.max_context_tokens) if cfg.rollout.max_context_tokens else estimate


def check_placement(cfg: RunConfig, placement: Placement, role: str = "client") -> None:
    """What the run config allows only as its `auto` keys resolve on this machine for `role`; a ValueError naming the
    key."""
    traits = cfg.traits
    if placement.param_dtype == "bf16":  # a working copy of every weight under bf16 compute
        _need(traits.grpo and cfg.grpo.finetuning == "full" and placement.precision == "bf16-mixed", "engine.param-dtype",
              cfg.engine.param_dtype, f"fp32 unless a GRPO strategy trains every weight (grpo.finetuning='full') under precision "
              f"'bf16-mixed' (here strategy={cfg.strategy!r}, grpo.finetuning={cfg.grpo.finetuning!r}, precision resolves to "
              f"{placement.precision!r} on {'a GPU' if placement.on_cuda else 'a CPU'})")
        _need(cfg.engine.ranks_per_client == 1, "engine.param-dtype", cfg.engine.param_dtype,
              "fp32 with engine.ranks-per-client > 1 (a bf16 working copy is not yet run under FSDP2; auto takes it for full "
              "fine-tuning on CUDA)")
    if traits.grpo and cfg.grpo.old_logprobs == "rollout" and role == "client":  # a client samples what it trains
        # The static engine samples from a bf16 copy with the LoRA delta merged in, where a small delta rounds away:
        # its log-probs are not the trained weights', so the PPO ratio would not start at 1 (no test shows they agree).
        _need(placement.decode_engine == "hf", "grpo.old-logprobs", cfg.grpo.old_logprobs,
              f"recompute where rollouts decode with the static engine (rollout.name={cfg.rollout.name!r} resolves to "
              f"'static' on {'a GPU' if placement.on_cuda else 'this machine'}: it samples from a bf16 copy of the weights, "
              "not the ones trained), or rollout.name='hf'")
    if cfg.engine.training_kernels == "liger":
        _need(placement.on_cuda, "engine.training-kernels", cfg.engine.training_kernels,
              f"eager | compile with device={cfg.device!r} resolving to {placement.device!r} (Liger's kernels run on "
              "CUDA only)")


def _need(ok: bool, key: str, value, allowed: str) -> None:
    if not ok:
        raise ValueError(f"invalid run config: {key}={value!r} is not allowed: expected {allowed}")
