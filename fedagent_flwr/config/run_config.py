"""The run config's sections and `RunConfig`: every key, its default, what it allows, and the checks that need only
the values; nothing else.

Flower passes the run config as a flat dict whose keys are dotted the way FlowerTune writes them: the everyday keys at
the top (`num-server-rounds`, `strategy`, `env`, `model`, `seed`...), the specialist ones in a section (`grpo.beta`,
`lora.r`, `fedse.max-steps`). Defaults are pyproject.toml's [tool.flwr.app.config]; overrides come from
`--run-config`, a string or a TOML file such as configs/fedagent-cpu.toml. Within a section a key is named as TRL,
PEFT, verl or Flower name the same concept; where ours means something else it keeps our name and its help says how
it differs. `RunConfig` turns the dict into a typed object before any work starts, so a bad value fails at once naming
the key, the value and what is allowed: each section checks its own fields as it is made (as TRL's configs do), and
`RunConfig.check_across` holds the rules that tie sections together. Whether a config is valid does not depend on the
machine that checks it: what the machine must offer is checked by runs/preflight.py, what `auto` becomes is decided
where the run runs (each process's placement: methods/placement.py). Keys renamed since the flat names are refused
with their new name (config/renames.py). After adding or changing a key run
`python -m fedagent_flwr.experiments.config_files` (pyproject's table, docs/run-config.md).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator
from dataclasses import Field, dataclass, field, fields
from pathlib import Path
from typing import Any, ClassVar

from fedagent_flwr.config.choices import (
    ACTION_MATCHING, ADVANTAGE_ESTIMATORS, ALL_PRECISIONS, ANSWER_PARSING, BASELINE_OPTIMIZERS, BASELINES,
    BATCH_PADDINGS, CLIENT_SAMPLING, DEVICES, DP_MODES, ENGINES, FEDRL_CLIENT_MODES, FEDSE_AGGREGATIONS, FEDSE_HISTORY,
    FEDSE_KEEP, FEDSE_LOSS_TOKENS, FEDSE_STEPS, FINETUNING, GIGPO_MODES, INVALID_ACTIONS, KERNELS, KL_REFERENCE_CHOICES,
    KL_REFERENCES, LOSS_AGGREGATIONS, LR_SCHEDULES, OLD_LOGPROBS, PARAM_DTYPE_CHOICES, PARTITION_MODES, PAVG_VARIANTS,
    PENALTY_SCOPES, PREFERENCE_MIXES, PROMPT_ROLES, PROMPT_TEMPLATES, REWARD_MODES, SCALE_REWARDS, STD_DDOFS,
    TOKEN_SAMPLERS, TRACKERS, TRAINING_ATTENTIONS, TRAINING_KERNELS, TRANSFER_DTYPES, UNIFORM_GROUPS,
)
from fedagent_flwr.config.fault_plan import FAULT_SYNTAX, FaultPlan
from fedagent_flwr.config.renames import RENAMED
from fedagent_flwr.config.strategy_traits import STRATEGIES, Traits, named

MIN_TEMPERATURE = 0.01  # logits / temperature in fp32 overflow to inf (NaN probabilities) far above 1e-30
RUN_NAME = re.compile(r"[A-Za-z0-9_+][A-Za-z0-9._+-]*")  # a folder name that needs no quoting anywhere


Need = Callable[[bool, str, Any, str], None]  # need(ok, key, value, allowed): records a problem when not ok


class ConfigError(ValueError):
    """A run config's problems, each one line naming the key, its value and what is allowed."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__(invalid(problems))


def invalid(problems: list[str]) -> str:
    """One line for one problem (the usual case); one line per problem under a header for several."""
    if len(problems) == 1:
        return f"invalid run config: {problems[0]}"
    return "invalid run config:\n  " + "\n  ".join(problems)


def spec_names(spec: str) -> list[str]:
    """The environment names of an env spec ('babyai,maze'), in order, as written."""
    return [part.strip() for part in str(spec).split(",")]


def env_spec_problem(spec: str) -> str | None:
    """What the env spec's form breaks (an empty or repeated name); whether each name is registered is a preflight
    check (runs/preflight.py: the registry is the envs package's)."""
    names = spec_names(spec)
    if not all(names):
        return "an env name, or env names separated by commas with none empty (e.g. 'babyai,maze')"
    if repeated := sorted({n for n in names if names.count(n) > 1}):
        return f"each environment named once (not {', '.join(repeated)} twice)"
    return None


def per_env_syntax_problem(value: int | str, spec: str) -> str | None:
    """What a per-environment setting written "babyai=20,webshop=10" breaks in its form, or by naming an environment
    the env spec does not list; None for a number or a good one."""
    if not isinstance(value, str):
        return None
    seen: list[str] = []
    for part in value.split(","):
        name, _, number = (x.strip() for x in part.partition("="))
        if not name or name in seen or not number.isdigit() or int(number) < 1:
            return (f"an integer, or name=integer >= 1 for the envs of env, comma-separated, each env once (entry "
                    f"{part.strip()!r} of {value!r}; e.g. 'babyai=20,webshop=10')")
        seen.append(name)
    if unlisted := sorted(set(seen) - set(spec_names(spec))):
        return f"entries for the envs of env={spec!r} only (not {', '.join(unlisted)})"
    return None


def _key(default: Any, doc: str, allowed: str = "", words: tuple[str, ...] = (), choices: tuple[str, ...] = (),
         at_least: float | None = None, above: float | None = None, interval: str = "", per_env: bool = False) -> Any:
    """A run-config key. `words`: strings it also takes besides values of its default's type (a bool key's "auto");
    `choices`: the only values it takes (then its `allowed`); `at_least` / `above` / `interval` ("(0, 1]"): its
    bounds; `per_env`: a number key that also takes a number per environment ("babyai=20,webshop=10", envs/multi.py).
    Its section checks these as it is made (`Section.__post_init__`); the section's `check` holds the rest."""
    return field(default=default, metadata={"doc": doc, "allowed": allowed or " | ".join(choices), "words": words, "per_env": per_env,
                                            "choices": choices, "at_least": at_least, "above": above, "interval": interval})


def _declared_problem(f: Field, value: Any) -> str | None:
    """What a key's declared choices or bound allow, where `value` breaks them; else None."""
    meta = f.metadata
    if meta["per_env"] and isinstance(value, str):  # its entries are checked against env by check_across
        return None
    if meta["choices"] and value not in meta["choices"]:
        return meta["allowed"]
    kind = "an integer " if isinstance(f.default, int) and not isinstance(f.default, bool) else ""
    if meta["at_least"] is not None and value < meta["at_least"]:
        return f"{kind}>= {meta['at_least']:g}"
    if meta["above"] is not None and value <= meta["above"]:
        return f"> {meta['above']:g}"
    if meta["interval"]:  # "(0, 1]": a round bracket leaves its end out, a square one takes it in
        low, high = (float(x) for x in meta["interval"][1:-1].split(","))
        inside = (value > low if meta["interval"][0] == "(" else value >= low) and (value < high if meta["interval"][-1] == ")" else value <= high)
        return None if inside else f"in {meta['interval']}"
    return None


def _collector(problems: list[str]) -> Need:
    def need(ok: bool, key: str, value: Any, allowed: str) -> None:
        if not ok and not any(p.startswith(f"{key}=") for p in problems):  # one line a key: later rules repeat it
            problems.append(f"{key}={value!r} is not allowed: expected {allowed}")
    return need


def _declared_keys(obj: Any, prefix: str, need: Need) -> bool:
    """Checks each declared key of `obj` (a section, or RunConfig's own top-level keys) against its declaration;
    False where a number is not finite (the checks after it assume finite numbers)."""
    own = [f for f in fields(obj) if "doc" in f.metadata]
    finite = True
    for f in own:
        value = getattr(obj, f.name)
        if isinstance(value, float) and not math.isfinite(value):
            need(False, prefix + f.name.replace("_", "-"), value, f"a finite number ({f.metadata['allowed']})")
            finite = False
    if finite:
        for f in own:
            problem = _declared_problem(f, getattr(obj, f.name))
            need(problem is None, prefix + f.name.replace("_", "-"), getattr(obj, f.name), problem)
    return finite


class Section:
    """A section of the run config: a frozen dataclass of keys named `<NAME>.<key>` that checks itself as it is made
    (a ConfigError naming each key, its value and what is allowed), as TRL's configs do."""

    NAME: ClassVar[str]

    def __post_init__(self) -> None:
        problems: list[str] = []
        need = _collector(problems)
        if _declared_keys(self, self.NAME + ".", need):
            self.check(need)
        if problems:
            raise ConfigError(problems)

    def check(self, need: Need) -> None:
        """The rules among this section's keys beyond each key's declaration."""


# ----- the sections, one per concern -----------------------------------------------------------------


@dataclass(frozen=True)
class FederationSection(Section):
    """How the server waits for and draws its clients, and how the weights travel (the rounds, clients and strategy
    are top-level keys)."""

    NAME: ClassVar[str] = "federation"
    min_replies: int = _key(1, "fewest successful replies that still update the model", "1 .. M", at_least=1)
    round_timeout: float = _key(3600.0, "seconds to wait for a round's replies", ">= 1")
    client_sampling: str = _key("run-seed", "how a round's clients are drawn: run-seed = a stream seeded by seed; reference = as the FedAgent reference draws them (round_orchestrator.py): Python's random.sample seeded 42 + round - 1, the same clients in every seed", choices=CLIENT_SAMPLING)
    transfer_dtype: str = _key("fp32", "dtype the weights travel in between server and clients: fp32, or bf16 (half the bytes; the server still averages in fp32); tied weights travel once either way", " | ".join(TRANSFER_DTYPES) + "; bf16 with the LLM strategies, privacy.dp-mode off and privacy.secure-aggregation false", choices=TRANSFER_DTYPES)

    def check(self, need: Need) -> None:
        # Flower waits in whole seconds: a fraction of a second would become a timeout of 0 s.
        need(self.round_timeout >= 1, "federation.round-timeout", self.round_timeout, ">= 1 (seconds)")


