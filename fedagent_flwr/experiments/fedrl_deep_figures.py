"""Figures 3-6 of Jin et al. (deep and personalised FedRL) at a CPU-feasible scale, on CartPole / Acrobot.

    python -m fedagent_flwr.experiments.fedrl_deep_figures --out DIR [--env cartpole] [--seeds 3] [--episodes 96] [--E 8]

Figures 3/4 (``communication``): DQNAvg (E local episodes, then average) vs its
E = inf variant (clients never communicate; the reported model is the average of
the independently trained networks) vs the independent Baseline (the mean over
clients of each independently trained network, scored on every environment). Each
is scored with greedy episodes on the N training environments ("train", the FedRL
objective) and on M environments with newly drawn lengths ("test"); "local" is each
client's own model on its own environment (Figure 3's quantity).

Figure 5 (``personalised``): DQNAvg vs PerDQNAvg (a private embedding per client,
never averaged); "local" as above.

Figure 6 (``adaptation``): the PerDQNAvg model meets a new environment with the
clients' mean embedding as the starting point, then adapts for a few episodes by
updating only the embedding (E-Update), the embedding and the network (E&N-Update),
or nothing (Phi-Update); scored after every adaptation chunk. Options: new environments
outside the training range (``--new-range``), a random starting embedding (``--adapt-init
random``, Figure 1's caption), the embedding's own step size (``--adapt-embed-lr``) and the
episodes / updates until a return threshold is first reached (``--adapt-threshold``).

Figures 3/4 are summarised per seed and as mean ± SE of the final point, the mean over all
evaluations (AUC) and over their second half, with paired tests (``summarise_communication``).
``--lr`` sets the DQN step size shared by all methods (fedrl/README.md: 0.003 is the setting
where DQNAvg's advantage shows at this scale).

The scale (5 clients, 96 episodes each, 3 seeds, CartPole capped at 200 steps)
is far below the paper's; the numbers say how the methods compare at this scale only.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import torch
from safetensors import safe_open
from safetensors.numpy import save_file
from scipy import stats

from fedrl.deep import (
    ENV_NAMES,
    DQNConfig,
    DQNLearner,
    EmbeddingSearch,
    make_env,
    sample_env_params,
)
from fedrl.tabular import average

__all__ = ["adaptation", "communication", "main"]

MIN_SEARCH_STD = 0.05  # E-Search's floor on its spread (EmbeddingSearch's default)


def _envs(env_name: str, seed: int, n_train: int, n_test: int):
    params = sample_env_params(env_name, np.random.default_rng([seed, 17]), n_train + n_test)
    return params[:n_train], params[n_train:]


def _score(learner: DQNLearner, envs, episodes: int) -> float:
    return float(np.mean([learner.evaluate(e, episodes) for e in envs])) if envs else float("nan")


def _train(env_name: str, train_params, E: int | None, total_episodes: int, config: DQNConfig, seed: int, eval_every: int,
           test_envs, eval_episodes: int, make_learner=None) -> tuple[dict, list[DQNLearner]]:
    """DQNAvg (finite E) or independent clients (E None), scored every ``eval_every`` episodes.

    ``make_learner(param, config, seed)`` builds another kind of learner with the same interface
    (fedagent_flwr.experiments.fedrl_ddpg_figures: DDPG on Pendulums); default: a DQN on ``make_env(env_name, param)``.
    """
    if make_learner is None:
        def make_learner(p, cfg, s):
            return DQNLearner(make_env(env_name, p), cfg, seed=s)
    learners = [make_learner(p, config, seed * 7919 + 1000 * k) for k, p in enumerate(train_params)]
    shared = config.embed_dim > 0
    start = learners[0].get_weights(shared_only=shared)
    for ln in learners:  # one common initialisation
        ln.set_weights(start, shared_only=shared)
    scorer = make_learner(train_params[0], config, seed * 7919 + 999)
    train_envs = [ln.env for ln in learners]
    hist = {k: [] for k in ("episodes", "global_train", "global_test", "local", "baseline_train", "baseline_test")}
    done = 0
    while done < total_episodes:
        chunk = eval_every
        if E is not None:
            for _ in range(chunk // E):
                for ln in learners:
                    ln.train_episodes(E)
                w = [average(ws) for ws in zip(*(ln.get_weights(shared_only=shared) for ln in learners))]
                for ln in learners:
                    ln.set_weights(w, shared_only=shared)
        else:
            for ln in learners:
                ln.train_episodes(chunk)
        done += chunk
        w = [average(ws) for ws in zip(*(ln.get_weights(shared_only=shared) for ln in learners))]
        if shared:  # the global model needs an embedding: the clients' mean (state_dict lists it first)
            w = [average([ln.net.embedding.detach().numpy() for ln in learners])] + w
        scorer.set_weights(w)
        hist["episodes"].append(done)
        hist["global_train"].append(_score(scorer, train_envs, eval_episodes))
        hist["global_test"].append(_score(scorer, test_envs, eval_episodes))
        hist["local"].append(float(np.mean([ln.evaluate(episodes=eval_episodes) for ln in learners])))
        if E is None:  # a randomly picked independent model, on every environment
            hist["baseline_train"].append(float(np.mean([_score(ln, train_envs, eval_episodes) for ln in learners])))
            hist["baseline_test"].append(float(np.mean([_score(ln, test_envs, eval_episodes) for ln in learners])))
    return hist, learners


def communication(env_name: str, seeds, n_train: int, n_test: int, E: int, episodes: int, eval_every: int,
                  eval_episodes: int, config: DQNConfig) -> dict:
    out = {"dqnavg": [], "independent": []}
    for seed in seeds:
        tr, te = _envs(env_name, seed, n_train, n_test)
        test_envs = [make_env(env_name, p) for p in te]
        for name, e in (("dqnavg", E), ("independent", None)):
            t0 = time.perf_counter()
            hist, _ = _train(env_name, tr, e, episodes, config, seed, eval_every, test_envs, eval_episodes)
            hist["seconds"] = round(time.perf_counter() - t0, 1)
            out[name].append(hist)
            print(f"seed {seed} {name}: train {hist['global_train'][-1]:.1f} test {hist['global_test'][-1]:.1f} "
                  f"local {hist['local'][-1]:.1f} ({hist['seconds']} s)", flush=True)
    return out


def _new_params(env_name: str, seed: int, n_train: int, n_new: int, new_range) -> np.ndarray:
    """The new environments: drawn like the training ones (``new_range`` None) or U(lo, hi) for the varied parameter."""
    if new_range is None:
        return _envs(env_name, seed, n_train, n_new)[1]
    lo, hi = new_range
    return np.random.default_rng([seed, 23]).uniform(lo, hi, size=n_new)


def _first_at(curve, xs, threshold):
    return next((x for x, v in zip(xs, curve) if v >= threshold), None)


def adaptation(env_name: str, seeds, n_train: int, n_new: int, E: int, episodes: int, adapt_episodes: int, adapt_every: int,
               eval_episodes: int, config: DQNConfig, adapt_epsilon: float, new_range=None, threshold: float | None = None,
               init: str = "mean", embed_lr: float = 0.0, search_population: int = 0, search_std: float | str = 1.0,
               trained_dir=None) -> dict:
    """PerDQNAvg training, then E-Update / E&N-Update / Phi-Update on new environments.

    With ``threshold``, also records for every new environment the number of adaptation
    episodes (and gradient updates) after which the greedy return first reaches it
    (None: not within ``adapt_episodes``). ``init``: the new environment's embedding starts at the
    clients' mean ("mean", Section 7.5) or at N(0, I) ("random", Figure 1's caption), the same draw for every mode.
    ``search_population`` > 0 adds "E-Search": the embedding alone, moved by ``EmbeddingSearch`` (one
    step of ``search_population`` greedy episodes per ``adapt_every`` episodes; updates = search steps),
    starting with spread ``search_std``: a number, or "clients" for the per-dimension spread of the
    training clients' embeddings around their mean (like the mean, computable from sums over clients, so
    no single client's embedding is needed).
    Also records, per new environment, the return of the trained network with each training client's
    embedding ("train_embedding_returns"): whether some embedding already plays it well.
    ``trained_dir``: where the trained PerDQNAvg of each seed is kept (written after training, read
    instead of training when present), so other adaptation settings can be run on the same networks.
    """
    if init not in ("mean", "random"):
        raise ValueError(f"init must be 'mean' or 'random', got {init!r}")
    if not (search_std == "clients" or (isinstance(search_std, (int, float)) and search_std > 0)):
        raise ValueError(f"search_std must be a number > 0 or 'clients', got {search_std!r}")
    if search_population and (search_population < 2 or adapt_every % search_population):
        raise ValueError(f"search_population must be 0 or >= 2 and divide adapt_every={adapt_every}, got {search_population}")
    modes = ("E-Update", "E&N-Update", "Phi-Update") + (("E-Search",) if search_population else ())
    out = {"personalised_local": [], "plain_local": [], "new_params": [], "train_embedding_returns": [], **{m: [] for m in modes},
           **{f"{m}/per_env": [] for m in modes}, **{f"{m}/episodes_to_threshold": [] for m in modes},
           **{f"{m}/updates_to_threshold": [] for m in modes}}
    xs = list(range(0, adapt_episodes + 1, adapt_every))
    for seed in seeds:
        tr = _envs(env_name, seed, n_train, n_new)[0]
        te = _new_params(env_name, seed, n_train, n_new, new_range)
        meta = {"env": env_name, "seed": seed, "clients": n_train, "E": E, "episodes": episodes,
                "eval_episodes": eval_episodes, "dqn": asdict(config)}
        path = None if trained_dir is None else Path(trained_dir) / f"perdqnavg-{env_name}-seed{seed}.safetensors"
        if path is not None and path.exists():
            embeddings, shared, local = load_trained(path, meta)
            print(f"seed {seed}: trained networks read from {path}", flush=True)
        else:
            hist, learners = _train(env_name, tr, E, episodes, config, seed, episodes, [], eval_episodes)
            plain, _ = _train(env_name, tr, E, episodes, replace(config, embed_dim=0), seed, episodes, [], eval_episodes)
            embeddings = np.stack([ln.net.embedding.detach().numpy() for ln in learners])
            shared = learners[0].get_weights(shared_only=True)
            local = {"personalised_local": hist["local"][-1], "plain_local": plain["local"][-1]}
            if path is not None:
                save_trained(path, meta, embeddings, shared, local)
        out["personalised_local"].append(local["personalised_local"])
        out["plain_local"].append(local["plain_local"])
        out["new_params"].append([float(p) for p in te])
        mean_embedding = average(list(embeddings))
        start_std = np.maximum(embeddings.std(axis=0), MIN_SEARCH_STD) if search_std == "clients" else search_std
        adapt_cfg = replace(config, epsilon=adapt_epsilon, embed_lr=embed_lr)
        probe = DQNLearner(make_env(env_name, te[0]), adapt_cfg, seed=seed * 7919 + 4999)
        rows = []
        for p in te:
            env = make_env(env_name, p)
            row = []
            for e in embeddings:
                probe.set_weights([e] + shared)
                row.append(probe.evaluate(env, eval_episodes))
            rows.append(row)
        out["train_embedding_returns"].append(rows)
        print(f"seed {seed} best training embedding on each new env: {[round(max(r), 1) for r in rows]}", flush=True)
        for mode in modes:
            curves, to_eps, to_upd = [], [], []
            for j, p in enumerate(te):
                ln = DQNLearner(make_env(env_name, p), adapt_cfg, seed=seed * 7919 + 5000 + j)
                start = mean_embedding if init == "mean" else \
                    np.random.default_rng([seed, 31, j]).normal(size=mean_embedding.shape).astype(np.float32)
                ln.set_weights([start] + shared)
                search = EmbeddingSearch(ln, search_population, search_population // 2, std=start_std,
                                         min_std=MIN_SEARCH_STD, seed=seed * 7919 + 6000 + j) \
                    if mode == "E-Search" else None
                curve, updates = [ln.evaluate(episodes=eval_episodes)], [0]
                for _ in range(adapt_episodes // adapt_every):
                    if mode == "E-Update":
                        ln.adapt_embedding(adapt_every)
                    elif mode == "E&N-Update":
                        ln.train_episodes(adapt_every)
                    elif search is not None:
                        for _ in range(adapt_every // search_population):
                            search.step()
                    curve.append(ln.evaluate(episodes=eval_episodes))
                    updates.append(search.updates if search is not None else ln.updates)
                curves.append(curve)
                if threshold is not None:
                    hit = _first_at(curve, xs, threshold)
                    to_eps.append(hit)
                    to_upd.append(None if hit is None else updates[xs.index(hit)])
            out[mode].append(np.mean(curves, axis=0).tolist())
            out[f"{mode}/per_env"].append(curves)
            out[f"{mode}/episodes_to_threshold"].append(to_eps)
            out[f"{mode}/updates_to_threshold"].append(to_upd)
            reached = f" reached {threshold:g} in {sum(x is not None for x in to_eps)}/{len(te)} envs, episodes {to_eps}" if threshold is not None else ""
            print(f"seed {seed} {mode}: {[round(x, 1) for x in out[mode][-1]]}{reached}", flush=True)
    out["adapt_episodes"] = xs
    out["threshold"] = threshold
    out["init"], out["embed_lr"], out["search_population"], out["search_std"] = init, embed_lr, search_population, search_std
    return out


def save_trained(path: Path, meta: dict, embeddings: np.ndarray, shared: list[np.ndarray], local: dict) -> None:
    """Write one seed's trained PerDQNAvg (client embeddings, shared layers, local returns) atomically."""
    tensors = {"embeddings": np.ascontiguousarray(embeddings, dtype=np.float32),
               **{f"shared.{i}": np.ascontiguousarray(w) for i, w in enumerate(shared)}}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    save_file(tensors, str(tmp), metadata={"settings": json.dumps(meta, sort_keys=True), "local": json.dumps(local)})
    os.replace(tmp, path)


