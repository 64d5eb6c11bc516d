"""A run folder's provenance.json (runs/provenance.py): what made the run, written by the server at each start, and
carried by scripts/keep_run_records.py with the wall time."""

import json
import subprocess
import sys
from pathlib import Path

from fedagent_flwr.agent.engine.cpu_rates import Processor
from fedagent_flwr.runs import provenance
from fedagent_flwr.simulation import run_provenance

ROOT = Path(__file__).resolve().parents[2]


def test_a_start_records_the_command_commit_and_processor_and_a_resume_adds_its_own(tmp_path, monkeypatch):
    monkeypatch.setenv(provenance.COMMAND_ENV, "python run_simulation.py --seed 1")
    monkeypatch.setenv(provenance.COMMIT_ENV, "0123abc")
    monkeypatch.setenv(provenance.DIRTY_ENV, "0")
    first = provenance.record_start(tmp_path, resumed=False)
    assert first["command"] == "python run_simulation.py --seed 1" and first["commit"] == "0123abc"
    assert first["dirty"] is False and first["processor"] and first["processor_slug"] and first["resumed"] == []
    assert first["software"]["torch"] and first["started_utc"].endswith("Z")
    monkeypatch.setenv(provenance.COMMIT_ENV, "4567def")
    monkeypatch.setenv(provenance.DIRTY_ENV, "3")
    again = provenance.record_start(tmp_path, resumed=True)
    assert again["commit"] == "0123abc" and [r["commit"] for r in again["resumed"]] == ["4567def"]
    assert again["resumed"][0]["dirty"] is True
    assert json.loads((tmp_path / provenance.FILE).read_text()) == again
    fresh = provenance.record_start(tmp_path, resumed=False)  # a new run in a claimed folder starts the file again
    assert fresh["resumed"] == [] and fresh["commit"] == "4567def"


def test_run_simulation_passes_its_command_and_the_apps_commit(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["run_simulation.py"])
    env = run_provenance(["--seed", "1", "--run-name", "a b"], ROOT, {})
    assert env[provenance.COMMAND_ENV] == "python run_simulation.py --seed 1 --run-name 'a b'"
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    assert env[provenance.COMMIT_ENV] == (head or "unknown")
    kept = run_provenance([], ROOT, {provenance.COMMIT_ENV: "given"})  # a tree without .git: the caller's commit
    assert provenance.COMMIT_ENV not in kept


def test_a_folder_without_git_has_an_unknown_commit(tmp_path):
    assert provenance.git_state(tmp_path) == ("unknown", None)


def test_a_processor_names_its_folder_by_model_and_widest_bf16_kernel():
    assert Processor("AMD EPYC", "avx512_bf16 avx512f avx2").slug() == "amd-epyc-avx512bf16"
    assert Processor("Intel(R) Xeon(R) Platinum 8488C", "amx_bf16 amx_tile avx512_bf16 avx512f avx2").slug() == \
        "intel-xeon-platinum-8488c-amx"
    assert Processor("Intel(R) Xeon(R) CPU @ 2.20GHz", "avx512f avx2").slug() == "intel-xeon-avx512"
    assert Processor("AMD EPYC 7B13 64-Core Processor", "avx2").slug() == "amd-epyc-7b13-avx2"
