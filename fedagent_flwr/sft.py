"""Supervised fine-tuning on agent steps: negative log-likelihood of the completion tokens.

Used to warm-start tiny models by behaviour cloning the environment's scripted
expert (a random tiny model never emits a valid action, so RL alone learns nothing).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from .tokens import collate, completion_logprobs


@dataclass
class SFTConfig:
    steps: int = 300
    batch_size: int = 32
    learning_rate: float = 1e-3
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    seed: int = 0


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
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.learning_rate, weight_decay=config.weight_decay)
    model.train()
    losses = []
    for _ in range(config.steps):
        idx = rng.choice(len(samples), size=min(config.batch_size, len(samples)), replace=False)
        batch = collate([samples[i] for i in idx], pad_id)
        logprobs, mask = completion_logprobs(model, batch)
        loss = -(logprobs.sum() / mask.sum().clamp(min=1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.max_grad_norm)
        optimizer.step()
        losses.append(float(loss.detach()))
    model.eval()
    return losses
