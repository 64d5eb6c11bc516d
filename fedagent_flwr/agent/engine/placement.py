"""Every `auto` of a process, decided in one place: `place()`.

The run config lets eight things say `auto` (or 0 for auto): the device, the precision, the working weights' dtype
(engine.param-dtype), the decode engine, the rollout rows (rollout.generation-batch-size = 0), the KL reference, gradient checkpointing
and, with it, the room the update's activations may take. What each becomes depends on the machine the process runs on
(and, for the engine, on the model; for the rows and the room, on the memory plan), so it cannot be decided when the run
config is read. Each process builds its placement once (methods/placement.py gives place() the run config's keys and
the memory planner) and passes it alone to what it builds; runs (clients and the server), evaluation and its replay,
the warm start, the memory plan and the benchmarks all come here, so on one machine they resolve alike. `Machine` is
what this process can use; a caller that plans for another machine (the memory plan's `--device cuda` on a CPU)
passes that machine instead of `this_machine()`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from fedagent_flwr.agent.engine.cpu_rates import MatmulRates
from fedagent_flwr.agent.engine.decode import UnsupportedModel, check_supported
from fedagent_flwr.agent.engine.memory import ACTIVATIONS_ROW, UPDATE, MemoryPlan, rows_that_fit
from fedagent_flwr.agent.engine.precision import compute_precision
from fedagent_flwr.config.choices import ALL_PRECISIONS, DEVICES, ENGINES, PARAM_DTYPES

# On a CPU, auto takes bf16-base only where bf16 runs the model's matmul at least this much faster than fp32: at or
# near parity fp32 keeps its exact arithmetic, and a probe of a few calls can be off by some percent.
BF16_CLEARLY_FASTER = 1.25
SLOWER_WARNING = 2.0  # a precision the user set that runs this much slower than the other here is warned about


@dataclass(frozen=True)
class Machine:
    """What a process can compute on; `auto` resolves against it."""

    cuda: bool

    def describe(self) -> str:
        return "a machine with a CUDA GPU" if self.cuda else "a machine without a GPU"


def this_machine() -> Machine:
    return Machine(cuda=torch.cuda.is_available())


@dataclass(frozen=True)
class Placement:
    """What a run's `auto` values became on one machine."""

    device: str  # cpu, cuda or cuda:N
    precision: str  # fp32 | bf16-mixed | bf16-base (agent/engine/precision.py)
    param_dtype: str  # fp32 | bf16: the weights the training passes compute with (agent/engine/master_weights.py)
    decode_engine: str  # hf | static (agent/engine/sampling.py)
    rollout_rows: int  # episodes per generate call
    kl_reference: str = "round-start"  # round-start | base: what GRPO's KL term anchors to
    engine_note: str = ""  # why `auto` took the hf engine where a GPU would take the static one ("" otherwise)
    # False | True (every layer) | "fitted": per micro-batch the fewest leading layers whose activations fit
    # activation_room_bytes (agent/engine/checkpointing.py); auto with no memory known is True
    gradient_checkpointing: bool | str = False
    activation_room_bytes: float | None = None  # what the update's activations may take under "fitted"
    context_tokens: int = 0  # the longest context the memory plan was made for (0: no plan)
    precision_note: str = ""  # on a CPU: how the precision was chosen, with the measured rates (cpu_rates.py)

    @property
    def on_cuda(self) -> bool:
        return self.device.startswith("cuda")

    @property
    def torch_device(self) -> torch.device:
        return torch.device(self.device)

    @property
    def compute_precision(self) -> str:
        """fp32 or bf16-mixed: what forward passes run in (bf16-base computes as bf16-mixed)."""
        return compute_precision(self.precision)

    def summary(self) -> str:
        """One console line: what this process computes with (the rows stand in the memory plan beside it)."""
        note = f" ({self.engine_note})" if self.engine_note else ""
        why = f" ({self.precision_note})" if self.precision_note else ""
        return (f"device {self.device} | precision {self.precision}{why} | param-dtype {self.param_dtype} | "
                f"decode engine {self.decode_engine}{note}")


