"""A real 2-round federated run: `run_simulation.py` -> `flwr run` -> Ray -> ServerApp + ClientApps."""

import json
import os
import subprocess
import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

ROOT = Path(__file__).resolve().parents[2]


def test_two_round_simulation_on_the_tiny_model(tmp_path):
    """Also runs a preset file (configs/fedagent-cpu.toml), its budget cut by flags, which override it."""
    out = tmp_path / "runs"
    cmd = [
        sys.executable, str(ROOT / "run_simulation.py"), "--run-config", str(ROOT / "configs" / "fedagent-cpu.toml"),
        "--num-clients", "3", "--clients-per-round", "2", "--num-server-rounds", "2",
        "--grpo.tasks-per-epoch", "2", "--grpo.num-generations", "4", "--eval.samples-per-task", "1",
        "--eval.test-freq", "1", "--output-dir", str(out), "--run-name", "ci", "--seed", "5",
    ]
    env = os.environ | {"FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1", "FLWR_TELEMETRY_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    run_dir = out / "ci"
    assert proc.returncode == 0 and (run_dir / "summary.json").exists(), proc.stdout[-4000:] + proc.stderr[-4000:]
    # the run had a SuperLink of its own and left no process of it behind (SuperLink, simulation, Ray)
    from fedagent_flwr.simulation import processes_of

    own = [line for line in proc.stdout.splitlines() if line.startswith("[run_simulation] a local SuperLink")]
    assert own and "port 39091 " not in own[0], proc.stdout[-2000:]
    home = own[0].split("FLWR_HOME=", 1)[1].split(")", 1)[0]
    assert processes_of(home) == set() and not Path(home).exists()

    config = json.loads((run_dir / "config.json").read_text())
    assert config["partition.tasks-per-client"] == 4 and config["num-server-rounds"] == 2  # from the preset; from a flag

    summary = json.loads((run_dir / "summary.json").read_text())
    assert 0.0 <= summary["initial_success_rate"] <= 1.0 and 0.0 <= summary["final_success_rate"] <= 1.0
    assert summary["clients"] == 3 and summary["failed_replies"] == {}
    sampled = summary["sampled_clients"]
    assert sorted(sampled) == ["1", "2"] and all(len(set(p)) == 2 for p in sampled.values())

    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == [0, 1, 2]
    assert all("eval/success_rate" in r for r in rows)
    assert any(k.startswith("eval/success_rate/") for k in rows[0])
    assert rows[1]["train/replies"] == 2.0 and rows[1]["train/episodes"] == 8.0  # 2 tasks x group of 4
    assert (run_dir / "learning_curve.png").stat().st_size > 0 and (run_dir / "categories.png").stat().st_size > 0
    assert (run_dir / "metrics.csv").read_text().startswith("round,")

    # The final checkpoint is a loadable HF model, and training changed the weights.
    first = AutoModelForCausalLM.from_pretrained(run_dir / "checkpoints" / "round-0000")
    last = AutoModelForCausalLM.from_pretrained(run_dir / "checkpoints" / "round-0002")
    diffs = [float((a - b).abs().max()) for a, b in zip(first.state_dict().values(), last.state_dict().values())]
    assert max(diffs) > 0
    assert all(torch.isfinite(t).all() for t in last.state_dict().values())


def test_run_simulation_fails_when_the_server_app_died_without_a_summary(tmp_path):
    # `flwr run --stream` exits 0 even when the ServerApp raised; a stand-in `flwr` does just that.
    fake = tmp_path / "bin" / "flwr"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho 'ServerApp raised ValueError: boom'\nexit 0\n")
    fake.chmod(0o755)
    env = os.environ | {"PATH": f"{fake.parent}{os.pathsep}{os.environ['PATH']}"}
    proc = subprocess.run([sys.executable, str(ROOT / "run_simulation.py"), "--num-server-rounds", "1"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert "boom" in proc.stdout and "without writing summary.json" in proc.stderr
