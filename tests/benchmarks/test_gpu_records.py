"""The raw outputs of the GPU sessions (benchmarks/results/<date>-<card>/): what they must hold for what the docs say of
them, and the table benchmarks/gpu_figures.py writes from them. The figures themselves are checked by tests/records."""

import json
import re
from pathlib import Path

from benchmark_scripts import load_script

REPO = Path(__file__).resolve().parents[2]
H100_E = REPO / "benchmarks" / "results" / "2026-12-05-h100-80gb-hbm3"
gpu_figures = load_script("gpu_figures")


def _record(name: str) -> dict:
    return json.loads((H100_E / name).read_text())


def test_h100_e_measurements_ran_on_the_card_and_finished():
    steps = _record("call-2/decode-compile.json")
    assert steps["device"] == "NVIDIA H100 80GB HBM3" and steps["raw_output"]["rc"] == 0
    assert len(steps["ms"]["eager"]) == len(steps["ms"]["compile"]) == steps["runs"]  # alternating runs, one of each
    for name in ("call-2/decode-compile.profile.json", "call-2/prefill.json"):
        assert _record(name)["raw_output"]["rc"] == 0


def test_h100_e_bugs_are_what_the_logs_show():
    """The failures the section reports, as the calls printed them, and the passes after the fixes."""
    call1 = (H100_E / "call-1" / "call.log").read_text()
    assert "got mixed torch.Tensor and DTensor" in (H100_E / "call-1" / "ranks.log").read_text()
    assert [_record(f"call-{n}/ranks.json")["raw_output"]["rc"] for n in (1, 2)] == [1, 0]
    assert "1 passed, 1 skipped" in (H100_E / "call-2" / "ranks.log").read_text()
    assert call1.count("No module named 'tomli'") >= 5
    gap = float(re.search(r"AssertionError: ([\d.]+)", (H100_E / "call-1" / "tests.log").read_text()).group(1))
    assert gap < 0.0625  # under one bf16 spacing for log-probs between -8 and -16
    assert "9 passed" in (H100_E / "call-2" / "tests.log").read_text()
    assert "No module named 'alfworld'" in (H100_E / "call-2" / "round-fast.log").read_text()
    assert "micro-batch-size is already set" in (H100_E / "call-2" / "levers.log").read_text()


def test_the_raw_outputs_name_no_machine_paths():
    """Placeholders stand for the lent machine's folders (commands.txt, which gives the calls as typed, says which)."""
    for path in H100_E.rglob("*"):
        if path.is_file() and path.name != "commands.txt":
            assert not re.search(r"(?<![\w<])/(tmp|work|opt|root|home|usr)/", path.read_text()), path


def test_the_raw_output_table_has_a_row_for_each_stage_json_of_each_gpu_session_only():
    sessions = gpu_figures.gpu_outputs()
    assert H100_E in sessions and not any(s.name.endswith("-cpu") for s in sessions)
    assert sorted(sessions[H100_E]) == sorted(H100_E.glob("call-*/*.json"))
    rows = [line for line in gpu_figures.table(H100_E, sessions[H100_E]) if line.startswith("| call-")]
    assert len(rows) == len(sessions[H100_E])
    by_file = {re.search(r"\[(call-\d/[\w.-]+\.json)\]", row).group(1): row.split(" | ") for row in rows}
    assert by_file["call-2/tests.json"][3:5] == ["9 passed", "passed"]
    assert by_file["call-1/prefill.json"][3:5] == ["none: No module named 'tomli'", "failed (rc 1)"]
    assert by_file["call-2/prefill.json"][3].endswith(f"{_record('call-2/prefill.json')['speedup']:.2f}x")
