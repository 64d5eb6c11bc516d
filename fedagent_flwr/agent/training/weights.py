"""Model weights <-> Flower ArrayRecords: each distinct tensor once, as fp32.

Tied weights (a language model's input embedding and output head share one matrix) appear under two
names in `state_dict()`; they travel once, under the first name, and the receiver ties them again
from its own model's structure, so a tied model costs its parameter count and no more. bf16 has no
numpy dtype, so bf16 tensors travel as float32 (strategies/transfer.py can halve that on the wire) and
are cast back to the model's dtype on load.

Each tensor is copied once on the way out (into the .npy bytes Flower sends) and once on the way in (from
those bytes into the model's parameter): see strategies/transfer.py for why not Flower's own conversions.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping

import numpy as np
import torch
from flwr.app import ArrayRecord

from fedagent_flwr.agent.fsdp.ranks import Ranks, like, whole
from fedagent_flwr.agent.fsdp.tensor_files import Streamed
from strategies.transfer import array_view, numpy_array


def tied_names(model: torch.nn.Module) -> dict[str, str]:
    """name -> the first name sharing its storage, for every name of `state_dict()` that repeats one."""
    first: dict[tuple, str] = {}
    tied = {}
    for name, tensor in model.state_dict().items():
        if tensor.numel() == 0:
            continue
        tensor = tensor.to_local() if hasattr(tensor, "to_local") else tensor  # a sharded weight: this rank's part
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape), tuple(tensor.stride()))
        if key in first:
            tied[name] = first[key]
        else:
            first[key] = name
    return tied


def model_to_arrays(model: torch.nn.Module) -> ArrayRecord:
    """The model's weights (less tied duplicates) as a Flower record, float32 for bf16. A sharded model: every rank
    gathers each weight in the same order, and only rank 0, whose record is the reply, keeps them (the others return
    an empty record instead of a whole model's copy)."""
    return streamed_record(model_weights(model))


def model_weights(model: torch.nn.Module) -> Streamed:
    """The model's weights (less tied duplicates) gathered one at a time, float32 for bf16, each kept by rank 0 only
    until whoever reads the stream takes it (a reply written to a file holds one whole weight at a time)."""
    tied = tied_names(model)
    return gathered({name: t for name, t in model.state_dict().items() if name not in tied})


def gathered(state: Mapping[str, torch.Tensor]) -> Streamed:
    """`state`'s tensors as a stream: each gathered whole by every rank in the stream's order, kept on the CPU by rank 0
    (float32 for bf16, which numpy lacks) and dropped by the others."""
    keep = Ranks.current().rank == 0

    def numpy_dtype(t: torch.Tensor) -> np.dtype:
        return np.dtype(np.float32) if t.dtype == torch.bfloat16 else torch.empty(0, dtype=t.dtype).numpy().dtype

    def produce(name: str) -> np.ndarray | None:
        t = whole(state[name]).detach()
        if not keep:
            return None
        t = t.to("cpu")
        return (t.float() if t.dtype == torch.bfloat16 else t).contiguous().numpy()

    return Streamed.computed({n: (numpy_dtype(t), tuple(t.shape)) for n, t in state.items()}, produce)


def streamed_record(streamed: Streamed) -> ArrayRecord:
    """A stream's tensors as a Flower record in the order their state had them (empty on ranks other than 0)."""
    # each tensor copied into its record bytes as it comes, the gathered one dropped
    arrays = {name: None if array is None else numpy_array(array)
              for (name, _, _), array in zip(streamed.layout, streamed.arrays, strict=True)}
    return ArrayRecord({name: arrays[name] for name in streamed.names()} if Ranks.current().rank == 0 else {})


def numpy_views(arrays: ArrayRecord | Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Arrays by name without a copy: views of a Flower record's bytes, or the arrays of a dict as they are (a rank's
    weights mapped from the file its client wrote)."""
    return {k: array_view(arrays[k]) if isinstance(arrays, ArrayRecord) else arrays[k] for k in arrays.keys()}


@torch.no_grad()
def arrays_to_model(model: torch.nn.Module, arrays: ArrayRecord | Mapping[str, np.ndarray]) -> None:
    """Load arrays into the model in place; keys (less tied duplicates) and shapes must match exactly."""
    current = model.state_dict()  # tensors sharing storage with the parameters and buffers
    tied = tied_names(model)
    expected = set(current) - set(tied)
    missing, unexpected = sorted(expected - set(arrays.keys())), sorted(set(arrays.keys()) - expected)
    if missing or unexpected:
        raise ValueError(f"weights do not fit the model: missing {missing[:5]}, unexpected {unexpected[:5]}")
    for name, values in numpy_views(arrays).items():
        if tuple(values.shape) != tuple(current[name].shape):
            raise ValueError(f"weights do not fit the model: {name} has shape {tuple(values.shape)}, "
                             f"the model's is {tuple(current[name].shape)}")
        with warnings.catch_warnings():  # a view of the message's bytes: read, never written
            warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
            # casts to the model's dtype; tied names share it; a sharded weight takes its rank's part
            current[name].copy_(like(torch.from_numpy(values), current[name]))
