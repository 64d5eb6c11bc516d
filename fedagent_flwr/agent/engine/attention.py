"""Which fused attention kernel the passes whose shapes change from call to call may use on a GPU.

PyTorch's scaled_dot_product_attention prefers cuDNN's fused attention on Hopper cards. cuDNN builds an execution
plan for every new combination of batch, query and key lengths (tens to hundreds of milliseconds on the host, and
on a fresh machine runtime-compiled kernels besides), and caches it by shape. A decode step replayed from a CUDA
graph always has the same shapes, so it pays once. The training passes do not: a micro-batch is padded to its own
longest sample, so nearly every micro-batch, forward and backward, has a shape not seen before; so does every
rollout turn's prefill and every step of the transformers decode loop (its key length grows). These passes run
with cuDNN's backend excluded: flash attention where it applies (no mask), else the memory-efficient kernel, which
takes any mask and any length with no plan to build.

`AVOID_CUDNN` is a module switch so that a benchmark can measure the cuDNN backend against this choice
(benchmarks/update_profile.py's variant key cudnn-attention=true, gpu_round.py --cudnn-attention). On a CPU nothing
changes (no cuDNN attention there).
"""

from __future__ import annotations

import contextlib

import torch
from fedagent_flwr.config.choices import TRAINING_ATTENTIONS

AVOID_CUDNN = True


def variable_shape_attention(device: torch.device) -> contextlib.AbstractContextManager:
    """The context a pass of changing shapes runs in: on CUDA, SDPA without the cuDNN backend; elsewhere nothing."""
    if device.type != "cuda" or not AVOID_CUDNN:
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])


@contextlib.contextmanager
def training_attention(model: torch.nn.Module, name: str):
    """`model` (a transformers model, or a PEFT wrapper of one) computes attention with transformers' `name` kernel for
    the duration, then with the one it had.

    Why eager on a CPU: at an agent step's few hundred tokens, SDPA's CPU flash kernel is slow above all backward; on
    an AMD EPYC its backward took 19 % of a profiled update micro-batch of the SmolLM2 preset (its forward 7 %), for
    attention FLOPs about 6 % of the weights' (docs/performance.md), where eager's batched matrix products and softmax
    are ordinary kernels: the update and the fine-tuning ran 1.10x and 1.14x faster with it there. So only the passes
    that take a gradient use it. Eager keeps the softmax's [heads, tokens, tokens] output for backward (the memory
    plan counts it) and rounds the scores to the compute dtype before the softmax, which SDPA does not: the same
    function up to float rounding, not the same numbers."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    before = base.config._attn_implementation
    if name not in TRAINING_ATTENTIONS:
        raise ValueError(f"engine.attn-implementation={name!r} is not allowed: expected {' | '.join(TRAINING_ATTENTIONS)}")
    if name == before:
        yield
        return
    base.set_attn_implementation(name)
    try:
        yield
    finally:
        base.set_attn_implementation(before)
