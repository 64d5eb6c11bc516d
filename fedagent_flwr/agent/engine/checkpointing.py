"""Activation (gradient) checkpointing for GRPO's update: every decoder layer, or per micro-batch only as many as
memory needs.

transformers checkpoints all decoder layers or every n-th. A round's micro-batches differ widely in length, and a plan
must fit the longest one at the run's full context, so checkpointing every layer makes the short ones, which most
are, pay the recompute (a third more compute) for memory they do not need. With `mode = "fitted"` (what the
placement resolves engine.gradient-checkpointing = auto to where it knows the memory), before each micro-batch `fit` checkpoints its first k layers only, k the fewest for which its activations (estimated as the memory
plan estimates them, agent/engine/memory.py) fit `room_bytes`. The first layers are the ones checkpointed because backward
reaches them last, when every later layer's activations are already freed, so their recompute adds nothing to the
peak. Which layers are recomputed changes only float rounding at most: the update is the same (tests/agent/
test_checkpointing.py). transformers reads each layer's own `gradient_checkpointing` flag at call time
(GradientCheckpointingLayer), which is what `fit` sets.
"""

from __future__ import annotations

import contextlib

import torch

from fedagent_flwr.agent.engine.memory import LayerActivations, ModelShape, layer_activations, layers_to_checkpoint
from fedagent_flwr.config.choices import RESOLVED_CHECKPOINTING


class Checkpointing:
    """What `activation_checkpointing` yields: `fit(tokens)` before each micro-batch's forward; `counts`, the layers
    checkpointed in each micro-batch so far."""

    def __init__(self, layers: list[torch.nn.Module], shape: ModelShape | None, room_bytes: float | None,
                 per_token: LayerActivations | None) -> None:
        self.layers = layers
        self.shape = shape
        self.room_bytes = room_bytes
        self.per_token = per_token
        self.counts: list[int] = []

    def fit(self, tokens: int) -> int:
        """Checkpoint the fewest leading layers that fit a micro-batch of `tokens` positions (rows x padded width);
        returns how many. Without a room (mode True, or no memory known) every layer stays checkpointed."""
        k = len(self.layers)
        if self.shape is not None and self.room_bytes is not None and self.per_token is not None:
            k = layers_to_checkpoint(self.shape, tokens, self.room_bytes, self.per_token)
            for i, layer in enumerate(self.layers):
                layer.gradient_checkpointing = i < k
        self.counts.append(k)
        return k


@contextlib.contextmanager
def activation_checkpointing(model, mode: bool | str, room_bytes: float | None, precision: str,
                             param_dtype: str = "fp32"):
    """Checkpointing switched on for the block (mode True or "fitted"), off again after it; yields a `Checkpointing`,
    or None for mode False. `precision` and `param_dtype` say what a layer keeps (memory.layer_activations). transformers checkpoints only in training mode; the models trained here have no dropout
    to switch on (a model with dropout is refused), so training mode changes nothing else."""
    if not any(mode is m if isinstance(m, bool) else mode == m for m in RESOLVED_CHECKPOINTING):
        raise ValueError(f"gradient_checkpointing must be one of {RESOLVED_CHECKPOINTING} (as placed), got {mode!r}")
    if mode is False:
        yield None
        return
    dropout = [getattr(model.config, k, 0.0) or 0.0 for k in ("attention_dropout", "hidden_dropout", "dropout")]
    if any(dropout):
        raise ValueError(f"engine.gradient-checkpointing needs a model without dropout (config dropout {dropout})")
    # transformers 5.24 renamed gradient checkpointing to activation checkpointing (the old names go in v6).
    if hasattr(model, "activation_checkpointing_enable"):
        enable, disable, kwargs = "activation_checkpointing_enable", "activation_checkpointing_disable", "activation_checkpointing_kwargs"
    else:
        enable, disable, kwargs = "gradient_checkpointing_enable", "gradient_checkpointing_disable", "gradient_checkpointing_kwargs"
    getattr(model, enable)(**{kwargs: {"use_reentrant": False}})
    from transformers.modeling_layers import GradientCheckpointingLayer

    layers = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]
    fitted = mode == "fitted" and room_bytes is not None and bool(layers)
    shape = ModelShape.of(model.config) if fitted else None
    per_token = layer_activations(shape, precision, param_dtype, *lora_adapter(model)) if fitted else None
    model.train()
    try:
        yield Checkpointing(layers, shape, room_bytes if fitted else None, per_token)
    finally:
        getattr(model, disable)()
        model.eval()


def lora_adapter(model) -> tuple[tuple[str, ...] | str | None, int]:
    """The module names a PEFT model's active LoRA adapter targets and its rank; (None, 0) for a model trained whole."""
    configs = getattr(model, "peft_config", None)
    if not configs:
        return None, 0
    config = configs[getattr(model, "active_adapter", "default")]
    targets = config.target_modules
    return (targets if isinstance(targets, str) else tuple(sorted(targets))), config.r
