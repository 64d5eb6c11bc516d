"""scripts/keep_run_records.py: a run's records copied into the repository with no machine path, and still testable."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run_folder(root: Path, name: str, wins: list[bool]) -> Path:
    run = root / "s55" / name
    (run / "episodes").mkdir(parents=True)
    from fedagent_flwr.agent.models.model_cache import default_cache_root

    (run / "config.json").write_text(json.dumps({"seed": 2, "output-dir": str(root / "s55"),
                                                 "model-source": str(default_cache_root() / "warm-x"),
                                                 "eval.initial-evaluation": str(root / "s55" / "other")}))
    (run / "summary.json").write_text(json.dumps({"run_dir": str(run), "seconds": 10.0}))
    rows = [{"round": 0, "eval/success_rate": 0.0}, {"round": 3, "eval/success_rate": sum(wins) / len(wins)}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    for r, won in ((0, [False] * len(wins)), (3, wins)):
        episodes = [{"task": f"room-{i // 2}", "category": "c", "won": w, "reward": 10.0 * w, "steps": 3}
                    for i, w in enumerate(won)]
        (run / "episodes" / f"round-{r:04d}.json").write_text(json.dumps({"round": r, "seed": 2, "episodes": episodes,
                                                                         "taken-from": str(root / "s55" / "other")}))
    (run / "episodes" / "round-0003.txt").write_text("=== episode 1\n")
    (run / "checkpoints").mkdir()
    (run / "checkpoints" / "weights.safetensors").write_bytes(b"\0" * 64)
    return run


def _keep(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "keep_run_records.py"), *map(str, args)],
                          capture_output=True, text=True, timeout=120)


def test_records_are_kept_without_machine_paths_and_paired_rounds_reads_them(tmp_path):
    run = _run_folder(tmp_path, "fa", [True, True, False, True, True, False])
    dest = tmp_path / "repo" / "fa-s2"
    done = _keep(run, dest, "--relative-to", tmp_path / "s55")
    assert done.returncode == 0, done.stderr
    kept = sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file())
    assert kept == ["config.json", "episodes/round-0000.json", "episodes/round-0003.json", "episodes/round-0003.txt",
                    "metrics.jsonl", "summary.json"]  # no weights
    texts = "".join(p.read_text() for p in dest.rglob("*") if p.is_file())
    assert str(tmp_path) not in texts and "<runs>/other" in texts
    config = json.loads((dest / "config.json").read_text())
    assert config["output-dir"] == "<runs>" and config["model-source"] == "<model-cache>/warm-x"
    out = subprocess.run([sys.executable, "-m", "fedagent_flwr.experiments.paired_rounds", str(dest), "--json"],
                         capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["mean"] == 4 / 6 and json.loads(out.stdout)["seed"] == 2


def test_an_existing_destination_or_a_path_left_absolute_is_refused(tmp_path):
    run = _run_folder(tmp_path, "fa", [True, False])
    dest = tmp_path / "repo" / "fa-s2"
    dest.mkdir(parents=True)
    refused = _keep(run, dest, "--relative-to", tmp_path / "s55")
    assert refused.returncode == 2 and "never overwritten" in refused.stderr
    elsewhere = _keep(run, tmp_path / "repo" / "new", "--relative-to", tmp_path / "somewhere-else")
    assert elsewhere.returncode == 2 and "still names the absolute path" in elsewhere.stderr
    assert not (tmp_path / "repo" / "new").exists() and not (tmp_path / "repo" / "new.partial").exists()


def test_the_runs_provenance_is_kept_with_its_wall_time_and_no_machine_path(tmp_path):
    run = _run_folder(tmp_path, "fa", [True, False])
    (run / "provenance.json").write_text(json.dumps({
        "command": f"python -m fedagent_flwr.simulation --app /opt/wt-t1 --output-dir {tmp_path / 's55'} --run-name fa",
        "commit": "0123abc",
        "processor": "AMD EPYC (avx512_bf16)", "processor_slug": "amd-epyc-avx512bf16", "resumed": []}))
    dest = tmp_path / "repo" / "fa-s2"
    assert _keep(run, dest, "--relative-to", tmp_path / "s55").returncode == 0
    kept = json.loads((dest / "provenance.json").read_text())
    assert kept["wall_s"] == 10.0 and kept["commit"] == "0123abc"
    assert kept["command"] == "python -m fedagent_flwr.simulation --app <path>/wt-t1 --output-dir <runs> --run-name fa"
