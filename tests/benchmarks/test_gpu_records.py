"""The GPU numbers the docs quote, recomputed from the raw outputs they cite (benchmarks/results/<date>-<card>/)."""

import json
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
H100_E = REPO / "benchmarks" / "results" / "2026-12-05-h100-80gb-hbm3"


def _prose(name: str) -> str:
    return " ".join((REPO / "docs" / name).read_text().split())


def _section(text: str, title: str) -> str:
    return text.split(f"## {title}", 1)[1].split(" ## ", 1)[0]


def _record(name: str) -> dict:
    return json.loads((H100_E / name).read_text())


def test_h100_e_figures_are_the_raw_outputs():
    text = _section(_prose("gpu-measurements.md"), "H100 E (2026-12-05)")
    steps = _record("call-2/decode-compile.json")
    assert steps["device"] == "NVIDIA H100 80GB HBM3" and steps["raw_output"]["rc"] == 0
    compiled, eager = (steps["ms_mean_se"][k][0] for k in ("compile", "eager"))
    quoted = re.search(r"runs\): ([\d.]+) ms a token step against ([\d.]+) ms with eager kernels, ([\d.]+)x \(paired "
                       r"t-test p = ([\d.e-]+)\)\. The first run, which compiles, took ([\d.]+) s against ([\d.]+) s", text)
    assert quoted.groups() == (f"{compiled:.3f}", f"{eager:.3f}", f"{steps['speedup_mean_se'][0]:.3f}",
                               f"{steps['paired_t_p']:.1e}", f"{steps['first_run_s']['compile']:.2f}",
                               f"{steps['first_run_s']['eager']:.2f}")
    assert len(steps["ms"]["eager"]) == len(steps["ms"]["compile"]) == 6 and "6 alternating runs" in text
    profile = _record("call-2/decode-compile.profile.json")
    ms = {e["engine"]: e["ms_per_token_step"] for e in profile["engines"]}
    quoted = re.search(r"the transformers loop ([\d.]+) ms, the static engine ([\d.]+) ms, with compiled kernels ([\d.]+) "
                       r"ms, the static engine without CUDA graphs ([\d.]+) ms\. The bandwidth bound is ([\d.]+) ms", text)
    assert quoted.groups() == tuple(f"{v:.2f}" for v in (ms["hf"], ms["static"], ms["static-compile"], ms["static-eager"],
                                                         profile["bound"]["bound_ms"]))
    prefill = _record("call-2/prefill.json")
    shared, whole = prefill["variants"]["shared prefixes"], prefill["variants"]["whole"]
    quoted = re.search(r"([\d,]+) prompt tokens\): ([\d.]+) ms with each group's shared prefix computed once \(([\d,]+) "
                       r"positions\) against ([\d.]+) ms with every prompt whole \(([\d,]+)\), ([\d.]+)x\. The two disagree "
                       r"by at most ([\d.]+) in a log-prob", text)
    assert quoted.groups() == (f"{prefill['prompt_tokens']:,}", f"{shared['ms']:.1f}", f"{shared['positions']:,}",
                               f"{whole['ms']:.1f}", f"{whole['positions']:,}", f"{prefill['speedup']:.2f}",
                               f"{prefill['logprob_gap']:.3f}")
    # gpu.md's speed-key table quotes the same token steps
    row = re.search(r"\| `rollout.kernels` \| `eager` \| [^|]*?([\d.]+) against ([\d.]+) ms a token step", _prose("gpu.md"))
    assert row.groups() == (f"{compiled:.3f}", f"{eager:.3f}")


def test_h100_e_bugs_are_what_the_logs_show():
    """The failures the section reports, as the calls printed them, and the passes after the fixes."""
    text = _section(_prose("gpu-measurements.md"), "H100 E (2026-12-05)")
    call1 = (H100_E / "call-1" / "call.log").read_text()
    assert "got mixed torch.Tensor and DTensor" in (H100_E / "call-1" / "ranks.log").read_text()
    assert _record("call-1/ranks.json")["raw_output"]["rc"] == 1 and _record("call-2/ranks.json")["raw_output"]["rc"] == 0
    assert "1 passed, 1 skipped" in (H100_E / "call-2" / "ranks.log").read_text()
    assert call1.count("No module named 'tomli'") >= 5
    gap = float(re.search(r"AssertionError: ([\d.]+)", (H100_E / "call-1" / "tests.log").read_text()).group(1))
    assert f"came out {gap:.3f} apart" in text
    assert "9 passed" in (H100_E / "call-2" / "tests.log").read_text()
    assert "No module named 'alfworld'" in (H100_E / "call-2" / "round-fast.log").read_text()
    assert "micro-batch-size is already set" in (H100_E / "call-2" / "levers.log").read_text()


def test_the_raw_outputs_name_no_machine_paths():
    """Placeholders stand for the lent machine's folders (commands.txt, which gives the calls as typed, says which)."""
    for path in H100_E.rglob("*"):
        if path.is_file() and path.name != "commands.txt":
            assert not re.search(r"(?<![\w<])/(tmp|work|opt|root|home|usr)/", path.read_text()), path
