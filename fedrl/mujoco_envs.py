"""Hoppers and HalfCheetahs with varied legs (Jin et al., Appendix: the continuous-control FedRL tasks).

The paper's families, on gymnasium's MuJoCo models (needs ``pip install -e ".[mujoco]"``):

* Hoppers: the leg's capsule radius ("leg size", ``leg_geom``) ~ U[0.03, 0.05] (model default 0.04).
* HalfCheetahs: the half-length of the back thigh's capsule ~ U[0.1005, 0.1855] (default 0.145) and of
  the front thigh's ~ U[0.1005, 0.1655] (default 0.133).

A capsule's size sets its mass and inertia (the models compute inertia from geoms) and its
contacts, so the transition kernel changes while observation and action spaces stay the same.
The size has to be changed in the XML before MuJoCo compiles the model: mass and inertia are
derived at compile time, so editing ``model.geom_size`` afterwards would change contacts only.
"""

from __future__ import annotations

import os
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

import gymnasium as gym
import numpy as np

__all__ = ["HALF_CHEETAH_RANGES", "HOPPER_RANGE", "make_half_cheetah", "make_hopper", "model_xml",
           "sample_half_cheetah_params", "sample_hopper_params"]

HOPPER_RANGE = (0.03, 0.05)
HALF_CHEETAH_RANGES = ((0.1005, 0.1855), (0.1005, 0.1655))  # back thigh, front thigh


def _asset(name: str) -> Path:
    import gymnasium.envs.mujoco as mj  # imports mujoco: a clear ImportError when the extra is missing

    return Path(mj.__file__).parent / "assets" / name


def model_xml(asset: str, geom_sizes: dict[str, dict[int, float]]) -> str:
    """The gymnasium asset ``asset`` with ``geom_sizes[geom][i]`` written into component i of each named geom's size."""
    tree = ET.parse(_asset(asset))
    geoms = {g.get("name"): g for g in tree.iter("geom")}
    for name, changes in geom_sizes.items():
        if name not in geoms:
            raise ValueError(f"{asset} has no geom named {name!r}")
        size = [float(x) for x in geoms[name].get("size").split()]
        for i, value in changes.items():
            if not value > 0:
                raise ValueError(f"geom {name!r} size[{i}] must be > 0, got {value}")
            size[i] = float(value)
        geoms[name].set("size", " ".join(repr(x) for x in size))
    return ET.tostring(tree.getroot(), encoding="unicode")


def _make(env_id: str, xml: str, max_episode_steps: int | None) -> gym.Env:
    # gymnasium reads the model from a path; the file is only needed while the env compiles it
    fd, path = tempfile.mkstemp(suffix=".xml", prefix="fedrl-")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(xml)
        kwargs = {"max_episode_steps": max_episode_steps} if max_episode_steps else {}
        return gym.make(env_id, xml_file=path, **kwargs)
    finally:
        os.remove(path)


def make_hopper(leg_size: float = 0.04, max_episode_steps: int | None = None) -> gym.Env:
    """Hopper-v5 whose leg capsule has radius ``leg_size`` (the paper's "leg size")."""
    return _make("Hopper-v5", model_xml("hopper.xml", {"leg_geom": {0: leg_size}}), max_episode_steps)


def make_half_cheetah(bthigh: float = 0.145, fthigh: float = 0.133, max_episode_steps: int | None = None) -> gym.Env:
    """HalfCheetah-v5 whose back / front thigh capsules have half-lengths ``bthigh`` / ``fthigh``."""
    xml = model_xml("half_cheetah.xml", {"bthigh": {1: bthigh}, "fthigh": {1: fthigh}})
    return _make("HalfCheetah-v5", xml, max_episode_steps)


def sample_hopper_params(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.uniform(*HOPPER_RANGE, size=n)


def sample_half_cheetah_params(rng: np.random.Generator, n: int) -> np.ndarray:
    """n (bthigh, fthigh) pairs from the paper's ranges."""
    return np.stack([rng.uniform(lo, hi, size=n) for lo, hi in HALF_CHEETAH_RANGES], axis=1)
