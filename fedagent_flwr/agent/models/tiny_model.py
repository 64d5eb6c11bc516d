"""Tiny offline models (`model = "tiny:<env>"`): built here, no model hub needed.

Recipe: a byte-level BPE tokenizer trained on the environment's own prompts and
expert answers, a small Qwen2-architecture causal LM, and a behaviour-cloning
warm start on the scripted expert's episodes over the training split. The result
is an ordinary Hugging Face folder (save_pretrained) cached under
`<cache>/tiny-<env>-<recipe hash>/`, built once under a file lock so concurrent
clients never build it twice, and published by an atomic rename.

A build says what it is doing on the module's logger (INFO, shown on stderr as "[fedagent] ..." lines, which
reach a Flower run's log): each of its four phases as it starts, and during training the step, the time spent
and the time left. `python -m fedagent_flwr.experiments.build_tiny --env <env>` builds one ahead of a run.
"""

from __future__ import annotations

import hashlib
import json
import logging
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    PreTrainedTokenizerFast,
    TrainerCallback,
)

from envs import env_class, env_names, is_multi_spec, make_env
from envs.multi import normalize_spec, per_env_sample
from fedagent_flwr.agent.models.model_cache import build_once, default_cache_root
from fedagent_flwr.agent.play.progress import clock
from fedagent_flwr.agent.play.prompts import expert_completion
from fedagent_flwr.agent.play.rollout import (
    ExpertPolicy,
    PromptEncoder,
    RolloutConfig,
    run_episodes,
)
from fedagent_flwr.agent.training.sft import SupervisedConfig, supervised_finetune


