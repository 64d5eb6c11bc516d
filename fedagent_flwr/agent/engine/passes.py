"""How GRPO's training passes compute: every choice of the log-prob and update passes that is not the algorithm.

The trainer (agent/training/grpo.py) writes the algorithm out: minibatches, micro-batches, the loss, backward, the
optimizer step. Around those lines a GPU run needs numeric precision, a bf16 working copy of the weights, fused
kernels, activation checkpointing and an attention-kernel rule; each is a context or a call at a precise place, and
interleaved with the algorithm they hid it. `TrainingPasses` holds them all, so the trainer calls a few methods:

    passes = TrainingPasses.of(engine, placement, device)  # the run config's engine section, the process's placement
    optimizer = passes.optimizer(params, lr, weight_decay)
    with passes.scoring(model):                           # no-grad log-prob passes (reference=True: a frozen copy)
        with passes.forward():
            logprobs = completion_logprobs(..., padding_mask=passes.padding_mask)
    with passes.update(model) as update:                 # checkpointing, kernels, working copy
        with update.forward(batch):                       # fits checkpointing to the batch; autocast
            loss = ...
        update.backward(loss)
        with update.optimizer_step():                     # masters in view; working copy refreshed after
            clip_grad_norm_(...); optimizer.step()

Three diagnostic switches (TrainingPasses' docstring) put back what the passes did before a change, so that a
benchmark measures the change by setting a PassSwitches field instead of patching the code.

Which SDPA backends the passes may use (cuDNN's attention or not) stays attention.py's module switch AVOID_CUDNN: the
rollout's passes read it too.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import torch

from fedagent_flwr.agent.engine.attention import training_attention, variable_shape_attention
from fedagent_flwr.agent.engine.checkpointing import Checkpointing, activation_checkpointing
from fedagent_flwr.agent.engine.kernels import training_kernels
from fedagent_flwr.agent.engine.master_weights import Bf16WorkingCopy, bf16_view
from fedagent_flwr.agent.engine.precision import autocast


def wait_for_device(device: torch.device) -> None:
    """The host waits until `device` has done all the work queued on it (nothing to wait for on a CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def adamw(params: list[torch.nn.Parameter], lr: float, weight_decay: float, fused: bool = True) -> torch.optim.AdamW:
    """PyTorch's AdamW. fused: on a GPU its fused kernel, which updates every tensor in one pass over the weights,
    gradients and both moments (transformers' Trainer and so TRL's trainers use it by default from torch 2.8);
    elsewhere its reference loop, as before: the CPU jobs' numbers stay exactly as they were (the fused kernel's
    rounding differs). Not fused: PyTorch's default everywhere (the fused_adamw=False diagnostic)."""
    on_gpu = fused and bool(params) and all(p.device.type == "cuda" for p in params)
    return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, fused=True if on_gpu else None)


@dataclass(frozen=True)
class PassSwitches:
    """The diagnostic switches (TrainingPasses' docstring): no run-config keys; a benchmark sets them to measure a
    change side by side (benchmarks/update_profile.py)."""

    fused_adamw: bool = True
    host_waits: bool = False
    padding_mask: bool = False


