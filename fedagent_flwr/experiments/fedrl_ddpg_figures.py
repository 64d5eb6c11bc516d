"""Figures 3-5 of Jin et al. for DDPGAvg at a CPU-feasible scale, on Pendulums with varied pole length.

    python -m fedagent_flwr.experiments.fedrl_ddpg_figures --out DIR [--seeds 3] [--episodes 30] [--E 5]

``--env pendulum`` (default: Pendulum-v1 with varied pole length, fedrl/ddpg.py) is the
CPU-scale stand-in; ``--env hopper`` / ``half-cheetah`` are the paper's MuJoCo families
(fedrl/mujoco_envs.py: leg radius / thigh lengths; needs the ``mujoco`` extra), whose
1,000-step episodes ``--max-steps`` can shorten.
Figures 3/4 (``communication``): DDPGAvg (E local episodes, then average actor and
critic) vs its E = inf variant (clients never communicate; the reported model is the
average of the independently trained networks) vs the independent Baseline (each
independently trained network scored on every environment, averaged). Scored with
noise-free episodes on the N training pendulums ("train") and on M pendulums with newly
drawn lengths ("test"); "local" is each client's own model on its own pendulum.
Figure 5 (``personalised``): PerDDPGAvg (a private embedding per client, never
averaged) vs DDPGAvg (the communication run of the same seed), local return.

The training loop, the scoring and the summaries are fedagent_flwr.experiments.fedrl_deep_figures' (its
``_train`` with a DDPG learner). Pendulum's returns: about -1200 to -1500 for a policy that
never swings up, about -150 for a good one (200 steps).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import time
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import torch

from fedagent_flwr.experiments.fedrl_deep_figures import (
    _mean_se,
    _paired_p,
    _train,
    summarise_communication,
)
from fedrl.ddpg import (
    CONTINUOUS_ENVS,
    DDPGConfig,
    DDPGLearner,
    make_continuous_env,
    sample_continuous_params,
)

__all__ = ["communication", "main", "personalised"]


def learner_factory(env_name: str, max_steps: int | None = None):
    def make(param, config: DDPGConfig, seed: int) -> DDPGLearner:
        return DDPGLearner(make_continuous_env(env_name, param, max_steps), config, seed=seed)

    return make


def _envs(seed: int, n_train: int, n_test: int, length_range, mass_range, env_name: str = "pendulum"):
    params = sample_continuous_params(env_name, np.random.default_rng([seed, 17]), n_train + n_test, length_range, mass_range)
    return [tuple(map(float, p)) for p in params[:n_train]], [tuple(map(float, p)) for p in params[n_train:]]


def communication(seeds, n_train: int, n_test: int, E: int, episodes: int, eval_every: int, eval_episodes: int,
                  config: DDPGConfig, length_range, mass_range, env_name: str = "pendulum", max_steps: int | None = None) -> dict:
    out = {"ddpgavg": [], "independent": [], "train_params": [], "test_params": []}
    for seed in seeds:
        tr, te = _envs(seed, n_train, n_test, length_range, mass_range, env_name)
        out["train_params"].append(tr)
        out["test_params"].append(te)
        test_envs = [make_continuous_env(env_name, p, max_steps) for p in te]
        for name, e in (("ddpgavg", E), ("independent", None)):
            t0 = time.perf_counter()
            hist, _ = _train(env_name, tr, e, episodes, config, seed, eval_every, test_envs, eval_episodes,
                             make_learner=learner_factory(env_name, max_steps))
            hist["seconds"] = round(time.perf_counter() - t0, 1)
            out[name].append(hist)
            print(f"seed {seed} {name}: train {[round(x) for x in hist['global_train']]} test {hist['global_test'][-1]:.0f} "
                  f"local {[round(x) for x in hist['local']]} ({hist['seconds']} s)", flush=True)
    return out


def personalised(seeds, n_train: int, E: int, episodes: int, eval_every: int, eval_episodes: int, config: DDPGConfig,
                 length_range, mass_range, env_name: str = "pendulum", max_steps: int | None = None) -> dict:
    out = {"perddpgavg": []}
    for seed in seeds:
        tr, _ = _envs(seed, n_train, 0, length_range, mass_range, env_name)
        t0 = time.perf_counter()
        hist, _ = _train(env_name, tr, E, episodes, config, seed, eval_every, [], eval_episodes,
                         make_learner=learner_factory(env_name, max_steps))
        hist["seconds"] = round(time.perf_counter() - t0, 1)
        out["perddpgavg"].append(hist)
        print(f"seed {seed} perddpgavg: local {[round(x) for x in hist['local']]} ({hist['seconds']} s)", flush=True)
    return out


def summarise_personalised(comm: dict, per: dict) -> dict:
    """Local return of PerDDPGAvg vs DDPGAvg (same seeds), final point and mean over evaluations (AUC)."""
    out = {}
    for stat, f in (("final", lambda h: h[-1]), ("auc", lambda h: float(np.mean(h)))):
        a = [f(h["local"]) for h in per["perddpgavg"]]
        b = [f(h["local"]) for h in comm["ddpgavg"][: len(a)]]
        out[f"local/{stat}"] = {
            **{name: {"mean": float(np.mean(v)), "se": float(_mean_se([[x] for x in v])[1][0]), "per_seed": v}
               for name, v in (("perddpgavg", a), ("ddpgavg", b))},
            "perddpgavg_vs_ddpgavg": _paired_p(a, b),
        }
    return out


def _plot(comm: dict, per: dict | None, path: Path, env_name: str = "pendulum") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = {
        "Fig 3: local performance": [("DDPGAvg", comm["ddpgavg"], "local"), ("independent", comm["independent"], "local")],
        "Fig 4: training envs": [("DDPGAvg", comm["ddpgavg"], "global_train"),
                                      ("E = inf (averaged)", comm["independent"], "global_train"),
                                      ("Baseline", comm["independent"], "baseline_train")],
        "Fig 4: new envs": [("DDPGAvg", comm["ddpgavg"], "global_test"),
                                        ("E = inf (averaged)", comm["independent"], "global_test"),
                                        ("Baseline", comm["independent"], "baseline_test")],
    }
    if per is not None:
        series["Fig 5: local, personalised"] = [("PerDDPGAvg", per["perddpgavg"], "local"), ("DDPGAvg", comm["ddpgavg"], "local")]
    fig, axes = plt.subplots(1, len(series), figsize=(5 * len(series), 4.2))
    x = comm["ddpgavg"][0]["episodes"]
    for ax, (title, lines) in zip(axes, series.items()):
        for label, runs, key in lines:
            m, se = _mean_se([h[key] for h in runs])
            ax.plot(x, m, marker=".", label=label)
            ax.fill_between(x, m - 1.65 * se, m + 1.65 * se, alpha=0.2)
        ax.set_title(f"{env_name} {title}")
        ax.set_xlabel("episodes per client")
        ax.set_ylabel("noise-free return")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m fedagent_flwr.experiments.fedrl_ddpg_figures", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--env", choices=CONTINUOUS_ENVS, default="pendulum",
                   help="pendulum: varied pole length / mass; hopper, half-cheetah: the paper's MuJoCo families")
    p.add_argument("--max-steps", type=int, default=0, help="episode cap (0 = the env's own: 200 / 1,000 / 1,000)")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--clients", type=int, default=5, help="N training environments (paper: 5)")
    p.add_argument("--test-envs", type=int, default=10, help="M new environments (paper: 20)")
    p.add_argument("--episodes", type=int, default=30, help="training episodes per client")
    p.add_argument("--E", type=int, default=5, help="local episodes between averages")
    p.add_argument("--eval-every", type=int, default=5)
    p.add_argument("--eval-episodes", type=int, default=2)
    p.add_argument("--embed-dim", type=int, default=4)
    p.add_argument("--length-range", type=float, nargs=2, default=(0.5, 1.5), metavar=("LO", "HI"))
    p.add_argument("--mass-range", type=float, nargs=2, default=(1.0, 1.0), metavar=("LO", "HI"))
    p.add_argument("--skip", choices=("none", "personalised"), default="none")
    args = p.parse_args(argv)
    for name in ("seeds", "clients", "episodes", "E", "eval_every", "eval_episodes", "embed_dim"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.eval_every % args.E or args.episodes % args.eval_every:
        p.error("--eval-every must be a multiple of --E, --episodes of --eval-every")
    if not (0 < args.length_range[0] <= args.length_range[1] and 0 < args.mass_range[0] <= args.mass_range[1]):
        p.error("--length-range and --mass-range need 0 < LO <= HI")
    if args.max_steps < 0:
        p.error("--max-steps must be >= 0")
    if args.env != "pendulum" and importlib.util.find_spec("mujoco") is None:
        p.error(f"--env {args.env} needs MuJoCo: pip install -e \".[mujoco]\"")
    torch.set_num_threads(1)
    args.out.mkdir(parents=True, exist_ok=True)
    config = DDPGConfig()
    seeds = list(range(args.seeds))
    report = {"args": {k: str(v) for k, v in vars(args).items()}, "ddpg": asdict(config),
              "machine": {"cpus": os.cpu_count(), "platform": platform.platform()}}
    t0 = time.perf_counter()
    comm = communication(seeds, args.clients, args.test_envs, args.E, args.episodes, args.eval_every, args.eval_episodes,
                         config, args.length_range, args.mass_range, args.env, args.max_steps or None)
    report["communication"] = comm
    report["communication_summary"] = summ = summarise_communication(comm, avg="ddpgavg")
    for key, v in summ.items():
        print(f"{key}: DDPGAvg {v['ddpgavg']['mean']:.1f}±{v['ddpgavg']['se']:.1f}  E=inf {v['e_inf']['mean']:.1f}±{v['e_inf']['se']:.1f}"
              f"  Baseline {v['baseline']['mean']:.1f}±{v['baseline']['se']:.1f}  | vs E=inf: wins {v['ddpgavg_vs_e_inf']['wins']}"
              f" p_w {v['ddpgavg_vs_e_inf']['wilcoxon_p']:.3f} | vs Baseline: wins {v['ddpgavg_vs_baseline']['wins']}"
              f" p_w {v['ddpgavg_vs_baseline']['wilcoxon_p']:.3f}", flush=True)
    per = None
    if args.skip != "personalised":
        per = personalised(seeds, args.clients, args.E, args.episodes, args.eval_every, args.eval_episodes,
                           replace(config, embed_dim=args.embed_dim), args.length_range, args.mass_range,
                           args.env, args.max_steps or None)
        report["personalised"] = per
        report["personalised_summary"] = psum = summarise_personalised(comm, per)
        for key, v in psum.items():
            d = v["perddpgavg_vs_ddpgavg"]
            print(f"{key}: PerDDPGAvg {v['perddpgavg']['mean']:.1f}±{v['perddpgavg']['se']:.1f}  DDPGAvg "
                  f"{v['ddpgavg']['mean']:.1f}±{v['ddpgavg']['se']:.1f}  | wins {d['wins']} p_w {d['wilcoxon_p']:.3f}", flush=True)
    report["seconds"] = round(time.perf_counter() - t0, 1)
    tmp = args.out / ".ddpg_figures.json.tmp"
    tmp.write_text(json.dumps(report, indent=1))
    os.replace(tmp, args.out / "ddpg_figures.json")
    _plot(comm, per, args.out / "ddpg_figures.png", args.env)
    print(f"wrote {args.out / 'ddpg_figures.json'} ({report['seconds']} s)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
