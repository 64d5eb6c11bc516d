#!/usr/bin/env python
"""A client's round and a held-out evaluation of a run config, setting by setting, side by side in one process.

Each variant (run-config values over the run config, e.g. `precision=bf16-mixed` or `rollout.name=static`) loads
the model as a client does (its base dtype), attaches the run's LoRA adapter, trains one round with the client's own
code (`methods/local_round.train_locally`: rollouts, then the GRPO update) on partition 0's tasks, and plays
`--eval-tasks` held-out tasks `eval.samples-per-task` times as the server's evaluator does (`--eval-only`: that
evaluation alone, of the model as loaded: how fast a setting such as rollout.name plays the held-out episodes). The
variants alternate repeat by repeat, so drift in the machine falls on all of them. Printed per variant: the
rollout's, the update's and the evaluation's seconds, and milliseconds per generated token (rollout, evaluation) and per trained step (update)
(mean and standard error over repeats), each as a ratio to the first variant's (per repeat, mean and standard
error), and the round's success rates (what a variant plays is sampled from other numbers, so
they differ; whether what is learnt differs is for paired runs to show, docs/results.md). Wall times, no profiler.

    python benchmarks/cpu_round.py --run-config configs/smollm2-fedagent-cpu.toml \\
        --variant precision=fp32 --variant precision=bf16-mixed --variant precision=bf16-base --repeats 2

A variant may also name `threads=N` (not a run-config key): torch's threads while it runs, e.g. `--variant threads=1
--variant threads=2 --eval-only`, the evaluation on one core against both, as the run's server has them.

With `--json` (one JSON line) under `python benchmarks/raw_output.py run OUT.json -- ...` the result is kept with the
machine, versions and commit it ran on (benchmarks/results/README.md).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

from envs import make_env
from envs.multi import per_env_spread
from fedagent_flwr.agent.models.loading import load_agent
from fedagent_flwr.agent.play.evaluation import GlobalEvaluator
from fedagent_flwr.agent.training.lora import attached_lora
from fedagent_flwr.config import RunConfig
from fedagent_flwr.methods.local_round import train_locally
from fedagent_flwr.methods.library_configs import rollout_config
from fedagent_flwr.methods.placement import process_placement, run_base_dtype
from fedagent_flwr.methods.tasks import learner_tasks
from fedagent_flwr.simulation import parse_overrides, read_run_config_file


def one_round(cfg: RunConfig, eval_tasks: int, train: bool = True) -> dict[str, float]:
    """Seconds of a client's rollouts, its update and a held-out evaluation under `cfg`, and their success rates;
    with `train=False` the evaluation's alone, of the model as loaded (its adapter attached, not yet trained)."""
    agent = load_agent(cfg.model, cfg.env, cfg.device_key("client"), run_base_dtype(cfg))
    tasks = learner_tasks(cfg, 0, cfg.num_clients)
    held_out = per_env_spread(make_env(cfg.env, cfg.rollout.max_steps).tasks_of_split("test"), eval_tasks)
    with attached_lora(agent.model, cfg.lora, seed=cfg.seed) as model:
        metrics = train_locally(agent, cfg, tasks, 1, 0, model=model) if train else None
        placement = process_placement(cfg, agent, held_out, "server", model=model)  # as the run's server resolves it
        evaluator = GlobalEvaluator(model, agent.tokenizer, lambda: make_env(cfg.env, cfg.rollout.max_steps), held_out,
                                    rollout_config(cfg, True, placement=placement),
                                    cfg.eval.samples_per_task, cfg.seed, precision=placement.precision)
        evaluation = evaluator.evaluate(0)
        eval_tokens = sum(len(s.completion_ids) for t in evaluator.last_trajectories for s in t.steps)
    played = {"eval_s": evaluation["seconds"], "eval_ms_per_token": 1000 * evaluation["seconds"] / max(1, eval_tokens),
              "eval_success": evaluation["success_rate"]}
    if metrics is None:
        return played
    update_s = metrics["seconds"] - metrics["rollout_seconds"]
    # Per generated token and per trained step: what each variant played differs (sampled), so its seconds alone
    # compare different work; these divide the work out (the prompts' lengths still vary with the episodes).
    return {"rollout_s": metrics["rollout_seconds"], "update_s": update_s,
            "rollout_ms_per_token": 1000 * metrics["rollout_seconds"] / max(1.0, metrics["generated_tokens"]),
            "update_ms_per_sample": 1000 * update_s / max(1.0, metrics["train_samples"]),
            "train_success": metrics["success_rate"]} | played


def timed(key: str) -> bool:
    """Whether a key of one_round's result is a time (a ratio to the first variant's is reported)."""
    return key.endswith("_s") or "_ms_per_" in key


