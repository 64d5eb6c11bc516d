"""Model weights <-> Flower ArrayRecords.

bf16 has no numpy dtype, so bf16 tensors travel as float32 (averaging happens in
float64 on the server anyway) and are cast back to the model's dtype on load.
"""

from __future__ import annotations

import torch
from flwr.app import ArrayRecord


def model_to_arrays(model: torch.nn.Module) -> ArrayRecord:
    state = {}
    for name, tensor in model.state_dict().items():
        t = tensor.detach().to("cpu")
        state[name] = t.float() if t.dtype == torch.bfloat16 else t
    return ArrayRecord(state)


def arrays_to_model(model: torch.nn.Module, arrays: ArrayRecord) -> None:
    """Load arrays into the model in place; keys and shapes must match exactly."""
    incoming = arrays.to_torch_state_dict()
    current = model.state_dict()
    missing, unexpected = sorted(set(current) - set(incoming)), sorted(set(incoming) - set(current))
    if missing or unexpected:
        raise ValueError(f"weights do not fit the model: missing {missing[:5]}, unexpected {unexpected[:5]}")
    state = {k: v.to(dtype=current[k].dtype) for k, v in incoming.items()}
    model.load_state_dict(state, strict=True)
