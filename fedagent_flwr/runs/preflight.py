"""What a valid run config needs of the machine it runs on, checked once at start-up, before any SuperLink, SuperNode
or model: the environments and models it names exist here, the packages it asks for are installed, the files and
folders it names open and parse, per-environment numbers fit the environments' splits, and a context limit holds a
first step's prompt.

The run config (fedagent_flwr/config) checks what the values say by themselves and never asks the machine; this
module asks it. Each role checks what lives on its machine: run_simulation.py checks everything (every role runs
here), the ServerApp what the server reads and writes, a ClientApp what its client reads (fedse.seed-data lives on the
client's machine). A problem is one line naming the key, its value and what is allowed, as the run config's are.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from envs import available_envs, env_names, make_env, per_env_problem, split_size
from fedagent_flwr.agent.models.pretrained import hub_model_problem, model_name_problem, tokenizer_of
from fedagent_flwr.agent.models.warm_start import WARM_PREFIX, WARM_RECIPE
from fedagent_flwr.agent.play.prompts import build_prompt, new_tokens, system_prompt
from fedagent_flwr.agent.play.rollout import PromptEncoder
from fedagent_flwr.atomic import unwritable_reason
from fedagent_flwr.config import RunConfig, invalid
from fedagent_flwr.config.run_config import Need
from strategies.registry import FEDRL_DDPG_ENVS, FEDRL_DQN_ENVS, FEDRL_ENVS, FEDRL_STRATEGY_ENVS

ROLES = ("simulation", "server", "client")  # simulation: every role on this machine


def preflight(cfg: RunConfig, role: str = "simulation") -> RunConfig:
    """`cfg` where this machine gives it what it needs in `role`; else one ValueError, one line a problem as
    RunConfig's."""
    if role not in ROLES:
        raise ValueError(f"preflight role {role!r}: expected one of {', '.join(ROLES)}")
    problems: list[str] = []

    def need(ok: bool, key: str, value: object, allowed: str) -> None:
        if not ok and not any(p.startswith(f"{key}=") for p in problems):  # one line a key
            problems.append(f"{key}={value!r} is not allowed: expected {allowed}")

    envs_ok = _check_envs(cfg, need)
    if envs_ok:  # the numbers per environment and the splits need the environments themselves
        _check_env_numbers(cfg, need)
    _check_model(cfg, need)
    if envs_ok and not any(p.startswith("model=") for p in problems):
        _check_context(cfg, need)
    _check_packages(cfg, need, role)
    _check_files(cfg, need, role, envs_ok)
    if (problem := _seed_data_problem(cfg, role)) and not any(p.startswith("fedse.seed-data=") for p in problems):
        problems.append(problem)
    if problems:
        raise ValueError(invalid(problems))
    return cfg


def _check_envs(cfg: RunConfig, need: Need) -> bool:
    """The env spec names registered environments, of the kind the strategy trains on; True where it does."""
    traits = cfg.traits
    if traits.trains == "fedrl":
        envs = FEDRL_STRATEGY_ENVS[cfg.strategy]
        need(cfg.env in envs, "env", cfg.env, f"one of {', '.join(envs)} with strategy={cfg.strategy!r} (QAvg / PAvg "
             "train RL tables or networks, not LLM agents; deep QAvg is DQNAvg: discrete actions, deep PAvg is DDPGAvg: "
             "continuous actions)")
        if cfg.env in ("hopper", "half-cheetah"):
            need(importlib.util.find_spec("mujoco") is not None, "env", cfg.env,
                 "an installed MuJoCo for the Hopper / HalfCheetah families: pip install -e \".[mujoco]\"")
        if cfg.env in FEDRL_DDPG_ENVS:
            need(cfg.fedrl.pavg_variant == "soft", "fedrl.pavg-variant", cfg.fedrl.pavg_variant,
                 "soft (the default) with a deep env: the simplex projection applies to policy tables only")
        if cfg.fedrl.env_embedding_dim:
            need(cfg.env in FEDRL_DQN_ENVS + FEDRL_DDPG_ENVS, "fedrl.env-embedding-dim", cfg.fedrl.env_embedding_dim,
                 "0 unless env is one of " + ", ".join(FEDRL_DQN_ENVS + FEDRL_DDPG_ENVS) + " (PerDQNAvg / PerDDPGAvg)")
        return cfg.env in envs
    if cfg.env in FEDRL_ENVS:
        need(False, "env", cfg.env, f"a text env ({', '.join(available_envs())}) with strategy={cfg.strategy!r}; "
             f"{', '.join(FEDRL_ENVS)} need strategy qavg or pavg")
        return False
    try:
        env_names(cfg.env)
    except ValueError as err:
        need(False, "env", cfg.env, f"registered environments: {err}")
        return False
    need(cfg.fedrl.env_embedding_dim == 0, "fedrl.env-embedding-dim", cfg.fedrl.env_embedding_dim,
         "0 unless env is one of " + ", ".join(FEDRL_DQN_ENVS + FEDRL_DDPG_ENVS) + " (PerDQNAvg / PerDDPGAvg)")
    return True


def _check_env_numbers(cfg: RunConfig, need: Need) -> None:
    """Held-out tasks fit each environment's test split (the run config checked that per-environment numbers name
    only the spec's environments, and _check_envs that those are registered)."""
    if cfg.traits.trains == "fedrl":
        return
    problem = per_env_problem(cfg.eval.tasks, cfg.env, lambda name: split_size(name, "test"))
    need(problem is None, "eval.tasks", cfg.eval.tasks, problem)


