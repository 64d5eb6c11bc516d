"""`python -m fedagent_flwr.experiments.warm_start`: a supervised warm start of any model on an environment's
scripted-expert demonstrations, written as a checkpoint folder that any run can use with `model=<folder>`.

Why: GRPO learns only from groups whose rewards differ. A model that never writes the answer format (a random
tiny model, or a real instruct model such as SmolLM2-135M zero-shot, which writes prose) earns the same reward
in every episode, so RL has nothing to learn from. A short behaviour-cloning pass on expert steps teaches the
format and a competent-but-imperfect policy that RL can then improve.

The training is TRL's `SFTTrainer` on prompt-completion data: the prompt is the user message the agent sees at
that step (rendered with the model's own chat template, system prompt included where the template adds one),
the completion the expert's answer in the agent's format; the loss covers the completion tokens only. With
`--finetuning lora` the adapter (PEFT, via `peft_config`) is merged into the base before saving, so the folder
is a plain model. Its configuration, the loss curve and the held-out valid-action rate and success before and
after are recorded in `warm_start.json` in the folder.

    python -m fedagent_flwr.experiments.warm_start --model smollm2-135m-instruct --env maze --out ~/warm/smollm2-maze
"""

from __future__ import annotations

import argparse
import json
import random
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from datasets import Dataset
from peft import LoraConfig
from trl import SFTTrainer

from envs import answer_token_budget, make_env
from envs.multi import per_env_spread
from fedagent_flwr.agent.evaluation import summarize
from fedagent_flwr.agent.loading import load_agent
from fedagent_flwr.agent.lora import LoRASpec
from fedagent_flwr.agent.prompts import PROMPT_ROLES, system_prompt
from fedagent_flwr.agent.rollout import (
    ExpertPolicy,
    LMPolicy,
    PromptEncoder,
    RolloutConfig,
    Trajectory,
    run_episodes,
)
from fedagent_flwr.agent.sft import step_losses, trainer_arguments


@dataclass(frozen=True)
class WarmStartConfig:
    model: str
    env: str
    out: str
    finetuning: str = "lora"  # lora | full
    steps: int = 20
    batch_size: int = 8
    learning_rate: float = 0.0  # 0 = 1e-3 for lora, 1e-5 for full
    lora_rank: int = 16
    lora_alpha: int = 32
    lora_target_modules: str = "all-linear"
    demo_episodes: int = 64  # expert episodes on training tasks
    expert_epsilon: float = 0.0  # share of random admissible actions in the demonstrations
    history_length: int = 0  # must match the runs that will use the folder (run-config history-length)
    prompt_roles: str = "user"  # likewise (run-config prompt-roles)
    eval_tasks: int = 9  # held-out tasks played greedily before and after; 0 = no evaluation
    gradient_checkpointing: bool = False  # TRL turns it on by default; a 135M model on CPU runs ~3x faster without
    device: str = "auto"
    seed: int = 0

    def check(self) -> None:
        problems = []
        if self.finetuning not in ("lora", "full"):
            problems.append(f"--finetuning={self.finetuning!r} is not allowed: expected lora | full")
        if self.prompt_roles not in PROMPT_ROLES:
            problems.append(f"--prompt-roles={self.prompt_roles!r} is not allowed: expected {' | '.join(PROMPT_ROLES)}")
        for name in ("steps", "batch_size", "demo_episodes", "lora_rank", "lora_alpha"):
            if getattr(self, name) < 1:
                problems.append(f"--{name.replace('_', '-')}={getattr(self, name)} is not allowed: expected an integer >= 1")
        for name in ("history_length", "eval_tasks"):
            if getattr(self, name) < 0:
                problems.append(f"--{name.replace('_', '-')}={getattr(self, name)} is not allowed: expected an integer >= 0")
        if not 0 <= self.learning_rate < 1:
            problems.append(f"--learning-rate={self.learning_rate} is not allowed: expected 0 <= value < 1 (0 = the default)")
        if not 0 <= self.expert_epsilon <= 1:
            problems.append(f"--expert-epsilon={self.expert_epsilon} is not allowed: expected a value in [0, 1]")
        out = Path(self.out).expanduser()
        if out.exists() and any(out.iterdir()):
            problems.append(f"--out={self.out!r} is not allowed: it exists and is not empty (nothing is overwritten)")
        if problems:
            raise ValueError("; ".join(problems))

    @property
    def lr(self) -> float:
        return self.learning_rate or (1e-3 if self.finetuning == "lora" else 1e-5)


def demonstrations(tokenizer, env: str, cfg: WarmStartConfig) -> list[dict]:
    """Prompt-completion rows (conversational) of expert steps on training tasks, in the rollout engine's prompts."""
    pool = make_env(env).tasks_of_split("train")
    tasks = random.Random(cfg.seed).choices(pool, k=cfg.demo_episodes)
    rollout = RolloutConfig(history_length=cfg.history_length, max_new_tokens=answer_token_budget(env),
                            prompt_roles=cfg.prompt_roles)
    trajectories = run_episodes(ExpertPolicy(tokenizer, epsilon=cfg.expert_epsilon, seed=cfg.seed), lambda: make_env(env),
                                tasks, PromptEncoder(tokenizer), rollout)
    system = [{"role": "system", "content": system_prompt(make_env(env))}] if cfg.prompt_roles == "system" else []
    return [{"prompt": [*system, {"role": "user", "content": s.prompt}], "completion": [{"role": "assistant", "content": s.completion}]}
            for t in trajectories for s in t.steps]


