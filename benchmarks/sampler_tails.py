#!/usr/bin/env python
"""Whether each token sampler draws from the softmax of a run's real model, its tail included.

The unit tests check the samplers on a small vocabulary; a real model's rows are a few tokens of nearly all the mass
and tens of thousands of tokens sharing the rest, where float rounding could make a sampler drop or favour the tail
(the inverse CDF's running sum in fp32 swallows a token far smaller than the sum so far; multinomial's exponential
numbers are fp32 too). This plays `--tasks` training tasks of the run config with its model as loaded (temperature and
sampler as configured), keeps the logits of the first `--rows` token steps, and for each temperature given reports:

- the inverse CDF's implied distribution (its fp32 running sum's steps over the sum) against the exact softmax in
  fp64: total variation per row (mean, max) and the mass of tokens it can never draw;
- `--draws` draws per row with each sampler: how often a tail token (exact probability below `--tail`) is drawn,
  against the expected rate (the rows' mean tail mass), with its Poisson standard error.

    python benchmarks/raw_output.py run OUT.json -- python benchmarks/sampler_tails.py \\
        --run-config configs/smollm2-fedse-cpu.toml --json
"""

from __future__ import annotations

import argparse
import json
import math

import torch

from envs import make_env
from fedagent_flwr.agent.engine import sampling
from fedagent_flwr.agent.models.loading import load_agent
from fedagent_flwr.agent.play.rollout import LMPolicy, PromptEncoder, run_episodes
from fedagent_flwr.config import RunConfig
from fedagent_flwr.methods.library_configs import rollout_config
from fedagent_flwr.methods.placement import place_run, run_base_dtype
from fedagent_flwr.simulation import parse_overrides, read_run_config_file


def real_logits(cfg: RunConfig, tasks: int, rows: int, seed: int) -> torch.Tensor:
    """The logits the sampler was handed in the first `rows` token steps of `tasks` training episodes, in fp32."""
    agent = load_agent(cfg.model, cfg.env, "cpu", run_base_dtype(cfg))
    kept: list[torch.Tensor] = []
    pick = sampling.pick_tokens

    def keep(logits, *args):
        if sum(len(k) for k in kept) < rows:
            kept.append(logits.float().clone())
        return pick(logits, *args)

    played = rollout_config(cfg, placement=place_run(cfg))  # this process's one placement
    sampling.pick_tokens = keep
    try:
        torch.manual_seed(seed)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=run_base_dtype(cfg) == torch.bfloat16):
            run_episodes(LMPolicy(agent.model, agent.tokenizer, played), lambda: make_env(cfg.env),
                         make_env(cfg.env).tasks()[:tasks], PromptEncoder(agent.tokenizer), played)
    finally:
        sampling.pick_tokens = pick
    return torch.cat(kept)[:rows]


def tails(logits: torch.Tensor, temperature: float, tail: float, draws: int, seed: int) -> dict:
    exact = torch.softmax(logits.double() / temperature, dim=-1)
    probs = torch.softmax(logits / temperature, dim=-1, dtype=torch.float32)
    running = probs.cumsum(dim=-1)
    implied = torch.diff(running, dim=-1, prepend=torch.zeros(len(running), 1)) / running[:, -1:]
    variation = 0.5 * (implied.double() - exact).abs().sum(dim=-1)
    in_tail = exact < tail
    result = {"rows": len(logits), "top_probability_mean": exact.max(dim=-1).values.mean().item(),
              "tail_mass_mean": (exact * in_tail).sum(dim=-1).mean().item(),
              "inverse_cdf_total_variation_mean": variation.mean().item(),
              "inverse_cdf_total_variation_max": variation.max().item(),
              "inverse_cdf_mass_never_drawn_mean": (exact * ((implied == 0) & (exact > 0))).sum(dim=-1).mean().item()}
    expected = result["tail_mass_mean"] * len(logits) * draws
    for sampler in sampling.TOKEN_SAMPLERS:
        torch.manual_seed(seed)
        hits = 0
        for start in range(0, len(logits), 50):  # 50 rows x draws at a time: a few hundred MB of probabilities
            block = logits[start:start + 50].repeat_interleave(draws, dim=0)
            tokens = sampling.pick_tokens(block, temperature, 1.0, sampler)
            hits += int(in_tail[start:start + 50].repeat_interleave(draws, dim=0).gather(1, tokens[:, None]).sum())
        result[sampler] = {"tail_draws": hits, "draws": len(logits) * draws, "expected": expected,
                           "expected_se": math.sqrt(expected)}
    return result


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run-config", required=True, metavar="FILE")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--tasks", type=int, default=8)
    parser.add_argument("--rows", type=int, default=600)
    parser.add_argument("--temperature", type=float, action="append", help="default: 1.0 and 0.4")
    parser.add_argument("--tail", type=float, default=1e-3)
    parser.add_argument("--draws", type=int, default=40)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    cfg = RunConfig.from_run_config(read_run_config_file(args.run_config) | parse_overrides(args.set))
    logits = real_logits(cfg, args.tasks, args.rows, args.seed)
    result = {"run_config": args.run_config, "tail": args.tail, "draws_per_row": args.draws,
              "temperatures": {str(t): tails(logits, t, args.tail, args.draws, args.seed)
                               for t in (args.temperature or [1.0, 0.4])}}
    if args.json:
        print(json.dumps(result), flush=True)
    else:
        for t, r in result["temperatures"].items():
            print(f"temperature {t}: tail mass {r['tail_mass_mean']:.5f}; inverse CDF's total variation "
                  f"{r['inverse_cdf_total_variation_mean']:.2e} (max {r['inverse_cdf_total_variation_max']:.2e}); "
                  + "; ".join(f"{s} {r[s]['tail_draws']} tail draws of {r[s]['draws']} (expected "
                              f"{r[s]['expected']:.1f} +- {r[s]['expected_se']:.1f})" for s in sampling.TOKEN_SAMPLERS))
    return result


if __name__ == "__main__":
    main()
