"""GRPO's settings (TRL's GRPOConfig is the model: one dataclass, checked as it is made) and the choices they take."""

from __future__ import annotations

from dataclasses import dataclass

from fedagent_flwr.config.choices import ADVANTAGE_ESTIMATORS, BATCH_PADDINGS, GIGPO_MODES, KL_REFERENCES, LOSS_AGGREGATIONS, OLD_LOGPROBS, PARAM_DTYPES, RESOLVED_CHECKPOINTING, RESOLVED_PRECISIONS, SCALE_REWARDS, STD_DDOFS, TRAINING_ATTENTIONS, TRAINING_KERNELS, UNIFORM_GROUPS


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
    # recompute layer activations in backward (transformers' checkpointing): True = every layer; "fitted" = per
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
    # Under trajectory-mean and token-mean the loss is the same (same normaliser; only float summation order
    # changes); under micro-batch-token-mean it is not: the grouping decides which tokens share a mean.
    length_grouped_micro_batches: bool
    # Cut each minibatch into micro-batches of micro_batch_size rows with summed lengths as even as a greedy split
    # makes them (micro_batches.balanced_micro_batches: verl's seqlen balancing across its GPUs, within one process)
    length_balanced_micro_batches: bool
    batch_padding: str  # BATCH_PADDINGS
    # The prompts' shared prefix computed once per pass (tokens.collate's share_prefix): the same values up to rounding
    shared_prompt_prefix: bool
    old_logprobs: str  # OLD_LOGPROBS: recompute them in a pass, or take the rollout's
    weight_decay: float  # AdamW's decoupled weight decay (verl's actor default is 0.01)
    # the decoder layers' kernels in the log-prob and update passes: eager | compile | liger (agent/engine/kernels.py)
    training_kernels: str
    # the update's forward passes' attention kernel: sdpa | eager (agent/engine/attention.py, training_attention)
    training_attention: str
    # what the log-prob and update passes compute with under bf16 autocast: "fp32" = the fp32 weights, cast by
    # autocast in every forward; "bf16" = a bf16 working copy over fp32 masters (agent/engine/master_weights.py)
    param_dtype: str
    # what the update's activations may take under gradient_checkpointing="fitted" (placement.place decides it);
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
    reward_std_ddof: int  # ddof of the standard deviations rewards are divided by (STD_DDOFS; verl's torch.std: 1)
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
        if self.reward_std_ddof not in STD_DDOFS:
            raise ValueError(f"reward_std_ddof={self.reward_std_ddof!r} is not allowed: expected 0 | 1")
        if not 0.0 <= self.gigpo_gamma <= 1.0 or self.gigpo_step_weight < 0:
            raise ValueError(f"gigpo_gamma={self.gigpo_gamma!r} and gigpo_step_weight={self.gigpo_step_weight!r}: "
                             "expected a discount in [0, 1] and a weight >= 0")
        for name, allowed in (("advantage_estimator", ADVANTAGE_ESTIMATORS), ("gigpo_mode", GIGPO_MODES),
                              ("old_logprobs", OLD_LOGPROBS), ("batch_padding", BATCH_PADDINGS),
                              ("loss_aggregation", LOSS_AGGREGATIONS), ("kl_reference", KL_REFERENCES),
                              ("uniform_groups", UNIFORM_GROUPS), ("scale_rewards", SCALE_REWARDS),
                              ("precision", RESOLVED_PRECISIONS), ("training_kernels", TRAINING_KERNELS),
                              ("training_attention", TRAINING_ATTENTIONS),
                              ("param_dtype", PARAM_DTYPES), ("gradient_checkpointing", RESOLVED_CHECKPOINTING)):
            value = getattr(self, name)
            # `is` for the booleans: 1 == True would pass a membership test
            if not any(value is a if isinstance(a, bool) else value == a for a in allowed):
                raise ValueError(f"{name}={value!r} is not allowed: expected {' | '.join(map(str, allowed))}")
        if self.shared_prompt_prefix and self.gradient_checkpointing:
            raise ValueError(f"shared_prompt_prefix=True needs gradient_checkpointing False, got "
                             f"{self.gradient_checkpointing!r} (checkpointed layers turn off the KV cache the prefix needs)")
        if self.param_dtype == "bf16" and self.precision != "bf16-mixed":
            raise ValueError(f"param_dtype='bf16' needs precision 'bf16-mixed', got precision={self.precision!r}")
