"""One client's passes shared by N ranks (torch.distributed, the model under FSDP2's fully_shard).

Every rank holds every sample, and cuts each batch into micro-batches as one process would (agent/engine/
micro_batches.py); rank r computes micro-batches r, r + N, ... (`Ranks.passes`), and FSDP2 averages the gradients over
the ranks. For the result to be one process's over the whole batch: the loss a rank backpropagates is its micro-batches'
shares of the whole minibatch's loss times the world size (the averaging divides it back), so the loss is the one a
single process computes under every loss aggregation, and every rank runs as many forward passes as the others (each
forward gathers the weights: a rank that stopped early would leave the others waiting), so a rank short of passes runs
spare ones whose loss counts zero. Every rank knows the cut, so no collective is needed to agree on how many.

Rollouts are not sharded: a sharded model's forward gathers the weights with the other ranks, and each rank's
episodes end after their own number of token steps. `unsharded` gathers every weight once and holds it on every rank
while the ranks decode their own episodes with the transformers model (FSDP2's unshard with resharding after forward
switched off), then frees it; the static engine instead copies the weights into its own buffers in the rollout's dtype
one unit gathered at a time (`gathered`), so the weights are never gathered whole.

Without a process group this is one rank of one, and nothing changes.
"""

from __future__ import annotations

import contextlib
import types
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Pass:
    """One forward (and backward) a rank runs: `rows` (sample indices), its `part` of the plan (-1: a spare pass, run only
    to keep step with the other ranks), and what its loss is multiplied by before backward (0 for a spare pass)."""

    rows: list[int]
    part: int
    scale: float

    @property
    def spare(self) -> bool:
        return self.part < 0


