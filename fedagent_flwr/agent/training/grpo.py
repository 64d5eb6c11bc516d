"""GRPO for multi-turn agents, written out so every step is visible.

One epoch (FedAgent's unit of local work, tau of them per round):
  1. sample `tasks_per_epoch` tasks with replacement from the client's tasks;
  2. play a group of `group_size` episodes per task with the current policy;
  3. advantage of a trajectory = (its reward - group mean) / (group std + eps);
  4. every agent step of a trajectory becomes a sample (its own prompt, with the
     windowed history, and the model's completion) carrying that advantage;
  5. PPO-clip loss on the completion tokens only (prompt = environment text is
     masked out), plus an optional k3 KL penalty to a reference policy (the
     weights the round started from), minimised with AdamW over minibatches.

Why not TRL's GRPOTrainer: its `rollout_func` returns one prompt and one
completion per rollout (with an `env_mask` over that single sequence), so a
multi-turn episode must be one growing token sequence. The FedAgent reference
instead prompts every step afresh with only the last `history_length` steps,
which makes each step a separate (prompt, completion) sample sharing the
trajectory's advantage. That does not fit the trainer's one-sequence-per-rollout
shape, and the trainer also owns the optimizer and data loop that the federated
round needs to control (fresh local iterate each round, tau epochs, round-start
reference model), so the loss is written here (about 40 lines).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from envs import Task, TextEnv
from fedagent_flwr.agent.engine import decode
from fedagent_flwr.agent.engine.checkpointing import CHECKPOINTING
from fedagent_flwr.agent.play.evaluation import summarize
from fedagent_flwr.agent.engine.master_weights import PARAM_DTYPES
from fedagent_flwr.agent.engine.kernels import TRAINING_KERNELS, apply_liger, check_training_kernels
from fedagent_flwr.agent.engine.passes import TrainingPasses
from fedagent_flwr.agent.engine.ranks import Ranks, like, whole
from fedagent_flwr.agent.engine.precision import RESOLVED_PRECISIONS, autocast, check_trainable_precision, model_device
from fedagent_flwr.agent.play.rollout import (
    PENALTY_SCOPES,
    LMPolicy,
    PromptEncoder,
    RolloutConfig,
    Trajectory,
    run_episodes,
)
from fedagent_flwr.agent.engine.tokens import collate, completion_logprobs, to_device
from fedagent_flwr.agent.training import gigpo
from fedagent_flwr.agent.training.gigpo import ADVANTAGE_ESTIMATORS, GIGPO_MODES

# "micro-batch-token-mean": verl's token-mean under gradient accumulation (dp_actor.py: each micro-batch's token mean,
# divided by the number of micro-batches), so a token in a short micro-batch weighs more than one in a long one.
LOSS_AGGREGATIONS = ("trajectory-mean", "token-mean", "micro-batch-token-mean")
STD_DDOFS = (0, 1)  # the group standard deviation's delta degrees of freedom: 0 = numpy's default, 1 = torch.std's
UNIFORM_GROUPS = ("drop", "keep")  # what an epoch does with the steps of a group whose rewards are all equal
# What a reward's deviation from its group's mean is divided by (TRL's GRPOConfig.scale_rewards, same names):
# "group" = the group's standard deviation (GRPO's, verl's and the FedAgent reference's); "batch" = the standard
# deviation of all the epoch's rewards; "none" = nothing (Dr. GRPO). Why it matters: under "group", a group of 4
# failures of which one drew a 0.1 invalid-action penalty gets the advantages of a group of 1 win and 3 failures,
# mirrored: its 3 penalty-free failures +0.58 each, as large as the won group's failures get -0.58
# (docs/results.md, issue 34).
SCALE_REWARDS = ("group", "batch", "none")
KL_REFERENCES = ("round-start", "base")
# Where the PPO ratio's denominator comes from: "recompute" = a no-grad pass of the round-start policy over every
# sample before the first step (verl's and TRL's way); "rollout" = the log-probs the sampler drew each token with
# (the same policy and the same tokens: the same numbers up to the decode passes' rounding), which saves that pass
OLD_LOGPROBS = ("recompute", "rollout")


@dataclass
class GRPOConfig:
    """GRPO's settings, checked as they are made (a ValueError names the field, its value and what is allowed).

    Built from the run config by methods/library_configs.grpo_config, the one source of the fields without defaults;
    those with defaults are no run-config keys (adv_eps, and the diagnostic switches at the end)."""

    group_size: int  # G rollouts per task
    tasks_per_epoch: int  # tasks sampled with replacement per epoch
    learning_rate: float
    clip_eps: float
    kl_beta: float  # weight of the KL to the reference (round-start) policy; 0 disables it
    minibatch_size: int  # agent steps per optimizer step
    micro_batch_size: int  # agent steps per forward/backward (gradient accumulation)
    # > 0: the update's micro-batches are cut by padded tokens (rows x the longest row) instead of by micro_batch_size:
    # as many consecutive samples as fit this many, a longer sample alone (micro_batches below)
    micro_batch_tokens: int
    # agent steps per no-grad log-prob pass (old policy, KL reference): no activations are kept for backward, so a
    # bigger batch fits and keeps a GPU busier (docs/gpu.md: on an H100, 16.9 % MFU at 8 rows, 25.5 % at 64)
    logprob_micro_batch_size: int
    # > 0: the no-grad passes cut by padded tokens instead of by logprob_micro_batch_size (micro_batches below)
    logprob_micro_batch_tokens: int
    max_grad_norm: float
    # "token-mean": every generated token weighs the same (verl's default), so long
    # failed episodes dominate; "trajectory-mean": every trajectory weighs the same,
    # its tokens averaged (as if the episode were one sequence).
    loss_aggregation: str
    # The KL anchor: "round-start" = the weights (or adapter) the round started from; "base" = the run's
    # initial model, fixed for the whole run: for a LoRA model the adapter switched off (no second copy of the
    # model in memory), for full fine-tuning a frozen copy of the base weights the trainer is given.
    kl_reference: str
    # recompute layer activations in backward (transformers' checkpointing): True = every layer; "auto" = per
    # micro-batch the fewest leading layers whose activations fit activation_room_bytes (agent/engine/checkpointing.py)
    gradient_checkpointing: bool | str
    # A group whose rewards are all equal has advantage 0: "drop" skips its steps (no policy-gradient signal, and
    # the forward/backward passes are saved, but with kl_beta > 0 its KL term goes too, so how many steps the KL
    # pulls back depends on how many groups were informative); "keep" trains on them with advantage 0, so the KL
    # term covers every step played, as verl's GRPO does.
    uniform_groups: str
    scale_rewards: str  # what group-centred rewards are divided by: group | batch | none (SCALE_REWARDS)
    # "fp32", or "bf16-mixed": fp32 weights and optimizer states, forward passes under bf16 autocast
    # (agent/engine/precision.py says why a pure-bf16 model does not train at lr 1e-6), or "bf16-base": a LoRA adapter in
    # fp32 over a frozen base held in bf16, forward passes under bf16 autocast
    precision: str
    # Completion tokens the output head scores at a time in the log-prob and update passes (tokens.py,
    # chunked_completion_logprobs): the full [micro-batch, tokens, vocab] logits are never built. 0 = the whole
    # model's logits, as before (bit-identical to earlier runs).
    logprob_chunk_tokens: int
    # Sort each minibatch's samples by length before cutting it into micro-batches (and all samples in the
    # log-prob passes), so that samples of similar length share a micro-batch and little padding is computed.
    # The loss is the same weighted token mean (same normalizer); only float summation order changes.
    length_grouped_micro_batches: bool
    # The prompts' shared prefix computed once per pass (tokens.collate's share_prefix): the same values up to rounding
    shared_prompt_prefix: bool
    old_logprobs: str  # OLD_LOGPROBS: recompute them in a pass, or take the rollout's
    weight_decay: float  # AdamW's decoupled weight decay (verl's actor default is 0.01)
    # the decoder layers' kernels in the log-prob and update passes: eager | compile | liger (agent/engine/kernels.py)
    training_kernels: str
    # what the log-prob and update passes compute with under bf16 autocast: "fp32" = the fp32 weights, cast by
    # autocast in every forward; "bf16" = a bf16 working copy over fp32 masters (agent/engine/master_weights.py)
    param_dtype: str
    # what the update's activations may take under gradient_checkpointing="auto" (methods/memory.plan_activation_room);
    # None = no memory known: every layer is checkpointed
    activation_room_bytes: float | None
    # grpo = one episode-level advantage for every step of a trajectory; gigpo adds GiGPO's step-level part
    # (agent/training/gigpo.py): discount gamma, mean_norm | mean_std_norm, the part's weight (0 = GRPO exactly)
    advantage_estimator: str
    gigpo_gamma: float
    gigpo_mode: str
    gigpo_step_weight: float
    # verl's loss details (core_algos.py of the FedAgent reference's verl), each 0 = off: dual clip (a negative
    # advantage's loss capped at -advantage x clip_ratio_c, c > 1), the k3 KL estimate clamped to [-kl_clamp,
    # kl_clamp], and an entropy bonus (the loss less entropy_coeff x the completion tokens' mean entropy)
    clip_ratio_c: float
    kl_clamp: float
    entropy_coeff: float
    std_ddof: int  # ddof of the standard deviations rewards are divided by (STD_DDOFS; verl's torch.std: 1)
    adv_eps: float = 1e-6
    # Diagnostic switches (agent/engine/passes.py, TrainingPasses): each puts back what the passes did before a change,
    # for a benchmark to measure the change side by side (benchmarks/update_profile.py's own variant keys). The
    # defaults are what runs use; they are no run-config keys.
    host_waits: bool = False  # True: the host waits for the device before and after every forward pass
    fused_adamw: bool = True  # True: PyTorch's fused AdamW on a GPU (engine/passes.py adamw); False: its default AdamW
    padding_mask: bool = False  # True: right-padded batches reach Qwen models with the 4-D padding mask (tokens.py)

    def __post_init__(self) -> None:
        for name in ("group_size", "tasks_per_epoch", "minibatch_size", "micro_batch_size", "logprob_micro_batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)!r} is not allowed: expected an integer >= 1")
        for name, zero in (("micro_batch_tokens", "cut by rows"), ("logprob_micro_batch_tokens", "cut by rows"),
                           ("logprob_chunk_tokens", "unchunked")):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}={getattr(self, name)!r} is not allowed: expected an integer >= 0 (0 = {zero})")
        if not (self.clip_ratio_c == 0 or self.clip_ratio_c > 1) or self.kl_clamp < 0 or self.entropy_coeff < 0:
            raise ValueError(f"clip_ratio_c={self.clip_ratio_c!r}, kl_clamp={self.kl_clamp!r}, entropy_coeff="
                             f"{self.entropy_coeff!r}: expected clip_ratio_c 0 (off) or > 1, the others >= 0")
        if self.std_ddof not in STD_DDOFS:
            raise ValueError(f"std_ddof={self.std_ddof!r} is not allowed: expected 0 | 1")
        if not 0.0 <= self.gigpo_gamma <= 1.0 or self.gigpo_step_weight < 0:
            raise ValueError(f"gigpo_gamma={self.gigpo_gamma!r} and gigpo_step_weight={self.gigpo_step_weight!r}: "
                             "expected a discount in [0, 1] and a weight >= 0")
        for name, allowed in (("advantage_estimator", ADVANTAGE_ESTIMATORS), ("gigpo_mode", GIGPO_MODES),
                              ("old_logprobs", OLD_LOGPROBS),
                              ("loss_aggregation", LOSS_AGGREGATIONS), ("kl_reference", KL_REFERENCES),
                              ("uniform_groups", UNIFORM_GROUPS), ("scale_rewards", SCALE_REWARDS),
                              ("precision", RESOLVED_PRECISIONS), ("training_kernels", TRAINING_KERNELS),
                              ("param_dtype", PARAM_DTYPES), ("gradient_checkpointing", CHECKPOINTING)):
            value = getattr(self, name)
            # `is` for the booleans: 1 == True would pass a membership test
            if not any(value is a if isinstance(a, bool) else value == a for a in allowed):
                raise ValueError(f"{name}={value!r} is not allowed: expected {' | '.join(map(str, allowed))}")
        if self.shared_prompt_prefix and self.gradient_checkpointing:
            raise ValueError(f"shared_prompt_prefix=True needs gradient_checkpointing False, got "
                             f"{self.gradient_checkpointing!r} (checkpointed layers turn off the KV cache the prefix needs)")
        if self.param_dtype == "bf16" and self.precision != "bf16-mixed":
            raise ValueError(f"param_dtype='bf16' needs precision 'bf16-mixed', got precision={self.precision!r}")


def group_advantages(rewards: Sequence[float], group_ids: Sequence[int], eps: float = 1e-6,
                     scale: str = "group", ddof: int = 0) -> np.ndarray:
    """GRPO advantages: each reward less its group's mean, divided as `scale` says (SCALE_REWARDS): by the group's
    standard deviation, by that of all `rewards`, or not at all; `ddof` 1 takes the unbiased deviations (verl's).

    A group whose rewards are all equal carries no learning signal: its advantages are 0.
    """
    if scale not in SCALE_REWARDS:
        raise ValueError(f"scale_rewards must be one of {SCALE_REWARDS}, got {scale!r}")
    rewards = np.asarray(rewards, dtype=np.float64)
    group_ids = np.asarray(group_ids)
    adv = np.zeros_like(rewards)
    batch_std = rewards.std(ddof=ddof) if len(rewards) > ddof else 0.0
    for g in np.unique(group_ids):
        idx = group_ids == g
        r = rewards[idx]
        std = r.std(ddof=ddof) if len(r) > ddof else 0.0
        if std < eps:
            continue  # equal rewards: advantage 0
        divisor = {"group": std + eps, "batch": batch_std + eps, "none": 1.0}[scale]
        adv[idx] = (r - r.mean()) / divisor
    return adv


def grpo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_eps: float,
    ref_logprobs: torch.Tensor | None = None,
    kl_beta: float = 0.0,
    token_weights: torch.Tensor | None = None,
    normalizer: float | None = None,
    clip_ratio_c: float = 0.0,
    kl_clamp: float = 0.0,
    entropy: torch.Tensor | None = None,
    entropy_coeff: float = 0.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO-clip token loss with an optional k3 KL penalty, dual clip, KL clamp and entropy bonus (GRPOConfig).

    logprobs/old_logprobs/ref_logprobs/mask/entropy: [batch, tokens]; advantages and
    token_weights: [batch]. The loss is sum(weight * per-token loss over `mask`) /
    normalizer, where the normalizer defaults to sum(weight * mask): a (weighted)
    token mean. Positions outside `mask` contribute nothing, so they get no gradient.
    The statistics (mean KL and clipped fraction over `mask`) are detached 0-d tensors on the
    loss's device: reading one waits for the device, so the caller reads them when it is done.
    """
    mask = mask.float()
    weights = mask if token_weights is None else mask * token_weights.unsqueeze(-1)
    ratio = torch.exp(logprobs - old_logprobs)
    adv = advantages.unsqueeze(-1)
    per_token = -torch.minimum(ratio * adv, torch.clamp(ratio, 1 - clip_eps, 1 + clip_eps) * adv)
    if clip_ratio_c > 0:  # dual clip: a negative advantage's loss grows with the ratio only up to ratio c
        per_token = torch.where(adv < 0, torch.minimum(per_token, -adv * clip_ratio_c), per_token)
    kl = torch.zeros_like(per_token)
    if ref_logprobs is not None and kl_beta > 0:
        delta = ref_logprobs - logprobs
        kl = torch.exp(delta) - delta - 1
        if kl_clamp > 0:
            kl = torch.clamp(kl, min=-kl_clamp, max=kl_clamp)
        per_token = per_token + kl_beta * kl
    if entropy is not None and entropy_coeff > 0:
        per_token = per_token - entropy_coeff * entropy
    denom = float(weights.sum()) if normalizer is None else normalizer
    loss = (per_token * weights).sum() / max(denom, 1e-12)
    n = mask.sum().clamp(min=1)
    stats = {
        "kl": (kl.detach() * mask).sum() / n,
        "clip_frac": (((ratio.detach() - 1).abs() > clip_eps).float() * mask).sum() / n,
    }
    return loss, stats


@dataclass
class StepSample:
    prompt_ids: list[int]
    completion_ids: list[int]
    advantage: float
    weight: float = 1.0  # per-token weight in the loss (see GRPOConfig.loss_aggregation)
    old_logprobs: list[float] | None = None  # the completion tokens' log-probs as the rollout sampled them, if known


def step_advantages(trajectories: Sequence[Trajectory], group_ids: Sequence[int], eps: float,
                    penalty_scope: str = "trajectory", scale: str = "group", ddof: int = 0) -> list[np.ndarray]:
    """Each trajectory's steps' advantages.

    "trajectory": one advantage per trajectory (its penalised reward normalised over the group's trajectories),
    shared by all its steps. "step": every step is a row scoring the episode's reward less its own penalty,
    normalised over all the rows of its group (RolloutConfig.penalty_scope): a group is then informative when only
    the steps' validity differs, and a long trajectory weighs more in the group's mean and deviation.
    """
    if penalty_scope not in PENALTY_SCOPES:
        raise ValueError(f"penalty scope must be one of {PENALTY_SCOPES}, got {penalty_scope!r}")
    if penalty_scope == "trajectory":
        adv = group_advantages([t.reward for t in trajectories], group_ids, eps, scale, ddof)
        return [np.full(len(t.steps), a) for t, a in zip(trajectories, adv)]
    scores = [t.episode_reward - s.penalty for t in trajectories for s in t.steps]
    rows = [g for t, g in zip(trajectories, group_ids) for _ in t.steps]
    adv = group_advantages(scores, rows, eps, scale, ddof)
    ends = np.cumsum([len(t.steps) for t in trajectories])
    return np.split(adv, ends[:-1]) if len(trajectories) else []


def trajectories_to_samples(
    trajectories: Sequence[Trajectory], group_ids: Sequence[int], eps: float, aggregation: str = "trajectory-mean",
    uniform_groups: str = "drop", penalty_scope: str = "trajectory", scale: str = "group",
    advantages: Sequence[np.ndarray] | None = None,
) -> list[StepSample]:
    """Every agent step becomes a sample carrying its advantage: `advantages` (one array per trajectory, e.g. GiGPO's),
    or else GRPO's (step_advantages with `penalty_scope` and `scale`).

    With uniform_groups="drop", zero-advantage steps are left out: their policy-gradient term is zero and skipping
    them saves the passes, but their KL term is lost with them (GRPOConfig.uniform_groups).
    """
    if aggregation not in LOSS_AGGREGATIONS:
        raise ValueError(f"loss aggregation must be one of {LOSS_AGGREGATIONS}, got {aggregation!r}")
    if uniform_groups not in UNIFORM_GROUPS:
        raise ValueError(f"uniform groups must be one of {UNIFORM_GROUPS}, got {uniform_groups!r}")
    samples = []
    if advantages is None:
        advantages = step_advantages(trajectories, group_ids, eps, penalty_scope, scale)
    for t, advs in zip(trajectories, advantages):
        tokens = sum(len(s.completion_ids) for s in t.steps)
        weight = 1.0 / max(1, tokens) if aggregation == "trajectory-mean" else 1.0
        samples.extend(StepSample(s.prompt_ids, s.completion_ids, float(a), weight, s.logprobs) for s, a in zip(t.steps, advs)
                       if s.completion_ids and not (a == 0.0 and uniform_groups == "drop"))
    return samples


def informative_share(trajectories: Sequence[Trajectory], group_ids: Sequence[int], penalised: bool = True) -> float:
    """Share of groups whose trajectories' rewards differ (a group of equal rewards has advantage 0 everywhere).

    penalised=False compares the episodes' rewards before the invalid-action penalty: the groups whose outcomes
    differ. The gap between the two shares is the groups that only the penalty makes informative; under the
    trajectory penalty scope, group normalisation gives those the same size of advantage as a won/lost split.
    """
    rewards: dict[int, set[float]] = {}
    for t, g in zip(trajectories, group_ids):
        rewards.setdefault(g, set()).add(round(t.reward if penalised else t.episode_reward, 9))
    return sum(len(r) > 1 for r in rewards.values()) / max(1, len(rewards))


class GRPOTrainer:
    """Local GRPO on one client: owns the optimizer and the reference policy for one round."""

    def __init__(self, model, tokenizer, config: GRPOConfig, rollout: RolloutConfig,
                 base_model: torch.nn.Module | None = None) -> None:
        """`base_model`: the frozen KL anchor of full fine-tuning, where the caller holds it: the run's initial weights
        for kl_reference='base'; under N ranks also the round-start copy (a sharded model cannot be deep-copied)."""
        self.model = model
        self.tokenizer = tokenizer
        self.config = config
        self.rollout = rollout
        self.encoder = PromptEncoder(tokenizer)
        self.policy = LMPolicy(model, tokenizer, rollout)
        self.device = model_device(model)
        # The config checked its own values; what remains needs the model.
        check_trainable_precision(model, config.precision)
        if config.param_dtype == "bf16" and not all(p.requires_grad for p in model.parameters()):
            raise ValueError("param_dtype='bf16' needs full fine-tuning (every weight trained; a LoRA base has "
                             "precision bf16-base)")
        check_training_kernels(config.training_kernels, self.device)  # liger: on a CUDA device, with its package
        if config.training_kernels == "liger":
            apply_liger(model)
        self.passes = TrainingPasses.of(config, self.device)
        self.ranks = Ranks.current()  # N ranks share the passes (agent/engine/ranks.py); one without a process group
        # A fresh optimizer each round: the local iterate starts from the broadcast model. Only trainable
        # tensors are optimized (all of them, or a LoRA adapter's).
        self.trainable = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = self.passes.optimizer(self.trainable, config.learning_rate, config.weight_decay)
        self.reference = None  # a frozen full model to score against: the round-start copy, or the base
        self.reference_adapter = None  # the round-start adapter's tensors (LoRA): swapped in to score
        if config.kl_beta > 0:
            from peft import (  # here: see agent/training/lora.py on PEFT imports
                PeftModel,
                get_peft_model_state_dict,
            )

            if isinstance(model, PeftModel):
                if config.kl_reference == "round-start":
                    self.reference_adapter = {k: v.detach().clone() for k, v in get_peft_model_state_dict(model).items()}
            elif config.kl_reference == "base" or base_model is not None:
                if base_model is None:
                    raise ValueError("kl_reference='base' with full fine-tuning needs the base model's weights (base_model)")
                self.reference = base_model.eval()
                for p in self.reference.parameters():
                    p.requires_grad_(False)
            else:
                self.reference = copy.deepcopy(model).eval()
                if config.param_dtype == "bf16":  # it computes on bf16 weights anyway: hold it so, half the memory
                    self.reference.to(torch.bfloat16)
                for p in self.reference.parameters():
                    p.requires_grad_(False)

    def _reference_logprobs(self, samples: Sequence[StepSample]) -> list[torch.Tensor] | None:
        """Completion log-probs under the KL anchor, or None when the KL term is off."""
        if self.config.kl_beta <= 0:
            return None
        if self.reference is not None:  # a frozen copy (under param-dtype bf16 it computes as the policy does)
            return self._logprobs(self.reference, samples, reference=True)
        if self.reference_adapter is None:  # base: the LoRA model with its adapter switched off
            with self.model.disable_adapter():
                return self._logprobs(self.model, samples)
        from peft import get_peft_model_state_dict, set_peft_model_state_dict

        current = {k: v.detach().clone() for k, v in get_peft_model_state_dict(self.model).items()}
        set_peft_model_state_dict(self.model, self.reference_adapter)
        try:
            return self._logprobs(self.model, samples)
        finally:
            set_peft_model_state_dict(self.model, current)

    def train_epoch(self, env_factory: Callable[[], TextEnv], tasks: Sequence[Task], rng: np.random.Generator, progress: bool | str = False) -> dict[str, float]:
        cfg = self.config
        started = time.time()
        chosen = [tasks[i] for i in rng.choice(len(tasks), size=cfg.tasks_per_epoch, replace=True)]
        group_ids = [i for i in range(len(chosen)) for _ in range(cfg.group_size)]
        trajectories = self._play(env_factory, chosen, rng, progress)
        rollout_seconds = time.time() - started
        advantages = step_advantages(trajectories, group_ids, cfg.adv_eps, self.rollout.penalty_scope, cfg.scale_rewards,
                                     cfg.std_ddof)
        if cfg.advantage_estimator == "gigpo":  # plus credit for steps that did better than others from the same state
            step_part = gigpo.step_level_advantages(trajectories, group_ids, cfg.gigpo_gamma, cfg.gigpo_mode,
                                                    per_step_rewards=self.rollout.reward == "env")
            advantages = gigpo.combine(advantages, step_part, cfg.gigpo_step_weight)
        samples = trajectories_to_samples(trajectories, group_ids, cfg.adv_eps, cfg.loss_aggregation,
                                          cfg.uniform_groups if cfg.kl_beta > 0 else "drop",  # no KL: nothing to keep
                                          advantages=advantages)
        update_stats = self.update(samples, rng)
        metrics = summarize(trajectories)
        metrics.update(update_stats)
        if cfg.advantage_estimator == "gigpo":  # the steps whose state another episode of their group also met
            metrics["repeated_states"] = gigpo.repeated_share(trajectories, group_ids)
        # the share of groups GRPO can learn from: those whose episodes' rewards are not all equal
        metrics["informative_groups"] = informative_share(trajectories, group_ids)
        metrics["outcome_groups"] = informative_share(trajectories, group_ids, penalised=False)
        metrics["tokens"] = float(sum(len(s.prompt_ids) + len(s.completion_ids) for t in trajectories for s in t.steps))
        metrics["generated_tokens"] = float(sum(len(s.completion_ids) for t in trajectories for s in t.steps))
        metrics["rollout_seconds"] = rollout_seconds
        metrics["seconds"] = time.time() - started
        return metrics

    def _play(self, env_factory: Callable[[], TextEnv], chosen: Sequence[Task], rng: np.random.Generator,
              progress: bool | str) -> list[Trajectory]:
        """group_size episodes of each chosen task, in that order. On N ranks each plays whole groups (a stride of them)
        with every weight gathered, and all ranks receive every episode."""
        cfg, ranks = self.config, self.ranks
        mine = ranks.share(range(len(chosen)))
        if ranks.world > 1:  # every rank drew the same seed: each samples from a stream of its own
            torch.manual_seed(int(rng.integers(2**62)) + ranks.rank)
        episodes = [chosen[g] for g in mine for _ in range(cfg.group_size)]
        with ranks.unsharded(self.model), autocast(cfg.precision, self.device):
            played = run_episodes(self.policy, env_factory, episodes, self.encoder, self.rollout, progress=progress)
        # The static decode engine keeps a weight copy, a KV cache and CUDA graphs per model; the update needs that
        # memory more (1.5B shape, 128 rows: about 6 GiB), and the next rollout builds them again.
        decode.release(self.policy.model)
        if ranks.world == 1:
            return played
        groups = ranks.gather({g: played[i * cfg.group_size:(i + 1) * cfg.group_size] for i, g in enumerate(mine)})
        return [t for g in range(len(chosen)) for t in groups[g]]

    def optimizer_arrays(self) -> dict[str, np.ndarray]:
        """AdamW's step counts and moments by parameter position ("<i>/exp_avg", ...): what a learner that trains
        on without averaging (the Centralized and Local baselines) carries from one round into the next."""
        return {f"{i}/{name}": whole(value).detach().cpu().numpy().copy()  # a sharded moment gathered, rank by rank alike
                for i, state in self.optimizer.state_dict()["state"].items() for name, value in state.items()}

    def load_optimizer_arrays(self, arrays: dict[str, np.ndarray]) -> None:
        """Continue from `optimizer_arrays()` of an earlier round's trainer on the same parameters."""
        state: dict[int, dict[str, torch.Tensor]] = {}
        params = [p for group in self.optimizer.param_groups for p in group["params"]]  # the state dict's numbering
        for key, value in arrays.items():
            i, name = key.split("/", 1)
            tensor = torch.from_numpy(np.array(value))
            # AdamW keeps its step count as a 0-d tensor; a trip through Flower's ArrayRecord makes it 1-d
            state.setdefault(int(i), {})[name] = tensor.reshape(()) if name == "step" else like(tensor, params[int(i)])
        self.optimizer.load_state_dict({"state": state, "param_groups": self.optimizer.state_dict()["param_groups"]})

    @torch.no_grad()
    def _logprobs(self, model, samples: Sequence[StepSample], reference: bool = False) -> list[torch.Tensor]:
        """Per-sample completion log-probs (1-D, completion tokens only). reference: `model` is the frozen KL
        reference (TrainingPasses.scoring)."""
        cfg, passes = self.config, self.passes
        order = list(range(len(samples)))
        if cfg.length_grouped_micro_batches:
            order = by_length(order, samples)
        micros = micro_batches(self.ranks.share(order), samples, cfg.logprob_micro_batch_size, cfg.logprob_micro_batch_tokens)
        spare = self.ranks.most(len(micros)) - len(micros)  # passes this rank runs only to keep step with the others
        pending = []  # each micro-batch's sample indices, log-probs (on the device) and completion mask (on the host)
        with passes.scoring(model, reference):
            for n, micro in enumerate(micros + [order[:1]] * spare):
                batch = collate([(samples[i].prompt_ids, samples[i].completion_ids) for i in micro], self.tokenizer.pad_token_id,
                                cfg.shared_prompt_prefix)
                with passes.forward():
                    logprobs, _ = completion_logprobs(model, batch, self.rollout.temperature, cfg.logprob_chunk_tokens,
                                                      padding_mask=passes.padding_mask)
                if n < len(micros):
                    pending.append((micro, logprobs, batch["completion_mask"][:, 1:]))
        # Copied to the host once every micro-batch is queued, rows cut there by the host's own mask: a copy waits for
        # the device, and a wait inside the loop would keep the host from queuing the next micro-batch while the
        # device computes this one (a boolean index of each row on the device would wait twice a row).
        out: dict[int, torch.Tensor] = {}
        for micro, logprobs, host_mask in pending:
            for i, lp, m in zip(micro, logprobs.cpu(), host_mask):
                out[i] = lp[m]
        everyone = self.ranks.gather(out)
        return [everyone[i] for i in range(len(samples))]

    def _old_logprobs(self, samples: Sequence[StepSample]) -> list[torch.Tensor]:
        """The round-start policy's completion log-probs: the rollout's where old_logprobs = rollout and every sample
        carries them (a demonstration or a greedy step does not), else a no-grad pass."""
        if self.config.old_logprobs == "rollout" and all(s.old_logprobs is not None for s in samples):
            return [torch.tensor(s.old_logprobs, dtype=torch.float32) for s in samples]
        return self._logprobs(self.model, samples)

    def update(self, samples: list[StepSample], rng: np.random.Generator) -> dict[str, float]:
        """One pass of clipped policy-gradient updates over the samples, in shuffled minibatches.

        How the passes compute (precision, working copy, kernels, checkpointing) is self.passes' business
        (agent/engine/passes.py); what is written here is the algorithm."""
        if not samples:  # every group was uniform: nothing to learn from this batch
            return {"loss": 0.0, "kl": 0.0, "clip_frac": 0.0, "grad_norm": 0.0, "optimizer_steps": 0.0, "train_samples": 0.0}
        self.model.eval()  # dropout off: old and new log-probs must come from the same function
        cfg = self.config
        with self.passes.update(self.model) as passes:
            # With a single minibatch the policy has not moved before the update, so the
            # "old" log-probs are the current ones (detached): skip a forward pass.
            single = len(samples) <= cfg.minibatch_size
            old = None if single else self._old_logprobs(samples)
            from_rollout = (old is not None and cfg.old_logprobs == "rollout"
                            and all(s.old_logprobs is not None for s in samples))  # as _old_logprobs decides
            gaps: list[torch.Tensor] = []  # |trained pass - rollout| over the first step's tokens, where the two agree
            ref = self._reference_logprobs(samples)
            # Each micro-batch's loss and statistics, and each step's gradient norm, stay on the device until every
            # step is queued: reading one waits for the device, and a wait inside the loop would keep the host from
            # queuing the next micro-batch while the device computes this one.
            pending: list[tuple[torch.Tensor, dict[str, torch.Tensor], int]] = []
            grad_norms: list[torch.Tensor] = []
            for mb in _chunks(list(rng.permutation(len(samples))), cfg.minibatch_size):
                self.optimizer.zero_grad(set_to_none=True)
                # The minibatch loss is one weighted token mean, however it is split into micro-batches.
                normalizer = sum(samples[i].weight * len(samples[i].completion_ids) for i in mb)
                if cfg.length_grouped_micro_batches:
                    mb = by_length(mb, samples)
                micros = micro_batches(self.ranks.share(mb), samples, cfg.micro_batch_size, cfg.micro_batch_tokens)
                spare = self.ranks.most(len(micros)) - len(micros)
                # FSDP averages the ranks' gradients: a rank's share of a loss over the whole minibatch counts world
                # times; verl's per-micro-batch mean is each rank's own mean, averaged over the ranks as it is there
                share = 1.0 if cfg.loss_aggregation == "micro-batch-token-mean" else float(self.ranks.world)
                for n, micro in enumerate(micros + [mb[:1]] * spare):
                    counts = n < len(micros)  # a spare pass keeps step with the other ranks and adds nothing
                    chunk = [samples[i] for i in micro]
                    if cfg.loss_aggregation == "micro-batch-token-mean":  # verl: each micro-batch's mean, averaged
                        normalizer = len(micros) * sum(len(s.completion_ids) for s in chunk)
                    batch = collate([(s.prompt_ids, s.completion_ids) for s in chunk], self.tokenizer.pad_token_id,
                                    cfg.shared_prompt_prefix)
                    with passes.forward(batch):
                        scored = completion_logprobs(self.model, batch, self.rollout.temperature, cfg.logprob_chunk_tokens,
                                                     padding_mask=passes.padding_mask, with_entropy=cfg.entropy_coeff > 0)
                        logprobs, mask = scored[:2]
                        entropy = scored[2] if cfg.entropy_coeff > 0 else None
                        host_mask = batch["completion_mask"][:, 1:]
                        old_lp = logprobs.detach() if old is None else _scatter_like(host_mask, [old[i] for i in micro], mask.device)
                        ref_lp = _scatter_like(host_mask, [ref[i] for i in micro], mask.device) if ref is not None else None
                        adv = to_device(torch.tensor([s.advantage for s in chunk], dtype=torch.float32), logprobs.device)
                        weights = to_device(torch.tensor([s.weight for s in chunk], dtype=torch.float32), logprobs.device)
                        loss, stats = grpo_loss(logprobs, old_lp, adv, mask, cfg.clip_eps, ref_lp, cfg.kl_beta, weights,
                                                normalizer, cfg.clip_ratio_c, cfg.kl_clamp, entropy, cfg.entropy_coeff)
                    passes.backward(loss * (share if counts else 0.0))
                    if counts:
                        pending.append((loss.detach(), stats, int(host_mask.sum())))
                        if from_rollout and not grad_norms:  # no step taken yet: both are the round-start policy's
                            gaps.append(((logprobs.detach() - old_lp).abs() * mask).sum() / mask.sum().clamp(min=1))
                with passes.optimizer_step():
                    grad_norms.append(torch.nn.utils.clip_grad_norm_(self.trainable, cfg.max_grad_norm))
                    self.optimizer.step()
            result = _update_stats(pending, grad_norms, len(samples), self.ranks,
                                   cfg.loss_aggregation == "micro-batch-token-mean")
            if gaps:  # how far the decode passes' rounding puts the rollout's log-probs from a training pass's
                result["rollout_logprob_gap"] = float(torch.stack(gaps).mean())
            if passes.checkpointed_layers is not None:  # the share of layer passes that recomputed (1.0 = every layer)
                result["checkpointed_layers"] = passes.checkpointed_layers
        return result


def _update_stats(pending: list[tuple[torch.Tensor, dict[str, torch.Tensor], int]], grad_norms: list[torch.Tensor],
                  samples: int, ranks: Ranks = Ranks(), per_rank_mean: bool = False) -> dict[str, float]:
    """An update's statistics from its micro-batches' (loss, statistics, completion tokens) and its steps' gradient
    norms, read from the device now that every step is queued."""
    steps = len(grad_norms)
    total_tokens = 0
    sums = {"loss": 0.0, "kl": 0.0, "clip_frac": 0.0}
    for loss, stats, n_tokens in pending:
        sums["loss"] += float(loss)  # micro-batch shares add up to the minibatch loss
        sums["kl"] += float(stats["kl"]) * n_tokens
        sums["clip_frac"] += float(stats["clip_frac"]) * n_tokens
        total_tokens += n_tokens
    if ranks.world > 1:  # each rank holds its share: the losses add up to the minibatch's (or average, per_rank_mean)
        sums = {k: ranks.total(v) / (ranks.world if k == "loss" and per_rank_mean else 1) for k, v in sums.items()}
        total_tokens = int(ranks.total(total_tokens))
    result = {"loss": sums["loss"] / max(1, steps), "kl": sums["kl"] / max(1, total_tokens),
              "clip_frac": sums["clip_frac"] / max(1, total_tokens)}
    result["grad_norm"] = float(np.mean([float(getattr(norm, "full_tensor", lambda: norm)()) for norm in grad_norms]))
    result["optimizer_steps"] = float(steps)
    result["train_samples"] = float(samples)
    return result


def _chunks(items: Sequence, size: int):
    for i in range(0, len(items), size):
        yield items[i : i + size]


def micro_batches(indices: Sequence[int], samples: Sequence[StepSample], size: int, tokens: int = 0) -> list[list[int]]:
    """`indices`, in their order, cut into the update's micro-batches: `size` samples each, or, with `tokens` > 0, runs
    of consecutive samples of at most `tokens` padded positions each (rows x the longest row's prompt and completion:
    what collate pads a batch to and the forward computes over), a sample longer than that alone.

    A budget in tokens rather than rows is verl's dynamic batch size (ppo_max_token_len_per_gpu): short agent steps
    share a pass by the dozen and long ones go a few at a time, so a GPU runs fewer, larger kernels. The fewest passes
    the budget allows, evened out: the cut is that of the smallest budget that needs no more passes than the full one,
    so a minibatch that needs two passes gets two of about half its tokens, not a full one and a remnant. Cuts are
    contiguous: with the order by length (length-grouped-micro-batches) each pass holds samples of similar length."""
    if tokens <= 0:
        return [list(c) for c in _chunks(list(indices), size)]
    lengths = [len(samples[i].prompt_ids) + len(samples[i].completion_ids) for i in indices]

    def cut(budget: int) -> list[list[int]]:  # greedy: each pass as long as the budget allows
        out: list[list[int]] = []
        current: list[int] = []
        longest = 0
        for i, length in zip(indices, lengths):
            if current and (len(current) + 1) * max(longest, length) > budget:
                out.append(current)
                current, longest = [], 0
            current.append(i)
            longest = max(longest, length)
        return out + [current] if current else out

    # greedy's count of passes never rises with the budget, so bisect for the smallest budget with as few as `tokens`
    fewest, low, high = len(cut(tokens)), 1, tokens
    while low < high:
        middle = (low + high) // 2
        if len(cut(middle)) <= fewest:
            high = middle
        else:
            low = middle + 1
    return cut(low)


def by_length(indices, samples: Sequence[StepSample]) -> list:
    """Sample indices longest first (stable: equal lengths keep their shuffled order), so that consecutive
    micro-batches hold samples of similar length; longest first also meets a micro-batch that does not fit at once."""
    return sorted(indices, key=lambda i: -(len(samples[i].prompt_ids) + len(samples[i].completion_ids)))


def _scatter_like(host_mask: torch.Tensor, values: list[torch.Tensor], device: torch.device) -> torch.Tensor:
    """Place per-sample 1-D completion values (on the host) back at the mask's positions, on `device`. Built on the
    host and copied once without waiting: per row, a copy and a boolean index on the device would each wait for it."""
    out = torch.zeros(host_mask.shape, dtype=torch.float32)
    for row, v in enumerate(values):
        out[row, host_mask[row]] = v
    return to_device(out, device)
