#!/usr/bin/env python
"""How busy the cores are in each phase of a client's round and a held-out evaluation: seconds, FLOPs computed and
their rate as a share of the cores' measured matmul peak, in one call.

The round is the run's own code (`methods/local_round.train_locally` on partition 0's tasks, then `--eval-tasks`
held-out tasks played `eval.samples-per-task` times as the server's evaluator plays them), on `--threads` threads (1:
what a simulated client with client-resources-num-cpus=1 gets). Its phases are timed by wrapping the functions that
run them (no profiler):
- rollout prefill / decode, and the same two in the evaluation: the hf engine's sampler (engine/sampling.py), its
  prefill (the shared prefix's pass and the distinct prompts' batch) apart from its token steps; what the rollout
  spends outside the sampler (environments, prompts, tokenising) is the phase's "other";
- old-policy and reference log-probs: the trainer's no-grad passes;
- the update's forward, backward, and optimizer step (clipping included).

A Fed-SE preset (strategy fedse-lora) runs its client's round instead (`agent/self_evolution.self_evolution_round`
on partition 0's tasks, seeded as the run seeds its client's, its buffer in a scratch folder; `--fedse-rounds N` plays
N rounds over that buffer and measures the last): the exploring rollout, then TRL's fine-tuning on the buffer,
timed apart as its forward (`SFTTrainer.compute_loss`), its backward (`Accelerator.backward`), its optimizer step,
and the Trainer's own work around them (its set-up, the batches' collation, clipping, logging) as "update other". It
has no log-prob passes. Its head counts the rows TRL's fused loss head projects, as counted at the head itself: the
completions' positions (`counts["sft loss tokens"]`) since `agent/training/sft.head_at_loss_positions`, every
position of the padded batch before it (the raw outputs of 2026-12-05).

FLOPs: 2 per weight per position a pass runs the weights at, counted as benchmarks/gpu_round.py counts them (the
layers at every position, the head where logits are computed), with two columns: "computed" counts the positions
the passes ran (padding included: what kept the cores busy) and "model" only those holding a token (what the result
needs). A LoRA backward counts one forward (the frozen weights need input gradients only; the adapter's share is
negligible), a full model's two; recomputed (checkpointed) layers count in "computed" only. Attention's
context-length terms are left out; the report gives their size beside the rest at the round's mean context.

Peak: the best FLOP/s of a matmul of the model's own shapes (hidden x hidden, hidden x intermediate and back, hidden
x vocabulary) at 512 rows, in fp32 and in bf16, on the same threads, measured in the same call; each phase is set
against the peak of the dtype its matmuls run in (bf16 under bf16-mixed / bf16-base autocast). The same shapes at the
decode's mean live rows give the decode's ceiling (a matmul of few rows reads every weight for little work).

    python benchmarks/cpu_roofline.py --run-config configs/smollm2-fedagent-cpu.toml --eval-tasks 16 --threads 1
    python benchmarks/cpu_roofline.py --run-config configs/smollm2-fedse-cpu.toml --eval-tasks 16 --threads 1
    python benchmarks/cpu_roofline.py --run-config configs/smollm2-fedagent-cpu.toml --peaks-only   # seconds

`--peaks-only` measures the two dtypes' peaks alone: whether bf16 is the fast dtype on this processor.

With `--json` (one JSON line) under `python benchmarks/raw_output.py run OUT.json -- ...` the result is kept with the
machine, versions and commit it ran on (benchmarks/results/README.md); `--table OUT.json` prints a kept result's phase
table as docs/performance.md quotes it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import accelerate
import torch
from accelerate.optimizer import AcceleratedOptimizer
from trl import SFTTrainer
from trl.trainer import utils as trl_utils

import fedagent_flwr.agent.engine.passes as passes_module
import fedagent_flwr.agent.engine.sampling as sampling
import fedagent_flwr.agent.self_evolution as self_evolution
import fedagent_flwr.agent.training.grpo as grpo_module
from envs import make_env
from envs.multi import per_env_spread
from fedagent_flwr.agent.engine.precision import compute_precision
from fedagent_flwr.agent.engine.tokens import MIN_SHARED_PREFIX, shared_prefix
from fedagent_flwr.agent.models.loading import load_agent
from fedagent_flwr.agent.models.pretrained import resolve_model
from fedagent_flwr.agent.play.evaluation import GlobalEvaluator
from fedagent_flwr.agent.play.seeding import seed_everything
from fedagent_flwr.agent.training.grpo import GRPOTrainer
from fedagent_flwr.agent.training.experience import ExperienceBuffer
from fedagent_flwr.agent.training.lora import arrays_to_adapter, attached_lora
from fedagent_flwr.config import RunConfig
from fedagent_flwr.methods.library_configs import rollout_config
from fedagent_flwr.methods.local_round import train_locally
from fedagent_flwr.methods.placement import process_placement, run_base_dtype
from fedagent_flwr.methods.tasks import learner_tasks
from fedagent_flwr.simulation import parse_overrides, read_run_config_file
from gpu_round import FlopShape

PEAK_ROWS = 512  # rows of the peak's matmul: enough that every shape here is compute-bound
PHASES = ("rollout prefill", "rollout decode", "rollout other", "old-policy log-probs", "reference log-probs",
          "update forward", "update backward", "optimizer step", "evaluation prefill", "evaluation decode",
          "evaluation other")
# a Fed-SE round: no log-prob passes; the Trainer's own work apart from the passes it runs
SFT_PHASES = ("rollout prefill", "rollout decode", "rollout other", "update forward", "update backward",
              "optimizer step", "update other", "evaluation prefill", "evaluation decode", "evaluation other")


def linear_shapes(config) -> list[tuple[int, int]]:
    """(in, out) of the model's distinct linear layers: attention's projections, the MLP's two ways, the head."""
    hidden, inter = config.hidden_size, config.intermediate_size
    heads = config.num_attention_heads
    kv = (getattr(config, "num_key_value_heads", None) or heads) * (hidden // heads)
    return sorted({(hidden, hidden), (hidden, kv), (hidden, inter), (inter, hidden), (hidden, config.vocab_size)})


def matmul_rate(rows: int, shape: tuple[int, int], dtype: torch.dtype, seconds: float = 0.3) -> float:
    """FLOP/s of F.linear over [rows, in] x [out, in] in `dtype`, the best of repeated timings over `seconds`."""
    k, n = shape
    x, w = torch.randn(rows, k).to(dtype), torch.randn(n, k).to(dtype) * 0.02
    torch.nn.functional.linear(x, w)  # warm: the kernel chosen and the buffers allocated
    best, spent = float("inf"), 0.0
    while spent < seconds:
        started = time.perf_counter()
        torch.nn.functional.linear(x, w)
        took = time.perf_counter() - started
        best, spent = min(best, took), spent + took
    return 2.0 * rows * k * n / best


def sweep_rate(rows: int, config, dtype: torch.dtype, seconds: float = 0.5) -> float:
    """FLOP/s of F.linear at `rows` rows through a model's worth of distinct weights (every layer's shapes, then the
    head): what a decode step does, reading every weight from memory once for `rows` rows of work."""
    layer = [s for s in linear_shapes(config) if s[1] != config.vocab_size]
    shapes = layer * config.num_hidden_layers + [(config.hidden_size, config.vocab_size)]
    weights = [(torch.randn(rows, k).to(dtype), torch.randn(n, k).to(dtype) * 0.02) for k, n in shapes]
    flops = sum(2.0 * rows * k * n for k, n in shapes)
    for x, w in weights:  # warm
        torch.nn.functional.linear(x, w)
    best, spent = float("inf"), 0.0
    while spent < seconds:
        started = time.perf_counter()
        for x, w in weights:
            torch.nn.functional.linear(x, w)
        took = time.perf_counter() - started
        best, spent = min(best, took), spent + took
    return flops / best


def measured_peaks(config, decode_rows: int) -> dict[str, dict]:
    """Per dtype: the best matmul FLOP/s over the model's shapes at PEAK_ROWS rows (each shape's rate kept), and the
    rate of a sweep through a model's worth of weights at `decode_rows` rows (the decode's ceiling)."""
    peaks = {}
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        shapes = {f"{k}x{n}": matmul_rate(PEAK_ROWS, (k, n), dtype) for k, n in linear_shapes(config)}
        peaks[name] = {"peak_flops": max(shapes.values()), "rows": PEAK_ROWS, "shapes": shapes,
                       "decode_rows": decode_rows, "decode_sweep_flops": sweep_rate(decode_rows, config, dtype)}
    return peaks


def cpu_facts() -> dict:
    """The processor's name and the matmul units its flags name (bf16 runs at fp32's speed or below without AMX or
    AVX-512 bf16, and the machines we run on differ in them)."""
    facts = {"model": platform.processor() or platform.machine(), "flags": []}
    try:
        text = open("/proc/cpuinfo").read()
    except OSError:
        return facts
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name":
            facts["model"] = value.strip()
        elif key.strip() == "flags":
            facts["flags"] = sorted(f for f in value.split() if f.startswith(("amx", "avx512_bf16", "avx512f", "avx2")))
            break
    return facts


class PhaseMeter:
    """Seconds and positions per phase, filled by the wrappers `instrumented` installs."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        # per phase: body positions computed / holding a token, head positions, and weight passes per position
        self.body_computed: dict[str, float] = defaultdict(float)
        self.body_model: dict[str, float] = defaultdict(float)
        self.head: dict[str, float] = defaultdict(float)
        self.counts: dict[str, float] = defaultdict(float)
        self.playing = "rollout"  # which play the sampler serves: the round's rollout or the evaluation
        self.scoring = "old-policy log-probs"
        self.context: list[float] = []  # each sampler call's mean prompt length (attention's share)
        self.prefill_done: float | None = None  # when the running sampler call's prefill ended
        self.head_everywhere = False  # engine.logprob-chunk-tokens = 0: the passes' head runs at every position

    def add(self, phase: str, seconds: float) -> None:
        self.seconds[phase] += seconds


@contextlib.contextmanager
def _patched(owner, name: str, make):
    inner, own = getattr(owner, name), name in vars(owner)
    setattr(owner, name, make(inner))
    try:
        yield
    finally:
        if own:
            setattr(owner, name, inner)
        else:  # inherited (an autograd Function's `apply`): uncover the parent's again
            delattr(owner, name)


@contextlib.contextmanager
def instrumented(meter: PhaseMeter):
    """The round's functions wrapped to fill `meter` (see the module docstring)."""

    def hf_rows(inner):
        def wrapper(model, prompts, *args, **kwargs):
            phase = meter.playing
            distinct = [list(p) for p in dict.fromkeys(tuple(p) for p in prompts)]
            prefix = shared_prefix(distinct) if len(distinct) > 1 else []
            prefix = prefix if len(prefix) >= MIN_SHARED_PREFIX else []
            suffixes = [len(p) - len(prefix) for p in distinct]
            # the prefix's pass (head at its last position), then the distinct prompts' batch, left-padded
            meter.body_computed[f"{phase} prefill"] += len(prefix) + len(distinct) * max(suffixes)
            meter.body_model[f"{phase} prefill"] += len(prefix) + sum(suffixes)
            meter.head[f"{phase} prefill"] += (1 if prefix else 0) + len(distinct)
            meter.counts[f"{phase} prompts"] += len(prompts)
            meter.counts[f"{phase} distinct prompts"] += len(distinct)
            meter.context.append(sum(len(p) for p in prompts) / max(len(prompts), 1))
            meter.prefill_done = None
            started = time.perf_counter()
            try:
                return inner(model, prompts, *args, **kwargs)
            finally:
                ended = time.perf_counter()
                prefill_end = meter.prefill_done or ended
                meter.add(f"{phase} prefill", prefill_end - started)
                meter.add(f"{phase} decode", ended - prefill_end)
        return wrapper

    def stepper_init(inner):
        def wrapper(self, *args, **kwargs):
            meter.prefill_done = time.perf_counter()
            return inner(self, *args, **kwargs)
        return wrapper

    def stepper_step(inner):
        def wrapper(self, tokens):
            rows = int(tokens.shape[0])
            phase = f"{meter.playing} decode"
            meter.body_computed[phase] += rows
            meter.body_model[phase] += rows
            meter.head[phase] += rows
            meter.counts[f"{meter.playing} token steps"] += 1
            meter.counts[f"{meter.playing} row steps"] += rows
            return inner(self, tokens)
        return wrapper

    def timed_as(phase_of):
        def make(inner):
            def wrapper(*args, **kwargs):
                started = time.perf_counter()
                try:
                    return inner(*args, **kwargs)
                finally:
                    meter.add(phase_of(), time.perf_counter() - started)
            return wrapper
        return make

    def labelled(attribute: str, value: str, phase: str | None = None):
        """Run the wrapped function with meter.<attribute> = value (timing it as `phase` when given)."""
        def make(inner):
            def wrapper(*args, **kwargs):
                before = getattr(meter, attribute)
                setattr(meter, attribute, value)
                started = time.perf_counter()
                try:
                    return inner(*args, **kwargs)
                finally:
                    if phase:
                        meter.add(phase, time.perf_counter() - started)
                    setattr(meter, attribute, before)
            return wrapper
        return make

    def play(inner):  # the round's rollout: the sampler's time is split out of it below
        return labelled("playing", "rollout", "rollout total")(inner)

    def scored_passes(inner):
        def wrapper(model, batch, *args, **kwargs):
            rows, width = batch["input_ids"].shape
            phase = "update forward" if torch.is_grad_enabled() else meter.scoring
            prefix = len(batch["prefix_ids"]) if "prefix_ids" in batch else 0  # engine.shared-prompt-prefix: its pass once
            meter.body_computed[phase] += rows * width + prefix
            meter.body_model[phase] += float(batch["attention_mask"].sum()) + prefix
            # chunked log-probs score the completion targets only; engine.logprob-chunk-tokens = 0 builds every position's logits
            meter.head[phase] += rows * width if meter.head_everywhere else float(batch["completion_mask"].sum())
            meter.counts[f"{phase} passes"] += 1
            return inner(model, batch, *args, **kwargs)
        return wrapper

    def logprobs(inner):
        def wrapper(self, model, samples, reference=False):
            started = time.perf_counter()
            try:
                return inner(self, model, samples, reference)
            finally:
                meter.add(meter.scoring, time.perf_counter() - started)
        return wrapper

    def optimizer_step(inner):
        @contextlib.contextmanager
        def wrapper(self):
            started = time.perf_counter()
            with inner(self):
                yield
            meter.add("optimizer step", time.perf_counter() - started)
        return wrapper

    def sft_forward(inner):  # TRL's loss: one forward over the padded batch
        def wrapper(self, model, inputs, *args, **kwargs):
            rows, width = inputs["input_ids"].shape
            mask = inputs.get("attention_mask")
            meter.body_computed["update forward"] += rows * width
            meter.body_model["update forward"] += rows * width if mask is None else float(mask.sum())
            meter.counts["update forward passes"] += 1
            meter.counts["sft loss tokens"] += float((inputs["labels"] != -100).sum()) if "labels" in inputs else 0.0
            return timed_as(lambda: "update forward (timed)")(inner)(self, model, inputs, *args, **kwargs)
        return wrapper

    def fused_head(inner):  # TRL's loss head: the rows it projects through the vocabulary
        def wrapper(hidden, *args, **kwargs):
            meter.head["update forward"] += len(hidden)
            return inner(hidden, *args, **kwargs)
        return wrapper

    with contextlib.ExitStack() as stack:
        for owner, name, make in (
                (sampling, "_hf_rows", hf_rows),
                (sampling._TransformersStepper, "__init__", stepper_init),
                (sampling._TransformersStepper, "step", stepper_step),
                (GRPOTrainer, "_play", play),
                (GRPOTrainer, "_reference_logprobs", labelled("scoring", "reference log-probs")),
                (GRPOTrainer, "_logprobs", logprobs),
                (GRPOTrainer, "update", timed_as(lambda: "update total")),
                (grpo_module, "completion_logprobs", scored_passes),
                (passes_module.UpdatePasses, "backward", timed_as(lambda: "update backward")),
                (passes_module.UpdatePasses, "optimizer_step", optimizer_step),
                (GlobalEvaluator, "evaluate", labelled("playing", "evaluation", "evaluation total")),
                (self_evolution, "run_episodes", play),
                (self_evolution, "supervised_finetune", timed_as(lambda: "update total")),
                (SFTTrainer, "compute_loss", sft_forward),
                (trl_utils._ChunkedLogProbFunction, "apply", fused_head),
                (accelerate.Accelerator, "backward", timed_as(lambda: "update backward")),
                (AcceleratedOptimizer, "step", timed_as(lambda: "optimizer step"))):
            stack.enter_context(_patched(owner, name, make))
        yield


def phase_table(meter: PhaseMeter, flop: FlopShape, precision: str, lora: bool, peaks: dict, recomputed_share: float,
                phases: tuple[str, ...] = PHASES) -> dict:
    """Per phase: seconds, share of the round's seconds, FLOPs (computed, model) and the computed rate against the
    peak of the dtype its matmuls run in. `phases`: PHASES (GRPO's update, its forward the rest of its time) or
    SFT_PHASES (TRL's, its forward timed and the rest "update other")."""
    s = meter.seconds
    seconds = defaultdict(float, s)
    for play in ("rollout", "evaluation"):
        seconds[f"{play} other"] = s[f"{play} total"] - s[f"{play} prefill"] - s[f"{play} decode"]
    if "update other" in phases:
        seconds["update forward"] = s["update forward (timed)"]
        seconds["update other"] = (s["update total"] - s["update forward (timed)"] - s["update backward"]
                                   - s["optimizer step"])
    else:
        logprob_s = s["old-policy log-probs"] + s["reference log-probs"]
        seconds["update forward"] = (s["update total"] - logprob_s - s["update backward"] - s["optimizer step"])
    backward_passes = 1.0 if lora else 2.0
    dtype = "bf16" if compute_precision(precision) == "bf16-mixed" else "fp32"
    total = sum(seconds[p] for p in phases)
    rows = {}
    for phase in phases:
        body_c, body_m, head = meter.body_computed[phase], meter.body_model[phase], meter.head[phase]
        if phase == "update backward":
            fwd = meter.body_computed["update forward"], meter.body_model["update forward"], meter.head["update forward"]
            body_c = fwd[0] * (backward_passes + recomputed_share)
            body_m, head = fwd[1] * backward_passes, fwd[2] * (backward_passes + recomputed_share)
            head_m = fwd[2] * backward_passes
        else:
            head_m = head
        computed = 2.0 * (flop.body * body_c + flop.head * head)
        model = 2.0 * (flop.body * body_m + flop.head * head_m)
        rate = computed / seconds[phase] if seconds[phase] > 0 else 0.0
        rows[phase] = {"seconds": seconds[phase], "share_of_round": seconds[phase] / total if total else 0.0,
                       "gflop_computed": computed / 1e9, "gflop_model": model / 1e9, "gflop_per_s": rate / 1e9,
                       "share_of_peak": rate / peaks[dtype]["peak_flops"] if computed else None}
    return {"phases": rows, "dtype": dtype, "total_seconds": total}


def attention_share(config, context: float) -> float:
    """Attention's context-length FLOPs per position (q.k and the weighted values: 4 x layers x hidden x context) beside
    the weights' 2 x body parameters, at a mean context of `context` tokens."""
    return 4.0 * config.num_hidden_layers * config.hidden_size * context / (2.0 * FlopShape.of(config).body)


def run_minutes(report: dict, clients: int = 4, cores: int = 2, rounds: int = 3, eval_episodes: int = 144) -> dict:
    """Arithmetic from one result, not a measurement: a run of `rounds` rounds of `clients` clients, a core each on
    `cores` cores (so ceil(clients / cores) waves a round), and two evaluations of `eval_episodes` episodes spread over
    every core without loss (an optimistic share). "measured rates": the phases' seconds scaled so; "at the peak": the
    same FLOPs computed at the measured matmul peak of the phase's dtype on every core."""
    phases, played = report["phases"], report["evaluation"]["episodes"]
    client = [p for p in phases if not p.startswith("evaluation")]
    evaluation = [p for p in phases if p.startswith("evaluation")]
    waves = -(-clients // cores)
    per_episode = lambda key: sum(phases[p][key] for p in evaluation) / played  # noqa: E731
    measured = rounds * waves * sum(phases[p]["seconds"] for p in client) + 2 * eval_episodes * per_episode("seconds") / cores
    peak = report["peaks"][report["dtype"]]["peak_flops"] / 1e9
    flop = rounds * clients * sum(phases[p]["gflop_computed"] for p in client) + 2 * eval_episodes * per_episode("gflop_computed")
    return {"measured_rates": measured / 60, "at_the_peak": flop / (cores * peak) / 60}


def best_rate_minutes(report: dict) -> dict:
    """run_minutes with every pass over whole sequences at the best rate any of them reached in `report` and every
    decode at the rate of a sweep through the weights at the rollout decode's rows (the peaks' second figure), a phase
    already faster keeping its own: what this processor's kernels showed they can do, not a bound (a kernel may be
    made faster than any measured here; the evaluation decodes more rows than the sweep's)."""
    phases = report["phases"]
    sequences = [p for p, r in phases.items() if r["gflop_computed"] > 0 and "decode" not in p]
    best = max(phases[p]["gflop_per_s"] for p in sequences)
    sweep = report["peaks"][report["dtype"]]["decode_sweep_flops"] / 1e9
    faster = {p: r | {"seconds": min(r["seconds"], r["gflop_computed"] / (sweep if "decode" in p else best))}
              if r["gflop_computed"] > 0 else r for p, r in phases.items()}
    return {"best_sequence_gflop_per_s": best, "sweep_gflop_per_s": sweep,
            "minutes": run_minutes(report | {"phases": faster})["measured_rates"]}


def markdown(report: dict) -> str:
    """The phase table of a kept result (the notes quote it as printed here: benchmarks/performance_figures.py)."""
    dtype = report["dtype"]
    lines = [f"| phase | seconds | share of the round | GFLOP computed | GFLOP model | GFLOP/s | share of the {dtype} peak |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for phase, r in report["phases"].items():
        share = "" if r["share_of_peak"] is None else f"{100 * r['share_of_peak']:.1f} %"
        lines.append(f"| {phase} | {r['seconds']:.1f} | {100 * r['share_of_round']:.1f} % | {r['gflop_computed']:,.0f} | "
                     f"{r['gflop_model']:,.0f} | {r['gflop_per_s']:.1f} | {share} |")
    peaks = report["peaks"]
    lines.append(f"| all phases | {report['total_seconds']:.1f} | 100.0 % | | | | |")
    lines.append("")
    lines.append(f"Peaks (a matmul of the model's shapes at {peaks['fp32']['rows']} rows, {report['threads']} thread(s)): fp32 "
                 f"{peaks['fp32']['peak_flops'] / 1e9:.1f} GFLOP/s, bf16 {peaks['bf16']['peak_flops'] / 1e9:.1f} GFLOP/s; "
                 f"a sweep through a model's weights at the decode's {peaks[dtype]['decode_rows']} rows: {dtype} "
                 f"{peaks[dtype]['decode_sweep_flops'] / 1e9:.1f} GFLOP/s.")
    run = run_minutes(report)
    lines.append(f"A run of the preset's shape (3 rounds of 4 clients on 2 cores, a core each; two evaluations of 144 "
                 f"episodes over both cores), by arithmetic from this table: {run['measured_rates']:.0f} minutes at these "
                 f"rates, {run['at_the_peak']:.0f} minutes with every FLOP at the {dtype} peak.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--table", metavar="JSON", help="print the markdown table of a kept result and stop")
    parser.add_argument("--run-config", metavar="FILE", help="a preset TOML of run-config keys")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a run-config value over the preset")
    parser.add_argument("--eval-tasks", type=int, default=16, help="held-out tasks the evaluation plays")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: a simulated client's one CPU)")
    parser.add_argument("--peaks-only", action="store_true",
                        help="measure the fp32 and bf16 matmul peaks of the model's shapes alone (seconds, no round): "
                             "which dtype this processor computes faster")
    parser.add_argument("--decode-rows", type=int, default=32, help="rows of --peaks-only's decode sweep")
    parser.add_argument("--fedse-rounds", type=int, default=1,
                        help="a Fed-SE preset: client 0 plays this many rounds, its buffer carried over, and the last "
                             "is measured (1: the run's first round, fine-tuning on that round's wins alone)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.table:
        with open(args.table) as f:
            report = json.load(f)
        print(markdown(report))
        return report
    if not args.run_config:
        parser.error("--run-config FILE is required (or --table JSON)")
    if args.threads < 1:
        parser.error(f"--threads must be at least 1, got {args.threads}")
    if args.fedse_rounds < 1:
        parser.error(f"--fedse-rounds must be at least 1, got {args.fedse_rounds}")
    try:
        cfg = RunConfig.from_run_config(RunConfig().to_run_config() | read_run_config_file(args.run_config)
                                        | parse_overrides(args.set))
    except ValueError as err:
        parser.error(str(err))
    if args.fedse_rounds != 1 and cfg.strategy != "fedse-lora":
        parser.error(f"--fedse-rounds {args.fedse_rounds} measures a Fed-SE client's round: the run config's strategy "
                     f"is {cfg.strategy!r}, expected 'fedse-lora'")
    torch.set_num_threads(args.threads)
    if args.peaks_only:
        return peaks_only(cfg, args)

    meter = PhaseMeter()
    meter.head_everywhere = cfg.engine.logprob_chunk_tokens == 0
    agent = load_agent(cfg.model, cfg.env, cfg.device_key("client"), run_base_dtype(cfg))
    tasks = learner_tasks(cfg, 0, cfg.num_clients)
    held_out = per_env_spread(make_env(cfg.env, cfg.rollout.max_steps).tasks_of_split("test"), args.eval_tasks)
    fedse = cfg.strategy == "fedse-lora"
    engine_error = ("rollout.name resolved to {!r}: this benchmark splits the hf engine's prefill from its token "
                    "steps (set rollout.name=hf)")
    started = time.perf_counter()
    if fedse:  # the client's round attaches its own adapter, as the run's does; the evaluation plays the result
        placement = process_placement(cfg, agent, tasks)
        if placement.decode_engine != "hf":
            parser.error(engine_error.format(placement.decode_engine))
        adapter, metrics = fedse_client_rounds(cfg, agent, tasks, placement, args.fedse_rounds, meter)
        if not metrics.get("fedse/sft-steps"):
            parser.error(f"no fine-tuning ran in round {args.fedse_rounds}: client 0's buffer held no wins; "
                         "measure a later round (--fedse-rounds)")
    with instrumented(meter), attached_lora(agent.model, cfg.lora, seed=cfg.seed) as model:
        if fedse:
            arrays_to_adapter(model, adapter)
        else:
            placement = process_placement(cfg, agent, tasks, model=model)
            if placement.decode_engine != "hf":
                parser.error(engine_error.format(placement.decode_engine))
            metrics = train_locally(agent, cfg, tasks, 1, 0, model=model, placement=placement)
        server = process_placement(cfg, agent, held_out, "server", model=model)
        evaluator = GlobalEvaluator(model, agent.tokenizer, lambda: make_env(cfg.env, cfg.rollout.max_steps), held_out,
                                    rollout_config(cfg, True, placement=server), cfg.eval.samples_per_task, cfg.seed,
                                    precision=server.precision)
        evaluation = evaluator.evaluate(0)
    wall = time.perf_counter() - started
    config = agent.model.config
    decode_rows = max(1, round(meter.counts["rollout row steps"] / max(meter.counts["rollout token steps"], 1)))
    peaks = measured_peaks(config, decode_rows)
    recomputed = float(metrics.get("checkpointed_layers", 0.0) or 0.0)
    table = phase_table(meter, FlopShape.of(config), placement.precision, fedse or cfg.grpo.finetuning == "lora", peaks,
                        recomputed, SFT_PHASES if fedse else PHASES)
    context = sum(meter.context) / max(len(meter.context), 1)
    report = {
        "run_config": args.run_config, "overrides": args.set, "threads": args.threads, "eval_tasks": args.eval_tasks,
        "cpu": cpu_facts(), "model": cfg.model, "precision": placement.precision, "finetuning": cfg.grpo.finetuning,
        "decode_engine": placement.decode_engine, "gradient_checkpointing": placement.gradient_checkpointing,
        "body_parameters": FlopShape.of(config).body, "head_parameters": FlopShape.of(config).head,
        "peaks": peaks, **table, "wall_seconds": wall,
        "counts": dict(meter.counts), "mean_prompt_tokens": context,
        "attention_share_at_mean_context": attention_share(config, context),
        "strategy": cfg.strategy, **({"fedse_rounds": args.fedse_rounds} if fedse else {}),
        "round": {"episodes": metrics.get("episodes"), "generated_tokens": metrics.get("generated_tokens"),
                  "success_rate": metrics.get("success_rate"),
                  # Fed-SE: the samples its fine-tuning drew from (the buffer), and its optimizer steps
                  "train_samples": metrics.get("fedse/train-samples" if fedse else "train_samples"),
                  "optimizer_steps": metrics.get("fedse/sft-steps" if fedse else "optimizer_steps")},
        "evaluation": {"episodes": evaluation.get("episodes"), "success_rate": evaluation.get("success_rate")},
    }
    if args.json:
        print(json.dumps(report))
    else:
        print(render(report))
    return report


def fedse_client_rounds(cfg: RunConfig, agent, tasks, placement, rounds: int, meter: PhaseMeter):
    """Client 0's first `rounds` Fed-SE rounds as the run's client plays them (seeded per round and client, its buffer
    carried over; each round from the adapter the last one left, as a client alone: no aggregation). Only the last
    round fills `meter`; returns its (adapter, metrics)."""
    adapter = None
    with tempfile.TemporaryDirectory(prefix="fedagent-roofline-") as scratch:
        buffer = ExperienceBuffer(Path(scratch), agent.base_fingerprint)
        for server_round in range(1, rounds + 1):
            seed_everything(cfg.seed, server_round, 0)  # as methods/fedse.FedSE.train seeds the client's round
            measured = instrumented(meter) if server_round == rounds else contextlib.nullcontext()
            with measured:
                adapter, metrics = self_evolution.self_evolution_round(
                    agent, cfg.fedse, cfg.lora, rollout_config(cfg, placement=placement),
                    lambda: make_env(cfg.env, cfg.rollout.max_steps), tasks, server_round, buffer, adapter,
                    seed=cfg.seed, precision=placement.compute_precision, attention=cfg.engine.attn_implementation)
    return adapter, metrics


def peaks_only(cfg: RunConfig, args) -> dict:
    """The fp32 and bf16 peaks of the run config's model shapes on this processor, and their ratio: whether bf16
    autocast (precision bf16-base / bf16-mixed) can pay here before a 30-minute round is measured."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(resolve_model(cfg.model, cfg.env).source)
    peaks = measured_peaks(config, args.decode_rows)
    report = {"run_config": args.run_config, "threads": args.threads, "cpu": cpu_facts(), "model": cfg.model,
              "peaks": peaks, "bf16_over_fp32": peaks["bf16"]["peak_flops"] / peaks["fp32"]["peak_flops"],
              "bf16_over_fp32_decode_sweep": peaks["bf16"]["decode_sweep_flops"] / peaks["fp32"]["decode_sweep_flops"]}
    if args.json:
        print(json.dumps(report))
    else:
        print(f"{report['cpu']['model']} ({', '.join(report['cpu']['flags'])}), {args.threads} thread(s), {cfg.model}:")
        for name, peak in peaks.items():
            print(f"  {name}: a matmul of the model's shapes at {peak['rows']} rows {peak['peak_flops'] / 1e9:.1f} GFLOP/s "
                  f"(best of {len(peak['shapes'])} shapes); a sweep through its weights at {peak['decode_rows']} rows "
                  f"{peak['decode_sweep_flops'] / 1e9:.1f} GFLOP/s")
        print(f"  bf16 / fp32: {report['bf16_over_fp32']:.2f}x at the peak, {report['bf16_over_fp32_decode_sweep']:.2f}x "
              f"in the sweep")
    return report


def render(report: dict) -> str:
    dtype = report["dtype"]
    peak = report["peaks"][dtype]["peak_flops"]
    lines = [f"{report['cpu']['model']} ({' '.join(report['cpu']['flags'])})",
             f"{report['run_config']} ({', '.join(report['overrides']) or 'as committed'}): {report['threads']} thread(s), "
             f"precision {report['precision']} (matmuls in {dtype}), engine {report['decode_engine']}; peak {peak / 1e9:.1f} "
             f"GFLOP/s ({dtype} matmul of the model's shapes at {PEAK_ROWS} rows; fp32 "
             f"{report['peaks']['fp32']['peak_flops'] / 1e9:.1f}, bf16 {report['peaks']['bf16']['peak_flops'] / 1e9:.1f})",
             f"{'phase':<22} {'seconds':>8} {'of round':>8} {'GFLOP comp.':>12} {'GFLOP model':>12} {'GFLOP/s':>8} {'of peak':>8}"]
    for phase, r in report["phases"].items():
        share = "" if r["share_of_peak"] is None else f"{100 * r['share_of_peak']:.1f}%"
        lines.append(f"{phase:<22} {r['seconds']:>8.1f} {100 * r['share_of_round']:>7.1f}% {r['gflop_computed']:>12.1f} "
                     f"{r['gflop_model']:>12.1f} {r['gflop_per_s']:>8.1f} {share:>8}")
    decode = report["peaks"][dtype]
    lines.append(f"total {report['total_seconds']:.1f} s; decode's mean live rows {decode['decode_rows']}: a sweep through "
                 f"a model's weights at that many rows {decode['decode_sweep_flops'] / 1e9:.1f} GFLOP/s; attention's context terms "
                 f"add {100 * report['attention_share_at_mean_context']:.0f}% at the mean prompt "
                 f"({report['mean_prompt_tokens']:.0f} tokens), not counted above")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
