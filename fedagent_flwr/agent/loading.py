"""The agent a process works with: model, tokenizer and base-weight fingerprint.

Loading is cached per process (a Ray worker in simulation, a SuperNode's
ClientApp process in deployment), so rounds reuse the loaded model instead of
reloading it for every message. Every round overwrites the weights with the
global ones, so reuse never leaks one round's local weights into the next.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch

from fedagent_flwr.agent.models import (
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
    base_fingerprint: str  # of the weights as loaded, before any training


@lru_cache(maxsize=2)
def load_agent(model_name: str, env: str, device: str) -> Agent:
    spec = resolve_model(model_name, env)
    dev = pick_device(device)
    model = load_model(spec, dev)
    tokenizer = load_tokenizer(spec)
    return Agent(model=model, tokenizer=tokenizer, spec=spec, device=dev, base_fingerprint=fingerprint(model))
