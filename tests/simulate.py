"""A small real simulation through run_simulation.py -> flwr run, isolated from any other run."""

import os
import subprocess
import sys
from pathlib import Path

from fedagent_flwr.deployment import free_port

ROOT = Path(__file__).resolve().parents[1]


def simulate(tmp_path, out, run_name, *extra):
    """(CompletedProcess, log tail); later flags in `extra` override the small defaults here."""
    cmd = [sys.executable, str(ROOT / "run_simulation.py"), "--grpo.tasks-per-epoch", "1", "--grpo.num-generations", "2",
           "--eval.samples-per-task", "1", "--eval.test-freq", "1", "--output-dir", str(out), "--run-name", run_name,
           "--seed", "4", *extra]
    # A SuperLink of our own (FLWR_HOME, ports): `flwr run` reuses any local SuperLink on the default
    # port, and another run stopping that one would take this run down with it.
    env = os.environ | {"FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1", "FLWR_TELEMETRY_ENABLED": "0",
                        "RAY_AUTH_MODE": "disabled", "FLWR_HOME": str(tmp_path / ".flwr"),
                        "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": str(free_port()), "FLWR_LOCAL_CONTROL_API_PORT": str(free_port())}
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1200)
    return proc, proc.stdout[-5000:] + proc.stderr[-3000:]
