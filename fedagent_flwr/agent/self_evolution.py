"""One Fed-SE client round (Fed-SE Algorithm 1, lines 6-17), with no Flower in sight.

1. Load the global LoRA adapter onto the frozen base model.
2. Explore: play the client's tasks with the current policy (the batched rollout engine).
3. Filter: keep the successful trajectories (binary success), or all of them (w/o filtering).
4. Accumulate: D_t = D_{t-1} u kept (or D^0 u kept, w/o history); the first round seeds
   D^0 with the environment expert's demonstrations on the client's tasks.
5. Fine-tune the adapter by NLL over D_t: of the whole completion (the default), or of the action given
   the reasoning (`loss_tokens="action"`, the paper's Eq. 7).
6. Return the adapter's tensors and numeric metrics - the buffer stays on disk here.

`explore-samples = 0` skips steps 2-4 after seeding: plain federated averaging of
adapters tuned on the static demonstrations (the paper's FedAvg baseline).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from flwr.app import ArrayRecord

from envs import Task, TextEnv, per_env_numbers, task_env
from fedagent_flwr.agent.engine import decode
from fedagent_flwr.agent.play.evaluation import summarize
from fedagent_flwr.agent.play.progress import ProgressLines
from fedagent_flwr.agent.training.experience import ExperienceBuffer, StoredTrajectory
from fedagent_flwr.agent.models.loading import Agent
from fedagent_flwr.agent.training.lora import adapter_to_arrays, arrays_to_adapter, attached_lora
from fedagent_flwr.agent.engine.precision import autocast, model_device
from fedagent_flwr.agent.play.rollout import (
    ExpertPolicy,
    LMPolicy,
    PromptEncoder,
    RolloutConfig,
    Trajectory,
    run_episodes,
)
from fedagent_flwr.agent.training.sft import SupervisedConfig, supervised_finetune
from fedagent_flwr.config import FedSESection, LoRASection
from fedagent_flwr.config.choices import FEDSE_KEEP


def keep_trajectories(trajectories: Sequence[Trajectory], keep: str) -> list[Trajectory]:
    """Fed-SE's filter (eq. 5): binary success. `all` is the w/o-filtering ablation."""
    if keep not in FEDSE_KEEP:
        raise ValueError(f"keep must be one of {FEDSE_KEEP}, got {keep!r}")
    return list(trajectories) if keep == "all" else [t for t in trajectories if t.won]


def valid_steps_only(trajectories: Sequence[Trajectory]) -> list[Trajectory]:
    """Copies without the invalid steps (malformed or inadmissible actions); trajectories left empty are dropped.

    A successful episode of a weak policy can contain steps the environment rejected; imitating
    those teaches malformed answers. The paper keeps whole trajectories (the default, steps=all).
    """
    out = []
    for t in trajectories:
        steps = [s for s in t.steps if s.valid]
        if steps:
            out.append(dataclasses.replace(t, steps=steps))
    return out


def demonstration_tasks(tasks: Sequence[Task], count: int | str) -> list[Task]:
    """The tasks D_k^0 is played on: `count` of the client's tasks, cycling; per environment ("webshop=3930,babyai=810",
    AgentTraj's sizes), that many cycling over the client's tasks of each named environment, none of the others."""
    if isinstance(count, str):
        by_env: dict[str | None, list[Task]] = {}
        for t in tasks:
            by_env.setdefault(task_env(t), []).append(t)
        return [t for name, n in per_env_numbers(count).items() for t in demonstration_tasks(by_env.get(name, []), n)]
    return [tasks[i % len(tasks)] for i in range(count)] if tasks else []


def expert_demonstrations(agent: Agent, env_factory: Callable[[], TextEnv], tasks: Sequence[Task], count: int | str,
                          rollout: RolloutConfig) -> list[Trajectory]:
    """D_k^0: the scripted expert's successful episodes on demonstration_tasks(tasks, count). Thousands of them (the
    AgentTraj sizes) take a while even without a model: progress lines say how far it is."""
    chosen = demonstration_tasks(tasks, count)
    if not chosen:
        return []
    progress = ProgressLines("expert demonstrations") if len(chosen) > 64 else False
    trajs = run_episodes(ExpertPolicy(agent.tokenizer, template=rollout.prompt_template), env_factory, chosen,
                         PromptEncoder(agent.tokenizer), rollout, progress)
    return [t for t in trajs if t.won]


def action_given_reasoning(prompt: list[int], completion: list[int], tokenizer) -> tuple[list[int], list[int]]:
    """(context, target) for the loss of Eq. 7: the reasoning moves to the conditioning side (masked like the
    prompt), the target starts at the first token after `</think>`. Where that tag ends inside a token shared with
    what follows, the shared token counts as reasoning. A completion without `</think>` stays a target whole."""
    for k in range(1, len(completion) + 1):
        if "</think>" in tokenizer.decode(completion[:k]):
            if k == len(completion):
                break
            return [*prompt, *completion[:k]], list(completion[k:])
    return list(prompt), list(completion)


