"""benchmarks/raw_output.py, the file every GPU number is cited from, degrades cleanly on a CPU machine."""

import datetime
import json
import subprocess
import sys
from pathlib import Path

from benchmark_scripts import load_script

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "raw_output.py"
raw_output = load_script("raw_output")


def test_a_cpu_machine_is_card_cpu_with_no_driver_and_its_folder_says_so(monkeypatch):
    monkeypatch.setattr(raw_output.shutil, "which", lambda name: None)  # no nvidia-smi, as here
    assert raw_output.card() == {"name": "cpu", "memory_mib": None, "driver": None, "count": 0}
    when = datetime.datetime(2026, 12, 1, 23, 59, tzinfo=datetime.timezone.utc)
    from fedagent_flwr.agent.engine import cpu_rates

    monkeypatch.setattr(cpu_rates, "this_processor", lambda: cpu_rates.Processor("AMD EPYC", "avx512_bf16 avx512f avx2"))
    assert raw_output.folder("benchmarks/results", when) == Path("benchmarks/results/2026-12-01-amd-epyc-avx512bf16")
    assert raw_output.slug("NVIDIA H100 80GB HBM3") == "h100-80gb-hbm3" and raw_output.slug("NVIDIA H200") == "h200"


def test_without_git_the_commit_comes_from_the_variables_set_where_the_call_started(tmp_path, monkeypatch):
    monkeypatch.delenv("FEDAGENT_GIT_COMMIT", raising=False)
    monkeypatch.delenv("FEDAGENT_GIT_DIRTY", raising=False)
    unknown = raw_output.git_state(tmp_path)  # a lent machine's copy of the tree: no .git
    assert unknown["commit"] == "unknown" and unknown["dirty"] is None and "no .git" in unknown["from"]
    monkeypatch.setenv("FEDAGENT_GIT_COMMIT", "0123abc")
    monkeypatch.setenv("FEDAGENT_GIT_DIRTY", "3")  # `git status --porcelain | wc -l`
    assert raw_output.git_state(tmp_path) == {"commit": "0123abc", "dirty": True, "changed": None,
                                              "from": "FEDAGENT_GIT_COMMIT and FEDAGENT_GIT_DIRTY"}
    monkeypatch.setenv("FEDAGENT_GIT_DIRTY", "0")
    assert raw_output.git_state(tmp_path)["dirty"] is False
    here = raw_output.git_state()  # this checkout has its .git: git wins over the variables
    assert here["from"] == "git" and len(here["commit"]) == 40 and isinstance(here["dirty"], bool)


def test_times_are_found_by_their_keys_estimates_and_rates_left_out():
    result = {"rollout_s": 1.5, "generated_tokens_per_s": 99.0, "decode_ms_per_token_step": 7.0, "episodes": 4,
              "variants": [{"update_s": 2.0, "update_mfu": 0.3}], "first_run_s": {"eager": 9.0},
              "ms": {"eager": [1.0, 2.0]}, "paper_rounds": {"webshop": {"client_s": 100.0}}}
    assert raw_output.phase_times(result) == {"rollout_s": 1.5, "decode_ms_per_token_step": 7.0,
                                              "variants.0.update_s": 2.0, "first_run_s.eager": 9.0,
                                              "ms.eager.0": 1.0, "ms.eager.1": 2.0}


def test_run_writes_the_result_after_the_card_versions_commit_settings_and_times(tmp_path):
    """On this CPU machine: card "cpu", driver null, CUDA null (a CPU build of torch). The benchmark's JSON keys stay
    at the top level beside raw_output (fastest_variant.py reads the file as the benchmark's output); its settings
    move into raw_output."""
    bench = ("import json, sys; print('progress', file=sys.stderr); print('a line'); "
             "print(json.dumps({'update_s': 2.5, 'variants': [{'logprobs_s': 0.5}], 'settings': {'shape': 'tiny'}, "
             "'run_config': {'rollout.max-steps': 2}}))")
    out = tmp_path / "session" / "stage.json"
    done = subprocess.run([sys.executable, str(SCRIPT), "run", str(out), "--stage", "stage", "--",
                           sys.executable, "-c", bench], capture_output=True, text=True, timeout=120,
                          env={"PATH": "/usr/bin:/bin", "SHAPE": "tiny"})  # no nvidia-smi, no other variable
    assert done.returncode == 0, done.stderr
    assert "a line" in done.stdout and '{"update_s": 2.5' in done.stdout and f"wrote {out}" in done.stdout
    assert "progress" in done.stderr  # the benchmark's stderr passes through, to the stage's log
    record = json.loads(out.read_text())
    assert list(record)[0] == "raw_output" and record["update_s"] == 2.5 and "settings" not in record
    raw = record["raw_output"]
    assert raw["stage"] == "stage" and raw["rc"] == 0 and raw["wall_s"] > 0
    software = raw["software"]
    assert software["torch"] and software["transformers"] and software["peft"]
    if raw_output.shutil.which("nvidia-smi") is None:  # this CPU machine (a GPU machine names its card and driver)
        assert raw["card"] == {"name": "cpu", "memory_mib": None, "driver": None, "count": 0}
        assert software["cuda"] is None and software["cudnn"] is None
    assert raw["git"]["from"] == "git" and len(raw["git"]["commit"]) == 40
    assert raw["command"][-2:] == ["-c", bench] and raw["environment"] == {"SHAPE": "tiny"}
    assert raw["settings"] == {"arguments": {"shape": "tiny"}, "run_config": {"rollout.max-steps": 2}}
    started = datetime.datetime.fromisoformat(raw["started_utc"])
    assert started.tzinfo == datetime.timezone.utc and raw["finished_utc"] >= raw["started_utc"]
    assert raw["times"] == {"update_s": 2.5, "variants.0.logprobs_s": 0.5}


def test_a_run_that_prints_no_json_keeps_its_last_lines_and_exit_status(tmp_path):
    out = tmp_path / "tests.json"
    rc = raw_output.run(out, [sys.executable, "-c", "print('1 passed'); raise SystemExit(3)"], "tests")
    record = json.loads(out.read_text())
    assert rc == 3 and record["raw_output"]["rc"] == 3 and list(record) == ["raw_output"]
    assert record["raw_output"]["stdout_tail"] == ["1 passed"] and "no JSON" in record["raw_output"]["result"]