def _check_model(cfg: RunConfig, need: Need) -> None:
    if cfg.traits.trains == "fedrl":
        return
    problem = model_name_problem(cfg.model) or hub_model_problem(cfg.model)  # agent/models/pretrained.py: what it loads
    need(problem is None, "model", cfg.model, problem)
    if cfg.model.startswith(WARM_PREFIX):  # the warm start cloned the expert on prompts of one shape
        for key in ("history_length", "prompt_roles"):
            need(getattr(cfg.rollout, key) == WARM_RECIPE[key], "rollout." + key.replace("_", "-"), getattr(cfg.rollout, key),
                 f"{WARM_RECIPE[key]!r} with model={cfg.model!r} (the warm start's prompts; agent/models/warm_start.py)")


CONTEXT_TASKS = 32  # first prompts measured per environment and split: enough for the longest, in about a second


def _check_context(cfg: RunConfig, need: Need) -> None:
    """rollout.max-context-tokens holds a first step: its prompt (no past step to leave out), as the rollout encodes
    it, plus the tokens generated. Measured on the first tasks of each environment's splits with the model's own
    tokenizer; a limit below that would stop the run at its first episode of such a task, minutes in."""
    limit = cfg.rollout.max_context_tokens
    if not limit or cfg.traits.trains == "fedrl":
        return
    tokenizer = tokenizer_of(cfg.model, cfg.env)
    if tokenizer is None:  # a shape: model's tokenizer is saved with its weights: the rollout checks it
        return
    encoder, generated, longest = PromptEncoder(tokenizer), new_tokens(cfg), (0, "")
    for name in env_names(cfg.env):
        env = make_env(name, cfg.rollout.max_steps)
        for split in ("train", "test"):
            for task in env.tasks_of_split(split)[:CONTEXT_TASKS]:
                observation, _ = env.reset(task)
                prompt = build_prompt(env, observation, [], 0, cfg.rollout.prompt_roles, cfg.rollout.prompt_template)
                system = system_prompt(env) if cfg.rollout.prompt_roles == "system" else None
                longest = max(longest, (len(encoder(prompt, system)), task.id))
    need(longest[0] + generated <= limit, "rollout.max-context-tokens", limit,
         f"0 (no cut), or at least {longest[0] + generated}: the first step of task {longest[1]} has a prompt of "
         f"{longest[0]} tokens, plus {generated} generated")


def _check_packages(cfg: RunConfig, need: Need, role: str) -> None:
    if role != "client" and cfg.tracker != "none":  # the server logs the run
        extra = "" if cfg.tracker == "tensorboard" else f': pip install -e ".[{cfg.tracker}]"'
        need(importlib.util.find_spec(cfg.tracker) is not None, "tracker", cfg.tracker,
             f"none, or {cfg.tracker} once installed{extra}")
    if role != "server" and cfg.engine.training_kernels == "liger":  # the clients train
        need(importlib.util.find_spec("liger_kernel") is not None, "engine.training-kernels", cfg.engine.training_kernels,
             "eager | compile where liger-kernel is not installed (pip install liger-kernel)")


def _check_files(cfg: RunConfig, need: Need, role: str, envs_ok: bool) -> None:
    """Every file or folder a key names, on the machine of the role that reads or writes it, opened and parsed."""
    if role != "client":
        unwritable = unwritable_reason(Path(cfg.output_dir).expanduser())
        need(unwritable is None, "output-dir", cfg.output_dir, f"a folder this process can write ({unwritable})")
        if cfg.eval.initial_evaluation:
            need((Path(cfg.eval.initial_evaluation).expanduser() / "episodes" / "round-0000.json").is_file(), "eval.initial-evaluation",
                 cfg.eval.initial_evaluation, "empty, or a run folder whose evaluation before round 1 finished (it holds "
                 "episodes/round-0000.json)")
    if cfg.partition.scheme == "hardness" and cfg.partition.success_labels:  # the partitions are drawn by the server and each client
        labels = Path(cfg.partition.success_labels).expanduser()
        need(labels.is_file(), "partition.success-labels", cfg.partition.success_labels, "an existing file (python -m "
             "fedagent_flwr.experiments.success_labels writes one)")
        if labels.is_file() and envs_ok and cfg.env in available_envs():
            from partitions.labels import label_file_problem  # here: the partitions package imports flwr-datasets

            problem = label_file_problem(labels, cfg.env)
            need(problem is None, "partition.success-labels", cfg.partition.success_labels, f"a success-label file of env {cfg.env!r} ({problem})")
    if role != "server" and cfg.traits.experience_buffer:  # Fed-SE's clients keep their buffers and read their seeds
        unwritable = unwritable_reason(Path(cfg.fedse.buffer_dir).expanduser())
        need(unwritable is None, "fedse.buffer-dir", cfg.fedse.buffer_dir, f"a folder this process can write ({unwritable})")


def _seed_data_problem(cfg: RunConfig, role: str) -> str | None:
    """Fed-SE's seed data, read whole and checked on the clients' machine: its reader's one line (naming the key, the
    file, the item and what is wrong), or None."""
    if role == "server" or not cfg.traits.experience_buffer or not cfg.fedse.seed_data:
        return None
    from fedagent_flwr.agent.agenttraj import read_items  # here: it reads and checks every item

    try:
        read_items(cfg.fedse.seed_data)
    except ValueError as err:
        return str(err)
    return None
