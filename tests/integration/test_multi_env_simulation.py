"""A real federated run over Fed-SE's five environments, one per client (`run_simulation.py` -> `flwr run`).

Slow: the first run builds the multi-env tiny model (minutes on 2 cores, cached
afterwards in the usual cache folder) and then plays one round on five clients.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ENVS = ["babyai", "webshop", "textcraft", "maze", "wordle"]


@pytest.mark.slow
def test_one_round_over_five_environments_reports_each(tmp_path):
    out = tmp_path / "runs"
    cmd = [
        sys.executable, str(ROOT / "run_simulation.py"),
        "--env", ",".join(ENVS), "--partition.scheme", "by-environment", "--num-clients", "5", "--clients-per-round", "5",
        "--num-server-rounds", "1", "--grpo.tasks-per-epoch", "2", "--grpo.num-generations", "2", "--rollout.max-steps", "6",
        "--eval.tasks", "2", "--eval.samples-per-task", "1", "--eval.test-freq", "1",
        "--output-dir", str(out), "--run-name", "multi", "--seed", "3",
    ]
    env = os.environ | {"FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1", "FLWR_TELEMETRY_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1800)
    run_dir = out / "multi"
    assert (run_dir / "summary.json").exists(), proc.stdout[-4000:] + proc.stderr[-4000:]

    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["environments"] == ENVS and summary["failed_replies"] == {}
    assert set(summary["final_success_rate_per_env"]) == set(ENVS)  # summary.json sorts keys; the order is "environments"
    rates = summary["final_success_rate_per_env"]
    assert all(0.0 <= r <= 1.0 for r in rates.values())
    assert summary["final_mean_over_envs"] == pytest.approx(sum(rates.values()) / 5)
    # eval.tasks=2 is per environment, so every env has 2 episodes and the pooled rate equals the mean.
    assert summary["final"]["episodes"] == 10.0
    assert all(summary["final"][f"episodes/env/{e}"] == 2.0 for e in ENVS)
    assert summary["final_success_rate"] == pytest.approx(summary["final_mean_over_envs"])

    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == [0, 1]
    assert all(f"eval/success_rate/env/{e}" in r for r in rows for e in ENVS)
    # by-environment: each of the five clients played 2 tasks x group of 2, all in its own env, so every
    # env reports exactly 4 training episodes (the mean over the clients that played it); a client
    # with tasks of two envs would pull some env's mean below 4.
    assert rows[1]["train/replies"] == 5.0 and rows[1]["train/episodes"] == 4.0
    assert all(rows[1][f"train/episodes/env/{e}"] == 4.0 for e in ENVS)
    assert "per environment" in proc.stdout
    assert (run_dir / "learning_curve.png").stat().st_size > 0
