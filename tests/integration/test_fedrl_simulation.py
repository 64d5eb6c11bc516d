"""QAvg and PAvg as real Flower apps: run_simulation.py -> flwr run -> Ray -> ServerApp + ClientApps."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fedrl.engine import Cell, run_cells
from fedrl.mdps import RandomMDPs

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # about 60-90 s each on 2 shared cores, almost all of it Ray start-up
@pytest.mark.parametrize("strategy, extra, algo", [("qavg", [], "qavg"), ("pavg", ["--fedrl.pavg-variant", "soft"], "softpavg")])
def test_flwr_run_of_qavg_and_pavg_matches_the_engine(tmp_path, strategy, extra, algo):
    out = tmp_path / "runs"
    cmd = [sys.executable, str(ROOT / "run_simulation.py"), "--strategy", strategy, "--env", "random-mdp",
           "--num-clients", "3", "--num-server-rounds", "3", "--fedrl.local-updates", "2", "--fedrl.kappa", "0.6", "--seed", "4",
           "--output-dir", str(out), "--run-name", "ci", *extra]
    env = os.environ | {"FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1", "FLWR_TELEMETRY_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    run_dir = out / "ci"
    assert (run_dir / "summary.json").exists(), proc.stdout[-4000:] + proc.stderr[-4000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["clients"] == 3 and summary["failed_replies"] == {} and summary["E"] == 2
    assert summary["sampled_clients"] == {str(r): [0, 1, 2] for r in (1, 2, 3)}
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == [0, 1, 2, 3] and all(r.get("train/replies", 3.0) == 3.0 for r in rows)
    # the same numbers as fedrl's vectorised engine on the same seed and repetition
    config = json.loads((run_dir / "config.json").read_text())
    from fedagent_flwr.config import RunConfig
    from fedrl_grid import build_problem

    cfg = RunConfig.from_run_config({k: v for k, v in config.items() if k in RunConfig().to_run_config()})
    problem = build_problem(cfg, 3)
    (ref,) = run_cells(RandomMDPs(n_train=3), [Cell(algo, 2, 6, problem.step_size, 0.6)], reps=1, seed=4)
    assert summary["final"]["center_value"] == pytest.approx(ref.center_value[0], rel=1e-10)
    assert summary["final"]["test_value"] == pytest.approx(ref.test_value[0], rel=1e-10)
    np.testing.assert_allclose(problem.values(np.load(run_dir / "final_params.npy"))["train_value"], ref.train_value[0], rtol=1e-10)
    assert (run_dir / "learning_curve.png").stat().st_size > 0


@pytest.mark.slow  # about 90 s on 2 shared cores, mostly Ray start-up
def test_flwr_run_of_per_ddpgavg_matches_an_in_process_run(tmp_path, run_identity):
    """strategy='pavg' on a deep env is DDPGAvg: the real app's global weights equal an in-process run's."""
    from flwr.app import ConfigRecord

    from fedagent_flwr.methods.fedrl import deep as fedrl_deep
    from fedagent_flwr.config import RunConfig
    from fedrl_grid import LocalGrid, strategy_for

    out = tmp_path / "runs"
    cmd = [sys.executable, str(ROOT / "run_simulation.py"), "--strategy", "pavg", "--env", "pendulum", "--num-clients", "2",
           "--num-server-rounds", "2", "--fedrl.local-updates", "4", "--fedrl.env-embedding-dim", "2", "--rollout.max-steps", "150",
           "--fedrl.test-envs", "1", "--eval.samples-per-task", "1", "--eval.test-freq", "1", "--seed", "3",
           "--output-dir", str(out), "--run-name", "ddpg"]
    env = os.environ | {"FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1", "FLWR_TELEMETRY_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    run_dir = out / "ddpg"
    assert (run_dir / "summary.json").exists(), proc.stdout[-4000:] + proc.stderr[-4000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["algorithm"] == "PerDDPGAvg" and summary["failed_replies"] == {} and summary["E"] == 4
    final = np.load(run_dir / "final_weights.npz")
    assert "embedding" not in final.files and any(k.startswith("actor.") for k in final.files)

    config = json.loads((run_dir / "config.json").read_text())
    cfg = RunConfig.from_run_config({k: v for k, v in config.items() if k in RunConfig().to_run_config()})
    problem = fedrl_deep.build_deep_problem(cfg, 2)
    strategy = strategy_for(cfg, problem, {0: 100, 1: 101})
    result = strategy.start(grid=LocalGrid(cfg, 2), initial_arrays=problem.initial_arrays(), num_rounds=2,
                            train_config=ConfigRecord({"fingerprint": problem.fingerprint()}))
    for key in final.files:
        np.testing.assert_allclose(final[key], result.arrays[key].numpy(), rtol=1e-5, atol=1e-6)
    # 4 x 150 steps a round: DDPG's 1,000 warm-up steps end in round 2, which trains, so the weights moved
    start = problem.initial_arrays()
    assert not all(np.allclose(final[k], start[k].numpy()) for k in final.files)
