"""The paper's MuJoCo families: Hoppers with varied leg radius, HalfCheetahs with varied thigh lengths."""

from __future__ import annotations

import json

import numpy as np
import pytest

mujoco = pytest.importorskip("mujoco")
pytest.importorskip("torch")

from fedrl.mujoco_envs import (  # noqa: E402
    HALF_CHEETAH_RANGES,
    HOPPER_RANGE,
    make_half_cheetah,
    make_hopper,
    model_xml,
    sample_half_cheetah_params,
    sample_hopper_params,
)


def _geom_size(env, name):
    m = env.unwrapped.model
    return m.geom_size[mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_GEOM, name)]


def _body_mass(env, name):
    m = env.unwrapped.model
    return float(m.body_mass[mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_BODY, name)])


def _rollout(env, steps=40):
    obs, _ = env.reset(seed=0)
    rng = np.random.default_rng(1)
    out = [obs]
    for _ in range(steps):
        obs, *_ = env.step(rng.uniform(-1, 1, size=env.action_space.shape).astype(np.float32))
        out.append(obs)
    return np.array(out)


def test_hopper_leg_size_sets_radius_and_mass_only():
    import gymnasium as gym

    thin, thick, default = make_hopper(0.03), make_hopper(0.05), make_hopper()
    assert _geom_size(thin, "leg_geom")[0] == pytest.approx(0.03) and _geom_size(thick, "leg_geom")[0] == pytest.approx(0.05)
    assert _geom_size(thin, "leg_geom")[1] == _geom_size(thick, "leg_geom")[1]  # the half-length is untouched
    assert _body_mass(thin, "leg") < _body_mass(default, "leg") < _body_mass(thick, "leg")  # inertia from geoms
    assert _body_mass(default, "leg") == pytest.approx(_body_mass(gym.make("Hopper-v5"), "leg"))  # 0.04 = the stock model
    assert _body_mass(thin, "thigh") == pytest.approx(_body_mass(thick, "thigh"))
    assert thin.observation_space.shape == (11,) and thin.action_space.shape == (3,)
    assert not np.allclose(_rollout(thin), _rollout(thick))  # same seed and actions, another transition kernel


def test_half_cheetah_thighs():
    env = make_half_cheetah(0.1005, 0.1655)
    assert _geom_size(env, "bthigh")[1] == pytest.approx(0.1005) and _geom_size(env, "fthigh")[1] == pytest.approx(0.1655)
    assert env.observation_space.shape == (17,) and env.action_space.shape == (6,)
    other = make_half_cheetah(0.1855, 0.1005)
    assert _body_mass(env, "bthigh") < _body_mass(other, "bthigh") and _body_mass(env, "fthigh") > _body_mass(other, "fthigh")
    assert not np.allclose(_rollout(env), _rollout(other))


def test_samples_follow_the_paper_ranges_and_bad_sizes_are_refused():
    rng = np.random.default_rng(0)
    h = sample_hopper_params(rng, 500)
    assert h.min() >= HOPPER_RANGE[0] and h.max() <= HOPPER_RANGE[1] and h.std() > 0.004
    c = sample_half_cheetah_params(rng, 500)
    assert c.shape == (500, 2)
    for j, (lo, hi) in enumerate(HALF_CHEETAH_RANGES):
        assert c[:, j].min() >= lo and c[:, j].max() <= hi
    with pytest.raises(ValueError, match="no geom named"):
        model_xml("hopper.xml", {"shin": {0: 0.04}})
    with pytest.raises(ValueError, match="must be > 0"):
        make_hopper(0.0)


def test_ddpg_figures_runs_on_hoppers(tmp_path):
    from fedagent_flwr.experiments.fedrl_ddpg_figures import main

    argv = ["--out", str(tmp_path), "--env", "hopper", "--max-steps", "20", "--seeds", "1", "--clients", "2",
            "--test-envs", "1", "--episodes", "2", "--E", "1", "--eval-every", "1", "--eval-episodes", "1"]
    assert main(argv) == 0
    report = json.loads((tmp_path / "ddpg_figures.json").read_text())
    tr = report["communication"]["train_params"][0]
    assert len(tr) == 2 and all(HOPPER_RANGE[0] <= p[0] <= HOPPER_RANGE[1] for p in tr)
    assert len(report["personalised"]["perddpgavg"][0]["local"]) == 2 and (tmp_path / "ddpg_figures.png").exists()
