"""`python -m fedagent_flwr.experiments.evaluate`: a model's held-out play, as the server's evaluation does it."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import torch
from safetensors.numpy import load_file

from envs import answer_token_budget, make_env
from envs.multi import per_env_spread
from fedagent_flwr.agent.play.evaluation import evaluation_seed, play, summarize
from fedagent_flwr.agent.models.loading import load_agent
from fedagent_flwr.agent.models.pretrained import adapter_base
from fedagent_flwr.agent.engine.placement import place, resolve_device
from fedagent_flwr.agent.engine.precision import autocast, base_dtype
from fedagent_flwr.agent.play.rollout import (
    LMPolicy,
    PromptEncoder,
    RolloutConfig,
)
from fedagent_flwr.agent.play.transcripts import write_transcripts
from fedagent_flwr.config import EvalSection, RunConfig
from fedagent_flwr.config.choices import ACTION_MATCHING, ALL_PRECISIONS, ANSWER_PARSING, BF16_PRECISIONS, PROMPT_ROLES, PROMPT_TEMPLATES
from fedagent_flwr.experiments.seed_statistics import paired_difference
from fedagent_flwr.experiments.seed_statistics import success_by_task as task_success
from fedagent_flwr.methods import method_for
from fedagent_flwr.methods import placement as run_placement
from fedagent_flwr.runs.reporting import checkpoint_rounds
from fedagent_flwr.runs.run_folder import recorded_run_config


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m fedagent_flwr.experiments.evaluate`: a model's held-out play, as the server's evaluation does it."""
    p = argparse.ArgumentParser(prog="python -m fedagent_flwr.experiments.evaluate", description=main.__doc__)
    p.add_argument("--run", type=Path, metavar="RUN_FOLDER",
                   help="replay a run's own held-out evaluation: its server's settings, tasks, seed and placement, on its "
                        "checkpoint of --round; the other options but --out, --threads and --transcripts are the run's")
    p.add_argument("--round", type=int, help="with --run: the evaluated round whose checkpoint is played (default: the last kept)")
    p.add_argument("--model", default="tiny", help="'tiny', a Hugging Face name or a local folder (e.g. a run's checkpoint)")
    p.add_argument("--env", default=RunConfig.env, help=f"an env name or a comma-separated list (default: the run config's, {RunConfig.env})")
    p.add_argument("--tasks", type=int, default=0, help="evenly spaced held-out tasks per environment; 0 = all")
    p.add_argument("--samples-per-task", type=int, default=EvalSection().samples_per_task,
                   help="episodes per task (default: a run's, eval.samples-per-task)")
    p.add_argument("--temperature", type=float, default=EvalSection().temperature, help="0 = greedy (default: a run's)")
    p.add_argument("--action-matching", choices=ACTION_MATCHING, default="exact")
    p.add_argument("--history-length", type=int, default=0)
    p.add_argument("--answer-parsing", choices=ANSWER_PARSING, default="strict")
    p.add_argument("--prompt-roles", choices=PROMPT_ROLES, default="user",
                   help="user: instructions in the user message (reference); system: in a system message")
    p.add_argument("--prompt-template", choices=PROMPT_TEMPLATES, default="compact",
                   help="the user message's layout: compact (ours) or reference (a run config's rollout.prompt-template)")
    p.add_argument("--seed", type=int, default=0,
                   help="the run's seed: with the run's evaluation settings this replays the server's evaluation")
    p.add_argument("--out", type=Path, help="also write the metrics as JSON to this file")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N (auto: CUDA when visible; bf16 autocast there)")
    p.add_argument("--precision", choices=ALL_PRECISIONS, default="auto",
                   help="as the run config's key; auto resolves as the run the model came from did on this machine: for "
                        "a LoRA run's adapter folder with --device cpu, bf16-base where a probe shows bf16 clearly faster "
                        "here, else fp32 on a CPU (bf16-mixed on CUDA). --paired-with plays in the same precision")
    p.add_argument("--transcripts", "--dump", dest="transcripts", type=Path,
                   help="write sampled episodes as text to this file (--dump is the same flag)")
    p.add_argument("--transcript-episodes", type=int, default=4, help="how many episodes --transcripts writes")
    p.add_argument("--paired-with", metavar="MODEL",
                   help="also play this model on the same tasks with the same seed, and test --model minus it with a "
                        "paired t-test over tasks (each task's success rate is one pair: episodes of one task are "
                        "correlated, tasks are not)")
    args = p.parse_args(argv)
    if args.run is not None:
        torch.set_num_threads(args.threads)
        try:
            metrics, trajectories = replay_run(args.run, args.round)
        except ValueError as err:
            p.error(str(err))
        return _report(args, metrics, trajectories, f"held-out episodes of {args.run}")
    if args.tasks < 0 or args.samples_per_task < 1 or args.temperature < 0 or args.history_length < 0:
        p.error("--tasks must be >= 0, --samples-per-task >= 1, --temperature and --history-length >= 0")
    torch.set_num_threads(args.threads)
    tasks = per_env_spread(make_env(args.env).tasks_of_split("test"), args.tasks)
    config = RolloutConfig(history_length=args.history_length, max_new_tokens=answer_token_budget(args.env),
                           temperature=args.temperature, action_matching=args.action_matching,
                           answer_parsing=args.answer_parsing, prompt_roles=args.prompt_roles,
                           prompt_template=args.prompt_template)

    try:  # one precision for --model and --paired-with, decided before either loads (bf16-base loads its base in bf16)
        # a LoRA run's checkpoint (only its adapter trained), on a device stated as cpu: as a run's placement decides
        adapter_only = adapter_base(args.model) is not None and args.device == "cpu"
        on_cpu = not resolve_device(args.device).startswith("cuda")
        measure = on_cpu and (adapter_only or args.precision in BF16_PRECISIONS)  # as a run's placement measures
        rates = run_placement.model_rates(args.model, args.env) if measure else None
        chosen = place(device=args.device, precision=args.precision, adapter_only=adapter_only, cpu_rates=rates)
    except ValueError as err:
        p.error(str(err))
    print(f"[fedagent] evaluation: {chosen.summary()}", file=sys.stderr, flush=True)

    def episodes_of(model: str):
        try:
            agent = load_agent(model, args.env, args.device, base_dtype(chosen.precision))
        except ValueError as err:
            p.error(str(err))
        torch.manual_seed(evaluation_seed(args.seed))
        # as the run's server resolves it on this machine, the precision as decided above
        placement = place(device=args.device, precision=chosen.precision, model=agent.model)
        played = replace(config, decode_engine=placement.decode_engine)
        with autocast(placement.compute_precision, agent.device):
            return play(LMPolicy(agent.model, agent.tokenizer, played), lambda: make_env(args.env), tasks,
                        PromptEncoder(agent.tokenizer), played, args.samples_per_task)

    trajectories = episodes_of(args.model)
    metrics: dict = summarize(trajectories)
    if args.paired_with:
        other = episodes_of(args.paired_with)
        metrics["paired_with/success_rate"] = summarize(other)["success_rate"]
        difference = paired_difference(success_by_task(trajectories), success_by_task(other))
        metrics["paired"] = {k: difference[k] for k in ("n", "mean", "se", "ci95", "p")}
        print(f"{args.model} minus {args.paired_with}: {difference['mean']:+.3f} +- {difference['se']:.3f} success "
              f"(95% interval [{difference['ci95'][0]:+.3f}, {difference['ci95'][1]:+.3f}]), paired t-test over "
              f"{difference['n']} tasks p = {difference['p']:.2g}", flush=True)
    return _report(args, metrics, trajectories, f"held-out episodes of {args.model} on {args.env} (temperature {args.temperature:g})")