def load_trained(path: Path, meta: dict) -> tuple[np.ndarray, list[np.ndarray], dict]:
    """Read what ``save_trained`` wrote; refuse a file trained with other settings than ``meta``."""
    with safe_open(str(path), framework="np") as f:
        stored = json.loads(f.metadata()["settings"])
        local = json.loads(f.metadata()["local"])
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    want = json.loads(json.dumps(meta, sort_keys=True))  # tuples -> lists, as stored
    if stored != want:
        diff = sorted(k for k in set(stored) | set(want) if stored.get(k) != want.get(k))
        raise ValueError(f"{path} was trained with other settings ({', '.join(diff)}: {[stored.get(k) for k in diff]}, "
                         f"this run asks for {[want.get(k) for k in diff]}); use another --trained-dir or remove the file")
    shared = [tensors[f"shared.{i}"] for i in range(len(tensors) - 1)]
    return tensors["embeddings"], shared, local


def _paired_p(a, b) -> dict:
    """Two-sided paired tests of a - b over seeds (Wilcoxon signed-rank, t); NaN with < 2 seeds or no difference."""
    d = np.asarray(a, float) - np.asarray(b, float)
    out = {"mean_diff": float(d.mean()), "wins": int((d > 0).sum()), "losses": int((d < 0).sum()),
           "wilcoxon_p": float("nan"), "t_p": float("nan")}
    if len(d) > 1 and np.any(d != 0):
        out["wilcoxon_p"] = float(stats.wilcoxon(d).pvalue)
        out["t_p"] = float(stats.ttest_1samp(d, 0.0).pvalue)
    return out


