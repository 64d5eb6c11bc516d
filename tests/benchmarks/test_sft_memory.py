"""benchmarks/sft_memory.py: each micro-batch setting measured in a process of its own, with the plan beside it, and
accumulation leaving the losses as they were."""

from pathlib import Path

import pytest
from benchmark_scripts import load_script

ROOT = Path(__file__).resolve().parents[2]


def test_each_setting_reports_its_peak_its_plan_and_the_same_losses(capsys):
    sft_memory = load_script("sft_memory")
    results = sft_memory.main(["--run-config", str(ROOT / "configs" / "fedse-cpu.toml"), "--micro", "0", "--micro", "4",
                               "--steps", "2", "--prompt-tokens", "40"])
    whole, passes = results
    assert (whole["micro_batch_size"], passes["micro_batch_size"]) == (16, 4) and whole["batch_size"] == 16
    assert passes["plan_gib"] < whole["plan_gib"] and whole["peak_rss_gib"] > 0
    assert passes["losses"] == pytest.approx(whole["losses"], rel=1e-5) and len(whole["losses"]) == 2
    assert "peak RSS GiB" in capsys.readouterr().out


def test_a_missing_run_config_is_one_line(capsys):
    with pytest.raises(SystemExit):
        load_script("sft_memory").main(["--run-config", "missing.toml"])
    assert "--run-config missing.toml" in capsys.readouterr().err
