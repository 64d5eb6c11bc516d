"""Which kernels the decoder layers run with in the training passes: GRPO's log-prob and update passes.

Why this exists: on an H100 the 1.5B update ran at 21.9 % model FLOP utilisation and the log-prob passes at 31.0 %
(docs/gpu-measurements.md). Between the GEMMs, a layer spends its time in small elementwise kernels: RMSNorm in fp32, SwiGLU,
RoPE and autocast's copies, each one a separate read and write of the activations. Two ways to fuse them:

- "compile": `torch.compile` of each decoder layer (regional compilation: the layers are instances of one class, so
  they share one compiled graph, and a model of any depth compiles about as fast as one layer). Shapes are
  dynamic: every micro-batch is padded to its own length, and a compile per length would cost more than it saves.
  The compiled layers are switched on only inside `training_kernels(...)`: a rollout step's shapes change at every
  token (the transformers loop) or run in a decoder of their own (agent/engine/decode.py), and neither should compile.
- "liger": Liger-Kernel's Triton RMSNorm, SwiGLU and RoPE, patched into the model for good (CUDA only, Qwen2 and
  Llama models; `pip install liger-kernel`). Liger's fused linear cross-entropy is not used: the log-prob passes
  score the head themselves (tokens.py) and need per-token log-probabilities, not a loss.
- "eager": the transformers modules as they are (the default; what every earlier run used).

The compiled and Liger layers compute the same function up to float rounding; tests/agent/test_kernels.py checks
log-probs and gradients against eager. Whether either is faster is a GPU measurement
(`benchmarks/update_profile.py ... --variant engine.training-kernels=compile`, docs/gpu-measurements.md).
"""

from __future__ import annotations

import contextlib
import types
import weakref

import torch
from fedagent_flwr.config.choices import TRAINING_KERNELS

# Liger's entry point per transformers model type: the architectures our models have (agent/models/pretrained.py).
_LIGER_PATCHES = {"qwen2": "apply_liger_kernel_to_qwen2", "llama": "apply_liger_kernel_to_llama"}
# One compiled forward per layer class, bound to each layer as it is switched on: every layer and every entry into
# `training_kernels` reuses it (and dynamo's cache of graphs) rather than compiling anew.
_COMPILED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _base(model: torch.nn.Module) -> torch.nn.Module:
    """The transformers model under a PEFT wrapper (LoRA layers live inside its modules)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The repeated transformer blocks of a causal LM (model.model.layers for Qwen2 and Llama)."""
    inner = _base(model)
    body = inner.get_decoder() if hasattr(inner, "get_decoder") else None
    layers = getattr(body, "layers", None)
    if not isinstance(layers, torch.nn.ModuleList) or len(layers) == 0:
        raise ValueError(f"engine.training-kernels: {type(inner).__name__} has no list of decoder layers to compile or patch; "
                         f"use engine.training-kernels='eager'")
    return list(layers)


def check_training_kernels(kind: str, device: torch.device) -> None:
    """Refuse a kernel choice this machine cannot run, before any work starts."""
    if kind not in TRAINING_KERNELS:
        raise ValueError(f"engine.training-kernels must be one of {' | '.join(TRAINING_KERNELS)}, got {kind!r}")
    if kind != "liger":
        return
    if device.type != "cuda":
        raise ValueError(f"engine.training-kernels='liger' runs Triton kernels on a CUDA device; this run's device is "
                         f"{device.type!r}: use 'eager' or 'compile'")
    try:
        import liger_kernel.transformers  # noqa: F401
    except ImportError as err:
        raise ValueError(f"engine.training-kernels='liger' needs the liger-kernel package ({err}); pip install liger-kernel, "
                         f"or use 'eager' or 'compile'") from err


def apply_liger(model: torch.nn.Module) -> None:
    """Patch Liger's RMSNorm, SwiGLU and RoPE into `model` (and, Liger's way, into the modeling module it came from)."""
    import liger_kernel.transformers as liger

    inner = _base(model)
    model_type = getattr(inner.config, "model_type", None)
    if model_type not in _LIGER_PATCHES:
        raise ValueError(f"engine.training-kernels='liger': no Liger patch for model type {model_type!r} here; "
                         f"supported: {', '.join(_LIGER_PATCHES)}")
    getattr(liger, _LIGER_PATCHES[model_type])(rope=True, rms_norm=True, swiglu=True, cross_entropy=False,
                                               fused_linear_cross_entropy=False, model=inner)


@contextlib.contextmanager
def training_kernels(model: torch.nn.Module, kind: str):
    """The context the training passes run in. "compile" switches each decoder layer to its compiled forward for
    the duration and back to eager after; "eager" and "liger" (already patched in by `apply_liger`) change nothing."""
    if kind != "compile":
        yield
        return
    layers = decoder_layers(model)
    for layer in layers:
        cls = type(layer)
        if cls not in _COMPILED:
            # Module.__call__ runs its hooks and then forward: compiling forward leaves hooks and transformers'
            # checkpointing wrapper (GradientCheckpointingLayer.__call__) outside the compiled region.
            _COMPILED[cls] = torch.compile(cls.forward, dynamic=True)
        layer.forward = types.MethodType(_COMPILED[cls], layer)
    try:
        yield
    finally:
        for layer in layers:
            # the instance attribute shadowed the class's forward; removing it restores eager
            layer.__dict__.pop("forward", None)