@dataclass(frozen=True)
class PartitionSection(Section):
    """How the train split is divided among clients, and each partitioner's parameters (FedAgentGym heterogeneity;
    docs/heterogeneity.md)."""

    NAME: ClassVar[str] = "partition"
    scheme: str = _key("uniform", "how the train split is divided among clients: uniform = each client's partition.tasks-per-client drawn independently (clients may share tasks); uniform-windows = the FedAgent reference's uniform split, a contiguous window of the pool shuffled by partition.seed (partitions/uniform.py); by-environment = client k owns env k of the env list (Fed-SE)", choices=PARTITION_MODES)
    tasks_per_client: int = _key(8, "tasks in each client's partition (overlap across clients allowed)", "1 .. train-split size", at_least=1)
    seed: int = _key(-1, "seed of the partition alone; -1 = the run's seed, so each seed holds other tasks. A fixed value (e.g. 42, as the reference seeds its clients) keeps every client's tasks across seeds, so Local (client k) is one data set and seeds pair up", "-1, or an integer >= 0")
    preference_omega: float = _key(0.1, "partition.scheme=preference: spread omega of the client category mixes (paper: 0.1 low, 0.9 high heterogeneity)", ">= 0 (gaussian); (0, 1) (dirichlet)")
    preference_mix: str = _key("gaussian", "partition.scheme=preference: gaussian = noise on category logits (Algorithm 2), dirichlet = Dirichlet draw (reference code)", choices=PREFERENCE_MIXES)
    coverage_xi: float = _key(256.0, "partition.scheme=coverage: Beta dispersion xi of client sizes (paper: 256 low, 1 high heterogeneity)", "> 0", above=0)
    coverage_r: float = _key(1.3, "partition.scheme=coverage: average clients per task; client sizes sum to floor(r N)", "> 0", above=0)
    coverage_l_min: int = _key(100, "partition.scheme=coverage: smallest client size L_min", "integer >= 0, <= partition.coverage-l-avg")
    coverage_l_avg: float = _key(500.0, "partition.scheme=coverage: centre L_avg of the Beta size shape (the mean when r = K L_avg / N)", "L_min .. L_max")
    coverage_l_max: int = _key(1000, "partition.scheme=coverage: largest client size L_max", "integer >= partition.coverage-l-avg, >= 1", at_least=1)
    hardness_xi: float = _key(256.0, "partition.scheme=hardness: Beta dispersion xi' of each client's successful-task count (paper: 256 low, 1 high)", "> 0", above=0)
    hardness_r: float = _key(0.0, "partition.scheme=hardness: clients per successful task; 0 = K (L/2) / |S|, so clients hold L/2 successful tasks on average", ">= 0")
    success_labels: str = _key("", "partition.scheme=hardness: JSON of task id -> success (python -m fedagent_flwr.experiments.success_labels); absolute or ~ path", "path")

    def check(self, need: Need) -> None:
        need(self.seed >= -1, "partition.seed", self.seed, "-1 (the run's seed) or an integer >= 0")
        if self.preference_mix == "dirichlet":
            need(0 < self.preference_omega < 1, "partition.preference-omega", self.preference_omega, "in (0, 1) with partition.preference-mix='dirichlet'")
        else:
            need(self.preference_omega >= 0, "partition.preference-omega", self.preference_omega, ">= 0 (the noise scale)")
        need(self.coverage_l_max < 1 or 0 <= self.coverage_l_min <= self.coverage_l_avg <= self.coverage_l_max, "partition.coverage-l-min/avg/max",
             (self.coverage_l_min, self.coverage_l_avg, self.coverage_l_max), "0 <= partition.coverage-l-min <= partition.coverage-l-avg <= partition.coverage-l-max")
        need(self.hardness_r >= 0, "partition.hardness-r", self.hardness_r, ">= 0 (0 = derived from the labels)")
        if self.scheme == "hardness":
            labels = self.success_labels
            need(labels.startswith("~") or Path(labels).is_absolute(), "partition.success-labels", labels,
                 "an absolute path (or ~/...) to a file from `python -m fedagent_flwr.experiments.success_labels` when partition.scheme='hardness'")


@dataclass(frozen=True)
class RolloutSection(Section):
    """How the agent plays an episode: prompt history, generation, reward, and the engine that decodes
    (agent/play/rollout.py)."""

    NAME: ClassVar[str] = "rollout"
    max_steps: int | str = _key(0, "episode horizon; 0 = the env's default; per environment as babyai=20,webshop=10 (an env not named keeps its default)", "integer >= 0, or name=integer >= 1 for envs of env, comma-separated", at_least=0, per_env=True)
    history_length: int = _key(0, "past (observation, action) pairs shown in the prompt (FedAgent reference: 2)", "integer >= 0", at_least=0)
    max_context_tokens: int = _key(0, "a step's prompt plus its generated tokens at most this many: the oldest past steps are left out of a prompt (the step count still shown) until it fits, and a step that does not fit with one past step is refused; a limit below a first step's prompt plus the generated tokens is refused at start-up (Fed-SE v2 App. B: 4096); 0 = no cut", "integer >= 0 (0 = no cut)", at_least=0)
    max_completion_length: int = _key(0, "tokens generated per agent step; 0 = the env's need (maze 32, alfworld 64, webshop 128)", "integer >= 0", at_least=0)
    temperature: float = _key(1.0, "sampling temperature of training rollouts", ">= 0.01")
    top_p: float = _key(1.0, "nucleus sampling of training rollouts", "(0, 1]", interval="(0, 1]")
    token_sampler: str = _key("multinomial", "how rollouts and evaluations draw a token from its softmax: multinomial = torch.multinomial, which on a CPU draws an exponential number for every vocabulary entry of every row; inverse-cdf = one uniform number a row, placed among the cumulative probabilities (agent/engine/sampling.py): the same distribution, and for a seed other tokens. Greedy decoding (temperature 0) draws nothing", choices=TOKEN_SAMPLERS)
    reward: str = _key("success", "trajectory reward: success = 10 x won (FedAgent reference), env = the env's own return, score = 10 x the env's task score (WebShop), else as success", "success | env | score", choices=REWARD_MODES)
    action_matching: str = _key("exact", "an inadmissible action: exact = passed on as written (reference), closest = the most similar admissible action is taken (still counted invalid)", "exact | closest", choices=ACTION_MATCHING)
    answer_parsing: str = _key("strict", "how a completion is read: strict = exactly one <think> and one <action> block, else malformed (the last action block taken); lenient = also one <action> block without <think>, inside a code fence, or quoted (what real chat models write); reference = the FedAgent reference's parser (verl-agent's projection.py): lowercased, the first action block, both think tags anywhere, no Chinese characters, without action tags the last 30 characters (WebShop: 20); agentgym = AgentGym's reading of Thought: ... Action: ... answers (agentenv's clients: BabyAI and TextCraft the first line after each Action:, WebShop the text after the last, the others after the first; agent/play/prompts.py), only with rollout.prompt-template = agentgym", choices=ANSWER_PARSING)
    prompt_roles: str = _key("user", "where the standing instructions (environment introduction, answer format) go: user = all in one user message (the FedAgent reference); system = in a system message, the way chat models take instructions; the user message keeps task, observation and admissible actions", choices=PROMPT_ROLES)
    prompt_template: str = _key("compact", "the user message's layout: compact = ours; reference = the FedAgent reference's templates (verl-agent's prompts/alfworld.py and webshop.py) in our words: the same information, order and format (agent/play/prompts.py reference_prompt); agentgym = AgentGym's ReAct form, in our words: the introduction, the steps as Observation / Action lines and the answer as Thought: ... Action: ... (agentgym_prompt), read by rollout.answer-parsing = agentgym; reference and agentgym need rollout.prompt-roles = user, as both send one message", choices=PROMPT_TEMPLATES)
    invalid_penalty: float = _key(0.1, "the penalty per invalid action (rollout.invalid-action says which; rollout.invalid-penalty-scope where it is taken off)", ">= 0", at_least=0)
    invalid_action: str = _key("inadmissible", "which step is invalid: inadmissible = not well formed, or an action the environment rejects or closest matching repaired; malformed = not well formed (no single <think> and <action> block) only, whatever the environment makes of the action (the FedAgent reference's projection)", choices=INVALID_ACTIONS)
    invalid_penalty_scope: str = _key("trajectory", "where the penalty is taken off: trajectory = summed over the episode and taken off its reward, so every step shares it; step = each step's sample scores the episode's reward less its own penalty and GRPO normalises over the group's step samples (the FedAgent reference, verl-agent)", choices=PENALTY_SCOPES)
    name: str = _key("auto", "the engine rollouts decode with (verl's rollout.name, whose engines are vllm | sglang | hf; ours are): hf = a KV-cache loop over the transformers model that drops finished rows (agent/engine/sampling.py); static = the project's decoder with a preallocated KV cache, a bf16 copy of the weights under bf16 autocast (on N ranks copied one FSDP unit gathered at a time, never the whole weights at once), and on CUDA one graph launch per token step (agent/engine/decode.py; the same tokens as hf on CPU and, greedy in fp32, on an H100, where a token step took 5.5 ms against hf's 26.8, docs/gpu-measurements.md); auto = static on CUDA where the model is supported, else hf", choices=ENGINES)
    kernels: str = _key("eager", "how the static engine's token step runs the element-wise work around its matrix products (norms, RoPE, SiLU, residual adds): eager = one kernel each, as written; compile = torch.compile fuses each layer half's into a few kernels (agent/engine/decode.py), compiled once per process at the first token step (torch caches it on disk for later processes; its time on a GPU is not yet measured, docs/gpu.md). Only where the static engine runs: with rollout.name=hf it must stay eager", choices=KERNELS)
    generation_batch_size: int = _key(64, "episodes per generate call; on a GPU tokens/s grows almost with it (docs/gpu.md). 0 = auto: as many as the memory plan leaves room for in engine.client-memory-gb (engine.server-memory-gb for the server's evaluation), or else on a GPU in the memory free when the client starts, up to an epoch's episodes (grpo.tasks-per-epoch x grpo.num-generations); on a CPU with no memory given, an epoch's episodes", "integer >= 0 (0 = auto)")

    def check(self, need: Need) -> None:
        need(self.temperature >= MIN_TEMPERATURE, "rollout.temperature", self.temperature,
             f">= {MIN_TEMPERATURE} (GRPO needs sampled rollouts; below this the logits / temperature overflow)")
        need(self.prompt_template == "compact" or self.prompt_roles == "user", "rollout.prompt-roles", self.prompt_roles, f"user with rollout.prompt-template = {self.prompt_template} (one user message)")
        need((self.prompt_template == "agentgym") == (self.answer_parsing == "agentgym"), "rollout.answer-parsing", self.answer_parsing, "agentgym with rollout.prompt-template = agentgym only")
        need(self.kernels == "eager" or self.name != "hf", "rollout.kernels", self.kernels,
             "eager with rollout.name='hf' (the kernels are the static engine's)")
        need(self.generation_batch_size >= 0, "rollout.generation-batch-size", self.generation_batch_size, "an integer >= 1, or 0 = auto")


