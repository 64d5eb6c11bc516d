#!/usr/bin/env python
"""Peak memory and seconds of Fed-SE's fine-tuning steps by setting, on the model and LoRA adapter of a run config:
the micro-batch (one batch in one pass against the same batch accumulated over passes, `fedse.sft-micro-batch-size`),
where TRL's loss head projects (`--head loss`: the completions' positions, as `agent/training/sft.py` has it; `every`:
every position of the padded batch, TRL's own choice on CPU) and the precision (fp32, bf16-mixed, or bf16-base: the
frozen base loaded in bf16 under the same autocast, as a run with that precision loads it) and the attention kernel
(`--attention`, the run-config key engine.attn-implementation: sdpa or eager).

Each setting runs in a fresh process of its own, since a process's peak resident memory (ru_maxrss) only grows; with
`--repeats` R the settings take turns R times, so that a drift of the machine's speed reaches each alike. The samples
are synthetic agent steps of `--prompt-tokens` (uniform over +-10 %) and `--completion-tokens` tokens, the same in
every process. Printed per setting: the peak resident memory, the memory plan's client total for the same setting,
the seconds (each repeat's), and the steps' losses (which accumulation and the head's positions must leave as they
were); per pair of head settings, the every/loss ratio of the seconds, repeat by repeat, per other precision the
first precision's seconds over its own, and per other attention kernel the first kernel's seconds over its own.

    python benchmarks/sft_memory.py --run-config configs/smollm2-fedse-cpu.toml --micro 0 --micro 4
    python benchmarks/sft_memory.py --run-config configs/smollm2-fedse-cpu.toml --micro 4 --head every --head loss \
        --precision fp32 --precision bf16-mixed --prompt-tokens 190 --completion-tokens 18 --repeats 2 --threads 1
    python benchmarks/sft_memory.py --run-config configs/smollm2-fedse-cpu.toml --micro 4 --precision bf16-mixed \
        --precision bf16-base --prompt-tokens 190 --completion-tokens 18 --repeats 2 --threads 1
    python benchmarks/sft_memory.py --run-config configs/smollm2-fedse-cpu.toml --micro 4 --precision bf16-base \
        --attention sdpa --attention eager --prompt-tokens 190 --completion-tokens 18 --repeats 3 --threads 1
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import resource
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import numpy as np

from fedagent_flwr.config.choices import TRAINING_ATTENTIONS
from fedagent_flwr.methods.memory import memory_plan
from flwr.common.config import flatten_dict  # a preset's sections as the dotted keys Flower reads


HEADS = ("loss", "every")
PRECISIONS = ("fp32", "bf16-mixed", "bf16-base")


def one_setting(run_config: dict, micro: int, steps: int, prompt_tokens: int, completion_tokens: int, seed: int,
                head: str = "loss", precision: str = "fp32", attention: str = "sdpa") -> dict:
    from envs import make_env
    from fedagent_flwr.agent.training import sft
    from fedagent_flwr.agent.models.loading import load_agent
    from fedagent_flwr.agent.training.lora import attached_lora
    from fedagent_flwr.agent.engine.memory import GB, ModelShape
    from fedagent_flwr.agent.training.sft import SupervisedConfig, supervised_finetune
    from fedagent_flwr.config import RunConfig
    from fedagent_flwr.methods.placement import place_run, process_placement, run_base_dtype

    # the setting's precision is the run's: its base dtype (bf16-base) and its memory plan follow it
    cfg = RunConfig.from_run_config(RunConfig().to_run_config() | run_config | {"fedse.sft-micro-batch-size": micro,
                                                                                "precision": precision,
                                                                                "engine.attn-implementation": attention})
    agent = load_agent(cfg.model, cfg.env, place_run(cfg).device, run_base_dtype(cfg))  # as a run's client loads it here
    placement = process_placement(cfg, agent, make_env(cfg.env, cfg.rollout.max_steps).tasks_of_split("test"))
    plan = memory_plan(cfg, ModelShape.of(agent.model.config), placement.context_tokens, placement, placement.rollout_rows)
    rng = np.random.default_rng(seed)
    vocab = agent.model.config.vocab_size
    lo, hi = int(prompt_tokens * 0.9), int(prompt_tokens * 1.1) + 1
    samples = [(rng.integers(10, vocab, size=int(rng.integers(lo, hi))).tolist(), rng.integers(10, vocab, size=completion_tokens).tolist())
               for _ in range(steps * cfg.fedse.sft_batch_size)]
    if head == "every":  # TRL's own path: its fused head at every position of the padded batch
        sft.head_at_loss_positions = contextlib.nullcontext
    started = time.perf_counter()
    with attached_lora(agent.model, cfg.lora, seed=cfg.seed) as model:
        losses = supervised_finetune(model, samples, agent.tokenizer, SupervisedConfig(
            steps=steps, batch_size=cfg.fedse.sft_batch_size, micro_batch_size=micro, learning_rate=cfg.fedse.learning_rate,
            precision=placement.compute_precision, attention=cfg.engine.attn_implementation))
    return {"micro_batch_size": micro or cfg.fedse.sft_batch_size, "batch_size": cfg.fedse.sft_batch_size,
            "head": head, "precision": precision, "attention": attention,
            "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, "plan_gib": plan.total / GB,
            "seconds": time.perf_counter() - started, "losses": losses}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run-config", type=Path, required=True, help="a TOML file of run-config keys (a Fed-SE preset)")
    parser.add_argument("--micro", type=int, action="append", default=[],
                        help="fedse.sft-micro-batch-size to measure (repeatable; 0 = the whole batch in one pass)")
    parser.add_argument("--head", action="append", default=[], choices=HEADS,
                        help="where TRL's loss head projects (repeatable; default loss, the project's)")
    parser.add_argument("--precision", action="append", default=[], choices=PRECISIONS,
                        help="the fine-tuning's precision (repeatable; default fp32)")
    parser.add_argument("--attention", action="append", default=[], choices=TRAINING_ATTENTIONS,
                        help="the fine-tuning's attention kernel, engine.attn-implementation (repeatable; default sdpa)")
    parser.add_argument("--repeats", type=int, default=1, help="turns of every setting (default 1)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads of each measuring process (0 = torch's default)")
    parser.add_argument("--steps", type=int, default=2, help="optimizer steps (default 2)")
    parser.add_argument("--prompt-tokens", type=int, default=360, help="mean prompt length (default 360, a long buffer step)")
    parser.add_argument("--completion-tokens", type=int, default=24)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # the child process: one setting, JSON out
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    try:
        run_config = flatten_dict(tomllib.loads(args.run_config.read_text()))
    except (OSError, tomllib.TOMLDecodeError) as err:
        parser.error(f"--run-config {args.run_config}: {err}")
    if args.repeats < 1:
        parser.error(f"--repeats {args.repeats}: must be at least 1")
    if args.threads < 0:
        parser.error(f"--threads {args.threads}: must be 0 (torch's default) or more")
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    if args.one:
        print(json.dumps(one_setting(run_config, args.micro[0], args.steps, args.prompt_tokens, args.completion_tokens,
                                     args.seed, (args.head or ["loss"])[0], (args.precision or ["fp32"])[0],
                                     (args.attention or ["sdpa"])[0])))
        return {}
    attentions = args.attention or ["sdpa"]
    settings = list(itertools.product(args.micro or [0], args.head or ["loss"], args.precision or ["fp32"], attentions))
    runs: dict[tuple, list[dict]] = {s: [] for s in settings}
    for _ in range(args.repeats):
        for micro, head, precision, attention in settings:
            child = subprocess.run([sys.executable, __file__, "--one", "--run-config", str(args.run_config),
                                    "--micro", str(micro), "--head", head, "--precision", precision,
                                    "--attention", attention,
                                    "--threads", str(args.threads), "--steps", str(args.steps),
                                    "--prompt-tokens", str(args.prompt_tokens),
                                    "--completion-tokens", str(args.completion_tokens), "--seed", str(args.seed)],
                                   capture_output=True, text=True)
            if child.returncode:
                sys.exit(f"micro-batch {micro}, head {head}, {precision}, {attention}: the measuring process failed:\n"
                         f"{child.stderr[-2000:]}")
            runs[(micro, head, precision, attention)].append(json.loads(child.stdout.strip().splitlines()[-1]))
    results = [{**r[0], "seconds": [x["seconds"] for x in r], "peak_rss_gib": max(x["peak_rss_gib"] for x in r)}
               for r in runs.values()]
    # the ratios below are of settings under the first attention kernel, but for the kernels' own
    at = attentions[0]
    ratios = [{"micro_batch_size": micro, "precision": precision,
               "every_over_loss": [e["seconds"] / x["seconds"] for e, x in zip(runs[(micro, "every", precision, at)],
                                                                              runs[(micro, "loss", precision, at)])]}
              for micro, precision in itertools.product(args.micro or [0], args.precision or ["fp32"])
              if (micro, "every", precision, at) in runs and (micro, "loss", precision, at) in runs]
    first = (args.precision or ["fp32"])[0]  # each other precision's seconds against the first's, turn by turn
    precision_ratios = [{"micro_batch_size": micro, "head": head, "precision": precision,
                         "first_over_this": [f["seconds"] / x["seconds"] for f, x in zip(runs[(micro, head, first, at)],
                                                                                         runs[(micro, head, precision, at)])]}
                        for micro, head, precision, attention in settings if precision != first and attention == at]
    attention_ratios = [{"micro_batch_size": micro, "head": head, "precision": precision, "attention": attention,
                         "first_over_this": [f["seconds"] / x["seconds"] for f, x in zip(runs[(micro, head, precision, at)],
                                                                                         runs[(micro, head, precision, attention)])]}
                        for micro, head, precision, attention in settings if attention != at]
    # not "settings": raw_output.py files a result's `settings` as the benchmark's arguments
    report = {"measured": results, "head_ratios": ratios, "precision_ratios": precision_ratios,
              "attention_ratios": attention_ratios}
    if args.json:
        print(json.dumps(report))
    else:
        print(f"Fed-SE fine-tuning of {args.run_config}: {args.steps} steps, prompts of ~{args.prompt_tokens} tokens")
        print(f"  {'micro-batch':>11s} {'batch':>6s} {'head':>5s} {'precision':>10s} {'attention':>9s} {'peak RSS GiB':>13s} "
              f"{'plan GiB':>9s} {'seconds':>8s}  losses")
        for r in results:
            print(f"  {r['micro_batch_size']:11d} {r['batch_size']:6d} {r['head']:>5s} {r['precision']:>10s} {r['attention']:>9s} "
                  f"{r['peak_rss_gib']:13.2f} {r['plan_gib']:9.2f} {min(r['seconds']):8.1f}  "
                  f"{', '.join(f'{x:.4f}' for x in r['losses'])}")
        for r in ratios:
            print(f"  head at every position / at the loss's, micro-batch {r['micro_batch_size']}, {r['precision']}: "
                  f"{', '.join(f'{x:.2f}x' for x in r['every_over_loss'])}")
        for r in precision_ratios:
            print(f"  {first} / {r['precision']}, micro-batch {r['micro_batch_size']}, head {r['head']}: "
                  f"{', '.join(f'{x:.2f}x' for x in r['first_over_this'])}")
        for r in attention_ratios:
            print(f"  {at} / {r['attention']}, micro-batch {r['micro_batch_size']}, head {r['head']}, {r['precision']}: "
                  f"{', '.join(f'{x:.2f}x' for x in r['first_over_this'])}")
    return report


if __name__ == "__main__":
    main(sys.argv[1:])
