"""bf16 working weights over fp32 master weights, for GRPO's log-prob and update passes (engine.param-dtype = "bf16").

Under bf16 autocast (PyTorch AMP, engine.param-dtype = "fp32") the model keeps its fp32 weights and autocast casts each of
them to bf16 for every forward pass; everything autocast does not cast stays fp32: the embedding's output, so the
whole residual stream, the norms' weights and their products. The backward pass then casts every weight's bf16
gradient back to fp32 before adding it to `.grad`. Counted op by op on CPU (benchmarks/update_traffic.py), those casts
and fp32 activations are about a third of the bytes a 1.5B-shaped micro-batch moves outside its matrix multiplies, and
a GPU spends most of an update's time on such memory-bound operations (docs/gpu-measurements.md).

FSDP's mixed precision (`param_dtype=torch.bfloat16`) and Megatron's bf16 training instead compute with a bf16 copy
of the weights and keep fp32 "master" weights for the optimizer; this module does the same for one process. While
the passes run, every parameter's `.data` is its bf16 working copy, so the model computes in bf16 throughout; after
each parameter's gradient is accumulated, a hook adds it to an fp32 gradient and frees the bf16 one, so gradients
accumulate over micro-batches in fp32 (as Megatron's main_grad). For the optimizer step the parameters show their
fp32 master tensors and gradients again (the same Parameter objects AdamW was built on, so its state, fused kernel and
gradient clipping are untouched), and after it the working copies are refreshed from the masters. Why fp32 masters at
all: AdamW's steps at lr 1e-6 round away in bf16 (agent/engine/precision.py).
"""

from __future__ import annotations

import contextlib

import torch


class Bf16WorkingCopy:
    """The trained model's parameters computing in bf16 over fp32 masters. Use as a context manager around the passes;
    call `master_view()` before clipping and stepping and `refresh()` after."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.params = [p for p in model.parameters() if p.is_floating_point()]
        if any(p.dtype != torch.float32 for p in self.params):
            raise ValueError("engine.param-dtype='bf16' keeps fp32 master weights: the model must hold fp32 weights")
        self.master = [p.data for p in self.params]
        self.work: list[torch.Tensor] = []
        self.grads: list[torch.Tensor | None] = [None] * len(self.params)
        self.hooks: list = []

    def __enter__(self) -> Bf16WorkingCopy:
        self.work = [m.to(torch.bfloat16) for m in self.master]
        for i, p in enumerate(self.params):
            p.data = self.work[i]
            if p.requires_grad:
                self.hooks.append(p.register_post_accumulate_grad_hook(self._accumulate(i)))
        return self

    def _accumulate(self, i: int):
        def hook(p: torch.nn.Parameter) -> None:
            if self.grads[i] is None:
                self.grads[i] = p.grad.float()
            else:
                self.grads[i].add_(p.grad)  # fp32 += bf16, upcast inside the kernel: no fp32 copy of the bf16 gradient
            p.grad = None
        return hook

    def master_view(self) -> None:
        """The parameters show their fp32 masters and accumulated fp32 gradients: clip and step as on an fp32 model."""
        for i, p in enumerate(self.params):
            p.data = self.master[i]
            p.grad = self.grads[i]

    def refresh(self) -> None:
        """After the optimizer step: the working copies take the stepped masters; gradients start again at zero."""
        for i, p in enumerate(self.params):
            self.work[i].copy_(self.master[i])
            p.data = self.work[i]
            p.grad = None
            self.grads[i] = None

    def __exit__(self, *exc) -> None:
        for h in self.hooks:
            h.remove()
        for i, p in enumerate(self.params):
            p.data = self.master[i]
            p.grad = self.grads[i]  # as after an fp32 update: the last step's gradients (None once refreshed)
        self.hooks, self.work, self.grads = [], [], [None] * len(self.params)


@contextlib.contextmanager
def bf16_view(model: torch.nn.Module):
    """A frozen model computing on bf16 copies of its weights for the block (the KL reference's no-grad pass, so that
    it computes as the policy's working copy does); its fp32 weights are back after it."""
    params = [p for p in model.parameters() if p.is_floating_point()]
    kept = [p.data for p in params]
    for p in params:
        p.data = p.data.to(torch.bfloat16)
    try:
        yield model
    finally:
        for p, data in zip(params, kept):
            p.data = data
