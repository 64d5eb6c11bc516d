#!/usr/bin/env python
"""One FedAgentAvg client round on a Qwen2.5-shaped model, timed phase by phase, with the memory plan beside
the measured peak.

The model is built offline from the published shape (random init, no hub; agent/engine/memory.py SHAPES) on the
device it runs on. The round follows the client's own code path (GRPOTrainer, the run config's builders) at the
FedAgent paper's WebShop settings unless `--set` says otherwise: 64 tasks x G = 8 episodes, history 2,
15 steps, 128 new tokens per step, rollout batch 128, minibatch 64, micro-batch 8, lr 1e-6, KL 0.01.

What is forced, and why: a random-init model never emits its end-of-turn token and never writes a valid
action, so every completion runs to `rollout.max-completion-length` (the WebShop answer budget: a plausible length, and the
worst case) and every episode to `rollout.max-steps`. All its rewards tie, so GRPO would drop every group; the
benchmark gives each step sample a random advantage instead, so the update runs on every step (what a round
with informative groups costs). The model and its small BPE tokenizer are built as `model="shape:<name>"` builds
them (agent/models/shaped_model.py); ids the model samples outside the tokenizer decode to nothing.

Phases: rollout (batched generation + environment steps), log-probs (the no-grad passes: old-policy
log-probs when there is more than one minibatch, and the KL reference's), update (forward/backward/AdamW, less
the log-prob passes inside it), transfer (the weights the client sends: to host arrays, encoded in the
transfer dtype, decoded and loaded back as a receiver would; the network is not in it - the deployment test
measures a real one).

Decode: the sampler's seconds over its token steps (one token step = one new token for every live row; prefill
included) beside the bandwidth bound of a step at that batch and context: the bytes it must read (the weights
in the forward's dtype, every row's KV cache) over `--bandwidth` (default an H100's 3.35e12 B/s).
`--decode-engine` picks the sampler's engine (agent/engine/sampling.py: auto, hf, static). `--paper-round` adds the
estimated wall time of a FedAgent paper round on ALFWorld and on WebShop, scaled from the measured phases
(paper_round), each with a table of the settings it used where configs/fedagent-paper.toml says otherwise.

Model FLOP utilisation counts the FLOPs the passes compute for the samples (model_flops): the layers' weights at
every sample token, the output head at the positions it scores (the completion tokens with chunked log-probs, every
token without), padding and recomputation left out (their share is reported apart, as padding).

    python benchmarks/gpu_round.py --shape tiny --set grpo.tasks-per-epoch=4 --set grpo.num-generations=2   # CPU, seconds
    python benchmarks/gpu_round.py --shape 1.5b                                               # one GPU
    python benchmarks/gpu_round.py --shape 1.5b --decode-engine hf --paper-round              # today's sampler
    python benchmarks/gpu_round.py --shape 7b --set grpo.finetuning=lora --set engine.gradient-checkpointing=true
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import math
import multiprocessing
import resource
import sys
import time
import tomllib
from collections import defaultdict
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

import fedagent_flwr.agent.training.grpo as grpo_module
import fedagent_flwr.agent.play.rollout as rollout_module
from fedagent_flwr.agent.engine import attention
from fedagent_flwr.agent.engine.decode import StaticDecoder
from fedagent_flwr.agent.engine.decode import release as release_decoder
from envs import env_class, make_env
from fedagent_flwr.agent.training.grpo import GRPOTrainer
from fedagent_flwr.agent.training.advantages import StepSample
from fedagent_flwr.agent.training.lora import adapter_to_arrays, arrays_to_adapter, attached_lora
from fedagent_flwr.agent.engine.memory import GB, SHAPES, ModelShape
from fedagent_flwr.agent.models.pretrained import pick_device
from fedagent_flwr.agent.engine.precision import autocast, base_dtype
from fedagent_flwr.agent.play.rollout import PromptEncoder, run_episodes, stop_token_ids
from fedagent_flwr.agent.engine.sampling import sample_batch
from fedagent_flwr.agent.models.shaped_model import (
    environment_tokenizer,
    random_model,
    shaped_config,
)
from fedagent_flwr.agent.training.weights import arrays_to_model, model_to_arrays
from fedagent_flwr.config import RunConfig
from fedagent_flwr.config.choices import ENGINES
from flwr.common.config import flatten_dict  # a preset's sections as the dotted keys Flower reads
from fedagent_flwr.simulation import parse_overrides
from fedagent_flwr.methods.memory import memory_budget
from strategies.communication import payload_bytes, wire_bytes
from strategies.transfer import decode, encode
from fedagent_flwr.methods.memory import memory_plan
from fedagent_flwr.methods.placement import context_tokens, place_run
from fedagent_flwr.methods.library_configs import rollout_config
import raw_output

SHAPE_NAMES = {"tiny": None, "0.5b": "qwen2.5-0.5b", "1.5b": "qwen2.5-1.5b", "3b": "qwen2.5-3b", "7b": "qwen2.5-7b"}
# The FedAgent paper's settings on WebShop (FedAgentGym §5 and the reference runs), as run-config values.
PAPER_ROUND = {"env": "webshop", "grpo.tasks-per-epoch": 64, "grpo.num-generations": 8, "rollout.history-length": 2, "rollout.max-steps": 15,
               "rollout.max-completion-length": 128, "rollout.generation-batch-size": 128, "grpo.mini-batch-size": 64, "grpo.ppo-micro-batch-size-per-gpu": 8,
               "grpo.learning-rate": 1e-6, "grpo.beta": 0.01, "rollout.temperature": 0.4, "grpo.local-epochs": 1}
# A shape small enough for a CPU test: the script's every path, in seconds.
TINY = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
            tie_word_embeddings=True)
H100_BANDWIDTH = 3.35e12  # bytes/s: an H100 SXM's HBM3
H100_BF16_FLOPS = 989e12  # dense bf16 tensor-core FLOP/s of an H100 SXM: the usual denominator of model FLOP utilisation
PAPER_PRESET = Path(__file__).resolve().parents[1] / "configs" / "fedagent-paper.toml"
# the settings that change how long the log-prob and update passes take, not what they compute: the paper-round
# estimate says which of them the measured run did not share with the preset
UPDATE_KEYS = ("engine.gradient-checkpointing", "grpo.ppo-micro-batch-size-per-gpu", "grpo.ppo-max-token-len-per-gpu", "grpo.log-prob-micro-batch-size-per-gpu",
               "grpo.log-prob-max-token-len-per-gpu", "engine.logprob-chunk-tokens",
               "grpo.group-by-length", "engine.training-kernels", "precision", "engine.param-dtype")
# ... and those that change how long a token step takes, or what a pass computes per token: the estimate takes the
# measured run's times, so it runs at the measured run's values of all of these (its table says where the preset's differ)
TIMING_KEYS = UPDATE_KEYS + ("grpo.finetuning", "rollout.name", "rollout.kernels")
# the keys the estimate counts its work by (episodes, token steps, samples, passes): its own values, the preset's
# unless --paper-set or an environment's settings below say otherwise
WORK_KEYS = ("env", "grpo.tasks-per-epoch", "grpo.num-generations", "rollout.max-steps", "rollout.max-completion-length", "rollout.history-length",
             "rollout.generation-batch-size", "grpo.mini-batch-size", "grpo.beta", "grpo.local-epochs", "clients-per-round")
# The FedAgent paper's two environments as a round plays them. configs/fedagent-paper.toml is ALFWorld's preset (50
# steps, 512 new tokens); there is no WebShop preset, so WebShop's round is that file with env = webshop and WebShop's
# 15 steps of 128 new tokens (PAPER_ROUND's). The estimate says which values came from where.
PAPER_ENVS = {"alfworld": {"env": "alfworld", "rollout.max-steps": 50, "rollout.max-completion-length": 512},
              "webshop": {k: PAPER_ROUND[k] for k in ("env", "rollout.max-steps", "rollout.max-completion-length")}}


def decode_bound(facts: ModelShape, tied: bool, rows: float, context: float, value_bytes: int,
                 bandwidth: float) -> dict:
    """The least time a token step can take: the bytes it must read over the memory bandwidth. Every weight
    once (an untied input embedding not at all: a lookup reads a few rows) and every row's keys and values over
    `context` tokens, all in `value_bytes` per number (the forward's dtype)."""
    weights = (facts.parameters - (0 if tied else facts.vocab * facts.hidden)) * value_bytes
    kv = rows * context * facts.layers * 2 * facts.kv_heads * facts.head_dim * value_bytes
    return {"weight_bytes": int(weights), "kv_bytes": int(kv), "bandwidth": bandwidth,
            "bound_ms": (weights + kv) / bandwidth * 1e3}


@contextlib.contextmanager
def sampler_clock(engine: str, record: dict):
    """Time every sampler call of the rollout and count its token steps, with the sampler on `engine`.

    `--decode-engine` wins over the run config's rollout.name here, around LMPolicy's call, so that one flag
    compares engines on the same settings. On the static engine it also times the decoder's `start` (the prefill,
    and on CUDA the graphs captured in it, each timed apart) with the device synchronised around it, and adds up
    the positions its prefill computed (padding included) beside what prefilling each distinct prompt whole
    would have (agent/engine/prefill_plan.py), and the positions of those that hold a token."""
    def timed(model, prompts, *args, **kwargs):
        started = time.perf_counter()
        rows = sample_batch(model, prompts, *args, **{**kwargs, "engine": engine})  # lists: the device is done
        record["sampler_s"] += time.perf_counter() - started
        steps = max((len(r) for r in rows), default=0)  # the rows advance together, one token a step
        record["token_steps"] += steps
        record["row_steps"] += steps * len(rows)  # rows at the start: a random model's rows never stop early
        record["prompt_tokens"] += sum(len(p) for p in prompts)
        record["rows"] += len(rows)
        record["calls"] += 1
        return rows

    def synchronize(decoder):
        if decoder.device.type == "cuda":
            torch.cuda.synchronize(decoder.device)

    def timed_start(decoder, *args, **kwargs):
        synchronize(decoder)
        started = time.perf_counter()
        logits = inner_start(decoder, *args, **kwargs)
        synchronize(decoder)
        record["start_s"] += time.perf_counter() - started
        plan = decoder.last_plan
        record["prefill_positions"] += plan.cost
        # the positions that hold a token (each group's prefix once, then each prompt's own rest), and the prompts
        # whose last position the head scores: the prefill's model FLOPs
        record["prefill_token_positions"] += (sum(len(p) for p in plan.prefixes)
                                              + sum(len(p) - plan.shared(j) for j, p in enumerate(plan.prompts)))
        record["prefill_scored_prompts"] += len(plan.prompts)
        record["prefill_prefix_positions"] += sum(len(p) for p in plan.prefixes)
        record["prefill_positions_whole"] += len(plan.prompts) * max(len(p) for p in plan.prompts)
        record["prefill_prompt_tokens"] += sum(len(p) for p in plan.prompts)  # distinct prompts
        record["prefill_shared_tokens"] += sum(plan.shared(j) for j in range(len(plan.prompts)))
        record["prefill_groups"] += len(plan.prefixes)
        record["prefill_group_prefix_tokens"] += sum(len(p) for p in plan.prefixes)
        return logits

    def timed_capture(decoder, *args, **kwargs):
        synchronize(decoder)
        started = time.perf_counter()
        inner_capture(decoder, *args, **kwargs)
        synchronize(decoder)
        record["capture_s"] += time.perf_counter() - started
        record["graphs_captured"] += 1

    inner, rollout_module.sample_batch = rollout_module.sample_batch, timed
    inner_start, StaticDecoder.start = StaticDecoder.start, timed_start
    inner_capture, StaticDecoder._capture = StaticDecoder._capture, timed_capture
    try:
        yield
    finally:
        rollout_module.sample_batch = inner
        StaticDecoder.start, StaticDecoder._capture = inner_start, inner_capture


def resolved_settings(values: dict, device_type: str) -> dict:
    """TIMING_KEYS of run-config `values` (defaults where absent), every auto among them resolved as a client on
    `device_type` (cpu or cuda) resolves it (agent/engine/placement.py)."""
    full = RunConfig().to_run_config() | values
    placement = place_run(RunConfig.from_run_config(full | {"device": device_type}))
    return {k: full[k] for k in TIMING_KEYS} | {"precision": placement.precision, "engine.param-dtype": placement.param_dtype,
                                                "rollout.name": placement.decode_engine}


def paper_envs(preset_path: Path = PAPER_PRESET) -> list[str]:
    """The environments a paper round is estimated for: the preset's first, then the others of PAPER_ENVS."""
    own = flatten_dict(tomllib.loads(preset_path.read_text())).get("env")
    return [own] + [env for env in PAPER_ENVS if env != own] if own in PAPER_ENVS else list(PAPER_ENVS)


def paper_settings(env: str, overrides: dict | None = None, preset_path: Path = PAPER_PRESET) -> tuple[dict, dict, dict]:
    """The run-config values a round of `env` is estimated at: the preset's, `env`'s own steps and answer budget where
    the preset is another environment's (PAPER_ENVS: no preset file exists for it), then `overrides` (--paper-set).
    Returns those values, the preset's, and for each key that is not the preset's where it came from."""
    preset = flatten_dict(tomllib.loads(preset_path.read_text()))
    if preset.get("rollout.max-steps") == 0:  # the environment's own horizon: the count below needs the number
        preset["rollout.max-steps"] = env_class(preset["env"]).default_max_steps
    own = {} if preset.get("env") == env else PAPER_ENVS[env]
    source = {k: f"{env}'s settings: no {env} preset exists ({preset_path.name} is {preset.get('env')}'s)" for k in own}
    source |= {k: "--paper-set" for k in overrides or {}}
    return preset | own | (overrides or {}), preset, source


class _Babbler:
    """A random model's completions without the model: `max_new_tokens` ids drawn uniformly from a vocabulary of
    `vocab`, cut at the first stop id, decoded as LMPolicy decodes them (ids past the tokenizer's decode to nothing,
    as a shape model's do). A random-init model's next-token distribution is close to uniform; its text never parses
    as an action, so the whole of it lands in the prompts' history, and every episode runs rollout.max-steps."""

    def __init__(self, tokenizer, vocab: int, max_new_tokens: int, seed: int) -> None:
        self.tokenizer, self.vocab, self.max_new_tokens = tokenizer, vocab, max_new_tokens
        self.stop_ids = set(stop_token_ids(tokenizer))
        self.rng = np.random.default_rng(seed)

    def act(self, live):
        out = []
        for _ in live:
            ids = self.rng.integers(0, self.vocab, self.max_new_tokens).tolist()
            ids = next((ids[: i + 1] for i, t in enumerate(ids) if t in self.stop_ids), ids)
            out.append((ids, self.tokenizer.decode(ids, skip_special_tokens=True)))
        return out


def played_prompt_tokens(values: dict, shape: str, tasks: int = 8, seed: int = 0) -> float:
    """The mean prompt length of a round's agent steps at run-config `values` on a random model of `shape`, in tokens
    of the environment's shape tokenizer (what this script builds), from `tasks` training tasks played with _Babbler
    in place of the model: the prompts of another environment than the one measured, which the model cannot play
    cheaply. A group's episodes differ only by their draws, so a few distinct tasks suffice; on the tiny round the
    mean lands near the measured one (tests/benchmarks/test_gpu_round.py)."""
    cfg = RunConfig.from_run_config(values | {"device": "cpu"})
    tokenizer = environment_tokenizer(cfg.env)
    name = SHAPE_NAMES[shape]
    vocab = SHAPES[name]["vocab_size"] if name else len(tokenizer)  # build_model's vocabulary for this shape
    sampled = cfg.updated({"rollout.generation-batch-size": tasks})
    rollout = rollout_config(sampled, placement=place_run(sampled))
    pool = make_env(cfg.env, cfg.rollout.max_steps).tasks_of_split("train")
    chosen = [pool[i] for i in np.random.default_rng(seed).choice(len(pool), size=tasks, replace=True)]
    trajectories = run_episodes(_Babbler(tokenizer, vocab, rollout.max_new_tokens, seed),
                                lambda: make_env(cfg.env, cfg.rollout.max_steps), chosen, PromptEncoder(tokenizer), rollout)
    lengths = [len(step.prompt_ids) for t in trajectories for step in t.steps]
    return sum(lengths) / max(len(lengths), 1)


def paper_round(r: dict, overrides: dict | None = None, preset_path: Path = PAPER_PRESET, env: str | None = None,
                prompt_tokens: float | None = None) -> dict:
    """A round of `env` (default: the preset's own) at the preset's settings (paper_settings), estimated from the
    measured phases of `r`.

    Assumptions (printed with it): every episode runs rollout.max-steps and every completion rollout.max-completion-length (what a
    random model does: the worst case); a token step costs what it cost here (at this run's rows per step and
    context: a longer context costs more); log-probs and update cost in proportion to their model FLOPs
    (sample_flops: a completion token costs more than a prompt token where the head scores completions only), at
    prompts of `prompt_tokens` on average (played_prompt_tokens; default: this run's mean); an old-policy pass where an
    epoch holds more than one minibatch and a KL-reference pass where grpo.beta > 0; each client sends once. Server
    evaluation and Flower's messaging are not in it. The phases' times are this run's, so the estimate runs at this
    run's TIMING_KEYS: the table it returns names every key whose value it used is not the preset's.
    rollout.generation-batch-size = 0 (auto) takes the rows this run resolved, capped at the preset's epoch."""
    env = env or paper_envs(preset_path)[0]
    p, preset, source = paper_settings(env, overrides, preset_path)
    defaults = RunConfig().to_run_config()
    episodes = p["grpo.tasks-per-epoch"] * p["grpo.num-generations"]
    rows = p["rollout.generation-batch-size"] or min(r["rollout_rows"], episodes)
    token_steps = p["rollout.max-steps"] * math.ceil(episodes / rows) * p["rollout.max-completion-length"]
    samples = episodes * p["rollout.max-steps"]
    prompt = r["mean_prompt_tokens"] if prompt_tokens is None else prompt_tokens
    f = r["flop_count"]
    shape = FlopShape(f["body_parameters"], f["head_parameters"])
    new = p["rollout.max-completion-length"]
    sample = model_flops(shape, prompt + new, new if f["head_scores"] == "completion tokens" else prompt + new, 1.0)
    logprob_passes = int(samples > p["grpo.mini-batch-size"]) + int(p["grpo.beta"] > 0)
    rollout = token_steps * r["rollout_s"] / max(r["token_steps"], 1)
    logprobs = samples * sample * logprob_passes * r["logprobs_s"] / f["logprob_flops"] if f["logprob_flops"] else 0.0
    update = samples * sample * f["update_passes"] * r["update_s"] / max(f["update_flops"], 1.0)
    client = p["grpo.local-epochs"] * (rollout + logprobs + update) + r["transfer_s"]

    table = []
    for k in WORK_KEYS:  # what the estimate counts: its own values
        used, was = (rows if k == "rollout.generation-batch-size" else p.get(k, defaults[k])), preset.get(k, defaults[k])
        if used != was:
            why = source.get(k, "the preset")
            table.append({"key": k, "preset": was, "used": used, "from": why if used == p.get(k) else
                          f"{why}: rollout.generation-batch-size = 0 (auto) takes the rows the measured run resolved"})
    if r.get("env") and r["env"] != env:  # the phases' times: the measured run's
        table.append({"key": "env", "preset": preset.get("env"), "used": r["env"],
                      "from": f"the measured run: its token steps and passes, timed on {r['env']}, priced {env}'s counts "
                              f"and prompt lengths"})
    theirs = resolved_settings(preset, "cpu" if r.get("device") == "cpu" else "cuda")
    for k, v in r.get("timing_settings", {}).items():
        if theirs.get(k) != v:
            why = "the measured run (its phases were timed at it)"
            if k in (overrides or {}) and overrides[k] != v:
                why += f"; --paper-set {k}={_toml(overrides[k])} not applied: no phase was timed at it"
            table.append({"key": k, "preset": theirs.get(k), "used": v, "from": why})
    return {"env": env, "preset": preset_path.name, "preset_env": preset.get("env"), "overrides": overrides or {},
            "settings_unlike_preset": table,
            "mean_prompt_tokens": round(prompt, 1),
            "prompt_tokens_from": "the measured round" if prompt_tokens is None else
            f"{env} played with random tokens for the model (played_prompt_tokens)",
            "timed_on": {"env": r.get("env"), "rollout_rows": r["rollout_rows"], "mean_prompt_tokens": r["mean_prompt_tokens"]},
            "clients": p["clients-per-round"],
            "local_epochs": p["grpo.local-epochs"], "episodes_per_epoch": episodes, "max_steps": p["rollout.max-steps"],
            "max_new_tokens": p["rollout.max-completion-length"],
            "rollout_batch_size": rows, "rollout_rows_as_measured": rows == r["rollout_rows"],
            "token_steps_per_epoch": token_steps, "logprob_passes_per_epoch": logprob_passes,
            "samples_per_epoch": samples, "epoch_rollout_s": round(rollout, 1), "epoch_logprobs_s": round(logprobs, 1),
            "epoch_update_s": round(update, 1), "client_s": round(client, 1),
            "round_s_clients_in_turn": round(p["clients-per-round"] * client, 1),
            "round_s_one_card_each": round(client, 1)}


def _toml(value) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def build_model(shape: str, tokenizer, device: torch.device, seed: int):
    """The shape's Qwen2 model with random weights, initialised on `device` (shaped_model.py, as `model=shape:...`)."""
    name = SHAPE_NAMES[shape]
    config = shaped_config(name, tokenizer) if name else shaped_config("", tokenizer, **TINY, vocab_size=len(tokenizer))
    return random_model(config, device, seed)


class PeakMemory:
    """Peak bytes per phase: CUDA's allocator peak on a GPU, the process's peak RSS on CPU (which never drops)."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.peaks: dict[str, int] = {}

    @contextlib.contextmanager
    def phase(self, name: str):
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        yield
        if self.cuda:
            torch.cuda.synchronize()
            self.peaks[name] = int(torch.cuda.max_memory_allocated())
        else:
            self.peaks[name] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def timed_method(obj, name: str, clock: dict[str, float]) -> None:
    """Wrap obj.name so the seconds spent in it add up in clock[name]."""
    inner = getattr(obj, name)

    def wrapper(*args, **kwargs):
        started = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            clock[name] += time.perf_counter() - started
            clock[f"{name}_calls"] += 1
    setattr(obj, name, wrapper)


@contextlib.contextmanager
def recorded_passes():
    """The [rows, padded width] of every forward GRPO's trainer runs inside: under True the update's passes (with
    gradients: its micro-batches as cut per minibatch), under False the no-grad log-prob passes'."""
    shapes: dict[bool, list[tuple[int, int]]] = {True: [], False: []}
    inner = grpo_module.completion_logprobs

    def recording(model, batch, *args, **kwargs):
        shapes[torch.is_grad_enabled()].append(tuple(batch["input_ids"].shape))
        return inner(model, batch, *args, **kwargs)

    grpo_module.completion_logprobs = recording
    try:
        yield shapes
    finally:
        grpo_module.completion_logprobs = inner


class FlopShape(NamedTuple):
    """The weights a position's forward multiplies by. `body`: the layers' (and the final norm's) parameters; the
    input embedding is a lookup and costs no FLOPs, so an untied model leaves it out, and a tied one counts its matrix
    once, as the head. `head`: the output head's vocabulary x hidden matrix, which runs only where logits are wanted."""

    body: int
    head: int

    @classmethod
    def of(cls, config) -> FlopShape:
        facts = ModelShape.of(config)
        head = facts.vocab * facts.hidden
        tied = bool(getattr(config, "tie_word_embeddings", False))
        return cls(body=facts.parameters - head * (1 if tied else 2), head=head)


def model_flops(shape: FlopShape, body_tokens: int, head_tokens: int, passes: float) -> float:
    """Model FLOPs of `passes` forward-equivalent passes: 2 per weight per position it runs at, the body at
    `body_tokens` positions and the head at `head_tokens` (attention's quadratic part left out). A forward is 1 pass;
    training a full model is 3 (backward costs two forwards); training a LoRA adapter about 2 (the frozen weights need
    the input gradients only). Recomputation (checkpointed layers; the chunked head, recomputed in backward) is not
    counted: the FLOPs the result needs, as model FLOP utilisation counts them."""
    return 2.0 * passes * (shape.body * body_tokens + shape.head * head_tokens)


def sample_flops(config, samples, chunk_tokens: int, passes: float) -> float:
    """model_flops of GRPO's passes over `samples` (each with prompt_ids and completion_ids) for a model of `config`.

    The body runs at every sample token. The head runs where agent/engine/tokens.py's completion_logprobs sends
    hidden states through it: with chunk_tokens > 0 (chunked_completion_logprobs) the completion tokens only, at 0
    (full logits) every token. Padding is left out of both, though the passes compute it: it is waste, not the
    model's work, and the reports give its share apart (so that padding more never raises the utilisation)."""
    tokens = sum(len(s.prompt_ids) + len(s.completion_ids) for s in samples)
    scored = sum(len(s.completion_ids) for s in samples) if chunk_tokens > 0 else tokens
    return model_flops(FlopShape.of(config), tokens, scored, passes)


def run_round(cfg: RunConfig, shape: str, device: torch.device, seed: int,
              bandwidth: float = H100_BANDWIDTH, peak_flops: float = H100_BF16_FLOPS) -> dict:
    env = make_env(cfg.env, cfg.rollout.max_steps)
    tokenizer = environment_tokenizer(cfg.env)
    model = build_model(shape, tokenizer, device, seed)
    if base_dtype(cfg.precision) != torch.float32:  # precision=bf16-base set: the base as load_agent would load it
        model.to(base_dtype(cfg.precision))
    shape_facts = ModelShape.of(model.config)
    eval_tasks = env.tasks_of_split("test")[:16]
    plan_context = context_tokens(cfg, tokenizer, env, eval_tasks)
    # every auto resolved as a client resolves it (methods/placement.py): rollout.generation-batch-size=0 the most rows the memory
    # plan fits in engine.client-memory-gb, or else in the GPU memory free now, up to an epoch's episodes; auto checkpointing
    # within the room the plan leaves
    placement = place_run(cfg, model=model, shape=shape_facts, context_tokens=plan_context,
                          budget_bytes=memory_budget(cfg, device))
    rows = placement.rollout_rows
    client_plan = memory_plan(cfg, shape_facts, plan_context, placement, rows)

    lora = attached_lora(model, cfg.lora, seed=seed) if cfg.grpo.finetuning == "lora" else contextlib.nullcontext()
    with lora as peft_model:
        trained = peft_model if peft_model is not None else model
        memory = PeakMemory(device)
        trainer = GRPOTrainer(trained, tokenizer, cfg.grpo, rollout_config(cfg, placement=placement), engine=cfg.engine, placement=placement)
        clock: dict[str, float] = defaultdict(float)
        timed_method(trainer, "_logprobs", clock)
        rng = np.random.default_rng(seed)
        pool = env.tasks_of_split("train")
        chosen = [pool[i] for i in rng.choice(len(pool), size=cfg.grpo.tasks_per_epoch, replace=True)]
        episodes = [t for t in chosen for _ in range(cfg.grpo.num_generations)]

        sampler: dict[str, float] = defaultdict(float)
        engine = placement.decode_engine  # rollout.name (--decode-engine) as the placement resolved it, with the model
        with memory.phase("rollout"), sampler_clock(engine, sampler):
            started = time.perf_counter()
            with autocast(placement.precision, device):
                trajectories = run_episodes(trainer.policy, lambda: make_env(cfg.env, cfg.rollout.max_steps), episodes,
                                            trainer.encoder, trainer.rollout)
            release_decoder(trainer.policy.model)  # as GRPOTrainer.train_epoch does before its update
            rollout_s = time.perf_counter() - started
        steps = [s for t in trajectories for s in t.steps if s.completion_ids]
        samples = [StepSample(s.prompt_ids, s.completion_ids, float(a)) for s, a in zip(steps, rng.standard_normal(len(steps)))]
        before = [p.detach().clone() for p in trained.parameters() if p.requires_grad][:1]
        with memory.phase("update"):
            started = time.perf_counter()
            with recorded_passes() as passes:
                stats = trainer.update(samples, rng)
            update_s = time.perf_counter() - started
        moved = float((before[0] != [p for p in trained.parameters() if p.requires_grad][0].detach()).float().mean())

        with memory.phase("transfer"):
            started = time.perf_counter()
            sent = encode(adapter_to_arrays(peft_model) if peft_model is not None else model_to_arrays(model), cfg.federation.transfer_dtype)
            sent_payload, sent_wire = payload_bytes(sent), wire_bytes(sent)
            received = decode(sent, cfg.federation.transfer_dtype)
            if peft_model is not None:
                arrays_to_adapter(peft_model, received)
            else:
                arrays_to_model(model, received)
            if device.type == "cuda":
                torch.cuda.synchronize()
            transfer_s = time.perf_counter() - started

    generated = sum(len(s.completion_ids) for s in steps)
    logprob_s = clock["_logprobs"]
    sample_tokens = sum(len(s.prompt_ids) + len(s.completion_ids) for s in steps)
    # What the update and log-prob passes compute for the samples, against the card's peak (sample_flops: the head
    # where it scores, padding and recomputation left out)
    flop_shape = FlopShape.of(model.config)
    update_passes = 2.0 if cfg.grpo.finetuning == "lora" else 3.0
    logprob_passes = int(clock["_logprobs_calls"])
    logprob_flops = sample_flops(model.config, samples, cfg.engine.logprob_chunk_tokens, logprob_passes)
    update_flops = sample_flops(model.config, samples, cfg.engine.logprob_chunk_tokens, update_passes)
    update_only_s = max(update_s - logprob_s, 1e-9)
    # The prefill runs the layers at each position holding a token (its padding left out, as the passes' is) and the
    # head at each distinct prompt's last position. The group prefixes' pass stops after the last layer's q/k/v (the
    # keys and values are all it is for): that layer's output projection and MLP do not run at the prefix positions.
    body_parameters = flop_shape.body
    last_layer = model.model.layers[-1]  # a Qwen2 model: the shapes this script builds
    skipped = sum(w.numel() for name, w in last_layer.named_parameters()
                  if name.startswith(("self_attn.o_proj.", "mlp.")) and "lora_" not in name)  # the decoder merges an adapter
    prefill_s = sampler["start_s"] - sampler["capture_s"]
    prefill_flops = (model_flops(flop_shape, int(sampler["prefill_token_positions"]), int(sampler["prefill_scored_prompts"]), 1.0)
                     - 2.0 * skipped * sampler["prefill_prefix_positions"])
    # the passes' padding: positions computed (rows x each pass's width) that hold no sample token
    computed = {grad: sum(r * w for r, w in passes[grad]) for grad in (True, False)}
    logprob_tokens = sample_tokens * int(clock["_logprobs_calls"])
    token_steps = int(sampler["token_steps"])
    rows_per_step = sampler["row_steps"] / max(token_steps, 1)
    mean_prompt = sampler["prompt_tokens"] / max(sampler["rows"], 1)
    # the context a step reads, averaged over the steps of a call: the prompt and half the completion
    context = mean_prompt + token_steps / max(sampler["calls"], 1) / 2
    value_bytes = 4 if placement.precision == "fp32" else 2  # bf16 forwards read bf16 weights at best
    bound = decode_bound(shape_facts, bool(getattr(model.config, "tie_word_embeddings", False)), rows_per_step, context,
                         value_bytes, bandwidth)
    return {
        "shape": shape, "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "parameters": shape_facts.parameters, "body_parameters": body_parameters, "finetuning": cfg.grpo.finetuning, "precision": placement.precision,
        "gradient_checkpointing": cfg.engine.gradient_checkpointing, "transfer_dtype": cfg.federation.transfer_dtype,
        "env": cfg.env, "run_config": cfg.to_run_config(),
        # the settings the phases' times depend on, every auto resolved as it ran, so that the paper round compares
        # like with like
        "timing_settings": resolved_settings(cfg.to_run_config(), device.type),
        "episodes": len(episodes), "rollout_rows": rows, "agent_steps": len(steps), "generated_tokens": generated,
        "rollout_s": round(rollout_s, 3), "logprobs_s": round(logprob_s, 3), "update_s": round(update_s - logprob_s, 3),
        "transfer_s": round(transfer_s, 3), "generated_tokens_per_s": round(generated / max(rollout_s, 1e-9), 1),
        "decode_engine": engine, "decode_kernels": cfg.rollout.kernels, "token_steps": token_steps, "sampler_s": round(sampler["sampler_s"], 3),
        "decode_ms_per_token_step": round(sampler["sampler_s"] / max(token_steps, 1) * 1e3, 3),
        "rollout_ms_per_token_step": round(rollout_s / max(token_steps, 1) * 1e3, 3),
        # the static engine's start (prefill and graph capture) apart from its token steps; 0 on the hf engine
        "prefill_s": round(prefill_s, 3), "capture_s": round(sampler["capture_s"], 3),
        "prefill_mfu": prefill_flops / prefill_s / peak_flops if prefill_s > 0 else 0.0,
        "prefill_flops": prefill_flops,
        "graphs_captured": int(sampler["graphs_captured"]),
        "step_ms_per_token_step": round((sampler["sampler_s"] - sampler["start_s"]) / max(token_steps, 1) * 1e3, 3)
        if sampler["start_s"] else None,
        "prefill_positions": int(sampler["prefill_positions"]),
        "prefill_positions_whole": int(sampler["prefill_positions_whole"]),
        "prefill_token_positions": int(sampler["prefill_token_positions"]),
        "prefill_prefix_positions": int(sampler["prefill_prefix_positions"]),
        "prefill_scored_prompts": int(sampler["prefill_scored_prompts"]),
        "prefill_padding_fraction": 1 - sampler["prefill_token_positions"] / sampler["prefill_positions"]
        if sampler["prefill_positions"] else 0.0,
        # how much of the distinct prompts' tokens the group prefixes held, and a prefix's mean length
        "prefill_shared_fraction": sampler["prefill_shared_tokens"] / max(sampler["prefill_prompt_tokens"], 1),
        "prefill_mean_group_prefix": sampler["prefill_group_prefix_tokens"] / max(sampler["prefill_groups"], 1),
        "rows_per_step": round(rows_per_step, 1), "context_tokens": round(context, 1),
        "mean_prompt_tokens": round(mean_prompt, 1), "sample_tokens": sample_tokens,
        "decode_bound": bound,
        "logprob_passes": int(clock["_logprobs_calls"]), "peak_flops": peak_flops,
        # forward passes as the trainer cut them (micro-batches: rows, or padded tokens with the *-tokens keys)
        "update_micro_batches": len(passes[True]), "logprob_micro_batches": len(passes[False]),
        "largest_update_pass_tokens": max((r * w for r, w in passes[True]), default=0),
        "update_padding_fraction": 1 - sample_tokens / computed[True] if computed[True] else 0.0,
        "logprob_padding_fraction": 1 - logprob_tokens / computed[False] if computed[False] else 0.0,
        "logprobs_mfu": logprob_flops / max(logprob_s, 1e-9) / peak_flops if logprob_s else 0.0,
        "update_mfu": update_flops / update_only_s / peak_flops,
        "logprobs_tflops_per_s": logprob_flops / max(logprob_s, 1e-9) / 1e12 if logprob_s else 0.0,
        "update_tflops_per_s": update_flops / update_only_s / 1e12,
        # what the MFUs count (sample_flops), and what the count before issue 54 (2 x every parameter x every sample
        # token a pass, the head included at prompt positions it never scores) made of the same passes
        "flop_count": {
            "body_parameters": flop_shape.body, "head_parameters": flop_shape.head,
            "head_scores": "completion tokens" if cfg.engine.logprob_chunk_tokens > 0 else "every token",
            "padding": "left out (update_padding_fraction, logprob_padding_fraction)",
            "sample_tokens": sample_tokens, "completion_tokens": generated,
            "update_passes": update_passes, "logprob_passes": logprob_passes,
            "update_flops": update_flops, "logprob_flops": logprob_flops,
            "update_flops_counted_before": 2.0 * shape_facts.parameters * sample_tokens * update_passes,
            "logprob_flops_counted_before": 2.0 * shape_facts.parameters * sample_tokens * logprob_passes},
        "checkpointed_layers": stats.get("checkpointed_layers", 0.0),
        "optimizer_steps": int(stats["optimizer_steps"]), "adamw_fused": bool(trainer.optimizer.defaults["fused"]),
        "grad_norm": stats["grad_norm"],
        "fraction_of_a_trained_tensor_moved": moved, "bytes_sent": sent_payload, "wire_bytes_sent": sent_wire,
        "peak_bytes": memory.peaks, "peak_bytes_measured_by": "cuda allocator" if memory.cuda else "process peak RSS",
        "plan_bytes": client_plan.as_dict(),
    }


def format_report(r: dict) -> str:
    plan, peak = r["plan_bytes"]["total"], max(r["peak_bytes"].values())
    rows = [
        f"shape {r['shape']} ({r['parameters'] / 1e6:,.1f}M parameters) on {r['device']}: {r['finetuning']}, {r['precision']}, "
        f"gradient checkpointing {r['gradient_checkpointing']}"
        + (f" ({100 * r['checkpointed_layers']:.0f}% of layer passes checkpointed)" if r["gradient_checkpointing"] else "")
        + f", transfer {r['transfer_dtype']}",
        f"  episodes {r['episodes']} ({r['rollout_rows']} a generate call), agent steps {r['agent_steps']}, "
        f"generated tokens {r['generated_tokens']:,}",
        f"  rollout   {r['rollout_s']:10.2f} s   ({r['generated_tokens_per_s']:,.1f} generated tokens/s)",
        f"  log-probs {r['logprobs_s']:10.2f} s   ({r['logprob_micro_batches']} forward passes, "
        f"{100 * r['logprob_padding_fraction']:.1f}% of their positions padding)",
        f"  update    {r['update_s']:10.2f} s   ({r['optimizer_steps']} {'fused ' if r.get('adamw_fused') else ''}AdamW steps, "
        f"{r['update_micro_batches']} forward/backward passes, the largest {r['largest_update_pass_tokens']:,} padded tokens, "
        f"{100 * r['update_padding_fraction']:.1f}% of their positions padding, grad norm {r['grad_norm']:.3g}, "
        f"{100 * r['fraction_of_a_trained_tensor_moved']:.1f}% of a trained tensor moved)",
        f"  transfer  {r['transfer_s']:10.2f} s   ({r['bytes_sent'] / 1e6:,.1f} MB of tensors sent, {r['wire_bytes_sent'] / 1e6:,.1f} MB serialized)",
        "  peak memory by phase (" + r["peak_bytes_measured_by"] + "): "
        + ", ".join(f"{k} {v / GB:.2f} GiB" for k, v in r["peak_bytes"].items()),
        f"  memory plan estimate {plan / GB:.2f} GiB vs measured peak {peak / GB:.2f} GiB",
        f"  model FLOP utilisation (the FLOPs the passes compute for the samples: the layers at every sample token, the "
        f"head at {r['flop_count']['head_scores']}, padding and recomputation left out; of {r['peak_flops'] / 1e12:,.0f} TFLOP/s): "
        f"update {100 * r['update_mfu']:.2f}% ({r['update_tflops_per_s']:,.3f} TFLOP/s), "
        f"log-probs {100 * r['logprobs_mfu']:.2f}% ({r['logprobs_tflops_per_s']:,.3f} TFLOP/s, {r['logprob_passes']} passes)",
    ]
    b = r["decode_bound"]
    rows += [
        f"  decode    {r['decode_ms_per_token_step']:10.3f} ms per token step ({r['decode_engine']} engine"
        + (f", {r['decode_kernels']} kernels" if r.get("decode_kernels", "eager") != "eager" else "") + "; "
        f"{r['token_steps']:,} token steps at {r['rows_per_step']:,.1f} rows, prefill included; "
        f"rollout with environment steps {r['rollout_ms_per_token_step']:,.3f} ms)",
    ]
    if r.get("step_ms_per_token_step") is not None:
        rows.append(
            f"            of which prefill {r['prefill_s']:,.2f} s ({100 * r['prefill_mfu']:.1f}% model FLOP utilisation; "
            f"{r['prefill_positions']:,} positions computed, {100 * r['prefill_padding_fraction']:.0f}% of them padding, "
            f"{r['prefill_positions_whole']:,} with every distinct prompt whole; group prefixes of "
            f"{r['prefill_mean_group_prefix']:,.0f} tokens held {100 * r['prefill_shared_fraction']:.0f}% of the prompt tokens), "
            f"graph capture {r['capture_s']:,.2f} s "
            f"({r['graphs_captured']} graphs), token steps {r['step_ms_per_token_step']:,.3f} ms each")
    rows += [
        f"            bandwidth bound {b['bound_ms']:.3f} ms per token step: {b['weight_bytes'] / 1e9:,.3f} GB of weights "
        f"+ {b['kv_bytes'] / 1e9:,.3f} GB of KV cache ({r['rows_per_step']:,.1f} rows x {r['context_tokens']:,.0f} tokens) "
        f"at {b['bandwidth']:.3g} B/s",
    ]
    for env, p in r.get("paper_rounds", {}).items():
        rows += [f"paper round, {env}: not estimated ({p['skipped']})"] if "skipped" in p else \
            format_paper_round(p, r["rollout_rows"])
    return "\n".join(rows)


def format_paper_round(p: dict, measured_rows: int) -> list[str]:
    """One paper-round estimate's lines: the round, its phases, its assumptions, and the table of the settings it used
    where the preset's differ."""
    lines = [
        f"  paper round on {p['env']} ({p['preset']}" + ("" if p["env"] == p["preset_env"] else f" with {p['env']}'s settings")
        + "".join(f", {k}={v}" for k, v in p["overrides"].items())
        + f": M = {p['clients']} clients, {p['local_epochs']} local epochs of "
        f"{p['episodes_per_epoch']} episodes, {p['max_steps']} steps x {p['max_new_tokens']} new tokens, "
        f"rollout batch {p['rollout_batch_size']}, prompts of {p['mean_prompt_tokens']:,.0f} tokens from "
        f"{p['prompt_tokens_from']}), estimated from the phases above:",
        f"            per epoch: rollout {p['epoch_rollout_s']:,.0f} s ({p['token_steps_per_epoch']:,} token steps), "
        f"log-probs {p['epoch_logprobs_s']:,.0f} s ({p['logprob_passes_per_epoch']} passes), "
        f"update {p['epoch_update_s']:,.0f} s ({p['samples_per_epoch']:,} samples)",
        f"            per client {p['client_s']:,.0f} s (transfer included); round {p['round_s_clients_in_turn']:,.0f} s "
        f"with the clients in turn on one card, {p['round_s_one_card_each']:,.0f} s with a card each",
        "            assumed: every episode runs rollout.max-steps and every completion rollout.max-completion-length (a random model's "
        "worst case); a token step costs what it cost here (this batch and context); log-probs and update "
        "scale with their model FLOPs; server evaluation and Flower's messaging left out",
    ]
    if p["settings_unlike_preset"]:
        width = max(len(t["key"]) for t in p["settings_unlike_preset"])
        cells = [(t["key"], _toml(t["preset"]), _toml(t["used"]), t["from"]) for t in p["settings_unlike_preset"]]
        value = max(len("preset"), *(max(len(c[1]), len(c[2])) for c in cells))
        lines.append("            settings the estimate used that are not the preset's:")
        lines.append(f"              {'key':{width}s}  {'preset':{value}s}  {'used':{value}s}  from")
        lines += [f"              {k:{width}s}  {a:{value}s}  {b:{value}s}  {why}" for k, a, b, why in cells]
    if not p["rollout_rows_as_measured"]:
        lines.append(f"            the preset's rollout batch ({p['rollout_batch_size']} rows) is not the measured one "
                     f"({measured_rows}): its token step is assumed to cost the same; measure at its rows")
    return lines


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", choices=list(SHAPE_NAMES), default="tiny")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a run-config value over the paper's round (repeatable), e.g. --set grpo.finetuning=lora")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print one JSON line instead of the table")
    parser.add_argument("--decode-engine", choices=ENGINES, default="auto",
                        help="the sampler's engine (agent/engine/sampling.py): auto = static on CUDA, hf elsewhere")
    parser.add_argument("--bandwidth", type=float, default=H100_BANDWIDTH,
                        help="memory bandwidth in bytes/s for the decode bound (default: an H100's 3.35e12)")
    parser.add_argument("--peak-flops", type=float, default=H100_BF16_FLOPS,
                        help="the card's peak FLOP/s for model FLOP utilisation (default: an H100's dense bf16 989e12)")
    parser.add_argument("--cudnn-attention", action="store_true",
                        help="let the passes of changing shapes use cuDNN's fused attention (agent/engine/attention.py keeps "
                             "it out of them), to measure that choice")
    parser.add_argument("--paper-round", action="store_true",
                        help=f"also estimate a round on each of {', '.join(PAPER_ENVS)} at {PAPER_PRESET.name}'s settings "
                             "from the measured phases")
    parser.add_argument("--paper-set", action="append", default=[], metavar="KEY=VALUE",
                        help="a preset value for the --paper-round estimate (repeatable), e.g. grpo.tasks-per-epoch=64")
    args = parser.parse_args(argv)
    try:
        overrides = parse_overrides(args.set)
        paper_overrides = parse_overrides(args.paper_set)
        cfg = RunConfig.from_run_config(PAPER_ROUND | overrides | {"device": args.device, "rollout.name": args.decode_engine})
        device = pick_device(args.device)
    except ValueError as err:
        parser.error(str(err))
    attention.AVOID_CUDNN = not args.cudnn_attention
    with contextlib.ExitStack() as stack:
        played = {}
        if args.paper_round:
            # The estimates' prompts, played in a process of its own while the round runs: ALFWorld's tokenizer takes
            # about 20 s of a CPU to build, device time the round would otherwise wait through
            pool = stack.enter_context(concurrent.futures.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")))
            played = {env: (pool.submit(played_prompt_tokens, values, args.shape, seed=args.seed), values, args.shape, args.seed)
                      for env in paper_envs() for values in [paper_settings(env, paper_overrides)[0]]}
        result = run_round(cfg, args.shape, device, args.seed, args.bandwidth, args.peak_flops)
        result["cudnn_attention"] = args.cudnn_attention
        result["settings"] = raw_output.settings(args)
        if args.paper_round:
            result["paper_rounds"] = paper_rounds(result, played, paper_overrides)
    print(json.dumps(result) if args.json else format_report(result), flush=True)
    return result


def paper_rounds(r: dict, played: dict, overrides: dict) -> dict:
    """Each environment's paper-round estimate from the measured round `r` and its played prompts (`played`: env ->
    the job main() submitted); an estimate that needs a package not installed here (a lent GPU machine has no
    alfworld, which the preset's own checks need) is `{"skipped": why}`, so the measured round is kept."""
    rounds = {}
    for env, job in played.items():
        try:  # every estimate starts from the ALFWorld preset, whose checks need the package too
            rounds[env] = paper_round(r, overrides, env=env, prompt_tokens=_played(*job))
        except ImportError as err:
            print(f"gpu_round.py: no {env} paper round: {err}", file=sys.stderr, flush=True)
            rounds[env] = {"skipped": str(err)}
    return rounds


def _played(future: concurrent.futures.Future, values: dict, shape: str, seed: int) -> float:
    try:
        return future.result()
    except concurrent.futures.process.BrokenProcessPool:  # no worker could start here: play in this process
        return played_prompt_tokens(values, shape, seed=seed)


if __name__ == "__main__":
    main(sys.argv[1:])
