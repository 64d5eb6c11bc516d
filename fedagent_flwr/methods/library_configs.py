"""The library configs a method's clients and server run with (RolloutConfig, GRPOConfig, SelfEvolutionConfig), built
from the run config and the process's placement here and nowhere else: the run config declares and checks keys, the
placement (methods/placement.py) says what their `auto` became on this machine, rows and checkpointing included. Each
takes the placement its process built once; none builds one of its own.
"""

from __future__ import annotations

from dataclasses import fields

from fedagent_flwr.agent.engine.placement import Placement
from fedagent_flwr.agent.play.rollout import RolloutConfig
from fedagent_flwr.agent.self_evolution import SelfEvolutionConfig
from fedagent_flwr.agent.training.grpo_config import GRPOConfig
from fedagent_flwr.agent.training.lora import lora_spec
from fedagent_flwr.config import RunConfig
from fedagent_flwr.methods.placement import new_tokens


def rollout_config(cfg: RunConfig, evaluation: bool = False, *, placement: Placement) -> RolloutConfig:
    """How episodes are played: training rollouts, or (evaluation=True) the server's held-out play. `placement`: this
    process's (methods/placement.py, built once a process), whose decode engine and rollout rows it takes."""
    return RolloutConfig(
        history_length=cfg.history_length,
        max_context_tokens=cfg.max_context_tokens,
        invalid_penalty=cfg.invalid_penalty,
        max_new_tokens=new_tokens(cfg),
        temperature=cfg.eval_temperature if evaluation else cfg.temperature,
        top_p=1.0 if evaluation else cfg.top_p,
        batch_size=placement.rollout_rows,
        reward=cfg.reward,
        action_matching=cfg.action_matching,
        answer_parsing=cfg.answer_parsing,
        prompt_roles=cfg.prompt_roles,
        prompt_template=cfg.prompt_template,
        invalid_action=cfg.invalid_action,
        penalty_scope=cfg.invalid_penalty_scope,
        decode_engine=placement.decode_engine,
        decode_kernels=cfg.decode_kernels,
        token_sampler=cfg.token_sampler,
    )


# GRPOConfig's fields that the placement resolves: the run config's keys of these names may say auto
PLACED = ("precision", "param_dtype", "kl_reference", "gradient_checkpointing", "activation_room_bytes")


def grpo_config(cfg: RunConfig, placement: Placement) -> GRPOConfig:
    """GRPO's settings: every GRPOConfig field is the run-config key of its name (declared and checked once, in
    config/), or one the placement resolved (PLACED: `placement` as rollout_config takes it); the fields with
    defaults are no keys (agent/training/grpo_config.py)."""
    keys = {f.name for f in fields(RunConfig)}
    settings = {f.name: getattr(cfg, f.name) for f in fields(GRPOConfig) if f.name in keys and f.name not in PLACED}
    settings["logprob_micro_batch_size"] = cfg.logprob_micro_batch_size or cfg.micro_batch_size  # 0: the update's
    return GRPOConfig(**settings, **{name: getattr(placement, name) for name in PLACED})


def self_evolution_config(cfg: RunConfig, placement: Placement) -> SelfEvolutionConfig:
    """A Fed-SE client's settings; `placement` as grpo_config takes it."""
    return SelfEvolutionConfig(
        lora=lora_spec(cfg), explore_samples=cfg.fedse_explore_samples, keep=cfg.fedse_keep,
        history=cfg.fedse_history, steps=cfg.fedse_steps, loss_tokens=cfg.fedse_loss_tokens,
        seed_demos=cfg.fedse_seed_demos,
        sft_steps=cfg.fedse_sft_steps, sft_epochs=cfg.fedse_sft_epochs, sft_batch_size=cfg.fedse_sft_batch_size,
        sft_micro_batch_size=cfg.fedse_sft_micro_batch_size,
        learning_rate=cfg.fedse_learning_rate, lr_schedule=cfg.fedse_lr_schedule, seed=cfg.seed, precision=placement.compute_precision,
        sft_attention=cfg.training_attention,
    )
