"""The library config a method's clients and server play episodes with (RolloutConfig), built from the
run config and the process's placement here and nowhere else: the run config declares and checks keys, the placement
(methods/placement.py) says what their `auto` became on this machine, rows and checkpointing included. Each takes the
placement its process built once; none builds one of its own. GRPO's trainer, Fed-SE's round and LoRA need none: they take their
sections as they are (agent/training/grpo.py, agent/self_evolution.py, agent/training/lora.py).
"""

from __future__ import annotations

from fedagent_flwr.agent.engine.placement import Placement
from fedagent_flwr.agent.play.rollout import RolloutConfig
from fedagent_flwr.config import RunConfig
from fedagent_flwr.agent.play.prompts import new_tokens


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
