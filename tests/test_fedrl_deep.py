"""Deep FedRL pieces: CartPole / Acrobot with varied dynamics, DQN learner, DQNAvg averaging."""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("gymnasium")

from fedrl.deep import DQNConfig, DQNLearner, make_acrobot, make_cartpole, make_env, run_dqnavg, sample_env_params  # noqa: E402

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


@pytest.mark.slow
def test_dqnavg_learns_cartpole():
    out = run_dqnavg("cartpole", [0.3, 0.5, 0.7], E=8, total_episodes=96, eval_episodes=5, eval_every=16, seed=0)
    train = out["history"]["train"]
    assert train[0] < 50 and max(train) > 150  # a random policy lasts about 20 steps, the cap is 200