@dataclass(frozen=True)
class GRPOSection(Section):
    """A client's local GRPO epochs: the algorithm, and how its passes cut the batch (agent/training/grpo.py takes
    this section as its config, as TRL's GRPOTrainer takes a GRPOConfig)."""

    NAME: ClassVar[str] = "grpo"
    local_epochs: int = _key(1, "local GRPO epochs tau per round", "integer >= 1", at_least=1)
    tasks_per_epoch: int = _key(4, "tasks sampled with replacement per epoch (paper: 64)", "integer >= 1", at_least=1)
    num_generations: int = _key(8, "rollouts G per task; advantages are normalised within the group", "integer >= 2")
    learning_rate: float = _key(5e-5, "AdamW learning rate (paper: 1e-6 for 1.5B+ models)", "> 0", above=0)
    epsilon: float = _key(0.2, "PPO clip range", "(0, 1)", interval="(0, 1)")
    beta: float = _key(0.01, "weight of the KL term to the policy grpo.kl-reference names; 0 = off", ">= 0", at_least=0)
    weight_decay: float = _key(0.0, "AdamW's decoupled weight decay (verl's actor, the FedAgent reference: 0.01)", ">= 0", at_least=0)
    mini_batch_size: int = _key(64, "agent steps per optimizer step (ours: verl's ppo_mini_batch_size counts prompts, each with its rollout.n responses; here each agent step of an episode is one sample)", "integer >= 1", at_least=1)
    ppo_micro_batch_size_per_gpu: int = _key(64, "agent steps per forward/backward pass", "integer >= 1", at_least=1)
    ppo_max_token_len_per_gpu: int = _key(0, "GRPO's update: > 0 cuts each minibatch into forward/backward passes of at most this many padded tokens (rows x the longest row) instead of grpo.ppo-micro-batch-size-per-gpu rows, a longer agent step alone (verl's dynamic batch size, ppo_max_token_len_per_gpu): short steps share a pass by the dozen, long ones go a few at a time, so each pass is about as full as memory allows (fewer, larger kernels on a GPU); with grpo.group-by-length the padding is least. The memory plan counts max(this, the context) tokens a pass; 0 = grpo.ppo-micro-batch-size-per-gpu", "integer >= 0 (0 = grpo.ppo-micro-batch-size-per-gpu)")
    log_prob_micro_batch_size_per_gpu: int = _key(0, "agent steps per no-grad log-prob pass (the old policy's and the KL reference's): these keep no activations for backward, so with engine.logprob-chunk-tokens > 0 they fit several times the update's micro-batch, and a bigger batch keeps a GPU busier (docs/gpu.md); 0 = grpo.ppo-micro-batch-size-per-gpu", "integer >= 0 (0 = grpo.ppo-micro-batch-size-per-gpu)")
    log_prob_max_token_len_per_gpu: int = _key(0, "the no-grad log-prob passes as grpo.ppo-max-token-len-per-gpu cuts the update's: > 0 = passes of at most this many padded tokens instead of grpo.log-prob-micro-batch-size-per-gpu rows, a longer agent step alone; they keep no activations for backward, so a budget several times the update's fits. The memory plan counts max(this, the context) tokens a pass; 0 = grpo.log-prob-micro-batch-size-per-gpu", "integer >= 0 (0 = grpo.log-prob-micro-batch-size-per-gpu)")
    group_by_length: bool = _key(False, "sort each minibatch by length before cutting it into micro-batches, so little padding is computed. Under grpo.loss-aggregation trajectory-mean or token-mean the loss is the same (up to rounding); under micro-batch-token-mean it is not: each micro-batch's token mean weighs alike, and grouping decides which rows share one (short rows' tokens then weigh more)", "true | false")
    balance_micro_batches: bool = _key(False, "GRPO's update: cut each minibatch into micro-batches of grpo.ppo-micro-batch-size-per-gpu rows whose summed lengths (prompt and completion) are as even as a greedy split makes them: verl's balancing of sequence lengths across the GPUs of a client (the FedAgent reference: 16 rows a GPU of a 64-row minibatch), done across one process's micro-batches; under micro-batch-token-mean each micro-batch's mean then covers about as many tokens. The update's cut only: with grpo.group-by-length the log-prob passes stay grouped", "true | false")
    max_grad_norm: float = _key(1.0, "gradient clipping norm", "> 0", above=0)
    finetuning: str = _key("full", "what a GRPO client trains: full = every weight; lora = a LoRA adapter (lora.r, lora.lora-alpha, lora.target-modules) on the frozen base, and only the adapter travels and is averaged", choices=FINETUNING)
    kl_reference: str = _key("auto", "the policy the KL term is taken against: round-start = the weights (or adapter) the round started from; base = the run's initial model for the whole run (the FedAgent reference's federated and centralized runs; with lora the adapter switched off, with full fine-tuning a second, frozen copy of the base weights on each client); auto = base for the Centralized and Local baselines (one learner trained T x tau epochs), round-start otherwise", "auto | " + " | ".join(KL_REFERENCES), choices=KL_REFERENCE_CHOICES)
    loss_aggregation: str = _key("trajectory-mean", "how token losses are averaged: each trajectory equally, each token equally, or each micro-batch's tokens and then the micro-batches (verl's token-mean under gradient accumulation, the FedAgent reference's)", choices=LOSS_AGGREGATIONS)
    clip_ratio_c: float = _key(0.0, "dual clip: a negative advantage's token loss stops growing at ratio c (verl's clip_ratio_c; the reference: 3.0); 0 = off", "0 or > 1")
    kl_clamp: float = _key(0.0, "the k3 KL estimate clamped to [-value, value] (verl's low_var_kl: 10); 0 = unclamped", ">= 0", at_least=0)
    entropy_coeff: float = _key(0.0, "entropy bonus: the loss less this x the completion tokens' mean next-token entropy, aggregated as the loss (verl's entropy_coeff; the reference's ppo_trainer.yaml: 0.001)", ">= 0", at_least=0)
    reward_std_ddof: int = _key(0, "delta degrees of freedom of the standard deviation grpo.scale-rewards divides by: 0 = the population's, 1 = the unbiased one (torch.std, verl's)", "0 | 1", choices=STD_DDOFS)
    scale_rewards: str = _key("group", "what a reward's deviation from its group's mean is divided by (TRL's scale_rewards): group = the group's standard deviation (GRPO, verl, the FedAgent reference); batch = the standard deviation of all the epoch's rewards, so a group split only by the small rollout.invalid-action penalty gets small advantages; none = nothing (Dr. GRPO)", choices=SCALE_REWARDS)
    uniform_groups: str = _key("drop", "steps of a group whose rewards are all equal (advantage 0): drop = skipped, so with grpo.beta > 0 their KL term goes too (cheaper; the default so far); keep = trained on with advantage 0, so the KL covers every step played (verl's GRPO)", choices=UNIFORM_GROUPS)
    batch_padding: str = _key("none", "the epoch's agent steps before the update: none = as played, the last minibatch maybe short; copy = padded to a multiple of grpo.mini-batch-size with copies of randomly drawn steps, none twice while the batch has enough (verl-agent's adjust_batch, mode copy: the FedAgent reference's; verl-agent pads to a multiple of the lcm of its micro-batch sizes times the world size, ours to grpo.mini-batch-size), so every minibatch is whole and a copied step weighs twice", choices=BATCH_PADDINGS)
    adv_estimator: str = _key("grpo", "grpo = every step of a trajectory gets its episode's group-normalised advantage; gigpo = plus GiGPO's step-level part (Feng et al. 2025, as verl-agent computes it; agent/training/gigpo.py): steps of one group that started from the same state (the same observation text) are compared by their discounted returns", choices=ADVANTAGE_ESTIMATORS)
    gamma: float = _key(0.95, "grpo.adv-estimator=gigpo: discount of a step's return (verl-agent's algorithm.gamma; 0.95 in its GiGPO scripts)", "[0, 1]", interval="[0, 1]")
    gigpo_mode: str = _key("mean_norm", "grpo.adv-estimator=gigpo: a step group's returns less their mean (mean_norm: verl-agent's default and WebShop script), or also divided by their standard deviation (mean_std_norm: its ALFWorld script)", choices=GIGPO_MODES)
    step_advantage_w: float = _key(1.0, "grpo.adv-estimator=gigpo: weight of the step-level part added to the episode-level one (verl-agent's step_advantage_w; 0 = GRPO exactly)", ">= 0", at_least=0)
    old_logprobs: str = _key("recompute", "where GRPO's PPO ratio takes the round-start policy's log-probs from: recompute = a no-grad pass over every sample before the first optimizer step (verl, TRL); rollout = the log-probs the sampler drew each token with, kept by the rollout: the same policy and tokens, so the same numbers up to the decode passes' rounding, and that pass is saved (the update 1.2x faster on a 2-core CPU; benchmarks/update_passes.py); each round reports the gap (train/rollout_logprob_gap_signed, _max, _over_001, first_step_clip_frac); refused where rollouts decode with the static engine, which samples from a bf16 copy of the weights", choices=OLD_LOGPROBS)

    def check(self, need: Need) -> None:
        need(self.num_generations >= 2, "grpo.num-generations", self.num_generations, "an integer >= 2 (advantages compare rollouts within a group)")
        need(self.clip_ratio_c == 0 or self.clip_ratio_c > 1, "grpo.clip-ratio-c", self.clip_ratio_c, "0 (off) or > 1")
        for name, zero in (("ppo_max_token_len_per_gpu", "grpo.ppo-micro-batch-size-per-gpu"),
                           ("log_prob_micro_batch_size_per_gpu", "grpo.ppo-micro-batch-size-per-gpu"),
                           ("log_prob_max_token_len_per_gpu", "grpo.log-prob-micro-batch-size-per-gpu")):
            need(getattr(self, name) >= 0, "grpo." + name.replace("_", "-"), getattr(self, name), f"an integer >= 0 (0 = {zero})")
        need(not (self.balance_micro_batches and self.ppo_max_token_len_per_gpu), "grpo.balance-micro-batches",
             self.balance_micro_batches, "false with grpo.ppo-max-token-len-per-gpu > 0 (a token budget cuts the update its own way)")
        if self.adv_estimator != "gigpo":
            for name in ("gamma", "gigpo_mode", "step_advantage_w"):
                default = GRPOSection.__dataclass_fields__[name].default
                need(getattr(self, name) == default, "grpo." + name.replace("_", "-"), getattr(self, name),
                     f"{default!r} (its default) unless grpo.adv-estimator='gigpo'")

    def log_prob_rows(self) -> int:
        """Agent steps per no-grad log-prob pass: log-prob-micro-batch-size-per-gpu, or the update's where it is 0."""
        return self.log_prob_micro_batch_size_per_gpu or self.ppo_micro_batch_size_per_gpu

    def epoch_episodes(self) -> int:
        """The most episodes a client plays at once: an epoch's GRPO groups (generation-batch-size=auto's cap)."""
        return self.tasks_per_epoch * self.num_generations


