"""Deep FedRL pieces: CartPole / Acrobot with varied dynamics, DQN learner, DQNAvg averaging."""

from __future__ import annotations

import math
from dataclasses import asdict, replace

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("gymnasium")

from fedrl.deep import DQNConfig, DQNLearner, EmbeddingSearch, make_acrobot, make_cartpole, make_env, run_dqnavg, sample_env_params  # noqa: E402

SMALL = DQNConfig(hidden=16, batch_size=4, replay_size=200)


def _cartpole_step(state, action, length, masspole=0.1, masscart=1.0, g=9.8, force_mag=10.0, tau=0.02):
    # Barto-Sutton-Anderson cart-pole equations with Euler integration, written out by hand
    x, x_dot, th, th_dot = state
    total = masspole + masscart
    pml = masspole * length
    force = force_mag if action == 1 else -force_mag
    temp = (force + pml * th_dot**2 * math.sin(th)) / total
    th_acc = (g * math.sin(th) - math.cos(th) * temp) / (length * (4.0 / 3.0 - masspole * math.cos(th) ** 2 / total))
    x_acc = temp - pml * th_acc * math.cos(th) / total
    return np.array([x + tau * x_dot, x_dot + tau * x_acc, th + tau * th_dot, th_dot + tau * th_acc])


@pytest.mark.parametrize("half_length", [0.1, 0.5, 0.9])
def test_cartpole_length_changes_the_dynamics_as_the_equations_say(half_length):
    env = make_cartpole(half_length)
    env.reset(seed=0)
    state = np.array([0.01, 0.2, 0.05, -0.3])
    env.unwrapped.state = state.copy()
    obs, *_ = env.step(1)
    np.testing.assert_allclose(obs, _cartpole_step(state, 1, half_length), rtol=1e-5, atol=1e-6)
    assert env.unwrapped.polemass_length == pytest.approx(0.1 * half_length)


@pytest.mark.parametrize("signed_half_length", [0.3, -0.3])
def test_polarity_cartpole_reverses_the_push_and_keeps_the_length(signed_half_length):
    env = make_env("cartpole-polarity", signed_half_length)
    env.reset(seed=0)
    state = np.array([0.01, 0.2, 0.05, -0.3])
    env.unwrapped.state = state.copy()
    obs, *_ = env.step(1)
    force = 10.0 if signed_half_length > 0 else -10.0
    np.testing.assert_allclose(obs, _cartpole_step(state, 1, 0.3, force_mag=force), rtol=1e-5, atol=1e-6)
    # action 1 speeds the cart up to the right, or to the left when reversed
    assert (obs[1] > state[1]) == (signed_half_length > 0)


def test_polarity_family_alternates_the_push_over_the_paper_lengths():
    p = sample_env_params("cartpole-polarity", np.random.default_rng(0), 9)
    assert list(np.sign(p)) == [1, -1, 1, -1, 1, -1, 1, -1, 1]
    assert np.abs(p).min() >= 0.1 and np.abs(p).max() <= 0.9
    with pytest.raises(ValueError, match="cartpole-polarity"):
        make_env("pendulum", 1.0)


def test_random_embedding_start_differs_per_client_and_zeros_stay_the_default():
    cfg = replace(SMALL, embed_dim=4)
    zeros = [DQNLearner(make_cartpole(0.5), cfg, seed=s).net.embedding.detach() for s in (1, 2)]
    assert all(float(z.abs().max()) == 0.0 for z in zeros)
    drawn = [DQNLearner(make_cartpole(0.5), replace(cfg, embed_init=2.0), seed=s).net.embedding.detach() for s in (1, 2, 1)]
    assert not torch.equal(drawn[0], drawn[1]) and torch.equal(drawn[0], drawn[2])  # seeded per client
    big = DQNLearner(make_cartpole(0.5), replace(cfg, embed_dim=4000, embed_init=2.0), seed=3).net.embedding.detach()
    assert float(big.std()) == pytest.approx(2.0, rel=0.05)
    with pytest.raises(ValueError, match="embed_init"):
        DQNConfig(embed_init=-1.0)


def test_acrobot_variants_change_the_dynamics():
    nxt = []
    for env in (make_acrobot(1.0), make_acrobot(1.5), make_acrobot(0.7, parameter="length_1")):
        env.reset(seed=0)
        env.unwrapped.state = np.array([0.3, -0.2, 0.5, 0.1])
        nxt.append(env.step(2)[0])
    assert not np.allclose(nxt[0], nxt[1]) and not np.allclose(nxt[0], nxt[2])
    u = make_acrobot(0.7, parameter="length_1").unwrapped
    assert (u.LINK_LENGTH_1, u.LINK_COM_POS_1) == (0.7, 0.35)


