"""Numeric precision of training and generation: fp32, or bf16 autocast over fp32 weights (bf16-mixed).

Why not plain bf16 weights: a bf16 number keeps 8 bits of mantissa, so a weight of size 0.02 moves
in steps of about 1e-4. AdamW at the papers' learning rate 1e-6 moves every weight by about 1e-6 a
step, which rounds back to the same bf16 number: a pure-bf16 model barely trains at all (measured in
tests/agent/test_precision.py). bf16-mixed keeps the weights, gradients and optimizer states in fp32 and
runs the forward passes (rollouts, log-probs, losses) under torch.autocast in bf16, the way
mixed-precision training is done elsewhere (PyTorch AMP, transformers' `bf16=True`).
"""

from __future__ import annotations

import contextlib

import torch

PRECISIONS = ("auto", "fp32", "bf16-mixed")  # run-config `precision`; auto = bf16-mixed on CUDA, fp32 on CPU


def resolve_precision(precision: str, on_cuda: bool) -> str:
    """'fp32' or 'bf16-mixed' for a run-config value and the device the model runs on."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision={precision!r} is not allowed: expected {' | '.join(PRECISIONS)}")
    if precision == "auto":
        return "bf16-mixed" if on_cuda else "fp32"
    return precision


def autocast(precision: str, device: torch.device) -> contextlib.AbstractContextManager:
    """The context forward passes run in: bf16 autocast for bf16-mixed, nothing for fp32."""
    if precision == "bf16-mixed":
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    if precision != "fp32":
        raise ValueError(f"precision must be resolved to fp32 or bf16-mixed, got {precision!r}")
    return contextlib.nullcontext()


def model_device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device
