"""A supervised warm start of a real instruct model on an environment's scripted expert, and the cached
`model = "warm:<base>"` models built with it.

Why: GRPO learns only from groups whose rewards differ. A real instruct model zero-shot (SmolLM2-135M writes
prose) earns the same reward in every episode, so RL has nothing to learn from. A short behaviour-cloning pass
teaches the answer format and a competent-but-imperfect policy that RL can then improve.

Training is TRL's `SFTTrainer` on prompt-completion rows: the prompt is the user message the agent sees at that
step (rendered with the model's own chat template), the completion the expert's answer in the agent's format; the
loss covers the completion only. With LoRA the adapter is merged before saving, so the result is a plain model.

`model = "warm:<base>"` (e.g. `warm:smollm2-135m-instruct`) builds that model once per (base weights, environment,
recipe) into the model cache, like the tiny models (model_cache.build_once: a lock, checksums, an atomic rename),
with progress lines and the time left, and every later run loads it. The recipe is WARM_RECIPE; its history length
is the run's `rollout.history-length` must match (runs/preflight.py checks it).
"""

from __future__ import annotations

import hashlib
import json
import random
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from envs import answer_token_budget, env_class, env_names, make_env
from envs.multi import per_env_spread
from fedagent_flwr.agent.engine.placement import Placement
from fedagent_flwr.agent.engine.precision import autocast, model_device
from fedagent_flwr.agent.play.evaluation import summarize
from fedagent_flwr.agent.models.model_cache import MARKER, build_once, default_cache_root
from fedagent_flwr.agent.play.prompts import system_prompt
from fedagent_flwr.agent.play.rollout import (
    ExpertPolicy,
    LMPolicy,
    PromptEncoder,
    RolloutConfig,
    Trajectory,
    run_episodes,
)
from fedagent_flwr.agent.training.lora import peft_config as lora_peft_config
from fedagent_flwr.agent.training.sft import quiet, step_losses, trainer_arguments
from fedagent_flwr.config import LoRASection
from fedagent_flwr.config.choices import PROMPT_ROLES

WARM_PREFIX = "warm:"


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
    history_length: int = 0  # must match the runs that will use the folder (run-config rollout.history-length)
    prompt_roles: str = "user"  # likewise (run-config rollout.prompt-roles)
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


# The recipe of `warm:<base>` models. A LoRA pass (all linear layers, rank 16, lr 1e-3) on 20 batches of 8 expert
# steps taught SmolLM2-135M the answer format on Maze (valid actions 0.00 -> 1.00; docs/agent.md). The demonstrations
# come from a half-random expert, as the tiny models' do: a model cloned on it plays validly but not well, so GRPO
# has groups whose rewards differ. History 2 is the FedAgent reference's prompt.
WARM_RECIPE = {"finetuning": "lora", "steps": 20, "batch_size": 8, "learning_rate": 1e-3, "lora_rank": 16, "lora_alpha": 32,
               "lora_target_modules": "all-linear", "demo_episodes": 64, "expert_epsilon": 0.5, "history_length": 2,
               "prompt_roles": "user", "eval_tasks": 8, "seed": 0}


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


def held_out_play(model, tokenizer, env: str, cfg: WarmStartConfig, placement: Placement) -> dict[str, float]:
    """Greedy play of `eval_tasks` evenly spaced held-out tasks: success, rollout.invalid-action rate, generated tokens/s."""
    tasks = per_env_spread(make_env(env).tasks_of_split("test"), cfg.eval_tasks)
    rollout = RolloutConfig(history_length=cfg.history_length, max_new_tokens=answer_token_budget(env), temperature=0.0,
                            prompt_roles=cfg.prompt_roles, decode_engine=placement.decode_engine)
    started = time.perf_counter()  # in the precision and with the engine a run's evaluation takes on this machine
    with autocast(placement.compute_precision, model_device(model)):
        trajectories: Sequence[Trajectory] = run_episodes(LMPolicy(model, tokenizer, rollout), lambda: make_env(env),
                                                          tasks, PromptEncoder(tokenizer), rollout)
    seconds = time.perf_counter() - started
    m = summarize(trajectories)
    generated = sum(len(s.completion_ids) for t in trajectories for s in t.steps)
    return {"success_rate": m["success_rate"], "valid_action_rate": 1.0 - m["invalid_action_rate"],
            "episodes": m["episodes"], "generated_tokens_per_s": generated / max(seconds, 1e-9), "seconds": seconds}


