"""One seed key for a client's round: task sampling (numpy) and rollout sampling (torch's global RNG)."""

from __future__ import annotations

import numpy as np
import torch


def seed_everything(*parts: int) -> np.random.Generator:
    """A generator for task sampling, and torch's global seed for rollout sampling, from one key."""
    seq = np.random.SeedSequence([abs(int(p)) for p in parts])
    torch.manual_seed(int(seq.generate_state(1)[0]))
    return np.random.default_rng(seq)