@dataclass(frozen=True)
class EngineSection(Section):
    """Where and how the model computes, and in how much memory: server device, memory budgets, working weights,
    kernels, checkpointing, ranks. Float rounding aside, none of it changes what is learnt; placement.py resolves
    every `auto` (docs/gpu.md)."""

    NAME: ClassVar[str] = "engine"
    server_device: str = _key("same", "where the ServerApp evaluates: same = as device; cpu leaves a GPU the clients share to them", "same | " + " | ".join(DEVICES) + " | cuda:N")
    client_memory_gb: float = _key(0.0, "memory (GiB) of the GPU or GPU share each client trains in; the memory plan (docs/gpu.md) is checked against it before round 1; 0 = not checked", ">= 0")
    server_memory_gb: float = _key(0.0, "memory (GiB) the ServerApp evaluates in; checked like engine.client-memory-gb; 0 = not checked", ">= 0")
    param_dtype: str = _key("fp32", "the weights GRPO's log-prob and update passes compute with under bf16-mixed: fp32 = the fp32 weights, which bf16 autocast casts in every forward (PyTorch AMP; the embedding's output, the residual stream and the norms stay fp32); bf16 = a bf16 working copy of every weight refreshed after each optimizer step, gradients accumulated in fp32 beside the fp32 master weights AdamW steps (FSDP's param_dtype=bf16, Megatron's bf16): no casts per forward, every activation in bf16 (agent/engine/master_weights.py; docs/gpu.md); auto = bf16 where it applies (a GRPO strategy, grpo.finetuning='full', precision resolving to bf16-mixed: on CUDA), else fp32", " | ".join(PARAM_DTYPE_CHOICES) + "; bf16 with precision resolving to bf16-mixed, grpo.finetuning='full' and a GRPO strategy", choices=PARAM_DTYPE_CHOICES)
    training_kernels: str = _key("eager", "the kernels GRPO's log-prob and update passes run the decoder layers with: eager = the transformers modules as they are; compile = torch.compile of each decoder layer (one graph shared by all layers, dynamic shapes) in those passes only; liger = Liger-Kernel's Triton RMSNorm, SwiGLU and RoPE (CUDA, Qwen2 and Llama models, pip install liger-kernel). The same function up to float rounding (agent/engine/kernels.py); speed is measured in docs/gpu-measurements.md", choices=TRAINING_KERNELS)
    attn_implementation: str = _key("sdpa", "the attention kernel of the passes that take a gradient (GRPO's update, Fed-SE's fine-tuning), by transformers' names: sdpa = torch's scaled_dot_product_attention, as every other pass; eager = transformers' matrix products and fp32 softmax, which keeps each layer's [heads, tokens, tokens] softmax for backward (the memory plan counts it) and rounds the scores to the compute dtype first: the same function up to float rounding. On a CPU at an agent step's few hundred tokens, where SDPA's backward is slow, the update and the fine-tuning ran 1.10x and 1.14x faster with eager (docs/performance.md). Not with engine.gradient-checkpointing, nor on several ranks (engine.ranks-per-client)", choices=TRAINING_ATTENTIONS)
    logprob_chunk_tokens: int = _key(0, "completion tokens the output head scores at a time in GRPO's log-prob and update passes, each chunk recomputed in backward: the [micro-batch, tokens, vocab] logits are never built (1024 suits a 152k vocabulary on a GPU); 0 = full logits", "integer >= 0")
    shared_prompt_prefix: bool = _key(False, "GRPO's log-prob and update passes compute the tokens every prompt of a micro-batch opens with (the chat template's system message, the environment's instructions and task) once, as one row whose keys and values every row attends to, instead of once per row: the same log-probs and gradients up to float rounding, and fewer tokens through the model (a quarter of a Gridworld step's), yet on a 2-core CPU the update ran slower with it (benchmarks/results/2026-11-30-cpu/update_passes.json; docs/results-path.md); not yet measured on a GPU. Not with engine.gradient-checkpointing", "true | false")
    gradient_checkpointing: bool | str = _key(False, "recompute each layer's activations in the backward pass instead of keeping them (transformers' gradient checkpointing): far less memory for the update, about a third more compute; auto = in each GRPO micro-batch only the fewest leading layers whose checkpointing makes its activations fit the memory the rest of the client's plan leaves in engine.client-memory-gb (or else the GPU memory free when the client starts), so short micro-batches skip the recompute; every layer where no memory is known (a CPU without engine.client-memory-gb)", "true | false | auto", words=("auto",))
    ranks_per_client: int = _key(1, "processes a client's local round runs on (started in its first round, kept while it runs; on real SuperNodes by the node's rank service, across rounds), each with a device of its own (one GPU of the client's --num-gpus-per-client, or a share of the CPU's cores): each plays a share of the epoch's episodes with the whole weights (the hf engine gathers them whole, the static engine copies them in its own dtype one unit gathered at a time), and GRPO's passes run under FSDP2 with weights, gradients and AdamW state sharded over them, the same loss as one process over the whole epoch (methods/ranked_round.py; docs/multi-gpu.md). GRPO strategies (fedagent-avg and its baselines); 1 = the client's own process", "integer >= 1", at_least=1)
    rank_timeout_s: float = _key(0.0, "seconds each collective of a client's ranks (engine.ranks-per-client > 1) may take before the client fails and ends its ranks, shorter than torch's own limits (NCCL's 10 minutes, gloo's 30); 0 = torch's own. A round on the ranks may take federation.round-timeout, as the server waits for it (agent/fsdp/launch.py)", "0 (torch's own), or >= 60")
    ranks_return_memory: bool = _key(False, "CPU ranks (engine.ranks-per-client > 1) give the memory they free back to the system: blocks of 64 KiB or more are mapped on their own, so that a rank's peak resident memory follows the memory plan instead of keeping what the rollout and each pass freed, at the cost of slower rounds (each large block's pages faulted in anew; the measurements of both are in docs/multi-gpu.md). false = the C library's own behaviour", "true | false")

    def check(self, need: Need) -> None:
        need(self.server_device in ("same", *DEVICES) or self.server_device.startswith("cuda:"), "engine.server-device",
             self.server_device, "same | " + " | ".join(DEVICES) + " | cuda:N")
        need(self.rank_timeout_s == 0 or self.rank_timeout_s >= 60, "engine.rank-timeout-s", self.rank_timeout_s,
             "0 (torch's own limits) or >= 60 (seconds: a collective of a large model can take a minute)")
        for name in ("client_memory_gb", "server_memory_gb"):
            need(getattr(self, name) >= 0, "engine." + name.replace("_", "-"), getattr(self, name), ">= 0 (0 = not checked)")
        need(self.logprob_chunk_tokens >= 0, "engine.logprob-chunk-tokens", self.logprob_chunk_tokens, "an integer >= 0 (0 = full logits)")
        need(self.gradient_checkpointing in (True, False, "auto"), "engine.gradient-checkpointing", self.gradient_checkpointing, "true | false | auto")
        # transformers' checkpointed layers turn the KV cache off, and the prefix reaches the rows through it
        need(not (self.shared_prompt_prefix and self.gradient_checkpointing), "engine.shared-prompt-prefix",
             self.shared_prompt_prefix, "false with engine.gradient-checkpointing on (the prefix's keys and values travel "
             "in the KV cache, which checkpointed layers turn off)")
        # the memory plan's fit of checkpointed layers (checkpointing.py) counts SDPA's activations, not eager's softmax
        need(not (self.attn_implementation == "eager" and self.gradient_checkpointing), "engine.attn-implementation",
             self.attn_implementation, "sdpa with engine.gradient-checkpointing on (the plan that fits checkpointed layers "
             "counts SDPA's activations)")


