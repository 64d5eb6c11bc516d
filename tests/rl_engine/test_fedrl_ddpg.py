"""DDPGAvg pieces: Pendulums with varied length / mass, DDPG learner, averaging, private embeddings."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("gymnasium")

from fedrl.ddpg import DDPGConfig, DDPGLearner, make_pendulum, run_ddpgavg, sample_pendulum_params, soft_update  # noqa: E402

SMALL = DDPGConfig(actor_hidden=(16,), critic_hidden=(16,), batch_size=8, replay_size=500, warmup_steps=20)
SMALL_EMB = DDPGConfig(actor_hidden=(16,), critic_hidden=(16,), batch_size=8, replay_size=500, warmup_steps=20, embed_dim=2)


def _pendulum_step(th, thdot, u, length, mass, g=10.0, dt=0.05):
    # Pendulum-v1's equations written out by hand
    newthdot = np.clip(thdot + (3 * g / (2 * length) * math.sin(th) + 3.0 / (mass * length**2) * u) * dt, -8, 8)
    newth = th + newthdot * dt
    return np.array([math.cos(newth), math.sin(newth), newthdot])


@pytest.mark.parametrize("length,mass", [(1.0, 1.0), (0.5, 1.0), (1.5, 1.0), (1.0, 2.0)])
def test_pendulum_length_and_mass_change_the_dynamics_as_the_equations_say(length, mass):
    env = make_pendulum(length, mass)
    env.reset(seed=0)
    env.unwrapped.state = np.array([0.7, -0.4])
    obs, *_ = env.step(np.array([1.5], np.float32))
    np.testing.assert_allclose(obs, _pendulum_step(0.7, -0.4, 1.5, length, mass), rtol=1e-5, atol=1e-6)


def test_different_pendulums_really_differ():
    nxt = []
    for length, mass in ((1.0, 1.0), (0.6, 1.0), (1.0, 1.7)):
        env = make_pendulum(length, mass)
        env.reset(seed=0)
        env.unwrapped.state = np.array([0.3, 0.2])
        nxt.append(env.step(np.array([1.0], np.float32))[0])
    assert not np.allclose(nxt[0], nxt[1]) and not np.allclose(nxt[0], nxt[2])


def test_parameter_ranges_and_bad_inputs():
    params = sample_pendulum_params(np.random.default_rng(0), 1000)
    assert params.shape == (1000, 2)
    assert params[:, 0].min() >= 0.5 and params[:, 0].max() <= 1.5 and np.all(params[:, 1] == 1.0)
    with pytest.raises(ValueError):
        make_pendulum(0.0)
    with pytest.raises(ValueError, match="E must be"):
        run_ddpgavg([1.0], 0, 4, SMALL)
    for bad in ({"tau": 0.0}, {"tau": 1.5}, {"noise": -0.1}, {"batch_size": 10, "replay_size": 5}):
        with pytest.raises(ValueError):
            DDPGConfig(**bad)


def test_soft_update_is_polyak_averaging():
    src, tgt = torch.nn.Linear(3, 2), torch.nn.Linear(3, 2)
    before = copy.deepcopy(tgt)
    soft_update(tgt, src, 0.1)
    for t, b, s in zip(tgt.parameters(), before.parameters(), src.parameters()):
        torch.testing.assert_close(t, 0.9 * b + 0.1 * s)
    soft_update(tgt, src, 1.0)
    for t, s in zip(tgt.parameters(), src.parameters()):
        torch.testing.assert_close(t, s)


def test_learner_updates_targets_softly_and_actions_stay_in_range():
    ln = DDPGLearner(make_pendulum(1.0), SMALL, seed=0)
    ln.train_episodes(1)
    assert ln.steps == 200 and ln.updates == 200 - SMALL.warmup_steps + 1
    # the targets moved towards the online nets, but only partly
    online, target = ln.get_weights(), [v.numpy() for v in ln.target.state_dict().values()]
    assert any(not np.allclose(o, t) for o, t in zip(online, target))
    for _ in range(5):
        a = ln.act(np.array([1.0, 0.0, 0.0], np.float32))
        assert a.shape == (1,) and -2.0 <= a[0] <= 2.0


def test_weights_round_trip_and_validation():
    a, b = DDPGLearner(make_pendulum(1.0), SMALL, seed=1), DDPGLearner(make_pendulum(1.0), SMALL, seed=2)
    wa = a.get_weights()
    assert not np.allclose(wa[0], b.get_weights()[0])
    b.set_weights(wa)
    for x, y, t in zip(wa, b.get_weights(), b.target.state_dict().values()):
        np.testing.assert_array_equal(x, y)
        np.testing.assert_array_equal(x, t.numpy())  # targets restart from the received weights
    with pytest.raises(ValueError, match="weight arrays"):
        b.set_weights(wa[:-1])
    with pytest.raises(ValueError, match="shape"):
        b.set_weights([w.T for w in wa])


def test_embedding_is_private_in_shared_weights():
    ln = DDPGLearner(make_pendulum(0.8), SMALL_EMB, seed=3)
    ln.net.embedding.data[:] = torch.tensor([0.25, -0.5])
    full, shared = ln.get_weights(), ln.get_weights(shared_only=True)
    assert len(full) == len(shared) + 1
    np.testing.assert_array_equal(full[0], [0.25, -0.5])  # the embedding is the first entry ...
    assert all(w.shape != (2,) or not np.allclose(w, [0.25, -0.5]) for w in shared)  # ... and only there
    other = DDPGLearner(make_pendulum(1.2), SMALL_EMB, seed=4)
    ln.set_weights(other.get_weights(shared_only=True), shared_only=True)
    np.testing.assert_array_equal(ln.net.embedding.detach().numpy(), [0.25, -0.5])
    for x, y in zip(ln.get_weights(shared_only=True), other.get_weights(shared_only=True)):
        np.testing.assert_array_equal(x, y)


def test_ddpgavg_round_is_the_elementwise_mean_of_the_clients():
    out = run_ddpgavg([0.6, (1.4, 1.0)], E=None, total_episodes=1, config=SMALL_EMB, eval_episodes=1)
    l0, l1 = out["learners"]
    w0, w1 = l0.get_weights(shared_only=True), l1.get_weights(shared_only=True)
    assert not np.allclose(w0[0], w1[0])  # trained apart from one common start
    expected_shared = [(x + y) / 2 for x, y in zip(w0, w1)]
    emb = (l0.net.embedding.detach().numpy() + l1.net.embedding.detach().numpy()) / 2
    assert len(out["global_weights"]) == len(expected_shared) + 1
    np.testing.assert_allclose(out["global_weights"][0], emb, rtol=1e-6)
    for g, e in zip(out["global_weights"][1:], expected_shared):
        np.testing.assert_allclose(g, e, rtol=1e-6, atol=1e-7)
    # with communication the clients end each round on the same shared weights, embeddings stay their own
    out = run_ddpgavg([0.6, 1.4], E=1, total_episodes=2, config=SMALL_EMB, eval_params=[1.0], eval_episodes=1)
    h, (l0, l1) = out["history"], out["learners"]
    assert h["episodes"] == [1, 2] and all(np.isfinite(h["train"] + h["test"] + h["local"]))
    for x, y in zip(l0.get_weights(shared_only=True), l1.get_weights(shared_only=True)):
        np.testing.assert_array_equal(x, y)
    assert not np.allclose(l0.net.embedding.detach().numpy(), l1.net.embedding.detach().numpy())


def test_adapt_embedding_changes_only_the_embedding():
    ln = DDPGLearner(make_pendulum(1.3), SMALL_EMB, seed=5)
    before = ln.get_weights()
    ln.adapt_embedding(1)
    after = ln.get_weights()
    assert ln.updates > 0 and not np.allclose(before[0], after[0])
    for x, y in zip(before[1:], after[1:]):
        np.testing.assert_array_equal(x, y)
    with pytest.raises(ValueError, match="embed_dim"):
        DDPGLearner(make_pendulum(1.0), SMALL).adapt_embedding(1)


def test_actor_does_not_train_the_embedding():
    ln = DDPGLearner(make_pendulum(1.0), SMALL_EMB, seed=6)
    s = torch.zeros(4, 3)
    (-ln.net.q(s, ln.net.pi(s)).mean()).backward()
    assert ln.net.embedding.grad is not None  # the critic path does reach it ...
    ln.net.embedding.grad = None
    ln.net.pi(s).sum().backward()
    assert ln.net.embedding.grad is None  # ... the actor path does not


@pytest.mark.slow
def test_ddpg_learns_the_default_pendulum():
    torch.set_num_threads(1)  # batch-64 updates: extra threads only contend for the CPU
    ln = DDPGLearner(make_pendulum(1.0), DDPGConfig(), seed=0)
    start = ln.evaluate(episodes=3)
    ln.train_episodes(30)
    end = ln.evaluate(episodes=5)
    assert start < -900 and end > -400  # never swings up vs swings up and holds (a good policy: about -150)