def place(*, device: str = "auto", precision: str = "auto", param_dtype: str = "auto", decode_engine: str = "auto",
          kl_reference: str = "auto", gradient_checkpointing: bool | str = False, single_learner: bool = False,
          full_grpo: bool = False, machine: Machine | None = None, model: torch.nn.Module | None = None,
          rollout_batch_size: int = 0, max_rows: int = 1,
          plan_for: Callable[[Placement, int], MemoryPlan] | None = None, budget_bytes: float | None = None,
          context_tokens: int = 0, adapter_only: bool = False, cpu_rates: MatmulRates | None = None) -> Placement:
    """Resolve every `auto`, in this order (each may read the ones before it):

    - device: auto = cuda where the machine has a GPU, else cpu;
    - precision: auto = bf16-mixed on CUDA; on a CPU, bf16-base where a LoRA adapter is all that trains
      (`adapter_only`) and `cpu_rates` (this processor's matmul rates for the model's shape) show bf16 clearly faster,
      else fp32 (resolve_precision);
    - engine.param-dtype: auto = bf16 where a working copy applies (`full_grpo`: a GRPO strategy training every weight) under
      bf16-mixed, else fp32;
    - rollout.name: auto = static on CUDA, hf on a CPU; given the `model`, a model the static engine does not
      reproduce takes hf under auto (with the reason in `engine_note`) and is refused under static;
    - grpo.kl-reference: auto = base for a single learner (a Table 1 baseline, as one plain run anchors to its initial
      model), round-start for a federated client;
    - rollout rows: rollout.generation-batch-size where it is set; 0 = the most rows up to `max_rows` whose plan
      (`plan_for(placement so far, rows)`, the process's memory plan) fits `budget_bytes`, or `max_rows` where no
      budget is known;
    - engine.gradient-checkpointing: auto = "fitted" with the room the update's activations may take, `budget_bytes` less every
      other row of the plan at those rows (which counts the rollout's KV cache too, though the update runs after it is
      freed: a margin); where no budget is known, True (every layer).
    """
    resolved_device = resolve_device(device, machine)
    on_cuda = resolved_device.startswith("cuda")
    resolved_precision, precision_note = resolve_precision(precision, on_cuda, adapter_only, cpu_rates)
    if param_dtype == "auto":
        param_dtype = "bf16" if full_grpo and resolved_precision == "bf16-mixed" else "fp32"
    elif param_dtype not in PARAM_DTYPES:
        raise ValueError(f"engine.param-dtype={param_dtype!r} is not allowed: expected {' | '.join(PARAM_DTYPES)} | auto")
    engine, note = decode_engine_for(decode_engine, on_cuda, model)
    if kl_reference == "auto":
        kl_reference = "base" if single_learner else "round-start"
    # the plan is asked with auto's worst case, every layer checkpointed
    placement = Placement(resolved_device, resolved_precision, param_dtype, engine, max_rows, kl_reference, note,
                          True if gradient_checkpointing == "auto" else gradient_checkpointing, None, context_tokens,
                          precision_note)
    planned = plan_for is not None and bool(budget_bytes)
    if rollout_batch_size:
        rows = rollout_batch_size
    elif planned:
        rows = rows_that_fit(lambda n: plan_for(placement, n), budget_bytes, max_rows)
    else:
        rows = max_rows
    room = None
    if gradient_checkpointing == "auto" and planned:
        plan = plan_for(placement, rows)
        kept = plan.as_dict().get(ACTIVATIONS_ROW)  # a client's plan has the row; a server's does not
        room = None if kept is None else budget_bytes - (plan.peak(UPDATE) - kept)  # beside the update's other rows
    resolved = ("fitted" if room is not None else True) if gradient_checkpointing == "auto" else gradient_checkpointing
    return replace(placement, rollout_rows=rows, gradient_checkpointing=resolved, activation_room_bytes=room)


def resolve_device(device: str, machine: Machine | None = None) -> str:
    """cpu, cuda or cuda:N for a device key on `machine` (default: this process's): auto = cuda where it has a GPU."""
    if device not in DEVICES and not device.startswith("cuda:"):
        raise ValueError(f"device={device!r} is not allowed: expected {' | '.join(DEVICES)} | cuda:N")
    return ("cuda" if (machine or this_machine()).cuda else "cpu") if device == "auto" else device


def resolve_precision(precision: str, on_cuda: bool, adapter_only: bool = False,
                      cpu_rates: MatmulRates | None = None) -> tuple[str, str]:
    """('fp32' | 'bf16-mixed' | 'bf16-base', why) for a run-config value and the device the model runs on.

    On CUDA, auto = bf16-mixed. On a CPU, auto = bf16-base where a LoRA adapter is all that trains and the measured
    `cpu_rates` show bf16 at least BF16_CLEARLY_FASTER times fp32's rate, else fp32 (also where nothing was measured).
    A precision the user set is kept; where the rates show it more than SLOWER_WARNING times slower than the other
    here (bf16-base for an adapter, bf16-mixed for full weights), `why` says so with a warning."""
    if precision not in ALL_PRECISIONS:
        raise ValueError(f"precision={precision!r} is not allowed: expected {' | '.join(ALL_PRECISIONS)}")
    if on_cuda or cpu_rates is None:
        return (("bf16-mixed" if on_cuda else "fp32") if precision == "auto" else precision), ""
    speedup, rates = cpu_rates.bf16_speedup, cpu_rates.describe()
    if precision == "auto":
        if adapter_only and speedup >= BF16_CLEARLY_FASTER:
            return "bf16-base", f"auto: bf16 is faster here, {rates}"
        reason = (f"bf16 is not {BF16_CLEARLY_FASTER}x faster here" if adapter_only
                  else "bf16-base needs an adapter that alone trains")
        return "fp32", f"auto: {reason}, {rates}"
    other = "fp32" if precision != "fp32" else "bf16-base" if adapter_only else "bf16-mixed"
    slowdown = speedup if precision == "fp32" else 1 / speedup
    if slowdown > SLOWER_WARNING:
        return precision, (f"as set; WARNING: it runs {slowdown:.1f}x slower here than {other} would: {rates}; "
                           "precision = 'auto' takes the faster")
    return precision, f"as set, {rates}"


def decode_engine_for(decode_engine: str, on_cuda: bool, model: torch.nn.Module | None = None) -> tuple[str, str]:
    """(hf | static, why auto fell back to hf): the rollout.name key resolved; `place()` and sampling's `auto` ask
    here. Given the model, one the static engine does not reproduce takes hf under auto and is refused under static."""
    if decode_engine not in ENGINES:
        raise ValueError(f"rollout.name={decode_engine!r} is not allowed: expected {' | '.join(ENGINES)}")
    engine = "static" if decode_engine == "static" or (decode_engine == "auto" and on_cuda) else "hf"
    if engine == "static" and model is not None:
        try:
            check_supported(model)
        except UnsupportedModel as err:
            if decode_engine == "static":
                raise
            return "hf", f"the static engine refused the model: {err}"
    return engine, ""