def test_parameter_ranges_and_bad_inputs():
    rng = np.random.default_rng(0)
    lengths = sample_env_params("cartpole", rng, 1000)
    masses = sample_env_params("acrobot", rng, 1000)
    assert lengths.min() >= 0.1 and lengths.max() <= 0.9  # full pole length in [0.2, 1.8]
    assert masses.min() >= 0.5 and masses.max() <= 1.5
    with pytest.raises(ValueError):
        make_cartpole(0.0)
    with pytest.raises(ValueError):
        make_env("pendulum", 1.0)
    with pytest.raises(ValueError):
        make_acrobot(1.0, parameter="mass_2")
    with pytest.raises(ValueError, match="E must be"):
        run_dqnavg("cartpole", [0.5], 0, 4, SMALL)


def test_weights_round_trip_and_validation():
    a = DQNLearner(make_cartpole(0.5), SMALL, seed=1)
    b = DQNLearner(make_cartpole(0.5), SMALL, seed=2)
    wa = a.get_weights()
    assert not np.allclose(wa[0], b.get_weights()[0])
    b.set_weights(wa)
    for x, y in zip(wa, b.get_weights()):
        np.testing.assert_array_equal(x, y)
    with pytest.raises(ValueError, match="weight arrays"):
        b.set_weights(wa[:-1])
    with pytest.raises(ValueError, match="shape"):
        b.set_weights([w.T for w in wa])


def test_dqnavg_averages_shared_weights_and_keeps_embeddings_private():
    cfg = DQNConfig(hidden=16, batch_size=4, replay_size=200, embed_dim=2)
    out = run_dqnavg("cartpole", [0.3, 0.8], E=1, total_episodes=2, config=cfg, eval_params=[0.5], eval_episodes=1)
    h = out["history"]
    assert h["episodes"] == [1, 2] and all(np.isfinite(h["train"])) and all(np.isfinite(h["test"]))
    l0, l1 = out["learners"]
    for x, y in zip(l0.get_weights(shared_only=True), l1.get_weights(shared_only=True)):
        np.testing.assert_array_equal(x, y)  # averaged after the last round
    assert not np.allclose(l0.net.embedding.detach().numpy(), l1.net.embedding.detach().numpy())
    # no communication: the clients' networks drift apart
    out = run_dqnavg("cartpole", [0.3, 0.8], E=None, total_episodes=2, config=SMALL, eval_episodes=1)
    l0, l1 = out["learners"]
    assert not np.allclose(l0.get_weights()[0], l1.get_weights()[0])


def test_embedding_adaptation_touches_only_the_embedding():
    cfg = DQNConfig(hidden=16, batch_size=4, replay_size=200, embed_dim=2)
    ln = DQNLearner(make_cartpole(0.9), cfg, seed=3)
    before = ln.get_weights()
    ln.adapt_embedding(2)
    after = ln.get_weights()
    assert not np.allclose(before[0], after[0])  # the embedding moved
    for x, y in zip(before[1:], after[1:]):
        np.testing.assert_array_equal(x, y)
    with pytest.raises(ValueError, match="embed_dim"):
        DQNLearner(make_cartpole(0.5), SMALL).adapt_embedding(1)



class _TargetEnv:
    """One-step task whose reward is -||action - target||^2: the best embedding is the target."""

    def __init__(self, target):
        self.target = np.asarray(target, float)
        self.episodes = 0

    def reset(self, seed=None):
        self.episodes += 1
        return np.zeros(1, np.float32), {}

    def step(self, action):
        return np.zeros(1, np.float32), -float(((np.asarray(action) - self.target) ** 2).sum()), True, False, {}


class _EmbeddingActs:
    """A learner whose greedy action is its embedding, so a return measures how far the embedding is from the target."""

    def __init__(self, target, start):
        self.config = DQNConfig(embed_dim=len(start))
        self.net = torch.nn.Module()
        self.net.embedding = torch.nn.Parameter(torch.tensor(start, dtype=torch.float32))
        self.env, self.rng = _TargetEnv(target), np.random.default_rng(0)

    def act(self, obs, greedy=False):
        return self.net.embedding.detach().numpy().copy()