@dataclass(frozen=True)
class LoRASection(Section):
    """The LoRA adapter of fedse-lora, and of fedagent-avg with grpo.finetuning=lora (PEFT's LoraConfig names;
    agent/training/lora.py)."""

    NAME: ClassVar[str] = "lora"
    r: int = _key(8, "fedse-lora, and fedagent-avg with grpo.finetuning=lora: LoRA rank r", "integer >= 1", at_least=1)
    lora_alpha: float = _key(16.0, "fedse-lora, and fedagent-avg with grpo.finetuning=lora: LoRA alpha (scaling alpha / r)", "> 0", above=0)
    target_modules: str = _key("q_proj,k_proj,v_proj,o_proj", "fedse-lora, and fedagent-avg with grpo.finetuning=lora: comma-separated module names that get LoRA (peft target_modules), or all-linear", "string")

    @property
    def targets(self) -> tuple[str, ...] | str:
        """lora.target-modules as PEFT's target_modules takes it: the module names, or "all-linear"."""
        text = self.target_modules.strip()
        return text if text == "all-linear" else tuple(t.strip() for t in text.split(","))

    def check(self, need: Need) -> None:
        targets = self.targets
        need(targets == "all-linear" or (all(targets) and all(" " not in t for t in targets)),
             "lora.target-modules", self.target_modules, "comma-separated module names (e.g. q_proj,v_proj) or all-linear")


@dataclass(frozen=True)
class EvalSection(Section):
    """The server's held-out evaluation."""

    NAME: ClassVar[str] = "eval"
    test_freq: int = _key(2, "evaluate the global model every this many rounds (and before round 1 and at the end)", "integer >= 1", at_least=1)
    tasks: int | str = _key(0, "held-out (test-split) tasks evaluated, evenly spaced over the pool (per env when env lists several; or per environment as webshop=200,babyai=90, an env not named keeping all); 0 = all", "integer >= 0, or name=integer >= 1 for envs of env, comma-separated", at_least=0, per_env=True)
    samples_per_task: int = _key(16, "episodes per evaluated task", "integer >= 1", at_least=1)
    temperature: float = _key(1.0, "sampling temperature of evaluation; 0 = greedy", "0 or >= 0.01")
    transcripts: int = _key(4, "held-out episodes written as text (observation, completion, action, valid, reward per step) to <run>/episodes/round-NNNN.txt at each evaluation; 0 = none", "integer >= 0", at_least=0)
    save_total_limit: int = _key(0, "checkpoints kept in <run>/checkpoints (TRL's save_total_limit): the last this many evaluations' and the one of the highest held-out success (the earliest of ties), the others removed as each new one is written; 0 = every evaluation's", "integer >= 0 (0 = keep all)", at_least=0)
    initial_evaluation: str = _key("", "a run folder whose evaluation before round 1 this run takes instead of playing it again (a Local or Centralized baseline, or another estimator, from the same model and seed: the SmolLM2 preset saves 6 of its 55 minutes); taken only if that run evaluated the same initial weights on the same held-out episodes with the same evaluation settings, project sources and torch / transformers / peft versions, else the run stops before round 1 naming what differs (runs/reused_evaluation.py); empty = evaluate", "empty, or an absolute (or ~) path to a run folder")

    def check(self, need: Need) -> None:
        need(self.temperature == 0 or self.temperature >= MIN_TEMPERATURE, "eval.temperature",
             self.temperature, f"0 (greedy) or >= {MIN_TEMPERATURE}")
        folder = self.initial_evaluation
        need(not folder or folder.startswith("~") or Path(folder).is_absolute(), "eval.initial-evaluation", folder,
             "empty, or an absolute path (or ~/...) to a run folder (run_simulation.py resolves relative paths)")


@dataclass(frozen=True)
class BaselineSection(Section):
    """FedAgent's Table 1 baselines (methods/baselines.py)."""

    NAME: ClassVar[str] = "baseline"
    name: str = _key("none", "none = FedAgent; centralized = one learner on the union of all clients' tasks; local = client baseline.local-client alone; baselines train one learner per round for grpo.local-epochs epochs, no averaging", choices=BASELINES)
    local_client: int = _key(0, "baseline.name=local: the partition-id that trains alone", "0 .. K-1")
    optimizer: str = _key("keep", "a baseline's one learner trains on through the rounds: keep = its AdamW state carries from round to round (kept on the client), as one learner trained for T x tau epochs would; reset = a fresh optimizer every round, like a FedAgent client's (what baselines did before this key)", choices=BASELINE_OPTIMIZERS)

    def check(self, need: Need) -> None:
        need(self.local_client >= 0, "baseline.local-client", self.local_client, "an integer >= 0 (a partition-id)")


@dataclass(frozen=True)
class FedRLSection(Section):
    """QAvg / PAvg (methods/fedrl/)."""

    NAME: ClassVar[str] = "fedrl"
    kappa: float = _key(0.4, "qavg/pavg tabular heterogeneity: client k's kernel is kappa P_k + (1 - kappa) P_0", "[0, 1]", interval="[0, 1]")
    local_updates: int = _key(4, "qavg/pavg local updates E per round (tabular: steps, deep: episodes); 0 = E = inf, clients never communicate (independent baseline)", "integer >= 0")
    pavg_variant: str = _key("soft", "PAvg parametrisation: soft = softmax logits (SoftPAvg), proj = tables projected onto the simplex (ProjPAvg)", choices=PAVG_VARIANTS)
    clients: str = _key("all", "qavg/pavg clients per round: all (the paper) or sampled (clients-per-round of them)", choices=FEDRL_CLIENT_MODES)
    step_size: float = _key(0.0, "qavg/pavg tabular step size: 0 = the Table 1 preset (QAvg: 2 / ((1 - gamma)(t + E)); PAvg: reference step with stall decay); > 0 = this constant step", ">= 0")
    step_decay: float = _key(1.0, "factor on a constant fedrl.step-size when a round's objective gains < 1e-3 of it (1 = never decay)", "(0, 1]", interval="(0, 1]")
    center_in_training: bool = _key(True, "qavg/pavg tabular envs: client 0's kernel is the centre P_0 itself (the reference code); false = every client's kernel is P_0 mixed with its own noise", "true | false")
    test_envs: int = _key(20, "qavg/pavg held-out environments the server also scores the global policy on", "integer >= 0", at_least=0)
    repetition: int = _key(0, "qavg/pavg tabular: the repetition of python -m fedagent_flwr.experiments.fedrl_table1 this run reproduces (problem and initial table from SeedSequence([seed, repetition]))", "integer >= 0", at_least=0)
    random_mdp_reward_scale: float = _key(1.0, "random-mdp reward R ~ U(0, scale); 10 gives the paper's magnitudes (1 = reference code)", "> 0", above=0)
    independent_steps_per_round: int = _key(8, "with fedrl.local-updates=0: local steps (tabular) / episodes (deep) each client takes per round between evaluations", "integer >= 1", at_least=1)
    env_embedding_dim: int = _key(0, "deep envs: size of each client's private environment embedding (PerDQNAvg / PerDDPGAvg); 0 = off; it never leaves the client", "integer >= 0", at_least=0)

    def check(self, need: Need) -> None:
        need(self.local_updates >= 0, "fedrl.local-updates", self.local_updates, "an integer >= 0 (0 = E = inf)")
        need(self.step_size >= 0, "fedrl.step-size", self.step_size, ">= 0 (0 = the Table 1 preset)")


