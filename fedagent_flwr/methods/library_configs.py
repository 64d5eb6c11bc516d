"""The library configs a method's clients and server run with (RolloutConfig, SelfEvolutionConfig), built from the
run config and the process's placement here and nowhere else: the run config declares and checks keys, the placement
(methods/placement.py) says what their `auto` became on this machine, rows and checkpointing included. Each takes the
placement its process built once; none builds one of its own. GRPO's trainer needs none: it takes the grpo and engine
sections as they are, with the placement (agent/training/grpo.py).
"""

from __future__ import annotations

from fedagent_flwr.agent.engine.placement import Placement
from fedagent_flwr.agent.play.rollout import RolloutConfig
from fedagent_flwr.agent.self_evolution import SelfEvolutionConfig
from fedagent_flwr.agent.training.lora import lora_spec
from fedagent_flwr.config import RunConfig
from fedagent_flwr.methods.placement import new_tokens


def rollout_config(cfg: RunConfig, evaluation: bool = False, *, placement: Placement) -> RolloutConfig:
    """How episodes are played: training rollouts, or (evaluation=True) the server's held-out play. `placement`: this
    process's (methods/placement.py, built once a process), whose decode engine and rollout rows it takes."""
    return RolloutConfig(
        history_length=cfg.rollout.history_length,
        max_context_tokens=cfg.rollout.max_context_tokens,
        invalid_penalty=cfg.rollout.invalid_penalty,
        max_new_tokens=new_tokens(cfg),
        temperature=cfg.eval.temperature if evaluation else cfg.rollout.temperature,
        top_p=1.0 if evaluation else cfg.rollout.top_p,
        batch_size=placement.rollout_rows,
        reward=cfg.rollout.reward,
        action_matching=cfg.rollout.action_matching,
        answer_parsing=cfg.rollout.answer_parsing,
        prompt_roles=cfg.rollout.prompt_roles,
        prompt_template=cfg.rollout.prompt_template,
        invalid_action=cfg.rollout.invalid_action,
        penalty_scope=cfg.rollout.invalid_penalty_scope,
        decode_engine=placement.decode_engine,
        decode_kernels=cfg.rollout.kernels,
        token_sampler=cfg.rollout.token_sampler,
    )


def self_evolution_config(cfg: RunConfig, placement: Placement) -> SelfEvolutionConfig:
    """A Fed-SE client's settings; `placement` as rollout_config takes it."""
    return SelfEvolutionConfig(
        lora=lora_spec(cfg), explore_samples=cfg.fedse.explore_samples, keep=cfg.fedse.keep,
        history=cfg.fedse.history, steps=cfg.fedse.steps, loss_tokens=cfg.fedse.loss_tokens,
        seed_demos=cfg.fedse.seed_demos,
        sft_steps=cfg.fedse.max_steps, sft_epochs=cfg.fedse.num_train_epochs, sft_batch_size=cfg.fedse.sft_batch_size,
        sft_micro_batch_size=cfg.fedse.sft_micro_batch_size,
        learning_rate=cfg.fedse.learning_rate, lr_schedule=cfg.fedse.lr_scheduler_type, seed=cfg.seed, precision=placement.compute_precision,
        sft_attention=cfg.engine.attn_implementation,
    )