def test_embedding_search_climbs_the_return_and_counts_episodes():
    target = [1.5, -2.0, 0.5]
    ln = _EmbeddingActs(target, [0.0, 0.0, 0.0])
    search = EmbeddingSearch(ln, population=8, elite=2, std=1.0, seed=0)
    start_gap = np.linalg.norm(search.mean - target)
    for _ in range(15):
        returns = search.step()
        assert len(returns) == 8
    assert search.updates == 15 and ln.env.episodes == 15 * 8  # one episode per candidate
    final = ln.net.embedding.detach().numpy()
    np.testing.assert_allclose(final, search.mean, rtol=0, atol=1e-6)  # the network holds the search mean
    assert np.linalg.norm(final - target) < 0.1 * start_gap
    assert np.all(search.std >= 0.05)  # the floor keeps it searching


def test_embedding_search_moves_only_the_embedding_of_a_dqn():
    cfg = DQNConfig(hidden=16, batch_size=4, replay_size=200, embed_dim=2)
    ln = DQNLearner(make_env("cartpole-polarity", -0.5), cfg, seed=3)
    before = ln.get_weights()
    search = EmbeddingSearch(ln, population=4, elite=2, seed=1)
    search.step()
    after = ln.get_weights()
    assert not np.allclose(before[0], after[0]) and ln.updates == 0 and len(ln.buffer) == 0  # no TD learning
    for x, y in zip(before[1:], after[1:]):
        np.testing.assert_array_equal(x, y)
    with pytest.raises(ValueError, match="embed_dim"):
        EmbeddingSearch(DQNLearner(make_cartpole(0.5), SMALL))
    with pytest.raises(ValueError, match="elite"):
        EmbeddingSearch(ln, population=4, elite=4)

@pytest.mark.slow
def test_dqnavg_learns_cartpole():
    out = run_dqnavg("cartpole", [0.3, 0.5, 0.7], E=8, total_episodes=96, eval_episodes=5, eval_every=16, seed=0)
    train = out["history"]["train"]
    assert train[0] < 50 and max(train) > 150  # a random policy lasts about 20 steps, the cap is 200


def test_huber_loss_gradient_clipping_and_config_checks():
    ln = DQNLearner(make_cartpole(0.5), DQNConfig(hidden=16, batch_size=4, replay_size=200, loss="huber", grad_clip=0.05), seed=4)
    ln.train_episodes(1)
    assert ln.updates > 0
    norm = torch.sqrt(sum((p.grad**2).sum() for p in ln.net.parameters() if p.grad is not None))
    assert float(norm) <= 0.05 + 1e-6  # the last update's gradient was clipped
    for bad in ({"loss": "l1"}, {"grad_clip": -1.0}, {"embed_lr": -1.0}):
        with pytest.raises(ValueError):
            DQNConfig(**bad)


def test_embedding_step_size_is_its_own():
    cfg = DQNConfig(hidden=16, batch_size=4, replay_size=200, embed_dim=2)
    moves = []
    for embed_lr in (0.0, 0.05):
        ln = DQNLearner(make_cartpole(0.5), replace(cfg, embed_lr=embed_lr), seed=5)
        assert [g["lr"] for g in ln.opt.param_groups] == ([1e-3] if embed_lr == 0 else [0.05, 1e-3])
        before = ln.net.embedding.detach().clone()
        ln.adapt_embedding(1)
        moves.append(float((ln.net.embedding.detach() - before).abs().max()))
        assert moves[-1] <= (embed_lr or 1e-3) * ln.updates * 1.01  # Adam moves each coordinate <= ~lr per step
    assert moves[1] > 5 * moves[0]