@dataclass(frozen=True)
class FedSESection(Section):
    """Fed-SE: its exploration, experience buffer and each round's LoRA fine-tuning (methods/fedse.py,
    agent/self_evolution.py; the adapter's shape is the lora section)."""

    NAME: ClassVar[str] = "fedse"
    aggregation: str = _key("mean", "fedse-lora server: mean = unweighted average of LoRA A and B (eq. 8), weighted = by each client's successes this round, exact = mean of B.A re-factorised to rank r by SVD", choices=FEDSE_AGGREGATIONS)
    fraction_train: float = _key(1.0, "fedse-lora: fraction of the K clients sampled each round (1 = all, the paper); clients-per-round is not used", "(0, 1]", interval="(0, 1]")
    explore_samples: int = _key(2, "fedse-lora: exploration episodes per client task per round; 0 = no exploration (FedAvg on the static demonstrations)", "integer >= 0", at_least=0)
    keep: str = _key("successes", "fedse-lora: trajectories added to the buffer: successes (the paper's filter) or all (w/o filtering)", choices=FEDSE_KEEP)
    history: str = _key("cumulative", "fedse-lora: cumulative = buffer grows every round; round = demonstrations plus this round's trajectories only (w/o history)", choices=FEDSE_HISTORY)
    steps: str = _key("all", "fedse-lora: steps of a kept trajectory trained on: all (the paper) or valid (drop steps whose action was malformed or inadmissible)", choices=FEDSE_STEPS)
    seed_demos: int | str = _key(8, "fedse-lora: expert demonstrations on the client's tasks that seed its buffer (D_k^0); per environment as webshop=3930,babyai=810 (AgentTraj's sizes; an env not named gets none), cycling over the client's tasks of that env, only the expert's wins kept: more demos than tasks replay them (3,930 over 300 tasks: about 13 plays of each)", "integer >= 0, or name=integer >= 1 for envs of env, comma-separated", at_least=0, per_env=True)
    seed_data: str = _key("", "fedse-lora: AgentGym's AgentTraj trajectories (a .json / .jsonl file, or a folder of them, on the client's machine) that seed the buffer instead of the scripted experts: the items of each environment a client holds, dealt round-robin over the clients holding it, capped per environment by fedse.seed-demos where it names environments; each trained chat turn one step (agent/agenttraj.py); \"\" = the experts", "a path, or \"\"")
    loss_tokens: str = _key("completion", "fedse-lora: tokens the SFT loss covers: completion = the whole completion, reasoning included (default: this project's reasoning names the action, so the choice is made there; docs/fedse.md); action = those after </think>, given the reasoning (the paper's Eq. 7)", choices=FEDSE_LOSS_TOKENS)
    max_steps: int = _key(20, "fedse-lora: optimizer steps of NLL fine-tuning on the buffer per round (unless fedse.num-train-epochs > 0)", "integer >= 1", at_least=1)
    num_train_epochs: int = _key(0, "fedse-lora: > 0 = this many passes over the client's whole buffer per round instead of fedse.max-steps steps, so the steps grow with the buffer (Fed-SE v2, App. B: 2 epochs); 0 = fedse.max-steps", "integer >= 0", at_least=0)
    lr_scheduler_type: str = _key("constant", "fedse-lora: the learning rate over each round's fine-tuning: constant, or cosine = decayed from fedse.learning-rate to 0 over the round's steps, no warm-up (Fed-SE v2, App. B; each round's fine-tuning a run of its own, as a LLaMA-Factory job per round)", choices=LR_SCHEDULES)
    sft_batch_size: int = _key(16, "fedse-lora: agent steps per fine-tuning batch", "integer >= 1", at_least=1)
    sft_micro_batch_size: int = _key(0, "fedse-lora: agent steps per forward/backward pass of the fine-tuning; a batch is accumulated over batch / micro-batch passes (TRL's gradient accumulation: the same loss, a quarter of the activations at a quarter of the batch); 0 = fedse.sft-batch-size", "0, or an integer >= 1 that divides fedse.sft-batch-size")
    learning_rate: float = _key(1e-3, "fedse-lora: AdamW learning rate of the LoRA fine-tuning", "> 0", above=0)
    buffer_dir: str = _key("~/.cache/fedagent-flwr/fedse-buffers", "fedse-lora: where each client keeps its buffer (<dir>/run-<run id>/partition-<k>/); absolute or ~ path", "path")

    def check(self, need: Need) -> None:
        need(self.sft_micro_batch_size >= 0 and (self.sft_micro_batch_size == 0 or self.sft_batch_size % self.sft_micro_batch_size == 0),
             "fedse.sft-micro-batch-size", self.sft_micro_batch_size,
             f"0, or an integer >= 1 that divides fedse.sft-batch-size ({self.sft_batch_size})")
        need(self.buffer_dir.startswith("~") or Path(self.buffer_dir).is_absolute(), "fedse.buffer-dir",
             self.buffer_dir, "an absolute path or one starting with ~ (clients run in the SuperNode's working directory)")


@dataclass(frozen=True)
class PrivacySection(Section):
    """Central differential privacy and secure aggregation (privacy/; docs/deployment.md)."""

    NAME: ClassVar[str] = "privacy"
    dp_mode: str = _key("off", "central differential privacy on client updates with Flower's fixed-clipping wrappers (fedagent_flwr/privacy/differential_privacy.py): the update is clipped on the server or on the client, Gaussian noise is added to the aggregate", "off | server-side | client-side; fedagent-avg, fedse-lora and the baselines", choices=DP_MODES)
    noise_multiplier: float = _key(1.0, "DP noise: standard deviation of the noise added to each aggregated coordinate = privacy.noise-multiplier x privacy.clipping-norm / clients-per-round", ">= 0", at_least=0)
    clipping_norm: float = _key(1.0, "DP clipping: L2 norm above which a client's update (its weights minus the global weights) is scaled down", "> 0", above=0)
    secure_aggregation: bool = _key(False, "SecAgg+ with Flower's own protocol (fedagent_flwr/privacy/secure_aggregation.py): the server learns only the mean of the sampled clients' weights", "true | false; true needs strategy fedagent-avg, clients-per-round >= 2, privacy.dp-mode off, resume false, baseline none")
    secagg_shares_fraction: float = _key(1.0, "SecAgg+: shares of each client's secret key, as a fraction of the sampled clients (Flower's num_shares)", "in (0, 1]", interval="(0, 1]")
    secagg_threshold_fraction: float = _key(0.67, "SecAgg+: shares needed to reconstruct a key (so to tolerate drop-outs), as a fraction of the shares; at least 2 (Flower's reconstruction_threshold)", "in (0, 1]", interval="(0, 1]")
    secagg_clipping_range: float = _key(8.0, "SecAgg+: every weight is clipped to [-range, range] and quantized to 2**22 levels before masking", "> 0; larger than the model's largest weight", above=0)


@dataclass(frozen=True)
class ResilienceSection(Section):
    """Clients made to fail on purpose (faults.py; resume is a top-level key)."""

    NAME: ClassVar[str] = "resilience"
    fault_injection: str = _key("", "make chosen clients fail on purpose (fedagent_flwr/faults.py), e.g. raise+malformed+nan:partition=0 or timeout:prob=0.5; empty = off", "empty, or <kinds>:partition=<k> or <kinds>:prob=<q>; kinds raise, timeout, malformed, nan joined by +")

    def check(self, need: Need) -> None:
        try:
            FaultPlan.parse(self.fault_injection)
        except ValueError:
            need(False, "resilience.fault-injection", self.fault_injection, FAULT_SYNTAX)


# The sections in the order pyproject's table and docs/run-config.md list them, after the top-level keys.
SECTIONS: tuple[type[Section], ...] = (
    FederationSection, PartitionSection, RolloutSection, GRPOSection, EngineSection, LoRASection, EvalSection,
    BaselineSection, FedRLSection, FedSESection, PrivacySection, ResilienceSection,
)


def _section(cls: type[Section]) -> Any:
    return field(default_factory=cls)


