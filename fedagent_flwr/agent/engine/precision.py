"""Numeric precision of training and generation: fp32, bf16 autocast over fp32 weights (bf16-mixed), or a LoRA
adapter in fp32 over a frozen base held in bf16 (bf16-base).

Why not plain bf16 weights: a bf16 number keeps 8 bits of mantissa, so a weight of size 0.02 moves
in steps of about 1e-4. AdamW at the papers' learning rate 1e-6 moves every weight by about 1e-6 a
step, which rounds back to the same bf16 number: a pure-bf16 model barely trains at all (measured in
tests/agent/test_precision.py). bf16-mixed keeps the weights, gradients and optimizer states in fp32 and
runs the forward passes (rollouts, log-probs, losses) under torch.autocast in bf16, the way
mixed-precision training is done elsewhere (PyTorch AMP, transformers' `bf16=True`).

bf16-base is for LoRA only: the frozen base takes no optimizer steps, so the spacing argument above does not
apply to it, and holding it in bf16 halves its memory (a 7B base: 14 GiB instead of 28) and spares autocast its
per-forward casts of frozen weights. The adapter - the only tensors AdamW moves - and its optimizer states stay
fp32, and the forward passes run under bf16 autocast as with bf16-mixed. The base is loaded in bf16
(`load_agent(..., base_dtype(precision))`), so a process's fp32 copy of the same model is never converted.
"""

from __future__ import annotations

import contextlib

import torch
from fedagent_flwr.config.choices import ALL_PRECISIONS, BF16_PRECISIONS, RESOLVED_PRECISIONS


def autocast(precision: str, device: torch.device) -> contextlib.AbstractContextManager:
    """The context forward passes run in: bf16 autocast for bf16-mixed and bf16-base, nothing for fp32."""
    if precision in BF16_PRECISIONS:
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    if precision != "fp32":
        raise ValueError(f"precision must be resolved to {' | '.join(RESOLVED_PRECISIONS)}, got {precision!r}")
    return contextlib.nullcontext()


def base_dtype(precision: str) -> torch.dtype:
    """The dtype the base model is loaded in: bf16 for bf16-base, fp32 otherwise (agent/models/pretrained.py: load_model)."""
    if precision not in ALL_PRECISIONS:
        raise ValueError(f"precision={precision!r} is not allowed: expected {' | '.join(ALL_PRECISIONS)}")
    return torch.bfloat16 if precision == "bf16-base" else torch.float32


def compute_precision(precision: str) -> str:
    """fp32 or bf16-mixed: what the forward passes run in, for code that knows only those two (bf16-base computes
    as bf16-mixed does; its difference is the base's storage)."""
    return "bf16-mixed" if precision == "bf16-base" else precision


def check_trainable_precision(model: torch.nn.Module, precision: str) -> None:
    """bf16-base trains only fp32 tensors (a LoRA adapter) over a bf16 base; refuse a model that is not that: bf16
    trained weights would not move at lr 1e-6, and an fp32 base would cost the memory the plan did not count."""
    if precision != "bf16-base":
        return
    trained = {p.dtype for p in model.parameters() if p.requires_grad}
    if trained - {torch.float32}:
        raise ValueError(f"precision='bf16-base' trains fp32 tensors only (grpo.finetuning='lora': an fp32 adapter over the "
                         f"bf16 base); this model trains {sorted(map(str, trained))}")
    embedding = model.get_input_embeddings().weight
    if embedding.dtype != torch.bfloat16:
        raise ValueError(f"precision='bf16-base' but the base holds {embedding.dtype} weights: load it with "
                         f"load_agent(..., base_dtype('bf16-base'))")


def model_device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device