def test_adaptation_threshold_bookkeeping_and_summary():
    from fedagent_flwr.experiments.fedrl_deep_figures import _first_at, _new_params, summarise_communication

    assert _first_at([10, 150, 200, 120], [0, 3, 6, 9], 195) == 6
    assert _first_at([10, 150], [0, 3], 195) is None
    new = _new_params("cartpole", 0, 5, 7, (2.0, 4.0))
    assert new.shape == (7,) and new.min() >= 2.0 and new.max() <= 4.0
    ep = [16, 32]
    comm = {"dqnavg": [{"episodes": ep, "global_train": [10, 30], "global_test": [5, 25]},
                       {"episodes": ep, "global_train": [20, 40], "global_test": [15, 35]}],
            "independent": [{"episodes": ep, "global_train": [10, 10], "global_test": [5, 5], "baseline_train": [0, 20], "baseline_test": [0, 10]},
                            {"episodes": ep, "global_train": [10, 50], "global_test": [5, 5], "baseline_train": [0, 20], "baseline_test": [0, 10]}]}
    s = summarise_communication(comm)
    assert s["train/final"]["dqnavg"]["per_seed"] == [30, 40] and s["train/auc"]["dqnavg"]["per_seed"] == [20, 30]
    assert s["train/final"]["e_inf"]["mean"] == 30 and s["train/final"]["dqnavg_vs_e_inf"]["mean_diff"] == 5
    assert s["train/last_half"]["dqnavg"]["per_seed"] == [30, 40]
    assert s["train/auc"]["dqnavg_vs_baseline"]["wins"] == 2 and s["train/auc"]["baseline"]["se"] == 0


def test_adaptation_records_updates_to_threshold():
    from fedagent_flwr.experiments.fedrl_deep_figures import adaptation

    cfg = DQNConfig(hidden=16, batch_size=4, replay_size=200, embed_dim=2)
    kw = dict(env_name="cartpole", seeds=[0], n_train=2, n_new=2, E=1, episodes=1, adapt_episodes=2, adapt_every=1,
              eval_episodes=1, config=cfg, adapt_epsilon=0.1, new_range=(1.0, 2.0))
    out = adaptation(**kw, threshold=0.0, init="random", embed_lr=0.01)
    assert out["adapt_episodes"] == [0, 1, 2] and all(1.0 <= p <= 2.0 for p in out["new_params"][0])
    for mode in ("E-Update", "E&N-Update", "Phi-Update"):
        assert out[f"{mode}/episodes_to_threshold"] == [[0, 0]] and out[f"{mode}/updates_to_threshold"] == [[0, 0]]
        assert np.shape(out[f"{mode}/per_env"]) == (1, 2, 3)
    assert np.shape(out["train_embedding_returns"]) == (1, 2, 2)  # seeds x new envs x training clients
    out = adaptation(**kw, threshold=1e9)
    assert out["E-Update/episodes_to_threshold"] == [[None, None]] and out["init"] == "mean"
    out = adaptation(**{**kw, "adapt_every": 2}, threshold=0.0, search_population=2)
    assert out["E-Search/updates_to_threshold"] == [[0, 0]] and np.shape(out["E-Search/per_env"]) == (1, 2, 2)
    with pytest.raises(ValueError, match="search_std"):
        adaptation(**{**kw, "adapt_every": 2}, search_population=2, search_std="wide")
    with pytest.raises(ValueError, match="search_population"):
        adaptation(**kw, search_population=2)  # does not divide adapt_every=1
    with pytest.raises(ValueError, match="init"):
        adaptation(**kw, init="zeros")


def test_trained_networks_are_kept_reused_and_checked(tmp_path, monkeypatch):
    import fedagent_flwr.experiments.fedrl_deep_figures as df

    cfg = DQNConfig(hidden=16, batch_size=4, replay_size=200, embed_dim=2, embed_init=1.0)
    kw = dict(env_name="cartpole-polarity", seeds=[0], n_train=3, n_new=2, E=1, episodes=3, adapt_episodes=2, adapt_every=2,
              eval_episodes=1, config=cfg, adapt_epsilon=0.1, threshold=195.0, search_population=2, trained_dir=tmp_path)
    first = df.adaptation(**kw)
    path = tmp_path / "perdqnavg-cartpole-polarity-seed0.safetensors"
    meta = {"env": "cartpole-polarity", "seed": 0, "clients": 3, "E": 1, "episodes": 3, "eval_episodes": 1, "dqn": asdict(cfg)}
    embeddings, shared, local = df.load_trained(path, meta)
    assert embeddings.shape == (3, 2) and len(shared) == 4 and local["personalised_local"] == first["personalised_local"][0]

    def no_training(*args, **kwargs):
        raise AssertionError("trained again although the networks were kept")

    monkeypatch.setattr(df, "_train", no_training)
    again = df.adaptation(**kw)
    assert again == first  # the same networks and the same adaptation draws give the same numbers
    starts = []

    class Recorded(df.EmbeddingSearch):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            starts.append(self.std.copy())

    monkeypatch.setattr(df, "EmbeddingSearch", Recorded)
    wide = df.adaptation(**kw, search_std="clients")  # the search starts with the clients' spread, floored
    assert wide["search_std"] == "clients" and wide["E-Update/per_env"] == first["E-Update/per_env"]
    assert len(starts) == 2
    for std in starts:
        np.testing.assert_allclose(std, np.maximum(embeddings.std(axis=0), df.MIN_SEARCH_STD))
    with pytest.raises(ValueError, match="other settings.*E"):
        df.adaptation(**{**kw, "E": 2})
    with pytest.raises(ValueError, match="search_std"):
        df.merge_adaptation([first, wide])


