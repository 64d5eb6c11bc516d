"""The library configs a method's clients and server run with (RolloutConfig, GRPOConfig, SelfEvolutionConfig), built
from the run config and its placement here and nowhere else: the run config declares and checks keys, the placement
(agent/engine/placement.py) says what their `auto` became on this machine.
"""

from __future__ import annotations

from envs import answer_token_budget
from fedagent_flwr.agent.engine.placement import Placement
from fedagent_flwr.agent.play.rollout import RolloutConfig
from fedagent_flwr.agent.self_evolution import SelfEvolutionConfig
from fedagent_flwr.agent.training.grpo import GRPOConfig
from fedagent_flwr.config import RunConfig


def rollout_config(cfg: RunConfig, evaluation: bool = False, batch_size: int | None = None,
                   placement: Placement | None = None) -> RolloutConfig:
    """How episodes are played: training rollouts, or (evaluation=True) the server's held-out play. `placement`:
    this process's (`RunConfig.placement()`, given the model), whose decode engine and rollout rows it takes; without one the
    engine's auto is resolved at each generate call, with the model (the same function decides). `batch_size`:
    rows to play at once, overriding the placement's; an epoch's episodes where neither says."""
    return RolloutConfig(
        history_length=cfg.history_length,
        invalid_penalty=cfg.invalid_penalty,
        max_new_tokens=cfg.max_new_tokens or answer_token_budget(cfg.env),
        temperature=cfg.eval_temperature if evaluation else cfg.temperature,
        top_p=1.0 if evaluation else cfg.top_p,
        batch_size=batch_size or (placement.rollout_rows if placement else cfg.rollout_batch_size or cfg.epoch_episodes()),
        reward=cfg.reward,
        action_matching=cfg.action_matching,
        answer_parsing=cfg.answer_parsing,
        prompt_roles=cfg.prompt_roles,
        prompt_template=cfg.prompt_template,
        invalid_action=cfg.invalid_action,
        penalty_scope=cfg.invalid_penalty_scope,
        decode_engine=placement.decode_engine if placement else cfg.decode_engine,
        decode_kernels=cfg.decode_kernels,
    )


def grpo_config(cfg: RunConfig, activation_room_bytes: float | None = None, placement: Placement | None = None) -> GRPOConfig:
    """`activation_room_bytes`: what the update's activations may take under gradient-checkpointing='auto'
    (methods/memory.py: activation_room); None checkpoints every layer. `placement`: precision and param-dtype as
    resolved (default: on this machine)."""
    placement = placement or cfg.placement()
    return GRPOConfig(
        group_size=cfg.group_size,
        tasks_per_epoch=cfg.tasks_per_epoch,
        learning_rate=cfg.learning_rate,
        clip_eps=cfg.clip_eps,
        kl_beta=cfg.kl_beta,
        minibatch_size=cfg.minibatch_size,
        micro_batch_size=cfg.micro_batch_size,
        micro_batch_tokens=cfg.micro_batch_tokens,
        logprob_micro_batch_size=cfg.logprob_micro_batch_size or cfg.micro_batch_size,
        logprob_micro_batch_tokens=cfg.logprob_micro_batch_tokens,
        max_grad_norm=cfg.max_grad_norm,
        loss_aggregation=cfg.loss_aggregation,
        uniform_groups=cfg.uniform_groups,
        scale_rewards=cfg.scale_rewards,
        kl_reference=placement.kl_reference,
        advantage_estimator=cfg.advantage_estimator,
        gigpo_gamma=cfg.gigpo_gamma,
        gigpo_mode=cfg.gigpo_mode,
        gigpo_step_weight=cfg.gigpo_step_weight,
        clip_ratio_c=cfg.clip_ratio_c,
        kl_clamp=cfg.kl_clamp,
        entropy_coeff=cfg.entropy_coeff,
        std_ddof=cfg.reward_std_ddof,
        weight_decay=cfg.weight_decay,
        logprob_chunk_tokens=cfg.logprob_chunk_tokens,
        length_grouped_micro_batches=cfg.length_grouped_micro_batches,
        shared_prompt_prefix=cfg.shared_prompt_prefix,
        old_logprobs=cfg.old_logprobs,
        gradient_checkpointing=cfg.gradient_checkpointing,
        activation_room_bytes=activation_room_bytes,
        precision=placement.precision,
        training_kernels=cfg.training_kernels,
        param_dtype=placement.param_dtype,
    )


def self_evolution_config(cfg: RunConfig, placement: Placement | None = None) -> SelfEvolutionConfig:
    """A Fed-SE client's settings; `placement` as grpo_config takes it."""
    return SelfEvolutionConfig(
        lora=cfg.lora_spec(), explore_samples=cfg.fedse_explore_samples, keep=cfg.fedse_keep,
        history=cfg.fedse_history, steps=cfg.fedse_steps, loss_tokens=cfg.fedse_loss_tokens,
        seed_demos=cfg.fedse_seed_demos,
        sft_steps=cfg.fedse_sft_steps, sft_batch_size=cfg.fedse_sft_batch_size,
        sft_micro_batch_size=cfg.fedse_sft_micro_batch_size,
        learning_rate=cfg.fedse_learning_rate, seed=cfg.seed, precision=(placement or cfg.placement()).compute_precision,
    )