def ratio_key(key: str) -> str:
    return key.removesuffix("_s") + "_ratio"


def mean_se(values: list[float]) -> tuple[float, float]:
    return statistics.mean(values), (statistics.stdev(values) / len(values) ** 0.5 if len(values) > 1 else 0.0)


def summarise(runs: dict[str, list[dict[str, float]]], first: str, is_timed=timed) -> dict[str, dict]:
    """Per variant and key, the mean and standard error over repeats; for a timed key also the ratio of the `first`
    variant's value to this one's, repeat by repeat (above 1: faster)."""
    report = {}
    for name, rows in runs.items():
        entry = {}
        for key in rows[0]:
            entry[key] = mean_se([r[key] for r in rows])
            if is_timed(key):
                entry[ratio_key(key)] = mean_se([ref[key] / r[key] for ref, r in zip(runs[first], rows)])
        report[name] = entry
    return report


def variant_parser(description: str) -> argparse.ArgumentParser:
    """The arguments of a side-by-side benchmark of run-config variants (this script, update_passes.py)."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run-config", required=True, metavar="FILE", help="a preset TOML of run-config keys")
    parser.add_argument("--variant", action="append", required=True, metavar="KEY=VALUE[,KEY=VALUE]",
                        help="run-config values of one variant over the run config; the first is the reference of the ratios")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    parser.add_argument("--json", action="store_true")
    return parser


def read_variants(parser: argparse.ArgumentParser, args: argparse.Namespace) -> dict[str, RunConfig]:
    """Each --variant's run config over --run-config, every one checked before any work (a bad value: the parser's
    one-line error); --threads applied."""
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        preset = RunConfig().to_run_config() | read_run_config_file(args.run_config)
        # an empty variant is the run config as it is
        return {v: RunConfig.from_run_config(preset | parse_overrides([i for i in v.split(",") if i])) for v in args.variant}
    except ValueError as err:
        parser.error(str(err))


def split_threads(parser: argparse.ArgumentParser, variant: str) -> tuple[str, int]:
    """A variant's run-config keys and the torch threads it names (`threads=N`; 0 where it names none)."""
    keys, threads = [], 0
    for item in (i for i in variant.split(",") if i):
        if item.startswith("threads="):
            value = item.removeprefix("threads=")
            if not value.isdigit() or int(value) < 1:
                parser.error(f"--variant {variant!r}: threads={value!r} is not allowed: expected an integer >= 1")
            threads = int(value)
        else:
            keys.append(item)
    return ",".join(keys), threads


def main(argv: list[str] | None = None) -> dict:
    parser = variant_parser(__doc__)
    parser.add_argument("--eval-tasks", type=int, default=8, help="held-out tasks the evaluation plays")
    parser.add_argument("--eval-only", action="store_true",
                        help="time the held-out evaluation alone, of the model as loaded (no client round first)")
    args = parser.parse_args(argv)
    own = {v: split_threads(parser, v) for v in args.variant}
    variants = {v: read_variants(parser, argparse.Namespace(**{**vars(args), "variant": [own[v][0]]}))[own[v][0]]
                for v in args.variant}
    default_threads = torch.get_num_threads()  # --threads, or torch's own
    runs: dict[str, list[dict[str, float]]] = {v: [] for v in variants}
    used: dict[str, int] = {}  # the threads each variant ran on, as torch reports them
    for repeat in range(args.repeats):
        for name, cfg in variants.items():
            torch.set_num_threads(own[name][1] or default_threads)
            used[name] = torch.get_num_threads()
            started = time.perf_counter()
            runs[name].append(one_round(cfg, args.eval_tasks, train=not args.eval_only))
            print(f"[cpu_round] repeat {repeat + 1}/{args.repeats} {name}: "
                  + ", ".join(f"{k} {v:.3f}" for k, v in runs[name][-1].items())
                  + f" ({time.perf_counter() - started:.0f} s)", file=sys.stderr, flush=True)
    first = args.variant[0]
    report = {"run_config": args.run_config, "repeats": args.repeats, "eval_tasks": args.eval_tasks,
              "eval_only": args.eval_only,
              "threads": default_threads, "variant_threads": used,
              "variants": summarise(runs, first)}
    if args.json:
        print(json.dumps(report))
    else:
        print(f"{args.run_config}: {args.repeats} repeats, {args.eval_tasks} held-out tasks, {report['threads']} threads; "
              f"ratio = {first}'s seconds / the variant's (above 1: faster)")
        for name, entry in report["variants"].items():
            print(f"  {name:<32} " + "  ".join(
                f"{key} {m:.1f} +- {se:.1f} ({entry[ratio_key(key)][0]:.2f}x)"
                for key, (m, se) in entry.items() if timed(key) and not key.endswith("_ratio")))
    return report


if __name__ == "__main__":
    main()
