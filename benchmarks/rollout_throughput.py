#!/usr/bin/env python
"""Rollout engine throughput: all episodes batched vs one episode at a time vs transformers' `generate`.

Same model, same tasks, same sampling settings, measured side by side in one run:
the batched engine advances every live episode with one sampler call per step;
the sequential baseline plays each episode alone (one call per step of that episode,
KV cache on in both); the `generate` baseline plays the same batch with transformers'
`model.generate` in place of the project's sampler (agent/engine/sampling.py says why it exists:
this measures whether it earns its place). Reports environment steps and generated tokens
per second and the ratios.

    python benchmarks/rollout_throughput.py --model tiny:maze --episodes 64 --threads 2
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from envs import make_env
from fedagent_flwr.agent.models.loading import load_agent
from fedagent_flwr.agent.play.rollout import LMPolicy, PromptEncoder, run_episodes
from fedagent_flwr.config import RunConfig
from fedagent_flwr.methods.library_configs import rollout_config
from fedagent_flwr.methods.placement import place_run


class GeneratePolicy(LMPolicy):
    """LMPolicy with transformers' `generate` (left padding, the same stop tokens, temperature and cap)."""

    def _generate(self, prompts):
        cfg, pad = self.config, self.pad_id
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), pad, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, p in enumerate(prompts):
            ids[i, width - len(p):] = torch.tensor(p)
            mask[i, width - len(p):] = 1
        device = next(self.model.parameters()).device
        sampling = {"do_sample": True, "temperature": cfg.temperature, "top_p": cfg.top_p, "top_k": 0} if cfg.temperature > 0 else {"do_sample": False}
        out = self.model.generate(input_ids=ids.to(device), attention_mask=mask.to(device), max_new_tokens=cfg.max_new_tokens,
                                  eos_token_id=self.stop_ids, pad_token_id=pad, **sampling)
        rows = []
        for row in out[:, width:].tolist():
            kept = []
            for tok in row:
                kept.append(tok)
                if tok in self.stop_ids:
                    break
            rows.append(kept)
        return [(r, self.tokenizer.decode(r, skip_special_tokens=True)) for r in rows]


def measure(fn) -> tuple[float, list]:
    started = time.perf_counter()
    trajectories = fn()
    return time.perf_counter() - started, trajectories


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny:maze")
    parser.add_argument("--env", default="maze")
    parser.add_argument("--episodes", type=int, default=64, help="episodes per mode")
    parser.add_argument("--group-size", type=int, default=1,
                        help="episodes per task, as GRPO's groups (G identical first prompts); 1 = every episode a new task")
    parser.add_argument("--skip-sequential", action="store_true", help="leave out the one-episode-at-a-time mode (slow)")
    parser.add_argument("--max-steps", type=int, default=0, help="episode horizon; 0 = env default")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--device", default="auto")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print one JSON line instead of text")
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    agent = load_agent(args.model, args.env, args.device)
    env = make_env(args.env, args.max_steps)
    pool = env.tasks()
    if args.group_size < 1 or args.episodes % args.group_size:
        parser.error(f"--group-size={args.group_size} is not allowed: expected a divisor of --episodes={args.episodes}")
    tasks = [pool[i % len(pool)] for i in range(args.episodes // args.group_size) for _ in range(args.group_size)]
    # The default run's prompt and generation settings, all episodes in one generate call.
    run_cfg = RunConfig.from_run_config({"rollout.temperature": args.temperature, "rollout.generation-batch-size": max(1, args.episodes)})
    cfg = rollout_config(run_cfg, placement=place_run(run_cfg))
    encoder = PromptEncoder(agent.tokenizer)
    policy = LMPolicy(agent.model, agent.tokenizer, cfg)
    factory = lambda: make_env(args.env, args.max_steps)

    run_episodes(policy, factory, tasks[:2], encoder, cfg)  # warm-up (allocator, kernels)
    torch.manual_seed(args.seed)
    t_batched, batched = measure(lambda: run_episodes(policy, factory, tasks, encoder, cfg))
    t_single, single = None, []
    if not args.skip_sequential:
        torch.manual_seed(args.seed)
        t_single, single = measure(lambda: [run_episodes(policy, factory, [t], encoder, cfg)[0] for t in tasks])
    torch.manual_seed(args.seed)
    t_generate, generated = measure(lambda: run_episodes(GeneratePolicy(agent.model, agent.tokenizer, cfg), factory, tasks, encoder, cfg))

    def tokens(trajectories):
        return sum(len(s.completion_ids) for t in trajectories for s in t.steps)

    steps_b = sum(len(t.steps) for t in batched)
    result = {
        "model": args.model,
        "device": str(agent.device),
        "threads": args.threads,
        "episodes": args.episodes,
        "group_size": args.group_size,
        "batched_env_steps": steps_b,
        "batched_seconds": round(t_batched, 2),
        "batched_steps_per_s": round(steps_b / t_batched, 1),
        "batched_tokens_per_s": round(tokens(batched) / t_batched, 1),
        "batched_success": sum(t.won for t in batched) / len(batched),
    }
    if t_single is not None:
        steps_s = sum(len(t.steps) for t in single)
        result.update({
            "sequential_env_steps": steps_s,
            "sequential_seconds": round(t_single, 2),
            "sequential_steps_per_s": round(steps_s / t_single, 1),
            "speedup": round((steps_b / t_batched) / (steps_s / t_single), 2),
            "sequential_tokens_per_s": round(tokens(single) / t_single, 1),
            "sequential_success": sum(t.won for t in single) / len(single),
        })
    result.update({
        "generate_env_steps": sum(len(t.steps) for t in generated),
        "generate_seconds": round(t_generate, 2),
        "generate_tokens_per_s": round(tokens(generated) / t_generate, 1),
        "tokens_per_s_vs_generate": round((tokens(batched) / t_batched) / (tokens(generated) / t_generate), 2),
        "generate_success": sum(t.won for t in generated) / len(generated),
    })
    if args.json:
        print(json.dumps(result))
    else:
        for k, v in result.items():
            print(f"{k:>24}: {v}")


if __name__ == "__main__":
    main()
