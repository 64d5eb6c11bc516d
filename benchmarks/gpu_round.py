#!/usr/bin/env python
"""One FedAgentAvg client round on a Qwen2.5-shaped model, timed phase by phase, with the memory plan beside
the measured peak.

The model is built offline from the published shape (random init, no hub; agent/memory.py SHAPES) on the
device it runs on. The round follows the client's own code path (GRPOTrainer, the run config's builders) at the
FedAgent paper's WebShop settings unless `--set` says otherwise: 64 tasks x G = 8 episodes, history 2,
15 steps, 128 new tokens per step, rollout batch 128, minibatch 64, micro-batch 8, lr 1e-6, KL 0.01.

What is forced, and why: a random-init model never emits its end-of-turn token and never writes a valid
action, so every completion runs to `max-new-tokens` (the WebShop answer budget: a plausible length, and the
worst case) and every episode to `max-steps`. All its rewards tie, so GRPO would drop every group; the
benchmark gives each step sample a random advantage instead, so the update runs on every step (what a round
with informative groups costs). The model and its small BPE tokenizer are built as `model="shape:<name>"` builds
them (agent/shaped_model.py); ids the model samples outside the tokenizer decode to nothing.

Phases: rollout (batched generation + environment steps), log-probs (the no-grad passes: old-policy
log-probs when there is more than one minibatch, and the KL reference's), update (forward/backward/AdamW, less
the log-prob passes inside it), transfer (the weights the client sends: to host arrays, encoded in the
transfer dtype, decoded and loaded back as a receiver would; the network is not in it - the deployment test
measures a real one).

    python benchmarks/gpu_round.py --shape tiny --set tasks-per-epoch=4 --set group-size=2   # CPU, seconds
    python benchmarks/gpu_round.py --shape 1.5b                                               # one GPU
    python benchmarks/gpu_round.py --shape 7b --set finetuning=lora --set gradient-checkpointing=true
"""

from __future__ import annotations

import argparse
import contextlib
import json
import resource
import sys
import time
from collections import defaultdict

import numpy as np
import torch

from envs import make_env
from fedagent_flwr.agent.grpo import GRPOTrainer, StepSample
from fedagent_flwr.agent.lora import adapter_to_arrays, arrays_to_adapter, attached_lora
from fedagent_flwr.agent.memory import GB, ModelShape
from fedagent_flwr.agent.models import pick_device
from fedagent_flwr.agent.precision import autocast
from fedagent_flwr.agent.rollout import run_episodes
from fedagent_flwr.agent.shaped_model import (
    environment_tokenizer,
    random_model,
    shaped_config,
)
from fedagent_flwr.agent.weights import arrays_to_model, model_to_arrays
from fedagent_flwr.config import RunConfig, parse_overrides
from fedagent_flwr.methods.fedagent import context_tokens
from strategies.communication import payload_bytes, wire_bytes
from strategies.transfer import decode, encode

SHAPE_NAMES = {"tiny": None, "0.5b": "qwen2.5-0.5b", "1.5b": "qwen2.5-1.5b", "3b": "qwen2.5-3b", "7b": "qwen2.5-7b"}
# The FedAgent paper's settings on WebShop (FedAgentGym §5 and the reference runs), as run-config values.
PAPER_ROUND = {"env": "webshop", "tasks-per-epoch": 64, "group-size": 8, "history-length": 2, "max-steps": 15,
               "max-new-tokens": 128, "rollout-batch-size": 128, "minibatch-size": 64, "micro-batch-size": 8,
               "learning-rate": 1e-6, "kl-beta": 0.01, "temperature": 0.4, "local-epochs": 1}
# A shape small enough for a CPU test: the script's every path, in seconds.
TINY = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
            tie_word_embeddings=True)


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
    setattr(obj, name, wrapper)