class _StderrHandler(logging.StreamHandler):
    """Writes to sys.stderr as it is when a line is logged, not as it was at import: Flower's ServerApp and
    pytest's capture replace it after this module is imported."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, _value) -> None:
        pass


# Without a handler of its own, INFO from this logger would be dropped (the root logger is at WARNING and has
# no handler in a Flower process); records still propagate, so a logging setup of the user's sees them too.
log = logging.getLogger(__name__)
if not log.handlers:
    _handler = _StderrHandler()
    _handler.setFormatter(logging.Formatter("[fedagent] %(message)s"))
    log.addHandler(_handler)
if log.level == logging.NOTSET:
    log.setLevel(logging.INFO)

SPECIAL_TOKENS = ["<|pad|>", "<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# ChatML; {% generation %} marks assistant tokens so TRL's assistant-only losses work too.
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['role'] == 'assistant' %}{% generation %}{{ message['content'] }}<|im_end|>{% endgeneration %}"
    "{% else %}{{ message['content'] }}<|im_end|>{% endif %}\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
RECIPE_VERSION = 3  # 2: history-length-0 prompts carry no step counter; 3: behaviour cloning on TRL's SFTTrainer
# Overrides of TinyRecipe's defaults for a multi-env spec (measured: see docs/multi-environment.md). 96 tasks per
# environment and 1,200 BC steps (was 48 and 400): the shorter clone won under a fifth of BabyAI and Maze episodes
# and so left Fed-SE's comparisons nothing to decide on (docs/fedse.md).
MULTI_ENV_PRESET: dict = dict(vocab_size=1024, bc_tasks_per_env=96, bc_steps=1200, bc_group_by_length=True)

# Long pages (WebShop results, ALFWorld's admissible lists): length-grouped BC batches pad
# little; WebShop's 2,000 training goals are sampled and its vocabulary is larger (shorter
# token sequences). Its 2,000 steps of 3 layers on pages of hundreds of tokens still take
# about an hour on 2 cores (docs/environments.md, "Building a tiny model").
SINGLE_ENV_PRESETS: dict[str, dict] = {
    # Maze: cloned from the plain expert, the model either under-fits (300 steps: near-uniform
    # moves on the maze's right half, and GRPO's gains on the left half spill over there) or
    # solves every start (450 steps), leaving RL nothing to do on held-out starts. An expert
    # taking a random move half the time (4 episodes per start) teaches the answer format and
    # a policy that is right more often than not everywhere: held-out success about 0.34 at
    # temperature 1; the Maze job's gain from there stays within noise (docs/results.md).
    "maze": dict(bc_expert_epsilon=0.5, bc_episodes_per_task=4, bc_steps=450),
    # Gridworld (the default env): the same noisy expert, one episode per room (512 training rooms): held-out
    # success about 0.3 at temperature 1, an eighth of the steps invalid, which the default job raises by
    # 0.13-0.19 in 8 rounds on rooms no client has seen (docs/results.md).
    "gridworld": dict(bc_expert_epsilon=0.5, bc_steps=450),
    # WebShop: the agent must copy 10-character product ids from the page. With 2 layers, 400
    # goals and 300 steps the clone never did (0/20 held-out goals); 3 layers, 1,200 goals, 2,000
    # steps and a think that names long actions by their verb only (no second copy of the query)
    # play with rollout.action-matching=closest (docs/webshop-alfworld.md), but still misspell most ids.
    "webshop": dict(vocab_size=1024, bc_tasks_per_env=1200, bc_group_by_length=True, num_layers=3, bc_steps=2000,
                    bc_learning_rate=7e-4, bc_think_limit=40),
    "alfworld": dict(bc_group_by_length=True),
}


@dataclass(frozen=True)
class TinyRecipe:
    """Everything that determines a tiny model; its hash names the cache folder."""

    env: str
    vocab_size: int = 640
    hidden_size: int = 128
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 512
    max_positions: int = 2048
    bc_episodes_per_task: int = 1  # the expert is deterministic: repeats would add nothing
    # Measured on Maze: lr 1e-3 learns the majority move and never discriminates left
    # from right; lr 3e-4 for 300 steps does (greedy 9/9 held-out tasks) while sampling
    # at temperature 1 still errs (about a third of the steps invalid), so RL has work left.
    bc_steps: int = 300
    bc_batch_size: int = 32
    bc_learning_rate: float = 3e-4
    history_length: int = 0  # demonstrations use the default run's prompts (rollout.history-length 0)
    seed: int = 0
    version: int = RECIPE_VERSION
    # Multi-env specs: a seeded sample of at most this many training tasks per environment
    # feeds the tokenizer and the demonstrations (None = every training task).
    bc_tasks_per_env: int | None = None
    bc_group_by_length: bool | None = None  # length-grouped BC batches (see SFTConfig); None = off
    # Demonstrations from an epsilon-noisy expert (see ExpertPolicy); None = the plain expert.
    bc_expert_epsilon: float | None = None
    # Demonstrations name actions longer than this many characters by their verb only in the
    # think (see expert_completion); None = the whole action.
    bc_think_limit: int | None = None
    # The environments' prompt revisions ("textcraft:1"), where any is above 0: a model cloned on an
    # environment's old prompt text gets another cache folder. None = every environment at revision 0.
    prompt_revisions: str | None = None

    def digest(self) -> str:
        # Optional fields left at None are omitted, so adding one keeps existing cache keys.
        fields_ = {k: v for k, v in asdict(self).items() if v is not None}
        return hashlib.sha256(json.dumps(fields_, sort_keys=True).encode()).hexdigest()[:12]


def prompt_revisions(env: str) -> str | None:
    """The recipe's `prompt_revisions` for an env name or spec: None while every environment is at revision 0,
    so that models of unchanged environments keep their cache folders."""
    revised = [f"{name}:{env_class(name).prompt_revision}" for name in env_names(env) if env_class(name).prompt_revision]
    return ",".join(revised) or None


def default_recipe(env: str) -> TinyRecipe:
    """The recipe `model = "tiny"` uses for an env name or a multi-env spec."""
    if not is_multi_spec(env):
        return TinyRecipe(env=env, prompt_revisions=prompt_revisions(env), **SINGLE_ENV_PRESETS.get(env, {}))
    return TinyRecipe(env=normalize_spec(env), prompt_revisions=prompt_revisions(env), **MULTI_ENV_PRESET)


def tiny_model_dir(recipe: TinyRecipe, cache_root: Path | None = None) -> Path:
    return (cache_root or default_cache_root()) / f"tiny-{recipe.env.replace(',', '+')}-{recipe.digest()}"


def ensure_tiny_model(env_name: str, cache_root: Path | None = None, recipe: TinyRecipe | None = None,
                      force: bool = False) -> Path:
    """Path of the cached tiny model for `env_name`, building it first if needed (`force`: build it again; the
    cached folder is replaced only once the new one is complete)."""
    recipe = recipe or default_recipe(env_name)
    return build_once(tiny_model_dir(recipe, cache_root), lambda folder: build_tiny_model(recipe, folder),
                      what=f"the tiny model for {recipe.env}", force=force)


class BuildPhases:
    """Logs each phase of a build as it starts, with how long the one before took, and keeps the durations."""

    def __init__(self, name: str, names: tuple[str, ...]) -> None:
        self.name, self.names = name, names
        self.seconds: dict[str, float] = {}
        self._current: str | None = None
        self._since = time.perf_counter()

    def start(self, phase: str, doing: str) -> None:
        took = self._close()
        log.info("%s %d/%d %s: %s%s", self.name, self.names.index(phase) + 1, len(self.names), phase, doing,
                 f" ({took})" if took else "")
        self._current = phase

    def finish(self) -> None:
        self._close()
        log.info("%s phases took: %s", self.name, ", ".join(f"{k} {clock(v)}" for k, v in self.seconds.items()))

    def _close(self) -> str:
        now, phase = time.perf_counter(), self._current
        if phase is None:
            return ""
        self.seconds[phase] = round(now - self._since, 1)
        self._since, self._current = now, None
        return f"{phase} took {clock(self.seconds[phase])}"


class TrainingProgress(TrainerCallback):
    """"step i/N, elapsed, time left" lines at every tenth of the steps and at least every `every_seconds`.
    Plain lines, not Trainer's tqdm bar (off in sft.trainer_arguments): carriage returns garble a Flower log
    stream. The time left assumes the remaining steps cost what the finished ones did on average."""

    def __init__(self, name: str, every_seconds: float = 60.0) -> None:
        self.name, self.every_seconds = name, every_seconds
        self.started = self.last_said = 0.0
        self.last_tenth = 0

    def on_train_begin(self, args, state, control, **kwargs):
        self.started = self.last_said = time.perf_counter()
        self.last_tenth = 0

    def on_step_end(self, args, state, control, **kwargs):
        step, total, now = state.global_step, max(state.max_steps, 1), time.perf_counter()
        tenth = step * 10 // total
        if tenth == self.last_tenth and now - self.last_said < self.every_seconds:
            return
        self.last_tenth, self.last_said = tenth, now
        elapsed = now - self.started
        left = elapsed / step * (total - step) if step else 0.0
        log.info("%s training: step %d/%d (%d%%), %s elapsed, %s left", self.name, step, total, 100 * step // total,
                 clock(elapsed), clock(left))


def train_tokenizer(texts: list[str], vocab_size: int) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<|pad|>",
        eos_token="<|im_end|>",
        bos_token=None,
        unk_token=None,
        additional_special_tokens=["<|endoftext|>", "<|im_start|>"],
        chat_template=CHAT_TEMPLATE,
        padding_side="left",
    )


class _TextOnlyEncoder:
    """Stands in for the tokenizer before it exists: collects the ChatML-wrapped prompt text."""

    def __init__(self) -> None:
        self.texts: list[str] = []

    def __call__(self, prompt: str, system: str | None = None) -> list[int]:
        if system:
            self.texts.append(f"<|im_start|>system\n{system}<|im_end|>\n")
        self.texts.append(f"<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n")
        return []

    def encode_many(self, prompts: list[str], systems: list[str] | None = None) -> list[list[int]]:
        return [self(p, s) for p, s in zip(prompts, systems or [None] * len(prompts))]


class _TextExpert:
    """The expert before the tokenizer exists: text only, collected for tokenizer training."""

    def __init__(self, think_limit: int | None = None) -> None:
        self.completions: list[str] = []
        self.think_limit = think_limit

    def act(self, episodes):
        out = []
        for e in episodes:
            text = expert_completion(e.env.expert_action(), self.think_limit)
            self.completions.append(text)
            out.append(([], text))
        return out


def build_tiny_model(recipe: TinyRecipe, out_dir: Path) -> None:
    """Tokenizer, model and behaviour-cloning warm start, saved into `out_dir`."""
    started, cpu_started = time.time(), time.process_time()
    name = f"tiny:{recipe.env}"
    phases = BuildPhases(name, ("expert text", "tokenizer", "demonstrations", "training"))
    torch.manual_seed(recipe.seed)
    env = make_env(recipe.env)
    train_tasks = per_env_sample(env.tasks_of_split("train"), recipe.bc_tasks_per_env or 0, recipe.seed)
    bc_tasks = [t for t in train_tasks for _ in range(recipe.bc_episodes_per_task)]
    rollout_cfg = RolloutConfig(history_length=recipe.history_length)

    # 1) Tokenizer on the text the agent will read and write.
    phases.start("expert text", f"the expert plays {len(train_tasks)} training tasks for the tokenizer's text")
    collector, expert_text = _TextOnlyEncoder(), _TextExpert(recipe.bc_think_limit)
    run_episodes(expert_text, lambda: make_env(recipe.env), train_tasks, collector, rollout_cfg)
    corpus = collector.texts + expert_text.completions + ["Invalid action."]
    phases.start("tokenizer", f"a {recipe.vocab_size}-token BPE tokenizer on {len(corpus)} texts")
    tokenizer = train_tokenizer(corpus, recipe.vocab_size)

    # 2) Expert demonstrations, tokenized exactly as rollouts will be.
    noise = f", a random action with probability {recipe.bc_expert_epsilon}" if recipe.bc_expert_epsilon else ""
    phases.start("demonstrations", f"{len(bc_tasks)} expert episodes{noise}")
    encoder = PromptEncoder(tokenizer)
    expert = ExpertPolicy(tokenizer, epsilon=recipe.bc_expert_epsilon or 0.0, seed=recipe.seed, think_limit=recipe.bc_think_limit)
    demos = run_episodes(expert, lambda: make_env(recipe.env), bc_tasks, encoder, rollout_cfg)
    samples = [(s.prompt_ids, s.completion_ids) for traj in demos for s in traj.steps]

    # 3) A small Qwen2 model, behaviour-cloned on the demonstrations.
    config = AutoConfig.for_model(
        "qwen2",
        vocab_size=len(tokenizer),
        hidden_size=recipe.hidden_size,
        intermediate_size=recipe.intermediate_size,
        num_hidden_layers=recipe.num_layers,
        num_attention_heads=recipe.num_heads,
        num_key_value_heads=recipe.num_kv_heads,
        max_position_embeddings=recipe.max_positions,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
    )
    model = AutoModelForCausalLM.from_config(config)
    phases.start("training", f"behaviour cloning, {recipe.bc_steps} steps, batches of {recipe.bc_batch_size} from "
                 f"{len(samples):,} demonstrated agent steps, {sum(p.numel() for p in model.parameters()):,} parameters")
    losses = supervised_finetune(
        model,
        samples,
        tokenizer,
        SupervisedConfig(steps=recipe.bc_steps, batch_size=recipe.bc_batch_size, learning_rate=recipe.bc_learning_rate, seed=recipe.seed,
                  group_by_length=bool(recipe.bc_group_by_length)),
        callbacks=[TrainingProgress(name)],
    )
    phases.finish()
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    meta = {
        "recipe": asdict(recipe),
        "parameters": sum(p.numel() for p in model.parameters()),
        "bc_samples": len(samples),
        "bc_loss_first": losses[0],
        "bc_loss_last": losses[-1],
        "build_seconds": round(time.time() - started, 1),
        "build_cpu_seconds": round(time.process_time() - cpu_started, 1),  # wall time varies with machine load
        "phase_seconds": phases.seconds,  # wall time of each phase: where a slow build spends it
    }
    (out_dir / "recipe.json").write_text(json.dumps(meta, indent=2))