def train_warm_start(model, tokenizer, placement: Placement, cfg: WarmStartConfig, say=print):
    """Behaviour-clone `model` on the expert; returns (the trained plain model, a report). `placement`: what a run's
    `auto` became on this machine (placement.py), whose device, precision and decode engine it takes. `say` gets
    progress lines."""
    device = placement.torch_device
    from datasets import Dataset
    from trl import SFTTrainer

    from fedagent_flwr.agent.models.tiny_model import TrainingProgress

    torch.manual_seed(cfg.seed)
    report: dict = {"config": asdict(cfg), "learning_rate": cfg.lr}
    if cfg.eval_tasks:
        say(f"[warm-start] playing {cfg.eval_tasks} held-out tasks greedily before training ...")
        report["before"] = held_out_play(model, tokenizer, cfg.env, cfg, placement)
        say(f"[warm-start] before: {_brief(report['before'])}")
    rows = demonstrations(tokenizer, cfg.env, cfg)
    report["demonstration_steps"] = len(rows)
    peft_config = None
    if cfg.finetuning == "lora":
        peft_config = lora_peft_config(LoRASection(r=cfg.lora_rank, lora_alpha=cfg.lora_alpha, target_modules=cfg.lora_target_modules))
    say(f"[warm-start] {len(rows)} expert steps from {cfg.demo_episodes} episodes; training {cfg.steps} steps of {cfg.batch_size} ...")
    with tempfile.TemporaryDirectory(prefix="fedagent-warm-start-") as scratch:  # Trainer's output_dir; nothing is saved there
        args = trainer_arguments(scratch, steps=cfg.steps, batch_size=cfg.batch_size, learning_rate=cfg.lr,
                                 seed=cfg.seed, device=device,
                                 bf16=placement.compute_precision == "bf16-mixed",
                                 gradient_checkpointing=cfg.gradient_checkpointing)
        trainer = quiet(SFTTrainer(model=model, args=args, train_dataset=Dataset.from_list(rows), processing_class=tokenizer,
                                   peft_config=peft_config, callbacks=[TrainingProgress("warm start", every_seconds=30.0)]))
        started = time.perf_counter()
        trainer.train()
        seconds = time.perf_counter() - started
    report["losses"] = [round(loss, 4) for loss in step_losses(trainer)]
    report["seconds_per_step"] = seconds / cfg.steps
    trained = trainer.model.merge_and_unload() if peft_config is not None else trainer.model
    trained.eval()
    say(f"[warm-start] {cfg.steps} steps in {seconds:.0f} s ({report['seconds_per_step']:.2f} s/step), "
        f"loss {report['losses'][0]} -> {report['losses'][-1]}")
    if cfg.eval_tasks:
        say(f"[warm-start] playing {cfg.eval_tasks} held-out tasks greedily after training ...")
        report["after"] = held_out_play(trained, tokenizer, cfg.env, cfg, placement)
        say(f"[warm-start] after: {_brief(report['after'])}")
    return trained, report


def _brief(play: dict[str, float]) -> str:
    return (f"success {play['success_rate']:.2f}, valid actions {play['valid_action_rate']:.2f} over {play['episodes']:.0f} "
            f"episodes, {play['generated_tokens_per_s']:.0f} generated tokens/s")


def save_warm_model(model, tokenizer, report: dict, folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    (folder / "warm_start.json").write_text(json.dumps(report, indent=2))


def warm_recipe(env: str) -> dict:
    """The cache key's recipe for an env: WARM_RECIPE, plus the environments' prompt revisions where any is above 0."""
    revised = [f"{name}:{env_class(name).prompt_revision}" for name in env_names(env) if env_class(name).prompt_revision]
    return WARM_RECIPE | ({"prompt_revisions": ",".join(revised)} if revised else {})


def base_identity(base_source: str) -> str:
    """What names the base weights in the cache key: a built folder's files by their SHA-256 (not their times, so the
    same conversion on another machine or day keys alike), else the name."""
    checksums = Path(base_source) / "checksums.json"
    if checksums.is_file():
        files = {name: entry["sha256"] for name, entry in json.loads(checksums.read_text()).items()}
        return hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()[:16]
    return base_source


def ensure_warm_model(base_name: str, base_source: str, env: str, placement: Placement,
                      cache_root: Path | None = None) -> Path:
    """The cached warm start of `base_source` (what `base_name` resolved to) on `env`, built first if needed, where
    `placement` (placement.py) puts it."""
    device = placement.torch_device
    from transformers import AutoModelForCausalLM, AutoTokenizer

    recipe = warm_recipe(env)
    key = json.dumps({"base": base_identity(base_source), "env": env, **recipe}, sort_keys=True)
    slug = base_name.rsplit("/", 1)[-1].lower().replace(".gguf", "")
    target = (cache_root or default_cache_root()) / f"warm-{slug}-{env.replace(',', '+')}-{hashlib.sha256(key.encode()).hexdigest()[:12]}"

    def build(folder: Path) -> None:
        say = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731 (stderr: JSON on stdout stays clean)
        cfg = WarmStartConfig(model=base_name, env=env, out=str(folder), device=str(device),
                              **{k: v for k, v in recipe.items() if k != "prompt_revisions"})
        model = AutoModelForCausalLM.from_pretrained(base_source, dtype=torch.float32).to(device)
        tokenizer = AutoTokenizer.from_pretrained(base_source)
        trained, report = train_warm_start(model, tokenizer, placement, cfg, say)
        report["base"] = {"name": base_name, "identity": base_identity(base_source)}
        save_warm_model(trained, tokenizer, report, folder)
        (folder / MARKER).write_text(key)

    return build_once(target, build, what=f"the warm start of {base_name} on {env}")


def warm_base(name: str) -> str:
    """`warm:<base>` -> `<base>`; ValueError for an empty base."""
    base = name[len(WARM_PREFIX):]
    if not base or base.startswith((WARM_PREFIX, "tiny", "shape:")):
        raise ValueError(f"model={name!r}: expected warm:<a real instruct model> (a hub name, a folder, a .gguf file or "
                         f"smollm2-135m-instruct)")
    return base

