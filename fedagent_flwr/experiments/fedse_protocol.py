"""Fed-SE's Table 1, ablations (Figure 4) and LoRA rank sweep (Figure 6) at CPU scale.

    python -m fedagent_flwr.experiments.fedse_protocol --out runs/fedse-protocol            # CPU preset (tiny model, maze)
    python -m fedagent_flwr.experiments.fedse_protocol --out DIR --set num-server-rounds=20 --set model=...  # other settings
    python -m fedagent_flwr.experiments.fedse_protocol --out DIR --seeds 0 1 2 3 4    # mean ± SE over seeds, paired tests
    python -m fedagent_flwr.experiments.fedse_protocol --out DIR --run-config configs/fedse-five-cpu.toml --seeds 0 1 2 3 4
                                                        # the paper's five environments, one per client

Every method runs in this process, with the same client and aggregation code the
Flower app runs (self_evolution.self_evolution_round, strategies.fedse_lora.
aggregate_adapters) but without Ray, so that ten methods fit on two CPU cores;
`flwr run . --run-config "strategy='fedse-lora'"` is the deployable form of the
same federated methods. Methods (all LoRA on the same frozen base, same rounds T,
same fine-tuning steps per round, same held-out tasks and evaluation seed):

  fed-se         explore, keep successes, cumulative buffer, unweighted A/B mean
  fedavg-static  federated, each client tunes on its static demonstrations D_k^0 only
  local          each client tunes its own adapter on D_k^0, no communication; mean success of the K adapters,
                 each on its own environment's held-out tasks when partition.scheme='by-environment'
  centralized    one adapter tuned on the union of all D_k^0
  no-history     fed-se, buffer = D_k^0 + this round's successes (w/o history)
  no-filter      fed-se, failed trajectories kept too (w/o filtering)
  weighted       fed-se, adapters averaged by each client's successes this round
  fed-se-valid-steps  fed-se trained only on the valid steps of kept trajectories (ours, not the paper's)
  rank-<r>       fed-se at LoRA rank r (rank sweep: final success vs MB per round)

Every method starts from the same fresh adapter, so each seed evaluates round 0
once, in its first method, and the others record that evaluation (`eval_reused`).
A method whose folder already holds a finished run of the same configuration
(<method>/config.json, and metrics.jsonl up to the last round) is reused, so an
interrupted protocol picks up where it stopped.

Outputs in --out: <method>/metrics.jsonl (held-out success overall and per
category after every evaluated round, training metrics, bytes), table.md and
table.json (final success per method; the paper's orderings checked),
rank_sweep.md. Numbers here come from whatever model the config names; the
preset's tiny model says nothing about the paper's 7B setting.
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from dataclasses import replace
from pathlib import Path

import torch
from flwr.app import Array, ArrayRecord

from envs import make_env
from envs.multi import env_names, per_env_spread, task_env
from fedagent_flwr.agent.play.evaluation import GlobalEvaluator
from fedagent_flwr.agent.training.experience import ExperienceBuffer
from fedagent_flwr.agent.models.loading import load_agent
from fedagent_flwr.agent.training.lora import adapter_to_arrays, arrays_to_adapter, attached_lora
from fedagent_flwr.agent.play.multi_env import ENV_PREFIX, MEAN_KEY
from fedagent_flwr.agent.play.seeding import seed_everything
from fedagent_flwr.agent.self_evolution import self_evolution_round
from fedagent_flwr.atomic import atomic_write_text
from fedagent_flwr.config import RunConfig
from fedagent_flwr.runs.preflight import preflight
from fedagent_flwr.simulation import parse_overrides, toml_value
from fedagent_flwr.experiments.seed_statistics import (
    cell,
    ordering,
    paired_difference,
    stats,
)
from fedagent_flwr.methods.tasks import learner_tasks
from fedagent_flwr.simulation import PROJECT_DIR as APP_DIR
from fedagent_flwr.simulation import read_run_config_file
from strategies.communication import payload_bytes
from strategies.fedse_lora import aggregate_adapters
from fedagent_flwr.methods.library_configs import rollout_config
from fedagent_flwr.methods.placement import place_run, run_base_dtype

# CPU preset (configs/fedse-cpu.toml): 3 clients x 4 maze tasks, 4 rounds; every key is a RunConfig key.
CPU_PRESET = read_run_config_file(str(APP_DIR / "configs" / "fedse-cpu.toml"))
METHODS = {
    "fed-se": {},
    "fedavg-static": {"fedse.explore-samples": 0},
    "local": {"fedse.explore-samples": 0},
    "centralized": {"fedse.explore-samples": 0},
    "no-history": {"fedse.history": "round"},
    "no-filter": {"fedse.keep": "all"},
    "weighted": {"fedse.aggregation": "weighted"},
    "fed-se-valid-steps": {"fedse.steps": "valid"},  # not in the paper: see self_evolution.valid_steps_only
}
RANKS = (2, 4, 16)  # plus the preset's rank 8, which is fed-se itself
# Keys the methods set above change only what happens in training; every method's round-0 evaluation scores the
# same fresh adapter (B = 0: the base model) with the same tasks and seed, so one seed evaluates it once.
TRAINING_ONLY_KEYS = frozenset(key for overrides in METHODS.values() for key in overrides)


def _evaluate(agent, cfg: RunConfig, adapter, server_round: int, only_env: str | None = None) -> dict[str, float]:
    tasks = per_env_spread(make_env(cfg.env, cfg.rollout.max_steps).tasks_of_split("test"), cfg.eval.tasks)  # per env with a spec
    if only_env is not None:  # a Local client is scored on its own environment's held-out tasks
        tasks = [t for t in tasks if task_env(t) == only_env]
    with attached_lora(agent.model, cfg.lora, seed=cfg.seed) as peft_model:
        arrays_to_adapter(peft_model, adapter)
        placement = place_run(cfg, "server", model=peft_model)  # as the run's server resolves it
        evaluator = GlobalEvaluator(peft_model, agent.tokenizer, lambda: make_env(cfg.env, cfg.rollout.max_steps), tasks,
                                    rollout_config(cfg, True, placement=placement), cfg.eval.samples_per_task, cfg.seed,
                                    precision=placement.precision)
        return evaluator.evaluate(server_round)


def own_environment_scores(evals: list[dict[str, float]], envs: list[str]) -> dict[str, float]:
    """Local's row when client p owns environment p, from `evals[p]`, client p's evaluation on environment p's
    held-out tasks alone: each environment's columns are its own client's (the paper's Local), the overall rates
    pool every client's episodes, and the mean over environments is the unweighted mean of their columns."""
    episodes = [e["episodes"] for e in evals]
    out = {key: sum(e[key] * n for e, n in zip(evals, episodes)) / sum(episodes)
           for key in evals[0] if "/" not in key and key != "episodes"}
    out["episodes"] = float(sum(episodes))
    for e in evals:  # each one's keys name its own environment (and categories within it) only
        out.update({key: v for key, v in e.items() if "/" in key and key != MEAN_KEY})
    out[MEAN_KEY] = sum(out[f"{ENV_PREFIX}{env}"] for env in envs) / len(envs)
    return out


def _due(cfg: RunConfig, r: int) -> bool:
    return r == 0 or r % cfg.eval.test_freq == 0 or r == cfg.num_server_rounds


def finished_rows(method: str, cfg: RunConfig, out: Path) -> list[dict] | None:
    """The rows of an earlier run of `method` with exactly this configuration that reached its final evaluation;
    None when there is none (a different configuration, or a run stopped part way, is run again)."""
    folder = out / method
    config = folder / "config.json"
    if not config.exists() or json.loads(config.read_text()) != cfg.to_run_config():
        return None
    rows = _read_rows(folder)
    if not rows or rows[-1].get("round") != cfg.num_server_rounds or "eval/success_rate" not in rows[-1]:
        return None
    return rows


def start_key(cfg: RunConfig) -> str:
    """What a round-0 evaluation depends on: the configuration without the methods' training-only keys."""
    return json.dumps({k: v for k, v in cfg.to_run_config().items() if k not in TRAINING_ONLY_KEYS}, sort_keys=True)


def start_evaluation(rows: list[dict]) -> dict | None:
    """The `eval/` keys of a run's round-0 row, None when it has none."""
    if not rows or rows[0].get("round") != 0 or "eval/success_rate" not in rows[0]:
        return None
    return {k: v for k, v in rows[0].items() if k.startswith("eval/")}


def run_method(method: str, cfg: RunConfig, out: Path, start_eval: dict | None = None) -> list[dict]:
    """Run one method; returns its per-round rows (also written to <out>/<method>/metrics.jsonl). `start_eval`: the
    round-0 evaluation of another method with the same `start_key`, used instead of evaluating the base again."""
    if (done := finished_rows(method, cfg, out)) is not None:
        print(f"[fedse-protocol] {method}: finished before with this configuration, reusing {out / method}", flush=True)
        return done
    (out / method).mkdir(parents=True, exist_ok=True)
    # Old rows go before the new config.json is written: were this run stopped before its first row, a finished
    # run of another configuration must not pass for one of this configuration.
    (out / method / "metrics.jsonl").unlink(missing_ok=True)
    atomic_write_text(out / method / "config.json", json.dumps(cfg.to_run_config(), indent=2, sort_keys=True))
    agent = load_agent(cfg.model, cfg.env, cfg.device, run_base_dtype(cfg))
    k = cfg.num_clients
    placement = place_run(cfg, model=agent.model)  # every auto of the clients, once
    how = dict(seed=cfg.seed, precision=placement.compute_precision, attention=cfg.engine.attn_implementation)
    rollout = rollout_config(cfg, placement=placement)
    env_factory = lambda: make_env(cfg.env, cfg.rollout.max_steps)  # noqa: E731
    buffers_root = out / method / "buffers"
    shutil.rmtree(buffers_root, ignore_errors=True)
    tasks = [learner_tasks(cfg, p, k) for p in range(k)]
    buffers = [ExperienceBuffer(buffers_root / f"partition-{p}", agent.base_fingerprint) for p in range(k)]
    with attached_lora(agent.model, cfg.lora, seed=cfg.seed) as peft_model:
        initial = adapter_to_arrays(peft_model)
    adapter_bytes = payload_bytes(initial)
    # One environment per client (Fed-SE's setting): client p's Local adapter is scored on environment p alone.
    own_envs = env_names(cfg.env) if cfg.partition.scheme == "by-environment" else None
    rows: list[dict] = []
    started = time.time()

    def log(r: int, adapters: list, train: list[dict], agg: dict) -> None:
        row: dict = {"round": r, "method": method}
        if train:
            for key in sorted({key for m in train for key in m}):
                vals = [m[key] for m in train if key in m]
                row[f"train/{key}"] = sum(vals) / len(vals)
        row.update({f"train/{key}": v for key, v in agg.items()})
        if r == 0 and start_eval is not None:
            row.update(start_eval)
            row["eval_reused"] = 1
            print(f"[fedse-protocol] {method} round 0: held-out success {row['eval/success_rate']:.3f} (the base "
                  "model's, evaluated by an earlier method of this seed)", flush=True)
        elif _due(cfg, r):
            if method == "local" and own_envs and len(adapters) == k:
                row.update({f"eval/{key}": v for key, v in own_environment_scores(
                    [_evaluate(agent, cfg, a, r, only_env=e) for a, e in zip(adapters, own_envs)], own_envs).items()})
            else:
                evals = [_evaluate(agent, cfg, a, r) for a in adapters]
                for key in evals[0]:
                    row[f"eval/{key}"] = sum(e.get(key, 0.0) for e in evals) / len(evals)
            print(f"[fedse-protocol] {method} round {r}: held-out success {row['eval/success_rate']:.3f}", flush=True)
        row["elapsed_seconds"] = round(time.time() - started, 1)  # after the evaluation, which it includes
        rows.append(row)
        atomic_write_text(out / method / "metrics.jsonl", "".join(json.dumps(x, sort_keys=True) + "\n" for x in rows))

    if method == "centralized":  # one learner on the pooled static sets: seed every buffer, then train on their union
        pooled = ExperienceBuffer(buffers_root / "pooled", agent.base_fingerprint)
        adapter = initial
        log(0, [adapter], [], {})
        for r in range(1, cfg.num_server_rounds + 1):
            seed_everything(cfg.seed, r, 0)
            for p in range(k):
                self_evolution_round(agent, cfg.fedse, cfg.lora, rollout, env_factory, tasks[p], r, buffers[p], adapter,
                                     finetune=False, **how)
            pooled.entries = [e for b in buffers for e in b.entries]
            adapter, m = self_evolution_round(agent, replace(cfg.fedse, seed_demos=0), cfg.lora, rollout, env_factory, tasks[0],
                                              r, pooled, adapter, **how)
            log(r, [adapter], [m], {})
        return rows

    adapters = [initial] * k
    log(0, [initial], [], {})
    for r in range(1, cfg.num_server_rounds + 1):
        results = []
        for p in range(k):
            seed_everything(cfg.seed, r, p)
            start_from = adapters[p] if method == "local" else adapters[0]
            results.append(self_evolution_round(agent, cfg.fedse, cfg.lora, rollout, env_factory, tasks[p], r, buffers[p],
                                                start_from, **how))
        metrics = [m for _, m in results]
        if method == "local":  # no communication: every client keeps its own adapter
            adapters = [a for a, _ in results]
            log(r, adapters, metrics, {"comm/bytes-per-client-round": 0.0})
            continue
        numpy_adapters = [{key: a[key].numpy() for key in a.keys()} for a, _ in results]
        successes = [m["fedse/new-successes"] for m in metrics]
        aggregated, agg = aggregate_adapters(numpy_adapters, cfg.fedse.aggregation, successes)
        global_adapter = ArrayRecord({key: Array(aggregated[key]) for key in initial.keys()})
        adapters = [global_adapter] * k
        agg["comm/bytes-per-client-round"] = float(2 * adapter_bytes)  # down + up
        log(r, [global_adapter], metrics, agg)
    return rows


def _final(rows: list[dict]) -> dict:
    return [r for r in rows if "eval/success_rate" in r][-1]


def one_seed_verdict(a: float, b: float, episodes: float) -> str:
    """Say "holds" when success rate `a` is above `b` by more than 1.96 binomial standard errors of the difference (two
    evaluations of `episodes` episodes each), else "not shown": one seed's means alone order noise as often as not."""
    se = (a * (1 - a) / episodes + b * (1 - b) / episodes) ** 0.5
    return "holds" if a - b > 1.96 * se else "not shown"


def write_tables(out: Path, results: dict[str, list[dict]], ranks: dict[int, list[dict]], cfg: RunConfig) -> None:
    first = next(iter(results.values()))
    categories = sorted(k.split("/", 2)[2] for k in _final(first) if k.startswith("eval/success_rate/"))
    if any(c.startswith("env/") for c in categories):  # several environments: Table 1's columns
        categories = [c for c in categories if c.startswith("env/")] + [c for c in categories if c == "mean_over_envs"]
    lines = [f"Held-out success after round {cfg.num_server_rounds} ({cfg.env}, model {cfg.model}, K={cfg.num_clients}; "
             f"{int(_final(first)['eval/episodes'])} episodes per evaluation)", "",
             "| method | " + " | ".join(categories) + " | overall | round 0 |", "|---" * (len(categories) + 3) + "|"]
    table = {}
    for method, rows in results.items():
        f = _final(rows)
        table[method] = {"final": f["eval/success_rate"], "initial": rows[0]["eval/success_rate"],
                         "per_category": {c: f.get(f"eval/success_rate/{c}") for c in categories},
                         "by_round": {r["round"]: r["eval/success_rate"] for r in rows if "eval/success_rate" in r}}
        lines.append(f"| {method} | " + " | ".join(f"{f.get(f'eval/success_rate/{c}', float('nan')):.3f}" for c in categories)
                     + f" | {f['eval/success_rate']:.3f} | {rows[0]['eval/success_rate']:.3f} |")
    n = _final(first)["eval/episodes"]
    checks = {}
    if {"fed-se", "fedavg-static"} <= table.keys():
        checks["fed-se > fedavg-static"] = one_seed_verdict(table["fed-se"]["final"], table["fedavg-static"]["final"], n)
    ablations = [m for m in ("fed-se", "no-history", "no-filter", "weighted") if m in table]
    if "no-filter" in table and len(ablations) > 1:
        below = [one_seed_verdict(table[m]["final"], table["no-filter"]["final"], n) for m in ablations if m != "no-filter"]
        checks["no-filter is the worst ablation"] = "holds" if all(v == "holds" for v in below) else "not shown"
    p = table[next(iter(table))]["initial"]
    lines += ["", "Paper orderings at this scale (one seed; seeds and paired tests decide): "
              + ", ".join(f"{k}: {v}" for k, v in checks.items()),
              f"Binomial standard error of one evaluation at p = {p:.2f} with {int(n)} episodes: {(p * (1 - p) / n) ** 0.5:.3f} "
              "(differences smaller than about twice that are noise; episodes of one task are correlated, so it is a lower bound)."]
    atomic_write_text(out / "table.md", "\n".join(lines) + "\n")
    atomic_write_text(out / "table.json", json.dumps({"config": cfg.to_run_config(), "methods": table, "checks": checks}, indent=2))
    if ranks:
        rl = ["| LoRA rank | adapter bytes per message | MB per client per round (down + up) | final held-out success |",
              "|---|---|---|---|"]
        for rank, rows in sorted(ranks.items()):
            per_round = rows[-1].get("train/comm/bytes-per-client-round", 0.0)
            rl.append(f"| {rank} | {int(per_round // 2)} | {per_round / 1e6:.4f} | {_final(rows)['eval/success_rate']:.3f} |")
        atomic_write_text(out / "rank_sweep.md", "\n".join(rl) + "\n")
    print((out / "table.md").read_text(), flush=True)


def print_plan(base: RunConfig, methods: list[str], ranks: list[int], seeds: list[int]) -> None:
    """What each method would run: its run-config keys that differ from the defaults (every config checked first)."""
    defaults = RunConfig().to_run_config()
    plans = [(m, base.to_run_config() | METHODS[m]) for m in methods]
    plans += [(f"rank-{r}", base.to_run_config() | {"lora.r": r, "lora.lora-alpha": 2.0 * r}) for r in ranks]
    for name, values in plans:
        RunConfig.from_run_config(values)
        changed = " ".join(f"{k}={toml_value(v)}" for k, v in values.items() if v != defaults[k] and k != "seed")
        print(f"[fedse-protocol] {name} (seeds {' '.join(map(str, seeds))}): {changed}", flush=True)


def run_seed(out: Path, base: RunConfig, methods: list[str], ranks: list[int]) -> dict[str, list[dict]]:
    """Every method (and the rank sweep) at one seed, tables in `out`; returns each method's rows."""
    out.mkdir(parents=True, exist_ok=True)
    results, sweep = {}, {}
    starts: dict[str, dict] = {}  # start_key -> the round-0 evaluation made under it
    for method in methods:
        cfg = RunConfig.from_run_config(base.to_run_config() | METHODS[method])
        results[method] = run_method(method, cfg, out, starts.get(start_key(cfg)))
        if (start := start_evaluation(results[method])) is not None:
            starts.setdefault(start_key(cfg), start)
        write_tables(out, results, sweep, base)
    if "fed-se" in results and ranks:
        sweep[base.lora.r] = results["fed-se"]
        for rank in ranks:
            cfg = RunConfig.from_run_config(base.to_run_config() | {"lora.r": rank, "lora.lora-alpha": 2.0 * rank})
            sweep[rank] = run_method(f"rank-{rank}", cfg, out)
            write_tables(out, results, sweep, base)
    return results


def _read_rows(folder: Path) -> list[dict] | None:
    path = folder / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else None


# The paper's orderings (Table 1 and Figure 4), each tested by a paired t-test over seeds: Fed-SE above the static
# and non-communicating baselines and above each ablation, and "without filtering" the worst ablation; first, whether
# Fed-SE learnt anything at all (above the base model it starts from).
BASE = "base model (round 0)"
ORDERINGS = [("fed-se", BASE), ("fed-se", "fedavg-static"), ("fed-se", "local"), ("fed-se", "no-history"), ("fed-se", "no-filter"),
             ("fed-se", "weighted"), ("no-history", "no-filter"), ("weighted", "no-filter")]
# Ours, not the paper's: whether training only on the steps the environment took as written (no repaired typos) is
# what Fed-SE needs at this scale; tested only when fed-se-valid-steps ran.
ORDERINGS += [("fed-se-valid-steps", "fed-se"), ("fed-se-valid-steps", "fedavg-static"), ("fed-se-valid-steps", BASE)]


def seeds_table(out: Path, per_seed: dict[int, dict[str, list[dict]]], cfg: RunConfig) -> dict:
    """<out>/table.md and table.json over seeds: each method's final held-out success (per environment too, when
    there are several) as mean ± standard error, and the paper's orderings with their paired tests."""
    methods = [m for m in METHODS if all(m in runs for runs in per_seed.values())]
    final = {m: {seed: _final(runs[m]) for seed, runs in per_seed.items()} for m in methods}
    # Every method starts from the same adapter (B = 0: the base model), so one method's round-0 evaluation is the
    # base row; a method that does not beat it has learnt nothing the evaluation can see.
    if methods and all(runs[methods[0]][0].get("round") == 0 and "eval/success_rate" in runs[methods[0]][0]
                       for runs in per_seed.values()):
        final[BASE] = {seed: runs[methods[0]][0] for seed, runs in per_seed.items()}
        methods = [*methods, BASE]
    columns = sorted({k[len("eval/success_rate/"):] for m in methods for f in final[m].values() for k in f
                      if k.startswith("eval/success_rate/env/")}) + ["overall"]
    key = {c: "eval/success_rate" if c == "overall" else f"eval/success_rate/{c}" for c in columns}
    table = {m: {c: stats([f[key[c]] for f in final[m].values()]) for c in columns
                 if all(key[c] in f for f in final[m].values())} for m in methods}
    seeds = sorted(per_seed)
    title = (f"Held-out success (%) after round {cfg.num_server_rounds} ({cfg.env}, model {cfg.model}, "
             f"K={cfg.num_clients}); mean ± standard error over seeds {', '.join(map(str, seeds))}")
    lines = [title, "",
             "| method | " + " | ".join(columns) + " |", "| --- |" + " --- |" * len(columns)]
    lines += [f"| {m} | " + " | ".join(cell(table[m][c]) if c in table[m] else "-" for c in columns) + " |"
              for m in methods]
    overall = {m: {seed: f["eval/success_rate"] for seed, f in final[m].items()} for m in methods}
    comparisons = {f"{a} > {b}": paired_difference(overall[a], overall[b]) for a, b in ORDERINGS if a in overall and b in overall}
    verdicts = [ordering(a, b, comparisons[f"{a} > {b}"]) for a, b in ORDERINGS if f"{a} > {b}" in comparisons]
    lines += [""] + [f"- {v}" for v in verdicts]
    atomic_write_text(out / "table.md", "\n".join(lines) + "\n")
    result = {"config": cfg.to_run_config(), "seeds": seeds, "methods": table, "comparisons": comparisons, "verdict": verdicts}
    atomic_write_text(out / "table.json", json.dumps(result, indent=2))
    print("\n".join(lines), flush=True)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, type=Path, help="output folder")
    parser.add_argument("--run-config", type=Path, default=None, metavar="FILE",
                        help="preset TOML of run-config keys (default configs/fedse-cpu.toml; "
                             "configs/fedse-five-cpu.toml: the five environments, one per client)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a run-config key of the preset")
    parser.add_argument("--methods", default=",".join(METHODS), help="comma-separated subset of " + ",".join(METHODS))
    parser.add_argument("--ranks", default=",".join(map(str, RANKS)), help="LoRA ranks of the sweep besides the preset's ('' = none)")
    parser.add_argument("--seeds", type=int, nargs="+",
                        help="several seeds: each in <out>/seed-<s>/, and <out>/table.md gives each method's mean ± standard "
                             "error and the paper's orderings with paired tests (default: the preset's seed alone, in <out>)")
    parser.add_argument("--tables-only", action="store_true", help="rewrite the tables from the metrics.jsonl files already in --out")
    parser.add_argument("--dry-run", action="store_true", help="print each method's run-config keys that differ from "
                                                               "the defaults, checked, without running anything")
    args = parser.parse_args(argv)
    if args.run_config and not args.run_config.is_file():
        parser.error(f"--run-config {args.run_config}: no such file (a TOML of run-config keys, e.g. configs/fedse-five-cpu.toml)")
    try:
        preset = read_run_config_file(str(args.run_config)) if args.run_config else CPU_PRESET
        overrides = dict(preset) | parse_overrides(args.set)
    except ValueError as err:
        parser.error(str(err))
    try:
        base = RunConfig.from_run_config(RunConfig().to_run_config() | overrides | {"strategy": "fedse-lora"})
    except ValueError as err:
        parser.error(str(err))
    methods = [m for m in args.methods.split(",") if m]
    unknown = sorted(set(methods) - set(METHODS))
    if unknown:
        parser.error(f"unknown method(s) {unknown}; choose from {', '.join(METHODS)}")
    ranks = [int(r) for r in args.ranks.split(",") if r]
    if args.dry_run:  # a plan, which may be made on another machine than the one that runs it
        print_plan(base, methods, ranks, args.seeds or [base.seed])
        return 0
    try:  # every run of the protocol runs on this machine: what it needs of it is checked before the first
        preflight(base)
    except ValueError as err:
        parser.error(str(err))
    several = args.seeds is not None and len(args.seeds) > 1
    if args.seeds and not several:
        # One seed writes its methods into --out itself; beside another run's seed-<s>/ folders it would mix with them
        # (a second one-seed process would overwrite the first's), so say where it belongs instead.
        if not args.tables_only and any(args.out.glob("seed-*/")):
            parser.error(f"--seeds {args.seeds[0]}: {args.out} holds the seed-<s>/ folders of a run over several seeds; "
                         f"add one seed with --out {args.out / f'seed-{args.seeds[0]}'}, or pass several seeds")
        base = replace(base, seed=args.seeds[0])
    if args.tables_only:
        if several:
            per_seed = {s: {m: rows for m in methods if (rows := _read_rows(args.out / f"seed-{s}" / m))} for s in args.seeds}
            if not any(per_seed.values()):
                parser.error(f"--tables-only: no method's metrics.jsonl under {args.out}/seed-<s>/ for seeds {args.seeds}")
            seeds_table(args.out, per_seed, base)
            return 0
        results = {m: rows for m in methods if (rows := _read_rows(args.out / m))}
        if not results:
            parser.error(f"--tables-only: no method's metrics.jsonl under {args.out}")
        sweep = {r: rows for r in ranks if (rows := _read_rows(args.out / f"rank-{r}"))}
        if sweep and "fed-se" in results:
            sweep[base.lora.r] = results["fed-se"]
        write_tables(args.out, results, sweep, base)
        return 0
    torch.set_num_threads(1)  # the cores are shared; one thread is the fast setting under contention
    if not several:
        run_seed(args.out, base, methods, ranks)
        return 0
    per_seed = {seed: run_seed(args.out / f"seed-{seed}", replace(base, seed=seed), methods, ranks) for seed in args.seeds}
    seeds_table(args.out, per_seed, base)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