def client_buffer_dir(root: str | Path, run_key: str, partition_id: int) -> Path:
    """Per-client storage: one folder per run (the strategy's run key, kept on resume) and partition-id."""
    if not run_key or "/" in run_key or run_key.startswith("."):
        raise ValueError(f"run key {run_key!r} is not a folder name")
    return Path(root).expanduser() / f"run-{run_key}" / f"partition-{partition_id}"


def self_evolution_round(
    agent: Agent,
    fedse: FedSESection,
    lora: LoRASection,
    rollout: RolloutConfig,
    env_factory: Callable[[], TextEnv],
    tasks: Sequence[Task],
    server_round: int,
    buffer: ExperienceBuffer,
    global_adapter: ArrayRecord | None = None,
    seed_data: Callable[[], tuple[list[StoredTrajectory], int]] | None = None,
    *,
    seed: int = 0,
    precision: str = "fp32",
    attention: str = "sdpa",
    finetune: bool = True,
) -> tuple[ArrayRecord, dict[str, float]]:
    """Run one round from `global_adapter` (None = a fresh adapter); returns (adapter, metrics). `fedse` and `lora`:
    the run config's sections as they are; `seed` seeds the adapter's initial A and the fine-tuning's batches,
    `precision` is the resolved compute precision (fp32 or bf16-mixed, the placement's), `attention` the fine-tuning's
    kernel (engine.attn-implementation); `finetune=False` explores and fills the buffer only. `seed_data`: where
    D_k^0 is read from files (agenttraj.seed_trajectories' entries and the steps it left out) instead of played by
    the scripted experts; called only while the buffer is unseeded."""
    if not tasks:
        raise ValueError("a Fed-SE client needs at least one training task")
    started = time.time()
    metrics: dict[str, float] = {}
    if not buffer.seeded and seed_data is not None:
        entries, left_out = seed_data()
        metrics["fedse/seeded-demos"], metrics["fedse/seed-steps-left-out"] = float(buffer.seed(entries)), float(left_out)
    elif not buffer.seeded and fedse.seed_demos:
        metrics["fedse/seeded-demos"] = float(buffer.seed(expert_demonstrations(agent, env_factory, tasks, fedse.seed_demos, rollout)))
    with attached_lora(agent.model, lora, seed=seed) as peft_model:
        if global_adapter is not None:
            arrays_to_adapter(peft_model, global_adapter)
        new_successes, exploring = 0, time.time()
        if fedse.explore_samples:
            episodes = [t for t in tasks for _ in range(fedse.explore_samples)]
            with autocast(precision, model_device(peft_model)):
                explored = run_episodes(LMPolicy(peft_model, agent.tokenizer, rollout), env_factory, episodes,
                                        PromptEncoder(agent.tokenizer), rollout)
            decode.release(peft_model)  # the static engine's copy and cache: the fine-tuning needs the memory
            metrics.update(summarize(explored))
            new_successes = sum(t.won for t in explored)
            kept = keep_trajectories(explored, fedse.keep)
            if fedse.steps == "valid":
                kept = valid_steps_only(kept)
            buffer.add_round(server_round, kept, keep_history=fedse.history == "cumulative")
            metrics["fedse/kept-trajectories"] = float(len(kept))
        # the round's time split as GRPO's reports it (runs/reporting.time_split): exploring, then the fine-tuning
        metrics["rollout_seconds"] = time.time() - exploring
        metrics["fedse/new-successes"] = float(new_successes)
        metrics.update({f"fedse/{k}": v for k, v in buffer.stats().items()})
        samples = buffer.samples()
        if fedse.loss_tokens == "action":
            samples = [action_given_reasoning(p, c, agent.tokenizer) for p, c in samples]
        if samples and finetune:
            sft = SupervisedConfig(steps=fedse.max_steps, epochs=fedse.num_train_epochs, batch_size=fedse.sft_batch_size,
                                   micro_batch_size=fedse.sft_micro_batch_size, learning_rate=fedse.learning_rate,
                                   lr_schedule=fedse.lr_scheduler_type, seed=seed * 1_000_003 + server_round,
                                   precision=precision, attention=attention)
            losses = supervised_finetune(peft_model, samples, agent.tokenizer, sft)
            metrics["loss"] = losses[-1]
            metrics["fedse/loss-first"] = losses[0]
            metrics["fedse/sft-steps"] = float(len(losses))
        metrics["fedse/train-samples"] = float(len(samples))
        adapter = adapter_to_arrays(peft_model)
    metrics["seconds"] = time.time() - started
    return adapter, {k: float(v) for k, v in metrics.items()}
