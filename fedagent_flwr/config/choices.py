"""The values each choice key of the run config takes, declared here once: the run config checks them and the code
that acts on them imports them from here (this module, like the whole config package, imports nothing of the project
and no torch, so every layer may import it)."""

from __future__ import annotations

# ----- where and how the model computes (agent/engine) -----------------------------------------------------------
DEVICES = ("auto", "cpu", "cuda")  # or cuda:N
ENGINES = ("auto", "hf", "static")  # rollout.name (agent/engine/sampling.py runs them)
RESOLVED_ENGINES = ("hf", "static")  # what placement.py resolves rollout.name to
# auto = bf16-mixed on CUDA; on a CPU fp32, or bf16-base where the processor's probe says so (agent/engine/placement.py)
ALL_PRECISIONS = ("auto", "fp32", "bf16-mixed", "bf16-base")
RESOLVED_PRECISIONS = ("fp32", "bf16-mixed", "bf16-base")
BF16_PRECISIONS = ("bf16-mixed", "bf16-base")  # the forward passes under bf16 autocast
PARAM_DTYPES = ("fp32", "bf16")  # the weights the log-prob and update passes compute with (agent/engine/master_weights.py)
PARAM_DTYPE_CHOICES = (*PARAM_DTYPES, "auto")
TRAINING_KERNELS = ("eager", "compile", "liger")  # the decoder layers' kernels in GRPO's passes (agent/engine/kernels.py)
TRAINING_ATTENTIONS = ("sdpa", "eager")  # the attention of the passes that take a gradient, by transformers' names
KERNELS = ("eager", "compile")  # how the static engine's token step runs its element-wise work (rollout.kernels)
CHECKPOINTING = (False, True, "auto")  # engine.gradient-checkpointing
# ... as the placement resolves it: "fitted" = in each micro-batch the fewest leading layers whose checkpointing makes
# its activations fit the room the memory plan leaves (agent/engine/checkpointing.py); auto with no room known: True
RESOLVED_CHECKPOINTING = (False, True, "fitted")
# How rollouts draw a token: multinomial = torch.multinomial, which on a CPU draws an exponential number for every
# vocabulary entry of every row (12-20 % of a SmolLM2 decode step there, docs/performance.md); inverse-cdf = one
# uniform number a row, placed among the cumulative probabilities. The same distribution; for a seed, other tokens.
TOKEN_SAMPLERS = ("multinomial", "inverse-cdf")
OLD_LOGPROBS = ("recompute", "rollout")  # where the PPO ratio's denominator comes from (grpo.old-logprobs)

# ----- how an episode is played (agent/play) ---------------------------------------------------------------------
REWARD_MODES = ("success", "env", "score")
ACTION_MATCHING = ("exact", "closest")
ANSWER_PARSING = ("strict", "lenient", "reference", "agentgym")
# Where the standing instructions go: all in the user message (the FedAgent reference's single prompt), or in a
# system message, the way chat models take instructions.
PROMPT_ROLES = ("user", "system")
# The user message's layout: ours, the FedAgent reference's templates in our words, or AgentGym's ReAct form.
PROMPT_TEMPLATES = ("compact", "reference", "agentgym")
# Which step draws the rollout.invalid-action penalty: one not well formed or whose action the environment rejects, or one
# not well formed only (the reference's projection, verl-agent's env_package/*/projection.py: tags only).
INVALID_ACTIONS = ("inadmissible", "malformed")
# Where the penalty lands: summed and taken off the trajectory's reward, or on each step's own sample (the reference).
PENALTY_SCOPES = ("trajectory", "step")

# ----- GRPO (agent/training) ---------------------------------------------------------------------------------------
# "micro-batch-token-mean": verl's token-mean under gradient accumulation (dp_actor.py: each micro-batch's token mean,
# divided by the number of micro-batches), so a token in a short micro-batch weighs more than one in a long one.
LOSS_AGGREGATIONS = ("trajectory-mean", "token-mean", "micro-batch-token-mean")
STD_DDOFS = (0, 1)  # the group standard deviation's delta degrees of freedom: 0 = numpy's default, 1 = torch.std's
UNIFORM_GROUPS = ("drop", "keep")  # what an epoch does with the steps of a group whose rewards are all equal
# What a reward's deviation from its group's mean is divided by (TRL's scale_rewards, same names): the group's
# standard deviation (GRPO, verl, the FedAgent reference), that of all the epoch's rewards, or nothing (Dr. GRPO).
SCALE_REWARDS = ("group", "batch", "none")
KL_REFERENCES = ("round-start", "base")
KL_REFERENCE_CHOICES = ("auto", *KL_REFERENCES)  # auto: resolved by agent/engine/placement.py
# The epoch's samples before the update: as played, or padded to whole minibatches with copies (verl-agent's
# adjust_batch, mode copy)
BATCH_PADDINGS = ("none", "copy")
ADVANTAGE_ESTIMATORS = ("grpo", "gigpo")
GIGPO_MODES = ("mean_norm", "mean_std_norm")
FINETUNING = ("full", "lora")  # what a GRPO client trains (methods/fedagent.py)
# How the learning rate moves over one supervised pass: held, or decayed to 0 along a half cosine, no warm-up.
LR_SCHEDULES = ("constant", "cosine")

# ----- Fed-SE (agent/self_evolution.py, strategies/fedse_lora.py) --------------------------------------------------
FEDSE_KEEP = ("successes", "all")
FEDSE_HISTORY = ("cumulative", "round")
FEDSE_STEPS = ("all", "valid")
FEDSE_LOSS_TOKENS = ("action", "completion")
FEDSE_AGGREGATIONS = ("mean", "weighted", "exact")

# ----- the federation, its strategies and the run around it --------------------------------------------------------
# How a round's clients are drawn: from one NumPy stream seeded by the run's seed, or as the FedAgent reference's
# round_orchestrator.py draws them (Python's random.sample seeded 42 + round - 1, the same clients in every seed).
CLIENT_SAMPLING = ("run-seed", "reference")
TRANSFER_DTYPES = ("fp32", "bf16")  # what the weights travel in between server and clients
PAVG_VARIANTS = ("soft", "proj")  # SoftPAvg (softmax logits) or ProjPAvg (tables projected onto the simplex)
FEDRL_CLIENT_MODES = ("all", "sampled")
DP_MODES = ("off", "server-side", "client-side")
BASELINES = ("none", "centralized", "local")  # fedagent_flwr/methods/tasks.py
BASELINE_OPTIMIZERS = ("keep", "reset")
TRACKERS = ("none", "tensorboard", "wandb", "mlflow")  # runs/tracking.py has one backend for each but none
# by-environment: client k owns env k of a multi-env spec
PARTITION_MODES = ("uniform", "uniform-windows", "preference", "coverage", "hardness", "by-environment")
PREFERENCE_MIXES = ("gaussian", "dirichlet")  # partitions/preference.py: Algorithm 2 as written, or the reference's
