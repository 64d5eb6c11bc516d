"""benchmarks/step_kernels.py runs on CPU with a tiny model, so the GPU comparison of rollout.kernels cannot rot."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "step_kernels.py"


# the shaped model's case only under -m slow (each case compiles its token steps in a subprocess, about 20 s)
@pytest.mark.parametrize("model", [["--model", "tiny:gridworld"], pytest.param(["--shape", "tiny"], marks=pytest.mark.slow)])
def test_tiny_model_sets_compiled_token_steps_beside_eager_ones(model):
    done = subprocess.run([sys.executable, str(SCRIPT), *model, "--json", "--rows", "4",
                           "--prompt-tokens", "16", "--steps", "4", "--runs", "2", "--threads", "1"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    r = json.loads(done.stdout.strip().splitlines()[-1])
    assert r["device"] == "cpu" and r["precision"] == "fp32" and r["graphs"] is False
    assert set(r["ms"]) == {"eager", "compile"} and all(len(v) == 2 and min(v) > 0 for v in r["ms"].values())
    ratios = [a / b for a, b in zip(r["ms"]["eager"], r["ms"]["compile"])]
    assert abs(r["speedup_mean_se"][0] - sum(ratios) / 2) < 1e-9 and r["speedup_mean_se"][1] >= 0
    assert 0 <= r["paired_t_p"] <= 1 or r["paired_t_p"] != r["paired_t_p"]  # NaN when the two runs tie exactly
    assert r["logprob_gap"] < 1e-4  # fp32: compiled and eager kernels compute the same step


def test_one_run_is_refused_by_name():
    done = subprocess.run([sys.executable, str(SCRIPT), "--runs", "1"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "--runs must be at least 2" in done.stderr
