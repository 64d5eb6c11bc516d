"""Model weights <-> Flower ArrayRecords: each distinct tensor once, as fp32.

Tied weights (a language model's input embedding and output head share one matrix) appear under two
names in `state_dict()`; they travel once, under the first name, and the receiver ties them again
from its own model's structure, so a tied model costs its parameter count and no more. bf16 has no
numpy dtype, so bf16 tensors travel as float32 (strategies/transfer.py can halve that on the wire) and
are cast back to the model's dtype on load.
"""

from __future__ import annotations

import torch
from flwr.app import ArrayRecord


def tied_names(model: torch.nn.Module) -> dict[str, str]:
    """name -> the first name sharing its storage, for every name of `state_dict()` that repeats one."""
    first: dict[tuple, str] = {}
    tied = {}
    for name, tensor in model.state_dict().items():
        if tensor.numel() == 0:
            continue
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape), tuple(tensor.stride()))
        if key in first:
            tied[name] = first[key]
        else:
            first[key] = name
    return tied


def model_to_arrays(model: torch.nn.Module) -> ArrayRecord:
    tied = tied_names(model)
    state = {}
    for name, tensor in model.state_dict().items():
        if name in tied:
            continue
        t = tensor.detach().to("cpu")
        state[name] = t.float() if t.dtype == torch.bfloat16 else t
    return ArrayRecord(state)


def arrays_to_model(model: torch.nn.Module, arrays: ArrayRecord) -> None:
    """Load arrays into the model in place; keys (less tied duplicates) and shapes must match exactly."""
    incoming = arrays.to_torch_state_dict()
    current = model.state_dict()
    for name, source in tied_names(model).items():
        if name not in incoming and source in incoming:
            incoming[name] = incoming[source]
    missing, unexpected = sorted(set(current) - set(incoming)), sorted(set(incoming) - set(current))
    if missing or unexpected:
        raise ValueError(f"weights do not fit the model: missing {missing[:5]}, unexpected {unexpected[:5]}")
    state = {k: v.to(dtype=current[k].dtype) for k, v in incoming.items()}
    model.load_state_dict(state, strict=True)
