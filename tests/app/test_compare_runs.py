"""scripts/compare_runs.py: the documented check that a run's numbers depend only on its seed and packages."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run(folder: Path, rows: list[dict]) -> Path:
    folder.mkdir(parents=True)
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def _compare(a: Path, b: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "compare_runs.py"), str(a), str(b)],
                          capture_output=True, text=True, timeout=60)


def test_runs_that_differ_only_in_timing_are_identical_and_a_metric_difference_is_named(tmp_path):
    row = {"round": 2, "eval/success_rate": 0.396, "train/seconds": 12.0, "elapsed_seconds": 54.0}
    a = _run(tmp_path / "a", [{"round": 0, "eval/success_rate": 0.306}, row])
    b = _run(tmp_path / "b", [{"round": 0, "eval/success_rate": 0.306}, row | {"train/seconds": 9.5, "elapsed_seconds": 40.0}])
    same = _compare(a, b)
    assert same.returncode == 0 and same.stdout.strip() == "identical"
    c = _run(tmp_path / "c", [{"round": 0, "eval/success_rate": 0.306}, row | {"eval/success_rate": 0.389}])
    differ = _compare(a, c)
    assert differ.returncode == 1 and "round 2: eval/success_rate 0.396 vs 0.389" in differ.stdout
    shorter = _compare(a, _run(tmp_path / "d", [{"round": 0, "eval/success_rate": 0.306}]))
    assert shorter.returncode == 1 and "2 rounds vs 1" in shorter.stdout