@dataclass(frozen=True)
class Ranks:
    rank: int = 0
    world: int = 1

    @classmethod
    def current(cls) -> Ranks:
        """This process's rank and the world size where a process group is up; else one rank."""
        if dist.is_available() and dist.is_initialized():
            return cls(dist.get_rank(), dist.get_world_size())
        return cls()

    def share(self, items: Sequence) -> list:
        """This rank's stride of `items` (all of them on one rank)."""
        return list(items[self.rank :: self.world])

    def passes(self, plan: Sequence[list[int]]) -> list[Pass]:
        """This rank's passes over a batch cut into `plan` (micro-batches of sample indices, the same on every rank):
        every world-th micro-batch from this rank's, then spare passes until it runs as many as the rank with most."""
        mine = [Pass(plan[i], i, float(self.world)) for i in range(self.rank, len(plan), self.world)]
        most = -(-len(plan) // self.world)
        return mine + [Pass(plan[0][:1], -1, 0.0)] * (most - len(mine))

    def gather(self, mine: dict) -> dict:
        """Every rank's dict merged (keys are disjoint across ranks), on every rank."""
        if self.world == 1:
            return dict(mine)
        everyone: list[dict | None] = [None] * self.world
        dist.all_gather_object(everyone, mine)
        return {k: v for part in everyone for k, v in part.items()}

    def total(self, value: float) -> float:
        """The sum of `value` over the ranks."""
        return self._reduce(value, dist.ReduceOp.SUM)

    def largest(self, value: float) -> float:
        """The largest `value` of any rank."""
        return self._reduce(value, dist.ReduceOp.MAX)

    def _reduce(self, value: float, op) -> float:
        if self.world == 1:
            return value
        t = torch.tensor([value], dtype=torch.float64)
        dist.all_reduce(t, op=op)
        return float(t)

    def unsharded(self, model: torch.nn.Module) -> contextlib.AbstractContextManager:
        """Inside: every weight of a sharded `model` whole on this rank, so forwards need no other rank (decoding)."""
        if self.world == 1:
            return contextlib.nullcontext()
        return _unsharded(model)


def fsdp_modules(model: torch.nn.Module) -> list:
    from torch.distributed.fsdp import FSDPModule

    return [m for m in model.modules() if isinstance(m, FSDPModule)]


@contextlib.contextmanager
def _unsharded(model: torch.nn.Module) -> Iterator[None]:
    modules = fsdp_modules(model)
    for m in modules:
        m.set_reshard_after_forward(False)  # a forward would free the gathered weights again
        m.unshard()
    try:
        yield
    finally:
        for m in modules:
            m.reshard()
            m.set_reshard_after_forward(True)


@contextlib.contextmanager
def gathered(unit: torch.nn.Module) -> Iterator[None]:
    """Inside: `unit`'s own weights whole on this rank, the units inside it still sharded (FSDP2's unshard is not
    recursive); a module FSDP2 did not shard is used as it is. The static decoder copies the weights so, one unit at a
    time (agent/engine/decode.py StaticDecoder.refresh); the root unit first, as FSDP2 initialises from the root."""
    from torch.distributed.fsdp import FSDPModule

    if not isinstance(unit, FSDPModule):
        yield
        return
    unit.unshard()
    try:
        yield
    finally:
        unit.reshard()


def shard(model: torch.nn.Module, device: torch.device | None = None) -> torch.nn.Module:
    """FSDP2 on `model` in place: each decoder layer a unit (transformers names its class in `_no_split_modules`), the
    rest (embeddings, final norm, head) in the root's unit. A PEFT model is sharded with its adapter inside the layers.
    Code that calls the body and the head itself (chunked log-probs) runs through `as_root_forward`.

    The mesh is on `device`, default the one the model's weights are on (a model on the meta device names the device
    it will live on): fully_shard's default mesh is on whatever accelerator torch finds, so CPU ranks on a machine with
    a GPU would otherwise shard onto cuda:0."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard, register_fsdp_forward_method

    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    names = set(getattr(inner, "_no_split_modules", None) or ())
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if not layers:
        raise ValueError(f"{type(inner).__name__} names no decoder layer class (_no_split_modules): cannot shard it")
    device = device or next(model.parameters()).device
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    for layer in layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    model.forward_as_root = types.MethodType(_call, model)
    register_fsdp_forward_method(model, "forward_as_root")
    return model


def _call(self, fn: Callable, *args, **kwargs):
    return fn(*args, **kwargs)


def as_root_forward(model: torch.nn.Module, fn: Callable, *args, **kwargs):
    """`fn(*args, **kwargs)` as a forward of a sharded `model`: FSDP2's root hooks run around it (the root's own
    weights, the embeddings and head, gathered first; the backward's reductions set up after), as they do around
    `model(...)`. Code that calls the body and the head itself needs it: without, the embeddings stay sharded (torch:
    "got mixed torch.Tensor and DTensor"). An unsharded model calls `fn` as it is."""
    run = getattr(model, "forward_as_root", None)
    return run(fn, *args, **kwargs) if run is not None else fn(*args, **kwargs)


def whole(tensor: torch.Tensor) -> torch.Tensor:
    """A tensor as one rank would hold it: a sharded DTensor gathered from every rank (all ranks must call this on the
    same tensors in the same order), anything else as it is."""
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


def local_part(tensor: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
    """The part of a full tensor shaped as `param` that this rank holds of `param` (a view of its rows; all of it for a
    plain tensor). Cut where torch says this rank's shard lies, on the tensor's own device: a mapped file's tensor is
    read only there, and no whole tensor goes to the rank's card."""
    if not hasattr(param, "device_mesh"):
        return tensor
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    shape, offset = compute_local_shape_and_global_offset(param.shape, param.device_mesh, param.placements)
    return tensor[tuple(slice(o, o + n) for o, n in zip(offset, shape))]


def like(tensor: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
    """A full tensor shaped as `param` sharded as `param` is (this rank's part of it), or as it is for a plain one. Each
    rank takes its part of its own copy (every rank holds the same full tensor): no collective."""
    if not hasattr(param, "device_mesh"):
        return tensor
    from torch.distributed.tensor import DTensor

    return DTensor.from_local(local_part(tensor, param).to(param.device), param.device_mesh, param.placements,
                              shape=param.shape, stride=param.stride())