def held_out_play(agent, env: str, cfg: WarmStartConfig) -> dict[str, float]:
    """Greedy play of `eval_tasks` evenly spaced held-out tasks: success, invalid-action rate, generated tokens/s."""
    tasks = per_env_spread(make_env(env).tasks_of_split("test"), cfg.eval_tasks)
    rollout = RolloutConfig(history_length=cfg.history_length, max_new_tokens=answer_token_budget(env), temperature=0.0,
                            prompt_roles=cfg.prompt_roles)
    started = time.perf_counter()
    trajectories: Sequence[Trajectory] = run_episodes(LMPolicy(agent.model, agent.tokenizer, rollout), lambda: make_env(env),
                                                      tasks, PromptEncoder(agent.tokenizer), rollout)
    seconds = time.perf_counter() - started
    m = summarize(trajectories)
    generated = sum(len(s.completion_ids) for t in trajectories for s in t.steps)
    return {"success_rate": m["success_rate"], "valid_action_rate": 1.0 - m["invalid_action_rate"],
            "episodes": m["episodes"], "generated_tokens_per_s": generated / max(seconds, 1e-9)}


def warm_start(cfg: WarmStartConfig) -> dict:
    cfg.check()
    torch.manual_seed(cfg.seed)
    out = Path(cfg.out).expanduser()
    agent = load_agent(cfg.model, cfg.env, cfg.device)
    report: dict = {"config": asdict(cfg), "learning_rate": cfg.lr, "source": agent.spec.source}
    if cfg.eval_tasks:
        report["before"] = held_out_play(agent, cfg.env, cfg)
        print(f"[warm-start] before: {report['before']}", flush=True)
    rows = demonstrations(agent.tokenizer, cfg.env, cfg)
    report["demonstration_steps"] = len(rows)
    peft_config = None
    if cfg.finetuning == "lora":
        targets = LoRASpec.parse_targets(cfg.lora_target_modules)
        peft_config = LoraConfig(r=cfg.lora_rank, lora_alpha=cfg.lora_alpha, lora_dropout=0.0, task_type="CAUSAL_LM",
                                 target_modules=targets if isinstance(targets, str) else list(targets))
    scratch = out.parent / f".{out.name}-trainer"
    args = trainer_arguments(str(scratch), steps=cfg.steps, batch_size=cfg.batch_size, learning_rate=cfg.lr,
                             seed=cfg.seed, device=agent.device, bf16=agent.device.type == "cuda",
                             gradient_checkpointing=cfg.gradient_checkpointing)
    trainer = SFTTrainer(model=agent.model, args=args, train_dataset=Dataset.from_list(rows),
                         processing_class=agent.tokenizer, peft_config=peft_config)
    started = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - started
    report["losses"] = [round(loss, 4) for loss in step_losses(trainer)]
    report["seconds_per_step"] = seconds / cfg.steps
    model = trainer.model.merge_and_unload() if peft_config is not None else trainer.model
    model.eval()
    agent.model = model
    if cfg.eval_tasks:
        report["after"] = held_out_play(agent, cfg.env, cfg)
        print(f"[warm-start] after: {report['after']}", flush=True)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    agent.tokenizer.save_pretrained(out)
    (out / "warm_start.json").write_text(json.dumps(report, indent=2))
    print(f"[warm-start] {cfg.steps} steps of {cfg.batch_size} in {seconds:.0f} s ({report['seconds_per_step']:.2f} s/step), "
          f"loss {report['losses'][0]} -> {report['losses'][-1]}; wrote {out} (use model='{out}')", flush=True)
    return report


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m fedagent_flwr.experiments.warm_start", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    defaults = WarmStartConfig(model="", env="", out="")
    p.add_argument("--model", required=True, help="a HF name or folder, a .gguf file, smollm2-135m-instruct, or tiny:<env>")
    p.add_argument("--env", default="maze")
    p.add_argument("--out", required=True, help="the checkpoint folder to write (must not exist or be empty)")
    for name, value in asdict(defaults).items():
        if name in ("model", "env", "out"):
            continue
        if isinstance(value, bool):
            p.add_argument(f"--{name.replace('_', '-')}", action=argparse.BooleanOptionalAction, default=value)
        else:
            p.add_argument(f"--{name.replace('_', '-')}", type=type(value), default=value)
    cfg = WarmStartConfig(**vars(p.parse_args(argv)))
    try:
        cfg.check()  # every bad flag refused before any model is loaded
    except ValueError as err:
        p.error(str(err))
    warm_start(cfg)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
