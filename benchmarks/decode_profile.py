#!/usr/bin/env python
"""Where a decode token step's time goes: today's sampler (the "hf" engine) and the static engine side by side.

The model is a Qwen2.5-shaped random model built as gpu_round.py builds it (`--shape`, agent/models/shaped_model.py),
run the way the rollout runs it (bf16 autocast on CUDA, fp32 on CPU). Each engine samples the same batch of
random prompts (half the rows one token shorter, so the padding mask is in play) with no stop token, so every
row runs to `--new-tokens`. Per engine it prints:

- ms per token step: (t(N new tokens) - t(1 new token)) / (N - 1), the best of `--repeats`, so the prefill and
  the first sample drop out;
- under torch.profiler, the same difference over `--profile-tokens` steps (the profiler is slow on thousands of
  kernels), per token step: operator calls, kernel launches (CUDA), and the operators with the most self CPU
  time (and on CUDA self device time);
- beside them the bandwidth bound of a step (gpu_round.decode_bound: weights in the forward's dtype + every
  row's KV cache, over `--bandwidth`, default an H100's 3.35e12 B/s; on a CPU that default is not this machine's);
- how far the static engine's first-token log-probs are from the transformers forward's (4 rows).

On CUDA the static engine runs twice: with CUDA graphs (what the rollout uses) and eagerly ("static-eager"), so
the graphs' share of the speed-up shows.

    python benchmarks/decode_profile.py --shape tiny            # CPU, well under a minute
    python benchmarks/decode_profile.py --shape 1.5b            # one GPU: batch 128, 512-token prompts, 64 new

With `--run-config FILE` (and `--set KEY=VALUE`) the model is a run's instead: its model loaded as a client loads it
(the base in bf16 under bf16-base), a LoRA adapter of the run's rank and targets attached as a Fed-SE client or a LoRA
learner holds it while it explores (B = 0, so the adapter computes and adds nothing), under the run's precision:

    python benchmarks/decode_profile.py --run-config configs/smollm2-fedse-cpu.toml --set precision=bf16-base \
        --batch 15 --prompt-tokens 195 --new-tokens 16 --threads 1
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time

import torch
from transformers import AutoConfig

from fedagent_flwr.agent.engine.decode import StaticDecoder
from fedagent_flwr.agent.engine.memory import SHAPES, ModelShape
from fedagent_flwr.agent.models.pretrained import pick_device
from fedagent_flwr.agent.engine.placement import place
from fedagent_flwr.agent.engine.precision import autocast
from fedagent_flwr.agent.engine.sampling import rollout_dtype, fast_sample_batch, hf_sample_batch
from fedagent_flwr.agent.models.shaped_model import random_model

from gpu_round import H100_BANDWIDTH, SHAPE_NAMES, TINY, decode_bound
import raw_output

TINY_VOCAB = 2000  # about the size of gpu_round's environment tokenizer, which this script does not need
LAUNCH_NAMES = ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC", "cudaGraphLaunch")


def build(shape: str, device: torch.device, seed: int):
    name = SHAPE_NAMES[shape]
    fields = SHAPES[name] if name else TINY | {"vocab_size": TINY_VOCAB}
    config = AutoConfig.for_model("qwen2", **fields, max_position_embeddings=32768, bos_token_id=None,
                                  eos_token_id=None, pad_token_id=0)
    return random_model(config, device, seed)


def run_model(parser: argparse.ArgumentParser, run_config: str, overrides: list[str], device: str, precision: str,
              stack: contextlib.ExitStack):
    """(model, device, precision, a name for the report) of a run config: the client's model as `load_agent` loads it,
    with the run's LoRA adapter attached where its clients train one (entered on `stack`)."""
    from fedagent_flwr.agent.models.loading import load_agent
    from fedagent_flwr.agent.training.lora import attached_lora
    from fedagent_flwr.config import RunConfig
    from fedagent_flwr.methods.placement import place_run, run_base_dtype
    from fedagent_flwr.simulation import parse_overrides, read_run_config_file

    if device is not None or precision is not None:
        parser.error("--run-config takes its device and precision from the run config (use --set device=..., "
                     "--set precision=...)")
    try:
        cfg = RunConfig.from_run_config(RunConfig().to_run_config() | read_run_config_file(run_config)
                                        | parse_overrides(overrides))
    except ValueError as err:
        parser.error(str(err))
    resolved, _ = device_and_precision(parser, cfg.device_key("client"), cfg.precision)
    precision = place_run(cfg).precision  # as the run's clients resolve it (on a CPU, measured: cpu_rates.py)
    model = load_agent(cfg.model, cfg.env, str(resolved), run_base_dtype(cfg)).model
    if cfg.grpo.finetuning == "lora" or cfg.traits.experience_buffer:
        model = stack.enter_context(attached_lora(model, cfg.lora, seed=cfg.seed))
    return model.eval(), resolved, precision, cfg.model