def test_embedding_search_takes_a_spread_per_dimension():
    ln = _EmbeddingActs([0.0, 0.0], [0.0, 0.0])
    search = EmbeddingSearch(ln, population=4, elite=2, std=np.array([2.0, 0.1]), std_smoothing=0.5, seed=0)
    np.testing.assert_array_equal(search.std, [2.0, 0.1])
    with pytest.raises(ValueError, match="std"):
        EmbeddingSearch(ln, std=np.array([1.0, 0.0]))


def test_adaptation_summary_merges_seeds_and_censors_misses(tmp_path):
    import json

    from fedagent_flwr.experiments.fedrl_deep_figures import main, merge_adaptation, summarise_adaptation

    def part(en, search, en_eps, search_eps):
        return {"adapt_episodes": [0, 4, 8], "threshold": 195.0, "E-Update": [[0, 0, 0]], "E&N-Update": [[0, 0, 0]],
                "E-Update/per_env": [[[10, 10, 10]]], "E-Update/episodes_to_threshold": [[None]],
                "E&N-Update/per_env": [[en]], "E&N-Update/episodes_to_threshold": [[en_eps]],
                "E-Search": [[0, 0, 0]], "E-Search/per_env": [[search]], "E-Search/episodes_to_threshold": [[search_eps]]}

    parts = [part([10, 100, 200], [10, 200, 200], 8, 4), part([10, 50, 60], [10, 40, 50], None, None)]
    merged = merge_adaptation(parts)
    assert merged["adapt_episodes"] == [0, 4, 8] and len(merged["E-Search/per_env"]) == 2
    summ = summarise_adaptation(merged)
    assert summ["E&N-Update"]["auc"]["mean"] == pytest.approx((150 + 55) / 2)  # points after 0 only
    assert summ["E-Search"]["last"]["mean"] == pytest.approx(125)
    assert summ["E-Search"]["reached"] == 1 and summ["E-Search"]["episodes_to_threshold"]["mean"] == pytest.approx((4 + 12) / 2)
    assert summ["E-Update"]["episodes_to_threshold"]["mean"] == 12  # never reached: one chunk past the 8-episode budget
    vs = summ["E-Search"]["vs_E&N-Update"]
    assert (vs["auc"]["wins"], vs["auc"]["losses"]) == (1, 1) and (vs["episodes_to_threshold"]["wins"], vs["episodes_to_threshold"]["losses"]) == (1, 0)
    with pytest.raises(ValueError, match="different adaptation settings"):
        merge_adaptation([parts[0], {**parts[1], "threshold": 100.0}])
    files = []
    for i, pt in enumerate(parts):
        files.append(tmp_path / f"{i}.json")
        files[-1].write_text(json.dumps({"adaptation": pt}))
    assert main(["--out", str(tmp_path / "sum"), "--summarise", *map(str, files)]) == 0
    assert json.loads((tmp_path / "sum" / "adaptation_summary.json").read_text())["adaptation_summary"]["E-Search"]["envs"] == 2


@pytest.mark.parametrize("argv", [["--embed-init", "-1"], ["--env", "cartpole-polarity", "--new-range", "1", "2"],
                                  ["--adapt-every", "3", "--adapt-search", "2"], ["--adapt-search", "1"], ["--first-seed", "-1"],
                                  ["--adapt-search-std", "0"], ["--adapt-search-std", "wide"]])
def test_deep_figures_refuses_bad_embedding_options(argv, tmp_path, capsys):
    from fedagent_flwr.experiments.fedrl_deep_figures import main

    with pytest.raises(SystemExit):
        main(["--out", str(tmp_path), *argv])
    err = capsys.readouterr().err
    assert any(flag in err for flag in ("--embed-init", "--new-range", "--adapt-search", "--first-seed"))
    assert not (tmp_path / "deep_figures.json").exists()