def _report(args, metrics: dict, trajectories, header: str) -> int:
    if args.transcripts:
        write_transcripts(args.transcripts, trajectories, args.transcript_episodes, header=header)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(metrics, indent=1, sort_keys=True))
    print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in metrics.items()}, indent=1))
    return 0


def replay_run(run_dir: Path, server_round: int | None = None) -> tuple[dict, list]:
    """A run's server evaluation of its checkpoint of `server_round` (default: the last kept), played again as that
    server played it: the run's config (config.json, old key names read as today's), its method's evaluator, tasks,
    seed and placement on this machine, and the global model loaded as the server holds it (a LoRA adapter onto the
    base, not merged). On the processor kind the run used, the metrics are the run's to the last digit."""
    run_dir = run_dir.expanduser()
    recorded = run_dir / "config.json"
    if not recorded.is_file():
        raise ValueError(f"--run {run_dir}: not a run folder (no config.json)")
    cfg = recorded_run_config(run_dir)
    if cfg.traits.trains == "fedrl":
        raise ValueError(f"--run {run_dir}: strategy {cfg.strategy!r} keeps no model checkpoints to evaluate")
    folder = run_dir / "checkpoints"
    kept = checkpoint_rounds(run_dir)
    if server_round is None and kept:
        server_round = kept[-1]
    if server_round not in kept:
        raise ValueError(f"--round {server_round}: {run_dir} keeps checkpoints of rounds {kept or 'none'}")
    method = method_for(cfg)
    method.prepare()
    try:
        checkpoint = folder / f"round-{server_round:04d}"
        files = sorted(checkpoint.glob("adapter_model.safetensors" if method.trains_adapter() else "model*.safetensors"))
        if not files:
            raise ValueError(f"--run {run_dir}: {checkpoint} holds no safetensors weights")
        arrays = {k: v for f in files for k, v in load_file(str(f)).items()}  # a large model's shards, joined
        metrics = method.evaluate(server_round, arrays)
        return metrics, method.evaluator.last_trajectories
    finally:
        method.close()


def success_by_task(trajectories) -> dict[str, float]:
    """Each task's success rate over its episodes."""
    return task_success((t.task.id, t.won) for t in trajectories)


if __name__ == "__main__":
    raise SystemExit(main())
