"""The figures of docs/presets.md's Fed-SE paper preset that are our environments' own, not the paper's: the turn
limits of the environments the preset leaves at their horizon, and the held-out tasks it plays where ours are fewer
than AgentGym's test sets. Computed from configs/fedse-paper.toml and the environments' code, written by
`python scripts/write_docs.py`; tests/records regenerates them and fails on any difference."""

from __future__ import annotations

from pathlib import Path

from envs import make_env
from envs.multi import per_env_spread, task_env
from fedagent_flwr.config import RunConfig
from fedagent_flwr.experiments.doc_blocks import Figure
from fedagent_flwr.simulation import read_run_config_file

ROOT = Path(__file__).resolve().parents[2]
PAGE = "docs/presets.md"


def paper_preset(name: str = "fedse-paper.toml") -> RunConfig:
    """The preset as a run reads it: the defaults, then the file's keys."""
    return RunConfig.from_run_config(RunConfig().to_run_config() | read_run_config_file(str(ROOT / "configs" / name)))


def horizons_and_held_out(cfg: RunConfig) -> tuple[dict[str, int], dict[str, int]]:
    """Each environment's turn limit under the preset, and how many held-out tasks of each its evaluation plays."""
    env = make_env(cfg.env, cfg.rollout.max_steps)
    held_out = per_env_spread(env.tasks_of_split("test"), cfg.eval.tasks)
    return ({name: env.env(name).max_steps for name in env.names},
            {name: sum(task_env(t) == name for t in held_out) for name in env.names})


def doc_parts() -> list[Figure]:
    """The horizons and test-set sizes of the preset's row of docs/presets.md's comparison table that are ours."""
    horizons, held_out = horizons_and_held_out(paper_preset())
    return [*(Figure(PAGE, f"fedse-paper.horizon-{name}", f"{horizons[name]}")
              for name in ("textcraft", "maze", "wordle")),
            *(Figure(PAGE, f"fedse-paper.held-out-{name}", f"{held_out[name]}") for name in ("textcraft", "maze"))]