def run_round(cfg: RunConfig, shape: str, device: torch.device, seed: int) -> dict:
    env = make_env(cfg.env, cfg.max_steps)
    tokenizer = environment_tokenizer(cfg.env)
    model = build_model(shape, tokenizer, device, seed)
    shape_facts = ModelShape.of(model.config)
    eval_tasks = env.tasks_of_split("test")[:16]
    client_plan, _ = cfg.memory_plans(shape_facts, context_tokens(cfg, tokenizer, env, eval_tasks))

    lora = attached_lora(model, cfg.lora_spec(), seed=seed) if cfg.finetuning == "lora" else contextlib.nullcontext()
    with lora as peft_model:
        trained = peft_model if peft_model is not None else model
        memory = PeakMemory(device)
        trainer = GRPOTrainer(trained, tokenizer, cfg.grpo_config(), cfg.rollout_config())
        clock: dict[str, float] = defaultdict(float)
        timed_method(trainer, "_logprobs", clock)
        rng = np.random.default_rng(seed)
        grpo = cfg.grpo_config()
        pool = env.tasks_of_split("train")
        chosen = [pool[i] for i in rng.choice(len(pool), size=grpo.tasks_per_epoch, replace=True)]
        episodes = [t for t in chosen for _ in range(grpo.group_size)]

        with memory.phase("rollout"):
            started = time.perf_counter()
            with autocast(grpo.precision, device):
                trajectories = run_episodes(trainer.policy, lambda: make_env(cfg.env, cfg.max_steps), episodes,
                                            trainer.encoder, cfg.rollout_config())
            rollout_s = time.perf_counter() - started
        steps = [s for t in trajectories for s in t.steps if s.completion_ids]
        samples = [StepSample(s.prompt_ids, s.completion_ids, float(a)) for s, a in zip(steps, rng.standard_normal(len(steps)))]
        before = [p.detach().clone() for p in trained.parameters() if p.requires_grad][:1]
        with memory.phase("update"):
            started = time.perf_counter()
            stats = trainer.update(samples, rng)
            update_s = time.perf_counter() - started
        moved = float((before[0] != [p for p in trained.parameters() if p.requires_grad][0].detach()).float().mean())

        with memory.phase("transfer"):
            started = time.perf_counter()
            sent = encode(adapter_to_arrays(peft_model) if peft_model is not None else model_to_arrays(model), cfg.transfer_dtype)
            sent_payload, sent_wire = payload_bytes(sent), wire_bytes(sent)
            received = decode(sent, cfg.transfer_dtype)
            if peft_model is not None:
                arrays_to_adapter(peft_model, received)
            else:
                arrays_to_model(model, received)
            if device.type == "cuda":
                torch.cuda.synchronize()
            transfer_s = time.perf_counter() - started

    generated = sum(len(s.completion_ids) for s in steps)
    logprob_s = clock["_logprobs"]
    return {
        "shape": shape, "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "parameters": shape_facts.parameters, "finetuning": cfg.finetuning, "precision": cfg.resolved_precision(),
        "gradient_checkpointing": cfg.gradient_checkpointing, "transfer_dtype": cfg.transfer_dtype,
        "episodes": len(episodes), "agent_steps": len(steps), "generated_tokens": generated,
        "rollout_s": round(rollout_s, 3), "logprobs_s": round(logprob_s, 3), "update_s": round(update_s - logprob_s, 3),
        "transfer_s": round(transfer_s, 3), "generated_tokens_per_s": round(generated / max(rollout_s, 1e-9), 1),
        "optimizer_steps": int(stats["optimizer_steps"]), "grad_norm": stats["grad_norm"],
        "fraction_of_a_trained_tensor_moved": moved, "bytes_sent": sent_payload, "wire_bytes_sent": sent_wire,
        "peak_bytes": memory.peaks, "peak_bytes_measured_by": "cuda allocator" if memory.cuda else "process peak RSS",
        "plan_bytes": client_plan.as_dict(),
    }


def format_report(r: dict) -> str:
    plan, peak = r["plan_bytes"]["total"], max(r["peak_bytes"].values())
    rows = [
        f"shape {r['shape']} ({r['parameters'] / 1e6:,.1f}M parameters) on {r['device']}: {r['finetuning']}, {r['precision']}, "
        f"gradient checkpointing {r['gradient_checkpointing']}, transfer {r['transfer_dtype']}",
        f"  episodes {r['episodes']}, agent steps {r['agent_steps']}, generated tokens {r['generated_tokens']:,}",
        f"  rollout   {r['rollout_s']:10.2f} s   ({r['generated_tokens_per_s']:,.1f} generated tokens/s)",
        f"  log-probs {r['logprobs_s']:10.2f} s",
        f"  update    {r['update_s']:10.2f} s   ({r['optimizer_steps']} optimizer steps, grad norm {r['grad_norm']:.3g}, "
        f"{100 * r['fraction_of_a_trained_tensor_moved']:.1f}% of a trained tensor moved)",
        f"  transfer  {r['transfer_s']:10.2f} s   ({r['bytes_sent'] / 1e6:,.1f} MB of tensors sent, {r['wire_bytes_sent'] / 1e6:,.1f} MB serialized)",
        "  peak memory by phase (" + r["peak_bytes_measured_by"] + "): "
        + ", ".join(f"{k} {v / GB:.2f} GiB" for k, v in r["peak_bytes"].items()),
        f"  memory plan estimate {plan / GB:.2f} GiB vs measured peak {peak / GB:.2f} GiB",
    ]
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", choices=list(SHAPE_NAMES), default="tiny")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a run-config value over the paper's round (repeatable), e.g. --set finetuning=lora")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print one JSON line instead of the table")
    args = parser.parse_args(argv)
    try:
        overrides = parse_overrides(args.set)
        cfg = RunConfig.from_run_config(PAPER_ROUND | overrides | {"device": args.device})
        device = pick_device(args.device)
    except ValueError as err:
        parser.error(str(err))
    result = run_round(cfg, args.shape, device, args.seed)
    print(json.dumps(result) if args.json else format_report(result), flush=True)
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
