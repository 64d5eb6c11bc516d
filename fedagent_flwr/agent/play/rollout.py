"""The batched rollout engine shared by GRPO, behaviour-cloning data collection and evaluation.

All live episodes advance together: at every step the engine builds one prompt per
live episode, asks the policy for all completions at once (one `generate` call
with KV cache for a language model, see sampling.py), steps each environment, and drops the
episodes that ended. A policy is any object with `act(episodes) -> completions`.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch
from tqdm.auto import tqdm

from envs import Task, TextEnv
from fedagent_flwr.agent.play.action_matching import match_action
from fedagent_flwr.agent.play.progress import ProgressLines
from fedagent_flwr.agent.play.prompts import (
    PROMPT_ROLES,
    PROMPT_TEMPLATES,
    build_prompt,
    expert_completion,
    parse_action,
    system_prompt,
)
from fedagent_flwr.agent.engine.sampling import sample_batch
from fedagent_flwr.config.choices import ACTION_MATCHING, INVALID_ACTIONS, KERNELS, PENALTY_SCOPES, RESOLVED_ENGINES, REWARD_MODES, TOKEN_SAMPLERS


@dataclass
class StepRecord:
    prompt_ids: list[int]
    completion_ids: list[int]
    completion: str
    action: str
    reward: float
    valid: bool  # well-formed and admissible
    observation: str = ""  # what the agent saw before this step (for transcripts)
    prompt: str = ""  # the user message the step answered (demonstrations for supervised warm starts)
    penalty: float = 0.0  # the rollout.invalid-action penalty this step drew (RolloutConfig.invalid_action says which step does)
    # each completion token's log-probability under the policy that sampled it (LMPolicy at a temperature > 0; None
    # from other policies): GRPO's old-policy log-probs under grpo.old-logprobs = rollout
    logprobs: list[float] | None = None


@dataclass
class Trajectory:
    task: Task
    steps: list[StepRecord] = field(default_factory=list)
    won: bool = False
    env_return: float = 0.0  # sum of the environment's rewards
    penalty: float = 0.0  # rollout.invalid-action penalty, already scaled by its coefficient: the sum of its steps'
    reward: float = 0.0  # the episode's reward less `penalty`, set when it ends (see RolloutConfig.reward)
    episode_reward: float = 0.0  # the episode's reward before any penalty (RolloutConfig.episode_reward)
    score: float | None = None  # the env's own task score at the end (WebShop's goal.py score), if it has one

    @property
    def num_invalid(self) -> int:
        return sum(not s.valid for s in self.steps)


@dataclass
class Episode:
    """A live episode as the policy sees it."""

    env: TextEnv
    trajectory: Trajectory
    observation: str
    history: list[tuple[str, str]] = field(default_factory=list)
    prompt: str = ""
    prompt_ids: list[int] = field(default_factory=list)


class Policy(Protocol):
    def act(self, episodes: Sequence[Episode]) -> list[tuple]:
        """(completion token ids, completion text) for every episode, or (ids, text, each token's log-probability)
        where the policy knows them."""


@dataclass
class RolloutConfig:
    # past (observation, action) pairs in the prompt; no default, so that no caller silently differs
    # from the run config's (methods/library_configs.rollout_config builds this for every run)
    history_length: int
    max_context_tokens: int = 0  # prompt + max_new_tokens at most this; the oldest history left out until it fits
    invalid_penalty: float = 0.1
    max_new_tokens: int = 48
    temperature: float = 1.0
    top_p: float = 1.0
    batch_size: int = 64  # episodes per generate call; bounds memory
    # Trajectory reward: "success" = success_reward if won else 0 (the FedAgent reference:
    # 10 x won), "env" = the environment's own return, or "score" = success_reward x the env's
    # task score where it has one (WebShop's own RL reward is its score), else as "success".
    # The invalid penalty is subtracted.
    reward: str = "success"
    success_reward: float = 10.0
    action_matching: str = "exact"  # see action_matching.py
    answer_parsing: str = "strict"  # see prompts.parse_action
    prompt_roles: str = "user"  # see prompts.PROMPT_ROLES
    prompt_template: str = "compact"  # see prompts.PROMPT_TEMPLATES
    invalid_action: str = "inadmissible"  # see INVALID_ACTIONS
    penalty_scope: str = "trajectory"  # see PENALTY_SCOPES; agent/training/grpo.py reads it
    decode_engine: str = "hf"  # hf = the transformers loop; static = decode.py (as placement.py resolved rollout.name)
    decode_kernels: str = "eager"  # the static engine's token step: eager, or compile (decode.KERNELS)
    token_sampler: str = "multinomial"  # how a token is drawn from its softmax (sampling.TOKEN_SAMPLERS)

    def __post_init__(self) -> None:
        if self.reward not in REWARD_MODES:
            raise ValueError(f"reward must be one of {REWARD_MODES}, got {self.reward!r}")
        if self.action_matching not in ACTION_MATCHING:
            raise ValueError(f"action_matching must be one of {ACTION_MATCHING}, got {self.action_matching!r}")
        if self.prompt_roles not in PROMPT_ROLES:
            raise ValueError(f"prompt_roles must be one of {PROMPT_ROLES}, got {self.prompt_roles!r}")
        if self.prompt_template not in PROMPT_TEMPLATES:
            raise ValueError(f"prompt_template must be one of {PROMPT_TEMPLATES}, got {self.prompt_template!r}")
        if self.invalid_action not in INVALID_ACTIONS:
            raise ValueError(f"invalid_action must be one of {INVALID_ACTIONS}, got {self.invalid_action!r}")
        if self.penalty_scope not in PENALTY_SCOPES:
            raise ValueError(f"penalty_scope must be one of {PENALTY_SCOPES}, got {self.penalty_scope!r}")
        if self.decode_engine not in RESOLVED_ENGINES:
            raise ValueError(f"decode_engine must be one of {RESOLVED_ENGINES}, got {self.decode_engine!r}")
        if self.decode_kernels not in KERNELS:
            raise ValueError(f"decode_kernels must be one of {KERNELS}, got {self.decode_kernels!r}")
        if self.token_sampler not in TOKEN_SAMPLERS:
            raise ValueError(f"token_sampler must be one of {TOKEN_SAMPLERS}, got {self.token_sampler!r}")

    def episode_reward(self, traj: Trajectory) -> float:
        """The episode's reward before any rollout.invalid-action penalty."""
        if self.reward == "env":
            return traj.env_return
        if self.reward == "score" and traj.score is not None:
            return self.success_reward * traj.score
        return self.success_reward if traj.won else 0.0

    def trajectory_reward(self, traj: Trajectory) -> float:
        return self.episode_reward(traj) - traj.penalty

    def step_penalty(self, well_formed: bool, valid: bool) -> float:
        penalized = not well_formed if self.invalid_action == "malformed" else not valid
        return self.invalid_penalty if penalized else 0.0


class PromptEncoder:
    """Turns a prompt string into the token ids the model is conditioned on (chat template if any)."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.has_chat_template = bool(getattr(tokenizer, "chat_template", None))

    def __call__(self, prompt: str, system: str | None = None) -> list[int]:
        return self.encode_many([prompt], None if system is None else [system])[0]

    def encode_many(self, prompts: Sequence[str], systems: Sequence[str] | None = None) -> list[list[int]]:
        """Token ids of each user message (after its system message, where given), in one tokenizer call (its
        Rust batch path): per-prompt calls cost as much as a batched decode step on a small model."""
        if not prompts:
            return []
        systems = systems or [None] * len(prompts)
        if self.has_chat_template:
            texts = self.tokenizer.apply_chat_template(
                [([{"role": "system", "content": s}] if s else []) + [{"role": "user", "content": p}]
                 for p, s in zip(prompts, systems)], add_generation_prompt=True, tokenize=False
            )
            return [list(ids) for ids in self.tokenizer(list(texts), add_special_tokens=False)["input_ids"]]
        texts = [f"{s}\n{p}" if s else p for p, s in zip(prompts, systems)]
        return [list(ids) for ids in self.tokenizer(texts, add_special_tokens=True)["input_ids"]]


def stop_token_ids(tokenizer) -> list[int]:
    ids = {tokenizer.eos_token_id}
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    if isinstance(im_end, int) and im_end != tokenizer.unk_token_id:
        ids.add(im_end)
    return sorted(i for i in ids if i is not None)


class LMPolicy:
    """Samples completions from a causal language model, all live episodes in one batch."""

    def __init__(self, model, tokenizer, config: RolloutConfig) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.config = config
        self.stop_ids = stop_token_ids(tokenizer)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.stop_ids[0]

    @torch.no_grad()
    def act(self, episodes: Sequence[Episode]) -> list[tuple[list[int], str, list[float] | None]]:
        out: list[tuple[list[int], str, list[float] | None]] = []
        size = self.config.batch_size
        for start in range(0, len(episodes), size):
            out.extend(self._generate([e.prompt_ids for e in episodes[start : start + size]]))
        return out

    def _generate(self, prompts: list[list[int]]) -> list[tuple[list[int], str, list[float] | None]]:
        cfg = self.config
        was_training = self.model.training
        self.model.eval()
        # the drawn tokens' log-probs, a few floats a token: greedy decoding (temperature 0) samples from no distribution
        logprobs: list[list[float]] | None = [] if cfg.temperature > 0 else None
        try:
            rows = sample_batch(self.model, prompts, self.pad_id, self.stop_ids, cfg.max_new_tokens,
                                cfg.temperature, cfg.top_p, engine=cfg.decode_engine, kernels=cfg.decode_kernels,
                                logprobs=logprobs, sampler=cfg.token_sampler)
        finally:
            self.model.train(was_training)
        return [(ids, self.tokenizer.decode(ids, skip_special_tokens=True), logprobs[i] if logprobs is not None else None)
                for i, ids in enumerate(rows)]


class ExpertPolicy:
    """The environment's scripted expert, written in the agent's answer format.

    With `epsilon` > 0 each step is, with that probability, a uniformly random admissible action
    instead (answer and think text name the action taken): demonstrations that visit states off
    the expert's path and a cloned policy that is competent but not yet sharp. `think_limit` is
    passed to `expert_completion`.
    """

    def __init__(self, tokenizer, epsilon: float = 0.0, seed: int = 0, think_limit: int | None = None,
                 template: str = "compact") -> None:
        if not 0.0 <= epsilon <= 1.0:
            raise ValueError(f"expert epsilon must lie in [0, 1], got {epsilon}")
        self.tokenizer = tokenizer
        self.stop_ids = stop_token_ids(tokenizer)
        self.epsilon = epsilon
        self.rng = random.Random(seed)
        self.think_limit = think_limit
        self.template = template  # the prompt template whose answer form the expert writes

    def act(self, episodes: Sequence[Episode]) -> list[tuple[list[int], str]]:
        out = []
        for e in episodes:
            if self.epsilon > 0 and self.rng.random() < self.epsilon:
                action = self.rng.choice(e.env.admissible_actions())
            else:
                action = e.env.expert_action()
            text = expert_completion(action, self.think_limit, self.template)
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"] + [self.stop_ids[0]]
            out.append((ids, text))
        return out


def cut_history(e: Episode, config: RolloutConfig, encoder: PromptEncoder, system: str | None) -> None:
    """Episode `e`'s prompt rebuilt with the most past steps (fewer than shown now) that leave room for max_new_tokens
    in max_context_tokens (found by bisection: each try encodes the prompt once). The prompt still counts every step
    taken; a step that does not fit with one past step is refused, naming the key."""
    def encoded(shown: int) -> tuple[str, list[int]]:
        prompt = build_prompt(e.env, e.observation, e.history, shown, config.prompt_roles, config.prompt_template)
        return prompt, encoder(prompt, system)

    room = config.max_context_tokens - config.max_new_tokens
    fits, lo, hi = None, 1, min(config.history_length, len(e.history)) - 1  # the most shown that fits, in [lo, hi]
    while lo <= hi:
        mid = (lo + hi) // 2
        prompt, ids = encoded(mid)
        if len(ids) <= room:
            fits, lo = (prompt, ids), mid + 1
        else:
            hi = mid - 1
    if fits is None:
        shortest = len(encoded(1)[1]) if e.history and config.history_length else len(e.prompt_ids)
        raise ValueError(f"rollout.max-context-tokens={config.max_context_tokens}: a prompt of task {e.trajectory.task.id} "
                         f"needs {shortest} tokens with {min(1, len(e.history), config.history_length)} past step(s) "
                         f"shown, plus {config.max_new_tokens} generated; allowed: a limit above that, or 0 (no cut)")
    e.prompt, e.prompt_ids = fits


def run_episodes(
    policy: Policy,
    env_factory: Callable[[], TextEnv],
    tasks: Sequence[Task],
    encoder: PromptEncoder,
    config: RolloutConfig,
    progress: bool | str | ProgressLines = False,
) -> list[Trajectory]:
    """Play one episode per task (tasks may repeat, e.g. a GRPO group) and return the trajectories. `progress`: a tqdm
    bar (True, or its label), or ProgressLines told of every finished episode."""
    episodes = []
    for task in tasks:
        env = env_factory()
        obs, _ = env.reset(task)
        episodes.append(Episode(env=env, trajectory=Trajectory(task=task), observation=obs))
    live = list(episodes)
    lines = progress if isinstance(progress, ProgressLines) else None
    bar = tqdm(total=len(episodes), desc=progress if isinstance(progress, str) else "rollout",
               disable=lines is not None or not progress, leave=False)
    finished, step = 0, 0
    max_steps = max((e.env.max_steps for e in episodes), default=0)
    while live:
        for e in live:
            e.prompt = build_prompt(e.env, e.observation, e.history, config.history_length, config.prompt_roles,
                                    config.prompt_template)
        systems = [system_prompt(e.env) for e in live] if config.prompt_roles == "system" else None
        for e, ids in zip(live, encoder.encode_many([e.prompt for e in live], systems)):
            e.prompt_ids = ids
        if config.max_context_tokens:
            for i, e in enumerate(live):
                if len(e.prompt_ids) + config.max_new_tokens > config.max_context_tokens:
                    cut_history(e, config, encoder, systems[i] if systems else None)
        completions = policy.act(live)
        still_live = []
        for e, (ids, text, *known) in zip(live, completions):
            parsed = parse_action(text, config.answer_parsing, e.env.reference_tail_chars, e.env.agentgym_reading)
            action, as_written = match_action(e.env, parsed.action, config.action_matching)
            obs, reward, terminated, truncated, info = e.env.step(action)
            valid = parsed.well_formed and info["valid"] and as_written
            traj = e.trajectory
            penalty = config.step_penalty(parsed.well_formed, valid)
            traj.steps.append(StepRecord(e.prompt_ids, ids, text, action, reward, valid, e.observation, e.prompt, penalty,
                                         known[0] if known else None))
            traj.env_return += reward
            traj.penalty += penalty
            e.history.append((e.observation, action))
            e.observation = obs
            if terminated or truncated:
                traj.won = bool(info["won"])
                traj.score = info.get("score")
                traj.episode_reward = config.episode_reward(traj)
                traj.reward = config.trajectory_reward(traj)
                bar.update(1)
                finished += 1
            else:
                still_live.append(e)
        live = still_live
        step += 1
        if lines is not None:
            lines.update(finished, len(episodes), step, max_steps)
    bar.close()
    return [e.trajectory for e in episodes]