def device_and_precision(parser: argparse.ArgumentParser, device: str, precision: str) -> tuple[torch.device, str]:
    """The --device and --precision flags resolved (auto: the GPU and bf16-mixed where there is one), or the
    parser's error naming what is wrong."""
    try:
        resolved = pick_device(device)  # refuses cuda where none is visible
        return resolved, place(device=str(resolved), precision=precision).precision  # the one place auto is decided
    except ValueError as err:
        parser.error(str(err))


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def device_us(event) -> float:
    """A profiler event's self device time in us (torch renamed self_cuda_time_total to self_device_time_total)."""
    value = getattr(event, "self_device_time_total", None)
    return getattr(event, "self_cuda_time_total", 0) if value is None else value


def op_table(prof) -> dict[str, dict]:
    return {e.key: {"calls": e.count, "self_cpu_us": e.self_cpu_time_total, "self_device_us": device_us(e)}
            for e in prof.key_averages()}


def per_step(long: dict, short: dict, steps: int) -> dict[str, dict]:
    """What the extra steps of the long run cost, per step, operator by operator."""
    out = {}
    for key, a in long.items():
        b = short.get(key, {"calls": 0, "self_cpu_us": 0.0, "self_device_us": 0.0})
        out[key] = {k: (a[k] - b[k]) / steps for k in a}
    return out


def measure(name: str, run, device: torch.device, new_tokens: int, repeats: int, profile_tokens: int) -> dict:
    run(2)  # warm-up: lazy initialisation, the static engine's first capture
    def timed(n):
        sync(device)
        started = time.perf_counter()
        run(n)
        sync(device)
        return time.perf_counter() - started
    one = min(timed(1) for _ in range(repeats))
    many = min(timed(new_tokens) for _ in range(repeats))
    ms = (many - one) / (new_tokens - 1) * 1e3
    print(f"{name}: {ms:.3f} ms per token step", file=sys.stderr, flush=True)  # before the profiler's slow part
    result = {"engine": name, "ms_per_token_step": ms, "aten_calls_per_step": 0.0, "kernel_launches_per_step": None,
              "profiled_steps": 0, "ops": {}}
    if profile_tokens < 2:
        return result
    # The profiler records every kernel of every step and key_averages walks them all in Python: on a GPU, 64 steps of
    # the hf engine (about 1,100 launches a step) took minutes. A few steps give the per-step table as well.
    profiled = min(profile_tokens, new_tokens)
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    tables = []
    for n in (1, profiled):
        with torch.profiler.profile(activities=activities) as prof:
            run(n)
            sync(device)
        tables.append(op_table(prof))
    ops = per_step(tables[1], tables[0], profiled - 1)
    launches = sum(v["calls"] for k, v in ops.items() if k in LAUNCH_NAMES)
    aten = sum(v["calls"] for k, v in ops.items() if k.startswith("aten::"))
    return result | {"aten_calls_per_step": round(aten, 1), "profiled_steps": profiled - 1,
                     "kernel_launches_per_step": round(launches, 1) if device.type == "cuda" else None,
                     "ops": {k: {f: round(x, 3) for f, x in v.items()} for k, v in ops.items() if v["calls"] > 0 or v["self_cpu_us"] > 0}}


def first_token_gap(model, prompts, decoder: StaticDecoder) -> float:
    """Max |log p| difference of the first sampled token's distribution, static engine vs transformers."""
    rows = prompts[:4]
    with torch.no_grad():
        want = torch.stack([model(torch.tensor([p], device=decoder.device)).logits[0, -1].float().log_softmax(-1)
                            for p in rows])
    got = decoder.start(rows, 0, 1).float().log_softmax(-1)
    return float((got - want).abs().max())


def replay_gap(prompts, a: StaticDecoder, b: StaticDecoder, steps: int = 8) -> float:
    """Max |log p| difference between two decoders of one model fed the same greedy tokens, with rows dropped
    part-way: a quarter (they ride along in the bucket), then down to under half and a sixth (the batch is
    compacted twice). On CUDA `a` replays CUDA graphs and `b` runs eagerly; on a CPU `a` runs the same
    bucketed bookkeeping eagerly."""
    la, lb = a.start(prompts, 0, steps + 1), b.start(prompts, 0, steps + 1)
    live, gap = list(range(len(prompts))), 0.0
    for t in range(steps):
        gap = max(gap, float((la.float().log_softmax(-1) - lb.float().log_softmax(-1)).abs().max()))
        tokens = la.argmax(-1)
        if t in (2, 4, 6):
            keep = [j for j in range(len(live)) if j % {2: 4, 4: 2, 6: 3}[t] != 1]
            index = torch.tensor(keep, device=a.device)
            a.keep(index), b.keep(index)
            live, tokens = [live[j] for j in keep], tokens[index]
        la, lb = a.step(tokens), b.step(tokens)
    return max(gap, float((la.float().log_softmax(-1) - lb.float().log_softmax(-1)).abs().max()))