def summarise_communication(comm: dict, avg: str = "dqnavg") -> dict:
    """Per seed and mean ± SE of the final greedy return and of its mean over all evaluations (area under the
    learning curve, "auc") and over the second half of the evaluations ("last_half"), for DQNAvg, the E = inf averaged network and the Baseline; paired tests DQNAvg - other.

    ``avg`` names the averaging run in ``comm`` and in the output ("ddpgavg" in fedagent_flwr.experiments.fedrl_ddpg_figures)."""
    runs = {avg: (avg, "global_"), "e_inf": ("independent", "global_"), "baseline": ("independent", "baseline_")}
    out = {}
    for where in ("train", "test"):
        for stat, f in (("final", lambda h: h[-1]), ("auc", lambda h: float(np.mean(h))),
                        ("last_half", lambda h: float(np.mean(h[len(h) // 2:])))):
            vals = {name: [f(h[prefix + where]) for h in comm[run]] for name, (run, prefix) in runs.items()}
            out[f"{where}/{stat}"] = {
                **{name: {"mean": float(np.mean(v)), "se": float(_mean_se([[x] for x in v])[1][0]), "per_seed": v}
                   for name, v in vals.items()},
                f"{avg}_vs_e_inf": _paired_p(vals[avg], vals["e_inf"]),
                f"{avg}_vs_baseline": _paired_p(vals[avg], vals["baseline"]),
            }
    return out


ADAPT_MODES = ("E-Update", "E&N-Update", "Phi-Update", "E-Search")


def merge_adaptation(parts: list[dict]) -> dict:
    """One adaptation result from several runs of the same settings over other seeds (``--first-seed``)."""
    out = dict(parts[0])
    for key, value in parts[0].items():
        if isinstance(value, list) and key != "adapt_episodes":
            out[key] = [x for part in parts for x in part[key]]
    settings = ("adapt_episodes", "threshold", "init", "embed_lr", "search_population", "search_std")

    def setting(part, key):  # files written before search_std existed searched with 1.0
        return part.get(key, 1.0 if key == "search_std" else None)

    for part in parts[1:]:
        differ = [k for k in settings if setting(part, k) != setting(out, k)]
        if differ:
            raise ValueError(f"the runs were made with different adaptation settings: {', '.join(differ)}")
    return out


def summarise_adaptation(adapt: dict) -> dict:
    """Per mode over every new environment of every seed: the mean return over the evaluations after
    adapting starts ("auc"), the last one, and with a threshold the environments that reached it and the
    episodes it took (not reached: counted as one chunk past the budget); paired per environment against
    E&N-Update (wins = this mode better: higher return, fewer episodes)."""
    xs = adapt["adapt_episodes"]
    censored = xs[-1] + (xs[1] - xs[0] if len(xs) > 1 else 1)
    out = {}
    for mode in ADAPT_MODES:
        if mode not in adapt:
            continue
        curves = np.array([c for seed in adapt[f"{mode}/per_env"] for c in seed], dtype=float)
        row = {"auc": _stat(curves[:, 1:].mean(axis=1)), "last": _stat(curves[:, -1]), "envs": len(curves)}
        if adapt.get("threshold") is not None:
            eps = [censored if e is None else e for seed in adapt[f"{mode}/episodes_to_threshold"] for e in seed]
            row["reached"] = sum(e is not None for seed in adapt[f"{mode}/episodes_to_threshold"] for e in seed)
            row["episodes_to_threshold"] = _stat(eps)
            row["_eps"] = eps
        row["_auc"] = curves[:, 1:].mean(axis=1).tolist()
        out[mode] = row
    ref = out.get("E&N-Update")
    for mode, row in out.items():
        if ref is not None and mode != "E&N-Update":
            row["vs_E&N-Update"] = {"auc": _paired_p(row["_auc"], ref["_auc"])}
            if "_eps" in row:
                row["vs_E&N-Update"]["episodes_to_threshold"] = _paired_p(ref["_eps"], row["_eps"])  # fewer is a win
    for row in out.values():
        row.pop("_auc"), row.pop("_eps", None)
    return out


def _stat(values) -> dict:
    mean, se = _mean_se([[x] for x in values])
    return {"mean": float(mean[0]), "se": float(se[0])}


def _mean_se(rows) -> tuple[np.ndarray, np.ndarray]:
    a = np.asarray(rows, dtype=float)
    se = a.std(axis=0, ddof=1) / np.sqrt(a.shape[0]) if a.shape[0] > 1 else np.zeros(a.shape[1:])
    return a.mean(axis=0), se


def _plot(comm: dict, adapt: dict, path: Path, env_name: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(20, 4.2))
    x = comm["dqnavg"][0]["episodes"]
    series = {
        "Fig 3: local performance": [("DQNAvg", "dqnavg", "local"), ("independent", "independent", "local")],
        "Fig 4: training envs": [("DQNAvg", "dqnavg", "global_train"), ("E = inf (averaged)", "independent", "global_train"),
                                 ("Baseline", "independent", "baseline_train")],
        "Fig 4: new-length envs": [("DQNAvg", "dqnavg", "global_test"), ("E = inf (averaged)", "independent", "global_test"),
                                   ("Baseline", "independent", "baseline_test")],
    }
    for ax, (title, lines) in zip(axes, series.items()):
        for label, run, key in lines:
            m, se = _mean_se([h[key] for h in comm[run]])
            ax.plot(x, m, marker=".", label=label)
            ax.fill_between(x, m - 1.65 * se, m + 1.65 * se, alpha=0.2)
        ax.set_title(f"{env_name} {title}")
        ax.set_xlabel("episodes per client")
        ax.set_ylabel("greedy return")
        ax.legend(fontsize=8)
    ax = axes[3]
    for mode in ("E-Update", "E&N-Update", "Phi-Update", "E-Search"):
        if mode not in adapt:
            continue
        m, se = _mean_se(adapt[mode])
        ax.plot(adapt["adapt_episodes"], m, marker=".", label=mode)
        ax.fill_between(adapt["adapt_episodes"], m - 1.65 * se, m + 1.65 * se, alpha=0.2)
    ax.set_title(f"{env_name} Fig 6: adapting PerDQNAvg to new envs")
    ax.set_xlabel("adaptation episodes")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m fedagent_flwr.experiments.fedrl_deep_figures", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--env", choices=ENV_NAMES, default="cartpole",
                   help="cartpole-polarity: CartPoles whose push is reversed in every second environment")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--first-seed", type=int, default=0, help="seeds run are FIRST .. FIRST + SEEDS - 1 (split a run over processes)")
    p.add_argument("--clients", type=int, default=5, help="N training environments (paper: 5)")
    p.add_argument("--test-envs", type=int, default=10, help="M new-length environments (paper: 20)")
    p.add_argument("--episodes", type=int, default=96, help="training episodes per client")
    p.add_argument("--E", type=int, default=8, help="local episodes between averages")
    p.add_argument("--lr", type=float, default=DQNConfig.lr, help="DQN Adam step size, the same for every method")
    p.add_argument("--eval-every", type=int, default=16)
    p.add_argument("--eval-episodes", type=int, default=2)
    p.add_argument("--embed-dim", type=int, default=4)
    p.add_argument("--embed-init", type=float, default=0.0,
                   help="std of the clients' N(0, std^2) starting embeddings (0 = zeros, all clients alike)")
    p.add_argument("--adapt-episodes", type=int, default=12)
    p.add_argument("--adapt-every", type=int, default=3)
    p.add_argument("--adapt-epsilon", type=float, default=0.1, help="exploration at the start of adaptation")
    p.add_argument("--new-range", type=float, nargs=2, metavar=("LO", "HI"), default=None,
                   help="draw the new environments' parameter from U(LO, HI) (default: the training distribution)")
    p.add_argument("--adapt-threshold", type=float, default=None,
                   help="also record the adaptation episodes / updates until the greedy return reaches this")
    p.add_argument("--adapt-init", choices=("mean", "random"), default="mean",
                   help="new environment's starting embedding: the clients' mean or N(0, I)")
    p.add_argument("--adapt-embed-lr", type=float, default=0.0,
                   help="Adam step size of the embedding while adapting, in E-Update and E&N-Update alike (0 = the network's)")
    p.add_argument("--adapt-search", type=int, default=0, metavar="POPULATION",
                   help="also adapt the embedding alone by a cross-entropy search on greedy returns (E-Search), "
                        "POPULATION episodes per step; must divide --adapt-every (0 = off)")
    p.add_argument("--trained-dir", type=Path, default=None,
                   help="keep each seed's trained PerDQNAvg here (safetensors) and reuse it when present, so "
                        "adaptation settings can be compared on the same networks without training again")
    p.add_argument("--adapt-search-std", default="1.0", metavar="STD|clients",
                   help="E-Search's starting spread: a number, or 'clients' for the per-dimension spread of the "
                        "training clients' embeddings")
    p.add_argument("--skip", choices=("none", "communication", "adaptation"), default="none")
    p.add_argument("--summarise", type=Path, nargs="+", metavar="JSON",
                   help="train nothing: merge the adaptation parts of these deep_figures.json files (runs split by "
                        "--first-seed) and write OUT/adaptation_summary.json")
    args = p.parse_args(argv)
    if args.summarise:
        return _summarise_files(args.summarise, args.out)
    for name in ("seeds", "clients", "episodes", "E", "eval_every", "eval_episodes", "embed_dim", "adapt_every"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.eval_every % args.E or args.episodes % args.eval_every or args.adapt_episodes % args.adapt_every:
        p.error("--eval-every must be a multiple of --E, --episodes of --eval-every, --adapt-episodes of --adapt-every")
    torch.set_num_threads(1)
    args.out.mkdir(parents=True, exist_ok=True)
    if not args.lr > 0:
        p.error("--lr must be > 0")
    if args.embed_init < 0:
        p.error("--embed-init must be >= 0")
    if args.first_seed < 0:
        p.error("--first-seed must be >= 0")
    if args.adapt_search and (args.adapt_search < 2 or args.adapt_every % args.adapt_search):
        p.error(f"--adapt-search must be 0 or a population >= 2 that divides --adapt-every ({args.adapt_every})")
    if args.adapt_search_std != "clients":
        try:
            args.adapt_search_std = float(args.adapt_search_std)
        except ValueError:
            args.adapt_search_std = -1.0
        if not 0 < args.adapt_search_std < float("inf"):
            p.error("--adapt-search-std must be a number > 0 or 'clients'")
    if args.new_range is not None and args.env == "cartpole-polarity":
        p.error("--new-range draws one parameter; cartpole-polarity's new environments come from its own family")
    config = DQNConfig(lr=args.lr)
    seeds = list(range(args.first_seed, args.first_seed + args.seeds))
    report = {"args": {k: str(v) for k, v in vars(args).items()}, "dqn": asdict(config),
              "machine": {"cpus": os.cpu_count(), "platform": platform.platform()}}
    t0 = time.perf_counter()
    comm = adapt = None
    if args.skip != "communication":
        comm = communication(args.env, seeds, args.clients, args.test_envs, args.E, args.episodes, args.eval_every,
                             args.eval_episodes, config)
        report["communication"] = comm
        report["communication_summary"] = summ = summarise_communication(comm)
        for key, v in summ.items():
            print(f"{key}: DQNAvg {v['dqnavg']['mean']:.1f}±{v['dqnavg']['se']:.1f}  E=inf {v['e_inf']['mean']:.1f}±{v['e_inf']['se']:.1f}"
                  f"  Baseline {v['baseline']['mean']:.1f}±{v['baseline']['se']:.1f}  | vs E=inf: wins {v['dqnavg_vs_e_inf']['wins']}"
                  f" p_w {v['dqnavg_vs_e_inf']['wilcoxon_p']:.3f} p_t {v['dqnavg_vs_e_inf']['t_p']:.3f}"
                  f" | vs Baseline: wins {v['dqnavg_vs_baseline']['wins']} p_w {v['dqnavg_vs_baseline']['wilcoxon_p']:.3f}"
                  f" p_t {v['dqnavg_vs_baseline']['t_p']:.3f}", flush=True)
    if args.skip != "adaptation":
        adapt = adaptation(args.env, seeds, args.clients, args.test_envs, args.E, args.episodes, args.adapt_episodes,
                           args.adapt_every, args.eval_episodes, replace(config, embed_dim=args.embed_dim, embed_init=args.embed_init), args.adapt_epsilon,
                           new_range=args.new_range, threshold=args.adapt_threshold, init=args.adapt_init, embed_lr=args.adapt_embed_lr,
                           search_population=args.adapt_search, search_std=args.adapt_search_std,
                           trained_dir=args.trained_dir)
        report["adaptation"] = adapt
        report["adaptation_summary"] = _print_adaptation_summary(adapt)
    report["seconds"] = round(time.perf_counter() - t0, 1)
    tmp = args.out / ".deep_figures.json.tmp"
    tmp.write_text(json.dumps(report, indent=1))
    os.replace(tmp, args.out / "deep_figures.json")
    if comm is not None and adapt is not None:
        _plot(comm, adapt, args.out / "deep_figures.png", args.env)
    print(f"wrote {args.out / 'deep_figures.json'} ({report['seconds']} s)", flush=True)
    return 0


def _print_adaptation_summary(adapt: dict) -> dict:
    summ = summarise_adaptation(adapt)
    for mode, row in summ.items():
        line = f"{mode}: return after adapting starts {row['auc']['mean']:.1f}±{row['auc']['se']:.1f}, last {row['last']['mean']:.1f}"
        if "reached" in row:
            line += (f", reached {adapt['threshold']:g} in {row['reached']}/{row['envs']}, episodes "
                     f"{row['episodes_to_threshold']['mean']:.1f}±{row['episodes_to_threshold']['se']:.1f}")
        for what, d in row.get("vs_E&N-Update", {}).items():
            line += f" | vs E&N {what}: wins {d['wins']} losses {d['losses']} p_w {d['wilcoxon_p']:.3f}"
        print(line, flush=True)
    return summ


def _summarise_files(paths, out: Path) -> int:
    parts = [json.loads(Path(p).read_text())["adaptation"] for p in paths]
    adapt = merge_adaptation(parts)
    out.mkdir(parents=True, exist_ok=True)
    report = {"sources": [str(p) for p in paths], "adaptation": adapt, "adaptation_summary": _print_adaptation_summary(adapt)}
    tmp = out / ".adaptation_summary.json.tmp"
    tmp.write_text(json.dumps(report, indent=1))
    os.replace(tmp, out / "adaptation_summary.json")
    print(f"wrote {out / 'adaptation_summary.json'}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