@dataclass
class TrainingPasses:
    """How GRPO's log-prob and update passes compute (the module's docstring shows the calls the trainer makes).

    precision: fp32 | bf16-mixed | bf16-base (agent/engine/precision.py); param_dtype: fp32 | bf16, the latter a bf16
    working copy over fp32 masters (agent/engine/master_weights.py); training_kernels: eager | compile | liger
    (agent/engine/kernels.py); gradient_checkpointing: False | True | "fitted", fitted within activation_room_bytes
    (agent/engine/checkpointing.py); attention: the update's forward passes' attention kernel, sdpa | eager
    (attention.training_attention); logprob_chunk_tokens: completion tokens the output head scores at a time, 0 =
    the whole logits (tokens.chunked_completion_logprobs); shared_prompt_prefix: the prompts' shared prefix computed
    once a pass (tokens.collate's share_prefix), the same values up to rounding.

    The diagnostic switches, each putting back what the passes did before a change, side by side in one process
    (benchmarks/update_profile.py's keys host-waits, fused-adamw, padding-mask). Their defaults are what runs use:

    - fused_adamw (True): PyTorch's fused AdamW on a GPU, its reference loop elsewhere (`adamw`); False = PyTorch's
      default AdamW everywhere (on a GPU a loop over tensor lists), what the update stepped with before.
    - host_waits (False): True = the host waits for the device before and after every forward pass (the log-prob and
      update passes'), as the passes did before they queued all their micro-batches (docs/gpu-measurements.md). The
      wait is `wait_for_device`, the hook the tests count.
    - padding_mask (False): True = right-padded batches reach a Qwen model with the 4-D causal-and-padding mask (the
      memory-efficient attention kernel, the mask kept per head), as before tokens.py's mask mapping; handed down to
      completion_logprobs by the trainer.
    """

    device: torch.device
    precision: str
    param_dtype: str = "fp32"
    training_kernels: str = "eager"
    gradient_checkpointing: bool | str = False
    activation_room_bytes: float | None = None
    attention: str = "sdpa"
    logprob_chunk_tokens: int = 0
    shared_prompt_prefix: bool = False
    fused_adamw: bool = True
    host_waits: bool = False
    padding_mask: bool = False
    # the model an update holds its kernels on: its log-prob passes inside the update must not enter them again,
    # since leaving a nested training_kernels would switch the compiled layers back to eager for the rest of it
    _updating: torch.nn.Module | None = field(default=None, init=False, repr=False, compare=False)

    @classmethod
    def of(cls, engine, placement, device: torch.device, switches: PassSwitches = PassSwitches()) -> TrainingPasses:
        """The passes on `device` that the run config's engine section (config.EngineSection) and the process's
        placement (placement.Placement: what its `auto` resolved to) ask for."""
        return cls(device=device, precision=placement.precision, param_dtype=placement.param_dtype,
                   training_kernels=engine.training_kernels, attention=engine.attn_implementation,
                   gradient_checkpointing=placement.gradient_checkpointing,
                   activation_room_bytes=placement.activation_room_bytes,
                   logprob_chunk_tokens=engine.logprob_chunk_tokens, shared_prompt_prefix=engine.shared_prompt_prefix,
                   fused_adamw=switches.fused_adamw, host_waits=switches.host_waits, padding_mask=switches.padding_mask)

    def optimizer(self, params: list[torch.nn.Parameter], lr: float, weight_decay: float) -> torch.optim.AdamW:
        return adamw(params, lr, weight_decay, fused=self.fused_adamw)

    @contextlib.contextmanager
    def forward(self) -> Iterator[None]:
        """What a forward pass (and the loss computed from it) runs in: autocast of the precision; backward runs
        outside it, as PyTorch advises. With host_waits, a wait for the device before and after."""
        if self.host_waits:
            wait_for_device(self.device)
        with autocast(self.precision, self.device):
            yield
        if self.host_waits:
            wait_for_device(self.device)

    @contextlib.contextmanager
    def scoring(self, model: torch.nn.Module, reference: bool = False) -> Iterator[None]:
        """What no-grad log-prob passes over `model` run in: the training kernels. reference=True: `model` is a frozen
        copy (the KL reference), which under param_dtype bf16 computes on bf16 copies of its weights, as the policy's
        working copy does, or the KL would see rounding."""
        kernels = training_kernels(model, self.training_kernels) if model is not self._updating else contextlib.nullcontext()
        view = bf16_view(model) if reference and self.param_dtype == "bf16" else contextlib.nullcontext()
        with view, kernels:
            yield

    @contextlib.contextmanager
    def update(self, model: torch.nn.Module) -> Iterator[UpdatePasses]:
        """What an update of `model` runs in, entered in this order: activation checkpointing (training mode for
        transformers' checkpointing; eval again after), the training kernels, and under param_dtype bf16 the working
        copy (its fp32 gradients accumulated over micro-batches)."""
        working_copy = Bf16WorkingCopy(model) if self.param_dtype == "bf16" else contextlib.nullcontext()
        with activation_checkpointing(model, self.gradient_checkpointing, self.activation_room_bytes, self.precision,
                                      self.param_dtype) as ckpt, \
                training_kernels(model, self.training_kernels), working_copy as working:
            self._updating = model
            try:
                yield UpdatePasses(self, model, ckpt, working)
            finally:
                self._updating = None


class UpdatePasses:
    """What `TrainingPasses.update` yields: the update's forward, backward and optimizer step (padding_mask: as the
    passes')."""

    def __init__(self, passes: TrainingPasses, model: torch.nn.Module, ckpt: Checkpointing | None,
                 working: Bf16WorkingCopy | None) -> None:
        self.passes = passes
        self.model = model
        self.ckpt = ckpt
        self.working = working
        self.padding_mask = passes.padding_mask

    @contextlib.contextmanager
    def forward(self, batch: dict[str, torch.Tensor]) -> Iterator[None]:
        """A micro-batch's forward context (TrainingPasses.forward) under the passes' attention kernel, checkpointing
        fitted to it first: under "fitted", only as many layers as this micro-batch's padded length needs. The backward
        needs no kernel set: autograd keeps what the forward ran."""
        if self.ckpt is not None:
            self.ckpt.fit(batch["input_ids"].numel())
        with training_attention(self.model, self.passes.attention), self.passes.forward():
            yield

    def backward(self, loss: torch.Tensor) -> None:
        # A checkpointed layer runs its forward again inside backward: it must pick the attention kernel the first
        # forward picked, or torch's checkpoint finds other saved tensors and stops (seen on an H100, where cuDNN's
        # attention is allowed outside this context: attention.py)
        with variable_shape_attention(self.passes.device):
            loss.backward()

    @contextlib.contextmanager
    def optimizer_step(self) -> Iterator[None]:
        """Clip and step inside: under param_dtype bf16 they act on the fp32 masters and their fp32 gradients, and
        the working copies take the stepped masters after."""
        if self.working is not None:
            self.working.master_view()
        yield
        if self.working is not None:
            self.working.refresh()

    @property
    def checkpointed_layers(self) -> float | None:
        """The share of layer passes that recomputed so far (1.0 = every layer, as with True); None without
        checkpointing."""
        if self.ckpt is None:
            return None
        return float(np.mean(self.ckpt.counts)) / max(1, len(self.ckpt.layers)) if self.ckpt.counts else 0.0
