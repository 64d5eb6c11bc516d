"""The agent a process works with: model, tokenizer and base-weight fingerprint.

Loading is cached per process (a Ray worker in simulation), so rounds reuse the loaded model instead of
reloading it for every message. Every round overwrites the weights with the global ones, so reuse never leaks
one round's local weights into the next. In deployment Flower (1.42) starts a fresh ClientApp process for
every message, whichever isolation mode the SuperNode runs (`flwr-clientapp` takes one token, runs one
message and exits), so nothing stays in memory between rounds there: the base fingerprint of a local model
folder is kept on disk instead, keyed by its weight files' names, sizes and modification times, which saves
hashing every weight again for every message (3.4 s for a 0.5B model on 2 cores).

The base's dtype is part of the cache key: precision='bf16-base' loads its own bf16 copy of the model
(`load_agent(..., base_dtype=torch.bfloat16)`) instead of converting the cached fp32 one, so a run in another
precision in the same process still gets fp32 weights. Both may be held at once (the cache keeps two agents).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import torch

from fedagent_flwr.agent.models.model_cache import default_cache_root
from fedagent_flwr.agent.models.pretrained import (
    ModelSpec,
    fingerprint,
    load_model,
    load_tokenizer,
    pick_device,
    resolve_model,
)


@dataclass
class Agent:
    model: torch.nn.Module
    tokenizer: object
    spec: ModelSpec
    device: torch.device
    base_fingerprint: str  # of the weights as loaded, before any training ("" on a client's rank: the client answers it)


def load_agent(model_name: str, env: str, device: str, base_dtype: torch.dtype = torch.float32) -> Agent:
    """The process's agent for a model, env, device and base dtype (precision.base_dtype), loaded once."""
    # One cache key however the dtype was passed (lru_cache keys a keyword apart from a positional argument).
    return _load_agent(model_name, env, device, base_dtype)


@lru_cache(maxsize=2)
def _load_agent(model_name: str, env: str, device: str, base_dtype: torch.dtype = torch.float32) -> Agent:
    spec = resolve_model(model_name, env)
    dev = pick_device(device)
    started = time.perf_counter()
    model = load_model(spec, dev, base_dtype)
    tokenizer = load_tokenizer(spec)
    # the on-disk memo is keyed by the base folder's files: a merged adapter changes the weights, so hash them afresh
    weights_print = base_fingerprint(spec.source, model) if spec.adapter is None else fingerprint(model)
    agent = Agent(model=model, tokenizer=tokenizer, spec=spec, device=dev, base_fingerprint=weights_print)
    # Once per process: in a deployment's logs, one line per ClientApp message shows the model reloaded
    # (stderr: commands that print JSON on stdout stay parseable).
    dtype = "" if base_dtype == torch.float32 else f" in {str(base_dtype).removeprefix('torch.')}"
    print(f"[fedagent] loaded {model_name}{dtype} on {dev} in {time.perf_counter() - started:.1f} s (process {os.getpid()})", file=sys.stderr, flush=True)
    return agent


# load_agent answers as the functools cache it fronts: callers and tests drop the process's agents through it, and
# a test that wants a second, separate cache builds one from the uncached loader (__wrapped__).
load_agent.cache_clear = _load_agent.cache_clear
load_agent.cache_info = _load_agent.cache_info
load_agent.__wrapped__ = _load_agent.__wrapped__


WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".json")


def base_fingerprint(source: str, model: torch.nn.Module) -> str:
    """fingerprint(model) of weights just loaded from `source`, remembered on disk for a local folder."""
    folder = Path(source)
    if not folder.is_dir():
        return fingerprint(model)
    files = sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in folder.iterdir() if p.suffix in WEIGHT_SUFFIXES)
    # The fingerprint hashes the weights as loaded, dtype included: a bf16 load has its own (fp32 keeps its old key).
    dtypes = sorted({str(t.dtype) for t in model.state_dict().values() if t.is_floating_point()} - {"torch.float32"})
    key = hashlib.sha256(json.dumps([str(folder.resolve()), files, *([dtypes] if dtypes else [])]).encode()).hexdigest()[:32]
    memo = default_cache_root() / "fingerprints" / f"{key}.txt"
    if memo.is_file():
        return memo.read_text().strip()
    value = fingerprint(model)
    memo.parent.mkdir(parents=True, exist_ok=True)
    tmp = memo.with_name(f".{memo.name}.{os.getpid()}")
    tmp.write_text(value)
    os.replace(tmp, memo)
    return value


@lru_cache(maxsize=1)
def load_frozen_base(model_name: str, env: str, device: str) -> torch.nn.Module:
    """A second copy of the base weights as loaded, never trained, for a KL term anchored to the run's initial model
    under full fine-tuning (grpo.kl-reference='base'). A separate load, because every round overwrites the agent's own
    model with the global weights; cached per process like the agent."""
    return frozen(load_model(resolve_model(model_name, env), pick_device(device)))


def frozen(model: torch.nn.Module) -> torch.nn.Module:
    """`model` in eval mode with no weight requiring grad (a KL anchor)."""
    for p in model.parameters():
        p.requires_grad_(False)
    return model.eval()
