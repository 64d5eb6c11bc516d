"""Supervised fine-tuning on agent steps: negative log-likelihood of the completion tokens.

Used to warm-start tiny models by behaviour cloning the environment's scripted
expert (a random tiny model never emits a valid action, so RL alone learns nothing).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from fedagent_flwr.agent.precision import autocast, model_device
from fedagent_flwr.agent.tokens import collate, completion_logprobs


@dataclass
class SFTConfig:
    steps: int = 300
    batch_size: int = 32
    learning_rate: float = 1e-3
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    seed: int = 0
    # Batches of similar length (as transformers' group_by_length): with prompts of very
    # different lengths (WebShop pages next to Maze lines) random batches are mostly padding.
    group_by_length: bool = False
    precision: str = "fp32"  # or "bf16-mixed": fp32 weights, forward under bf16 autocast (agent/precision.py)


def supervised_finetune(
    model: torch.nn.Module,
    samples: Sequence[tuple[Sequence[int], Sequence[int]]],
    pad_id: int,
    config: SFTConfig,
) -> list[float]:
    """Train on (prompt ids, completion ids) pairs; returns the loss of every step."""
    if not samples:
        raise ValueError("supervised_finetune needs at least one sample")
    rng = np.random.default_rng(config.seed)
    device = model_device(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.learning_rate, weight_decay=config.weight_decay)
    model.train()
    losses = []
    batches = _length_grouped_batches(samples, config.batch_size, rng) if config.group_by_length else None
    for _ in range(config.steps):
        if batches is not None:
            idx = next(batches)
        else:
            idx = rng.choice(len(samples), size=min(config.batch_size, len(samples)), replace=False)
        batch = collate([samples[i] for i in idx], pad_id)
        with autocast(config.precision, device):
            logprobs, mask = completion_logprobs(model, batch)
            loss = -(logprobs.sum() / mask.sum().clamp(min=1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.max_grad_norm)
        optimizer.step()
        losses.append(float(loss.detach()))
    model.eval()
    return losses


def _length_grouped_batches(samples: Sequence[tuple[Sequence[int], Sequence[int]]], batch_size: int,
                            rng: np.random.Generator, megabatch: int = 8):
    """Endless batches of indices: every epoch shuffles, sorts each run of `megabatch` batches by length,
    cuts it into batches and shuffles the batch order, so each batch holds samples of similar length."""
    lengths = np.array([len(p) + len(c) for p, c in samples])
    size = min(batch_size, len(samples))
    while True:
        order = rng.permutation(len(samples))
        batches = []
        for start in range(0, len(order), size * megabatch):
            chunk = order[start : start + size * megabatch]
            chunk = chunk[np.argsort(lengths[chunk], kind="stable")]
            batches.extend(chunk[i : i + size] for i in range(0, len(chunk), size))
        for b in rng.permutation(len(batches)):
            yield batches[b]