@dataclass(frozen=True)
class RunConfig:
    """Every run-config key: the everyday ones as fields, the rest in their sections (`cfg.grpo.beta`); a RunConfig
    that exists is a valid one.

    `from_run_config` turns Flower's flat dict of dotted keys into this typed object. Each section checks its own keys
    as it is made; `check_top` and `check_across` hold the rules of the top-level keys and those that tie sections
    together. Any problem raises one ConfigError (a ValueError) naming each key, its value and what is allowed,
    before any work starts.
    """

    num_server_rounds: int = _key(8, "communication rounds T", "integer >= 1", at_least=1)
    strategy: str = _key("fedagent-avg", "server strategy", choices=STRATEGIES)
    env: str = _key("gridworld", "text environment, or several separated by commas (e.g. babyai,webshop,textcraft,maze,wordle)", "a registered env name, or a comma-separated list of them")
    model: str = _key("tiny", "HF model name or local path, or tiny / tiny:<env> (tiny = built for the run's env list), or shape:<name> (a published shape with random weights, for memory and transfer checks: docs/gpu.md), or a .gguf file, or smollm2-135m-instruct (a real instruct model shipped in a package: docs/agent.md), or warm:<one of those> (that model behaviour-cloned on the run's env once, cached: docs/agent.md)", "string")
    seed: int = _key(0, "seed of client sampling, task sampling, rollouts and partitions", "integer >= 0")
    num_clients: int = _key(0, "clients K (partitions); 0 = one per SuperNode", "0, or the number of SuperNodes", at_least=0)
    clients_per_round: int = _key(2, "clients M sampled per round, without replacement", "1 .. K", at_least=1)
    device: str = _key("auto", "where clients run the model (and the server, unless engine.server-device says otherwise)", " | ".join(DEVICES) + " | cuda:N")
    precision: str = _key("auto", "training and generation precision: fp32, or bf16-mixed = fp32 weights and optimizer states with forward passes under bf16 autocast (pure bf16 weights do not move at lr 1e-6), or bf16-base = where only a LoRA adapter trains (fedse-lora, or fedagent-avg with grpo.finetuning=lora), the frozen base held in bf16 (half its memory, no casts of it per forward) under an fp32 adapter and fp32 AdamW; auto = bf16-mixed on CUDA; with device=cpu, bf16-base where a LoRA adapter alone trains and a start-up probe of the model's matmul shows bf16 at least 1.25x faster than fp32 on this processor; else fp32 (the start-up line gives both rates)", choices=ALL_PRECISIONS)
    output_dir: str = _key("~/fedagent-flwr/runs", "where run folders are written; must be absolute or start with ~", "path")
    run_name: str = _key("", "run folder name; empty = <env>-<strategy>-<timestamp>; an existing run's name needs resume=true (nothing is overwritten)", "letters, digits and . _ + -")
    resume: bool = _key(False, "continue the run named run-name from its last complete round (state in <run folder>/state/, written after every round)", "true | false; true needs run-name, and not with a baseline whose AdamW state carries over (baseline.optimizer='keep')")
    tracker: str = _key("none", "where the run is also logged: tensorboard = <run folder>/tensorboard/ (every metric row as scalars, the run config and the held-out episode texts as text; `tensorboard --logdir <output-dir>`); wandb = the same to a Weights & Biases run named after the run folder, files in <run folder>/wandb/ unless WANDB_DIR (extra `pip install -e \".[wandb]\"`; WANDB_MODE=offline needs no account); mlflow = the same to an MLflow run named after the run folder, in sqlite:///<run folder>/mlflow.db unless MLFLOW_TRACKING_URI (extra `pip install -e \".[mlflow]\"`; needs no server)", choices=TRACKERS)

    federation: FederationSection = _section(FederationSection)
    partition: PartitionSection = _section(PartitionSection)
    rollout: RolloutSection = _section(RolloutSection)
    grpo: GRPOSection = _section(GRPOSection)
    engine: EngineSection = _section(EngineSection)
    lora: LoRASection = _section(LoRASection)
    eval: EvalSection = _section(EvalSection)
    baseline: BaselineSection = _section(BaselineSection)
    fedrl: FedRLSection = _section(FedRLSection)
    fedse: FedSESection = _section(FedSESection)
    privacy: PrivacySection = _section(PrivacySection)
    resilience: ResilienceSection = _section(ResilienceSection)

    def __post_init__(self) -> None:
        problems: list[str] = []
        need = _collector(problems)
        if _declared_keys(self, "", need):
            self.check_top(need)
            self.check_across(need)
        if problems:
            raise ConfigError(problems)

    # ----- the keys, by their dotted names --------------------------------------------------------------

    @staticmethod
    def keys() -> Iterator[tuple[str, Field, type[Section] | None]]:
        """Every run-config key in order: (its dotted name, its dataclass field, its section or None at the top)."""
        for f in fields(RunConfig):
            if "doc" in f.metadata:
                yield f.name.replace("_", "-"), f, None
        for section in SECTIONS:
            for f in fields(section):
                yield f"{section.NAME}.{f.name.replace('_', '-')}", f, section

    @classmethod
    def from_run_config(cls, run_config: dict[str, Any]) -> RunConfig:
        """Build from Flower's flat dict of dotted keys: renamed, unknown keys and wrong types are errors."""
        known = {key: (f, section) for key, f, section in cls.keys()}
        if renamed := sorted(key for key in run_config if key in RENAMED):
            key = renamed[0]
            raise ConfigError([f"{key} is a key's old name: write {RENAMED[key]} (docs/renamed-keys.md lists every "
                               f"renamed key)" + (f"; also {', '.join(renamed[1:])}" if len(renamed) > 1 else "")])
        if unknown := sorted(set(run_config) - set(known)):
            raise ValueError(f"unknown run-config key(s) {unknown}; known keys: {', '.join(known)}")
        top: dict[str, Any] = {}
        grouped: dict[type[Section], dict[str, Any]] = {}
        for key, raw in run_config.items():
            f, section = known[key]
            value = _coerce(key, raw, type(f.default), f.metadata["words"], f.metadata["per_env"])
            (grouped.setdefault(section, {}) if section else top)[f.name] = value
        problems: list[str] = []
        for section, values in grouped.items():
            try:
                top[section.NAME] = section(**values)
            except ConfigError as err:
                problems += err.problems
        if problems:  # the top-level keys are checked too; the rules across sections wait for sections that hold
            raise ConfigError(cls._top_problems(top) + problems)
        return cls(**top)

    @classmethod
    def _top_problems(cls, top: dict[str, Any]) -> list[str]:
        """The problems of the top-level keys alone (their declarations and check_top), with no section built."""
        probe = object.__new__(cls)  # not __init__: its __post_init__ would check across sections too
        for f in fields(cls):
            if "doc" in f.metadata:
                object.__setattr__(probe, f.name, top.get(f.name, f.default))
        problems: list[str] = []
        need = _collector(problems)
        if _declared_keys(probe, "", need):
            probe.check_top(need)
        return problems

    def to_run_config(self) -> dict[str, Any]:
        """Flower's flat dict of dotted keys, every key with its value."""
        return {key: getattr(getattr(self, section.NAME) if section else self, f.name) for key, f, section in self.keys()}

    def updated(self, overrides: dict[str, Any]) -> RunConfig:
        """This config with some keys set anew (dotted names, as from_run_config takes them), checked again."""
        return RunConfig.from_run_config({**self.to_run_config(), **overrides})

    # ----- what the keys mean together ------------------------------------------------------------------

    def epoch_episodes(self) -> int:
        """The most episodes a client plays at once: an epoch's GRPO groups (rollout.generation-batch-size=auto's cap)."""
        return self.grpo.epoch_episodes()

    def device_key(self, role: str = "client") -> str:
        """The device key `role` (client or server) runs on, auto unresolved: engine.server-device, or device where it is same."""
        return self.device if role == "client" or self.engine.server_device == "same" else self.engine.server_device

    def adapter_only(self) -> bool:
        """A LoRA adapter is all that trains (what precision='bf16-base' needs): Fed-SE (the strategy with an
        experience buffer) trains only its adapter whatever grpo.finetuning says, FedAgentAvg with grpo.finetuning='lora'."""
        traits = STRATEGIES.get(self.strategy)
        return bool(traits and traits.experience_buffer) or (self.grpo.finetuning == "lora" and self.strategy == "fedagent-avg")

    @property
    def traits(self) -> Traits:
        return STRATEGIES[self.strategy]

    @property
    def output_path(self) -> Path:
        return Path(self.output_dir).expanduser().resolve()

    def check_top(self, need: Need) -> None:
        """The rules among the top-level keys."""
        need(self.seed >= 0, "seed", self.seed, "an integer >= 0 (NumPy seeds take no negative numbers)")
        if self.num_clients > 0:  # a negative one is refused by its bound, not against clients-per-round
            need(self.clients_per_round <= self.num_clients, "clients-per-round", self.clients_per_round, f"<= num-clients ({self.num_clients})")
        need((problem := env_spec_problem(self.env)) is None, "env", self.env, problem)
        need(self.model.strip() != "", "model", self.model, "a model name (docs/agent.md lists the kinds)")
        need(self.device in DEVICES or self.device.startswith("cuda:"), "device", self.device, " | ".join(DEVICES) + " | cuda:N")
        need(self.run_name == "" or RUN_NAME.fullmatch(self.run_name) is not None, "run-name", self.run_name,
             "empty (a name is made up) or a folder name of letters, digits and . _ + - not starting with . or -")
        need(
            self.output_dir.startswith("~") or Path(self.output_dir).is_absolute(),
            "output-dir",
            self.output_dir,
            "an absolute path or one starting with ~ (the ServerApp runs in the SuperLink's working "
            "directory, so a relative path would land somewhere unexpected; run_simulation.py resolves "
            "relative paths for you)",
        )
        need(not self.resume or self.run_name != "", "resume", self.resume,
             "false, or true together with run-name set to the run folder to continue")

    def check_across(self, need: Need) -> None:
        """The rules that tie sections together, a method a concern; none asks the machine it runs on (what `auto`
        resolves to is checked where the run runs: methods/placement.py)."""
        traits = STRATEGIES.get(self.strategy)  # None: a bad strategy, reported by its key; its rules wait
        self._check_model_across(need, traits)
        self._check_grpo_keys(need, traits)
        self._check_ranks(need, traits)
        self._check_envs_across(need, traits)
        self._check_resilience_across(need, traits)

    def _check_model_across(self, need: Need, traits: Traits | None) -> None:
        if self.precision == "bf16-base":  # a bf16 base cannot take AdamW's steps: only a LoRA adapter over it trains
            need(self.adapter_only(), "precision", self.precision,
                 "fp32 | bf16-mixed | auto unless a LoRA adapter is all that trains: strategy='fedse-lora', or "
                 "'fedagent-avg' with grpo.finetuning='lora'")
        if self.eval.initial_evaluation and traits:  # only a language-model method's server evaluates held-out episodes
            llm_strategies = " | ".join(n for n, t in STRATEGIES.items() if t.trains == "llm")
            need(traits.trains == "llm", "eval.initial-evaluation", self.eval.initial_evaluation,
                 "empty unless the strategy trains a language-model agent (" + llm_strategies + ")")
        if self.federation.transfer_dtype != "fp32":
            # DP clips and SecAgg+ masks the weights as they travel; QAvg / PAvg tables are small and exact
            need(bool(traits) and traits.trains == "llm" and self.privacy.dp_mode == "off" and not self.privacy.secure_aggregation,
                 "federation.transfer-dtype", self.federation.transfer_dtype, "fp32 unless the strategy trains a language "
                 "model and privacy.dp-mode='off' and privacy.secure-aggregation=false")

    def _check_grpo_keys(self, need: Need, traits: Traits | None) -> None:  # Fed-SE has no advantages, its own passes
        grpo, engine = self.grpo, self.engine
        for key, value, off in (("grpo.ppo-max-token-len-per-gpu", grpo.ppo_max_token_len_per_gpu, 0),
                                ("grpo.log-prob-max-token-len-per-gpu", grpo.log_prob_max_token_len_per_gpu, 0),
                                ("grpo.adv-estimator", grpo.adv_estimator, "grpo"), ("grpo.batch-padding", grpo.batch_padding, "none"),
                                ("grpo.balance-micro-batches", grpo.balance_micro_batches, False),
                                ("grpo.clip-ratio-c", grpo.clip_ratio_c, 0.0), ("grpo.kl-clamp", grpo.kl_clamp, 0.0),
                                ("grpo.entropy-coeff", grpo.entropy_coeff, 0.0), ("grpo.reward-std-ddof", grpo.reward_std_ddof, 0),
                                ("engine.training-kernels", engine.training_kernels, "eager")):
            if value != off and traits:
                need(traits.grpo, key, value, f"{off!r} unless the strategy trains with GRPO ({named('grpo')})")
        if engine.param_dtype == "bf16" and traits:  # a working copy of every weight under bf16 compute
            # precision auto resolves where the run runs: methods/placement.py checks it there
            need(traits.grpo and grpo.finetuning == "full" and self.precision in ("bf16-mixed", "auto"), "engine.param-dtype",
                 engine.param_dtype, f"fp32 unless a GRPO strategy trains every weight (grpo.finetuning='full') under precision "
                 f"'bf16-mixed' (here strategy={self.strategy!r}, grpo.finetuning={grpo.finetuning!r}, precision resolves to "
                 f"{self.precision!r})")
        if engine.training_kernels == "liger":  # CUDA only (device auto: methods/placement.py checks it where it runs)
            need(self.device != "cpu", "engine.training-kernels", engine.training_kernels,
                 f"eager | compile with device={self.device!r} (Liger's kernels run on CUDA only)")
        if grpo.finetuning != "full" and traits:
            need(traits.grpo, "grpo.finetuning", grpo.finetuning,
                 f"full unless the strategy trains with GRPO ({named('grpo')}); fedse-lora always trains a LoRA adapter")
            need(not self.privacy.secure_aggregation, "grpo.finetuning", grpo.finetuning, "full with privacy.secure-aggregation=true")
        if self.baseline.name != "none" and traits:
            need(traits.baselines, "baseline.name", self.baseline.name,
                 f"none with strategy={self.strategy!r} (the Table 1 baselines train GRPO agents: strategy "
                 f"{named('baselines')}; Fed-SE's Local / Centralized / FedAvg baselines: python -m "
                 "fedagent_flwr.experiments.fedse_protocol)")
        need(self.federation.client_sampling == "run-seed" or self.strategy == "fedagent-avg", "federation.client-sampling",
             self.federation.client_sampling, "run-seed unless strategy='fedagent-avg' (the reference's draw is FedAgent's)")

    def _check_ranks(self, need: Need, traits: Traits | None) -> None:
        """What was run on N ranks (tests/methods/test_ranked_round.py)."""
        engine = self.engine
        if engine.ranks_per_client == 1 or traits is None:
            return
        need(traits.grpo, "engine.ranks-per-client", engine.ranks_per_client, f"1 unless the strategy trains with GRPO "
             f"({named('grpo')}): Fed-SE's SFT runs in the client's own process (TRL's trainer would need accelerate's "
             "launcher)")
        need(engine.param_dtype != "bf16", "engine.param-dtype", engine.param_dtype,
             "fp32 with engine.ranks-per-client > 1 (a bf16 working copy is not yet run under FSDP2; auto takes it for "
             "full fine-tuning on CUDA)")
        need(engine.training_kernels == "eager", "engine.training-kernels", engine.training_kernels,
             "eager with engine.ranks-per-client > 1 (the others are not yet run under FSDP2)")
        need(engine.attn_implementation == "sdpa", "engine.attn-implementation", engine.attn_implementation,
             "sdpa with engine.ranks-per-client > 1 (eager is not yet run under FSDP2)")
        need(not self.device.startswith("cuda:"), "device", self.device,
             "cpu | cuda | auto with engine.ranks-per-client > 1 (rank r computes on the client's r-th visible GPU)")

    def _check_envs_across(self, need: Need, traits: Traits | None) -> None:
        """The rules between the env spec and the other keys that need no registry (which envs exist, and which a
        QAvg / PAvg strategy runs on, are preflight checks: runs/preflight.py)."""
        need(self.federation.min_replies <= self.clients_per_round or self.clients_per_round < 1, "federation.min-replies",
             self.federation.min_replies, f"<= clients-per-round ({self.clients_per_round})")
        if traits and traits.trains == "fedrl" and self.fedrl.local_updates == 0:
            need(self.fedrl.clients == "all", "fedrl.clients", self.fedrl.clients, "all when fedrl.local-updates=0 (E = inf: every client trains on its own)")
        if self.partition.scheme == "by-environment" and self.num_clients and env_spec_problem(self.env) is None:
            count = len(spec_names(self.env))
            need(self.num_clients == count, "num-clients", self.num_clients,
                 f"{count} (one client per environment of env={self.env!r}) or 0 with partition.scheme='by-environment'")
        if self.num_clients and self.baseline.name == "local":
            need(self.baseline.local_client < self.num_clients, "baseline.local-client", self.baseline.local_client, f"< num-clients ({self.num_clients})")
        for key, value in (("rollout.max-steps", self.rollout.max_steps), ("eval.tasks", self.eval.tasks),
                           ("fedse.seed-demos", self.fedse.seed_demos)):
            need((problem := per_env_syntax_problem(value, self.env)) is None, key, value, problem)
        if traits and traits.experience_buffer:
            need(self.fedse.explore_samples > 0 or self.fedse.seed_demos != 0, "fedse.seed-demos", self.fedse.seed_demos,
                 "> 0 when fedse.explore-samples=0 (otherwise no client has anything to train on)")

    def _check_resilience_across(self, need: Need, traits: Traits | None) -> None:
        privacy = self.privacy
        if self.resume and traits:
            # qavg/pavg runs save no state. Fed-SE clients' buffers are keyed by the strategy's run
            # key, which the saved state restores, and a replayed round replaces its entries.
            need(traits.resume, "resume", self.resume,
                 f"false with strategy={self.strategy!r} (resume covers {named('resume')} and the baselines)")
        # A baseline's carried AdamW moments live in the client's node state, which a resumed run (a new Flower run)
        # does not have: it would go on with fresh moments, another procedure than the run it continues.
        need(not (self.resume and self.baseline.name != "none" and self.baseline.optimizer == "keep"), "resume", self.resume,
             f"false with baseline.name={self.baseline.name!r} and baseline.optimizer='keep' (the learner's AdamW state stays on "
             "its client and is not in the saved state; baseline.optimizer='reset' runs resume)")
        if privacy.dp_mode != "off" and traits:
            need(traits.dp, "privacy.dp-mode", privacy.dp_mode,
                 f"off with strategy={self.strategy!r} (DP wraps the LLM strategies: {named('dp')}, baselines)")
        if privacy.secure_aggregation:
            for ok, key, value, allowed in (
                (traits is not None and traits.secure_aggregation, "strategy", self.strategy,
                 f"{named('secure_aggregation')} with privacy.secure-aggregation=true"),
                (self.clients_per_round >= 2, "clients-per-round", self.clients_per_round, ">= 2 with privacy.secure-aggregation=true (a mean of one client is that client)"),
                (privacy.dp_mode == "off", "privacy.dp-mode", privacy.dp_mode, "off with privacy.secure-aggregation=true (not combined here)"),
                (not self.resume, "resume", self.resume, "false with privacy.secure-aggregation=true"),
                (self.baseline.name == "none", "baseline.name", self.baseline.name, "none with privacy.secure-aggregation=true"),
            ):
                need(ok, key, value, allowed)
        plan = FaultPlan.parse(self.resilience.fault_injection)  # its section made sure it parses; None: no faults
        if plan is not None and plan.partition is not None and self.num_clients:
            need(plan.partition < self.num_clients, "resilience.fault-injection", self.resilience.fault_injection,
                 f"a partition-id below num-clients ({self.num_clients})")
        if plan is not None and "timeout" in plan.kinds:
            need(self.federation.round_timeout <= 600, "federation.round-timeout", self.federation.round_timeout,
                 "<= 600 s with a timeout fault (the failing client sleeps federation.round-timeout + 30 s)")

    def check_federation(self, num_nodes: int) -> int:
        """Number of clients K given the SuperNodes that answered; raises if the config does not fit."""
        k = self.num_clients or num_nodes
        if k != num_nodes:
            raise ValueError(f"num-clients={self.num_clients} but the federation has {num_nodes} SuperNode(s); each client is one SuperNode "
                             f"holding one partition. Set num-clients={num_nodes} (or 0), or start {self.num_clients} SuperNodes "
                             f"(simulation: --federation-config \"num-supernodes={self.num_clients}\").")
        if self.clients_per_round > k:
            raise ValueError(f"clients-per-round={self.clients_per_round} is larger than the number of clients K={k}")
        if self.baseline.name == "local" and self.baseline.local_client >= k:
            raise ValueError(f"baseline.local-client={self.baseline.local_client} is not a partition-id of the K={k} clients (allowed: 0 .. {k - 1})")
        if self.partition.scheme == "by-environment":
            names = spec_names(self.env)
            if k != len(names):
                raise ValueError(f"partition.scheme='by-environment' gives client k the k-th environment of env={self.env!r}, so it needs "
                                 f"{len(names)} clients, but the federation has K={k}; start {len(names)} SuperNodes "
                                 f"(simulation: --federation-config \"num-supernodes={len(names)}\").")
        return k


def _coerce(key: str, raw: Any, kind: type, words: tuple[str, ...] = (), per_env: bool = False) -> Any:
    """Accept the types Flower's TOML parsing produces; ints are fine where floats are expected."""
    if isinstance(raw, str) and (raw in words or per_env):
        return raw
    if kind is bool:
        if isinstance(raw, bool):
            return raw
    elif kind is int:
        if isinstance(raw, int) and not isinstance(raw, bool):
            return raw
        if isinstance(raw, float) and raw.is_integer():
            return int(raw)
    elif kind is float:
        if isinstance(raw, (int, float)) and not isinstance(raw, bool):
            return float(raw)
    elif kind is str:
        if isinstance(raw, str):
            return raw
    expected = kind.__name__ + "".join(f" or {w!r}" for w in words) + (" or a string name=number,..." if per_env else "")
    raise ValueError(f"run-config {key}={raw!r} has type {type(raw).__name__}; expected {expected}")
