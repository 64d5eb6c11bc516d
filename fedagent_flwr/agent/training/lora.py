"""LoRA adapters on the frozen base model (PEFT), and their Flower / disk forms.

The process-wide agent (agent/models/loading.py) holds one base model. `attached_lora` injects
a LoRA adapter into it for the duration of a `with` block and removes it again
afterwards (PEFT's `unload`, which does not merge), restoring every base
parameter's `requires_grad`: the cached base is the same object before and after,
so a later message in this process - of any strategy - sees the plain base model.

Adapters travel as ArrayRecords of exactly the tensors PEFT saves
(`get_peft_model_state_dict`: keys such as `...q_proj.lora_A.weight`), and are
saved as standard PEFT folders that `PeftModel.from_pretrained` loads.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from flwr.app import ArrayRecord

from fedagent_flwr.agent.fsdp.ranks import like
from fedagent_flwr.agent.fsdp.tensor_files import Streamed
from fedagent_flwr.agent.training.weights import gathered, numpy_views, streamed_record
from fedagent_flwr.config import LoRASection

# PEFT is imported where an adapter is made or read, not at the top: reading a run config must not pay for it
# (about 2 s of every process's start on 2 cores).
if TYPE_CHECKING:
    from peft import LoraConfig, PeftModel


def peft_config(lora: LoRASection) -> LoraConfig:
    """PEFT's LoraConfig for the run config's lora section (no dropout: the papers' adapters use none)."""
    from peft import LoraConfig

    targets = lora.targets if isinstance(lora.targets, str) else list(lora.targets)
    return LoraConfig(r=lora.r, lora_alpha=lora.lora_alpha, target_modules=targets, lora_dropout=0.0, bias="none",
                      task_type="CAUSAL_LM")


def keep_input_dtype(peft_model: torch.nn.Module) -> None:
    """Hand each adapter its input in the dtype it arrives in, not cast to the adapter's fp32 first.

    Why: under bf16 compute (bf16-base, bf16-mixed) every forward runs under bf16 autocast (engine/precision.py),
    which casts the adapter's input back to bf16 for its matmul: PEFT's cast to fp32 made two copies of each adapted
    layer's input to compute the same bf16 product (bitwise the same numbers; a SmolLM2 LoRA update 1.04x faster,
    docs/performance.md). In fp32 the input is already the adapter's dtype. A bf16 input met outside autocast by an
    fp32 adapter now fails loudly in its matmul instead of running in fp32."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    for module in peft_model.modules():
        if isinstance(module, BaseTunerLayer):
            module.cast_input_dtype_enabled = False


@contextlib.contextmanager
def attached_lora(model: torch.nn.Module, lora: LoRASection, seed: int = 0) -> Iterator[PeftModel]:
    """The base model with a fresh LoRA adapter (A seeded, B = 0) inside the block; plain base after."""
    grads = {name: p.requires_grad for name, p in model.named_parameters()}
    # PEFT draws A's initial values from the CPU generator (it builds the adapter's layers on the CPU before moving
    # them to the base layer's device). Seed that generator alone, inside a fork that restores it: the same seed
    # gives every process the same initial adapter, and the caller's random streams are left as they were.
    # torch.manual_seed would also reseed CUDA (every device, even lazily before CUDA starts), which
    # fork_rng(devices=[]) does not restore: a Fed-SE client seeds its exploration before it attaches the
    # adapter, so on a GPU every client in every round would have sampled from the one stream `seed` starts.
    with torch.random.fork_rng(devices=[]):
        torch.default_generator.manual_seed(seed)
        try:
            from peft import get_peft_model

            peft_model = get_peft_model(model, peft_config(lora))
        except ValueError as exc:  # PEFT names the missing modules; add the key that chose them
            raise ValueError(f"lora.target-modules={lora.target_modules!r} does not fit this model: {exc}") from None
    keep_input_dtype(peft_model)
    try:
        yield peft_model
    finally:
        peft_model.unload()
        for name, p in model.named_parameters():
            p.requires_grad_(grads.get(name, p.requires_grad))


def adapter_to_arrays(peft_model: PeftModel) -> ArrayRecord:
    """The adapter's tensors only (float32 on the CPU: bf16 has no numpy dtype). A sharded adapter is gathered by
    every rank alike, and kept by rank 0 alone (the others return an empty record), as model_to_arrays does."""
    return streamed_record(adapter_weights(peft_model))


def adapter_weights(peft_model: PeftModel) -> Streamed:
    """The adapter's tensors gathered one at a time, as model_weights streams a model's."""
    from peft import get_peft_model_state_dict

    return gathered(get_peft_model_state_dict(peft_model))


def arrays_to_adapter(peft_model: PeftModel, arrays: ArrayRecord | Mapping[str, np.ndarray]) -> None:
    from peft import get_peft_model_state_dict, set_peft_model_state_dict

    """Load an adapter; its keys must be exactly the model's adapter keys."""
    current = get_peft_model_state_dict(peft_model)
    with warnings.catch_warnings():  # views of the message's bytes (or of a mapped file): read, never written
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        incoming = {k: torch.from_numpy(v) for k, v in numpy_views(arrays).items()}
    missing, unexpected = sorted(set(current) - set(incoming)), sorted(set(incoming) - set(current))
    if missing or unexpected:
        raise ValueError(f"adapter does not fit the model (check lora.r / lora.target-modules): "
                         f"missing {missing[:3]}, unexpected {unexpected[:3]}")
    for k, v in incoming.items():
        if tuple(v.shape) != tuple(current[k].shape):
            raise ValueError(f"adapter tensor {k!r} has shape {tuple(v.shape)}, the model expects {tuple(current[k].shape)}")
    # a sharded adapter (a rank's model kept between rounds) takes each rank's part
    result = set_peft_model_state_dict(peft_model, {k: like(v.to(current[k].dtype), current[k]) for k, v in incoming.items()})
    if getattr(result, "unexpected_keys", None):
        raise ValueError(f"PEFT did not place adapter keys {result.unexpected_keys[:3]}")


def adapter_num_parameters(peft_model: PeftModel) -> int:
    from peft import get_peft_model_state_dict

    return sum(v.numel() for v in get_peft_model_state_dict(peft_model).values())


def save_adapter(peft_model: PeftModel, folder: Path, tokenizer=None, base_model: str | None = None) -> Path:
    """Write a PEFT folder (adapter_config.json + adapter_model.safetensors) atomically. `base_model` is what the
    folder names as its base (the run's `model`): PEFT would write the path the base was loaded from, which for
    a built or converted model is a cache folder of the machine that wrote it."""
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    config = peft_model.peft_config[peft_model.active_adapter]
    loaded_from = config.base_model_name_or_path
    try:
        if base_model is not None:
            config.base_model_name_or_path = base_model
        peft_model.save_pretrained(tmp, safe_serialization=True)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        if folder.exists():
            shutil.rmtree(folder)
        os.replace(tmp, folder)
    finally:
        config.base_model_name_or_path = loaded_from
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return folder