def top_ops(results: list[dict], field: str, k: int) -> list[tuple[str, list[float]]]:
    names = set()
    for r in results:
        names |= {n for n, _ in sorted(r["ops"].items(), key=lambda kv: -kv[1][field])[:k]}
    rows = [(n, [r["ops"].get(n, {}).get(field, 0.0) for r in results]) for n in names]
    return sorted(rows, key=lambda row: -max(row[1]))


def format_report(r: dict) -> str:
    engines = r["engines"]
    b = r["bound"]
    lines = [
        f"decode profile: shape {r['shape']} ({r['parameters'] / 1e6:,.1f}M parameters) on {r['device']}, {r['precision']}, "
        f"batch {r['batch']}, prompts {r['prompt_tokens']} tokens (half the rows one shorter), {r['new_tokens']} new tokens, "
        f"temperature {r['temperature']}, {r['threads']} CPU threads",
        f"{'engine':14s} {'ms/step':>10s} {'aten calls/step':>16s} {'launches/step':>14s}",
    ]
    for e in engines:
        launches = "-" if e["kernel_launches_per_step"] is None else f"{e['kernel_launches_per_step']:,.1f}"
        aten = f"{e['aten_calls_per_step']:,.1f}" if e.get("profiled_steps", 1) else "-"
        lines.append(f"{e['engine']:14s} {e['ms_per_token_step']:10.3f} {aten:>16s} {launches:>14s}")
    lines.append(f"bandwidth bound {b['bound_ms']:.4f} ms per token step: {b['weight_bytes'] / 1e9:,.4f} GB of weights + "
                 f"{b['kv_bytes'] / 1e9:,.4f} GB of KV cache ({r['batch']} rows x {r['context_tokens']:.0f} tokens, "
                 f"{r['value_bytes']} bytes a number) at {b['bandwidth']:.3g} B/s"
                 + ("" if r["device"] != "cpu" else " (an H100's unless --bandwidth says otherwise: not this CPU's)"))
    lines.append(f"static engine's first-token log-probs vs transformers': max difference {r['first_token_logprob_gap']:.2e}")
    lines.append(f"static engine {r['replay_gap_between']}, fed the same tokens with rows dropping: max log-prob "
                 f"difference {r['replay_logprob_gap']:.2e}")
    if r.get("compile_logprob_gap") is not None:
        lines.append(f"static engine with rollout.kernels=compile vs eager kernels, the same check: max log-prob difference "
                     f"{r['compile_logprob_gap']:.2e} (that first check took {r['compile_check_s']:.1f} s, compilation included)")
    names = [e["engine"] for e in engines]
    fields = [("self_cpu_us", "self CPU")] + ([("self_device_us", "self device")] if r["device"] != "cpu" else [])
    if not any(e["ops"] for e in engines):
        return "\n".join(lines)  # --profile-tokens 0
    for field, label in fields:
        lines.append(f"where a token step's time goes: {label} us per step (calls per step), top {r['top']} per engine")
        lines.append(f"  {'operator':44s}" + "".join(f"{n:>24s}" for n in names))
        for op, values in top_ops(engines, field, r["top"]):
            calls = [e["ops"].get(op, {}).get("calls", 0.0) for e in engines]
            lines.append(f"  {op[:44]:44s}" + "".join(f"{v:>14,.1f} ({c:>6,.1f})" for v, c in zip(values, calls)))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", choices=list(SHAPE_NAMES), default="tiny")
    parser.add_argument("--run-config", metavar="FILE", help="a run's model, adapter and precision in place of --shape")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a run-config value over FILE's")
    parser.add_argument("--device", help="auto (default: the GPU where there is one), cpu, cuda, cuda:N")
    parser.add_argument("--batch", type=int, help="rows (default: 128 on CUDA, 32 on CPU)")
    parser.add_argument("--prompt-tokens", type=int, help="prompt length (default: 512 on CUDA, 64 on CPU)")
    parser.add_argument("--new-tokens", type=int, help="token steps timed (default: 64 on CUDA, 24 on CPU)")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--precision", help="auto (default: bf16-mixed on CUDA, fp32 on CPU), fp32, bf16-mixed")
    parser.add_argument("--bandwidth", type=float, default=H100_BANDWIDTH, help="bytes/s for the bound")
    parser.add_argument("--repeats", type=int, default=2, help="timed runs per length; the best counts")
    parser.add_argument("--profile-tokens", type=int, default=8,
                        help="token steps run under torch.profiler per engine (0: no operator tables)")
    parser.add_argument("--top", type=int, default=8, help="operators listed per engine")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(),
                        help="CPU threads for torch (tiny operators on a busy machine time best on 1)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--compile", action="store_true",
                        help="also the static engine with rollout.kernels=compile (its token step's element-wise work "
                             "fused by torch.compile; on CUDA in graphs too), timed after its compilation")
    parser.add_argument("--json", action="store_true", help="print one JSON line instead of the tables")
    args = parser.parse_args(argv)
    stack = contextlib.ExitStack()
    if args.run_config:
        model, device, precision, shape = run_model(parser, args.run_config, args.set, args.device, args.precision, stack)
    else:
        device, precision = device_and_precision(parser, args.device or "auto", args.precision or "auto")
        shape = args.shape
    torch.set_num_threads(args.threads)
    cuda = device.type == "cuda"
    batch = args.batch or (128 if cuda else 32)
    prompt = args.prompt_tokens or (512 if cuda else 64)
    new = args.new_tokens or (64 if cuda else 24)
    if new < 2:
        parser.error("--new-tokens must be at least 2 (the per-step cost is a difference of two lengths)")

    if not args.run_config:
        model = build(args.shape, device, args.seed)
    vocab = model.config.vocab_size
    parameters = sum(p.numel() for p in model.parameters())  # an attached adapter's included
    g = torch.Generator().manual_seed(args.seed)
    prompts = [torch.randint(1, vocab, (prompt - i % 2,), generator=g).tolist() for i in range(batch)]

    results = []
    with stack, autocast(precision, device):
        dtype = rollout_dtype(device)
        static = StaticDecoder(model, dtype)
        engines = {"hf": lambda n: hf_sample_batch(model, prompts, 0, [], n, args.temperature),
                   "static": lambda n: fast_sample_batch(model, prompts, 0, [], n, args.temperature, decoder=static)}
        if args.compile:
            fused = StaticDecoder(model, dtype, kernels="compile")
            engines["static-compile"] = lambda n: fast_sample_batch(model, prompts, 0, [], n, args.temperature, decoder=fused)
        if cuda:
            eager = StaticDecoder(model, dtype, cuda_graphs=False)
            engines["static-eager"] = lambda n: fast_sample_batch(model, prompts, 0, [], n, args.temperature, decoder=eager)
        # the numerical checks first: on a GPU they are the static engine's only check of its CUDA graphs
        gap = first_token_gap(model, prompts, static)
        if cuda:
            replay = replay_gap(prompts, static, eager)
            between = "with CUDA graphs vs eager"
        else:
            replay = replay_gap(prompts, StaticDecoder(model, dtype, bucketed=True), static)
            between = "bucketed (the graphs' bookkeeping, run eagerly) vs eager"
        print(f"first-token log-prob gap {gap:.2e}; {between}: {replay:.2e}", file=sys.stderr, flush=True)
        compile_s = compile_gap = None
        if args.compile:  # compiled against eager kernels, both as the rollout runs them (graphs on CUDA)
            started = time.perf_counter()
            compile_gap = replay_gap(prompts, fused, StaticDecoder(model, dtype))
            compile_s = time.perf_counter() - started  # the compilation, for the first bucket sizes
            print(f"rollout.kernels=compile vs eager: {compile_gap:.2e} ({compile_s:.1f} s, compilation included)",
                  file=sys.stderr, flush=True)
        for name, run in engines.items():
            results.append(measure(name, run, device, new, args.repeats, args.profile_tokens))

    value_bytes = torch.finfo(static.dtype).bits // 8
    context = (sum(len(p) for p in prompts) / batch) + (new - 1) / 2  # the steps' average context
    bound = decode_bound(ModelShape.of(model.config), bool(model.config.tie_word_embeddings), batch, context,
                         value_bytes, args.bandwidth)
    result = {"shape": shape, "device": torch.cuda.get_device_name(device) if cuda else "cpu",
              "parameters": parameters, "precision": precision, "batch": batch,
              "prompt_tokens": prompt, "new_tokens": new, "temperature": args.temperature, "value_bytes": value_bytes,
              "context_tokens": context, "threads": args.threads, "bound": bound, "first_token_logprob_gap": gap,
              "replay_logprob_gap": replay, "replay_gap_between": between, "top": args.top,
              "compile_logprob_gap": compile_gap, "compile_check_s": compile_s,
              "engines": results}
    result["settings"] = raw_output.settings(args)  # every argument as parsed, for the raw output's file
    if args.json:
        print(json.dumps(result), flush=True)
    else:
        print(format_report(result), flush=True)
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
