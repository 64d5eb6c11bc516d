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
    whole, passes = results["measured"]
    assert (whole["micro_batch_size"], passes["micro_batch_size"]) == (16, 4) and whole["batch_size"] == 16
    assert passes["plan_gib"] < whole["plan_gib"] and whole["peak_rss_gib"] > 0
    assert passes["losses"] == pytest.approx(whole["losses"], rel=1e-5) and len(whole["losses"]) == 2
    assert "peak RSS GiB" in capsys.readouterr().out


@pytest.mark.slow  # eight measuring processes, about two minutes
def test_the_heads_positions_take_turns_and_leave_the_losses_as_they_were(capsys):
    """The head at every position against the completions' only, in two precisions, two turns each: one process a
    setting and turn, the same losses for either head (the loss reads the same positions), a ratio a turn."""
    report = load_script("sft_memory").main([
        "--run-config", str(ROOT / "configs" / "fedse-cpu.toml"), "--micro", "8", "--head", "every", "--head", "loss",
        "--precision", "fp32", "--precision", "bf16-mixed", "--repeats", "2", "--threads", "1", "--steps", "1",
        "--prompt-tokens", "40"])
    settings = {(r["head"], r["precision"]): r for r in report["measured"]}
    assert sorted(settings) == sorted((h, p) for h in ("every", "loss") for p in ("fp32", "bf16-mixed"))
    for precision in ("fp32", "bf16-mixed"):
        every, loss = settings[("every", precision)], settings[("loss", precision)]
        assert len(every["seconds"]) == len(loss["seconds"]) == 2
        assert every["losses"] == loss["losses"] and len(loss["losses"]) == 1
    assert settings[("loss", "fp32")]["losses"] != settings[("loss", "bf16-mixed")]["losses"]  # the precision reached it
    assert [(r["precision"], len(r["every_over_loss"])) for r in report["head_ratios"]] == [("fp32", 2), ("bf16-mixed", 2)]
    assert "head at every position / at the loss's, micro-batch 8, bf16-mixed" in capsys.readouterr().out


def test_bf16_base_loads_the_base_in_bf16_and_plans_it_so(capsys):
    """--precision bf16-base is the run's precision: the base loaded in bf16 (half the plan's weights), the passes under
    the same autocast as bf16-mixed, so the losses differ only by the base's rounding; its seconds against the first's."""
    report = load_script("sft_memory").main([
        "--run-config", str(ROOT / "configs" / "fedse-cpu.toml"), "--micro", "8", "--precision", "bf16-mixed",
        "--precision", "bf16-base", "--threads", "1", "--steps", "1", "--prompt-tokens", "40"])
    mixed, base = report["measured"]
    assert (mixed["precision"], base["precision"]) == ("bf16-mixed", "bf16-base")
    assert base["plan_gib"] < mixed["plan_gib"]
    assert base["losses"] != mixed["losses"] and base["losses"] == pytest.approx(mixed["losses"], rel=0.05)
    assert [(r["precision"], len(r["first_over_this"])) for r in report["precision_ratios"]] == [("bf16-base", 1)]
    assert "bf16-mixed / bf16-base, micro-batch 8, head loss" in capsys.readouterr().out


@pytest.mark.slow  # four measuring processes, about 45 s; the kernel itself is checked by tests/agent/test_sft.py
def test_the_attention_kernels_take_turns_plan_eagers_softmax_and_train_alike(capsys):
    """--attention sdpa --attention eager (engine.attn-implementation): two turns, the eager setting's plan the larger by its
    softmax row, the losses the same function's (fp32: to rounding), a ratio a turn, and the other ratios still read
    under the first kernel alone."""
    report = load_script("sft_memory").main([
        "--run-config", str(ROOT / "configs" / "fedse-cpu.toml"), "--micro", "8", "--attention", "sdpa", "--attention",
        "eager", "--repeats", "2", "--threads", "1", "--steps", "1", "--prompt-tokens", "40"])
    sdpa, eager = report["measured"]
    assert (sdpa["attention"], eager["attention"]) == ("sdpa", "eager") and len(eager["seconds"]) == 2
    assert eager["plan_gib"] > sdpa["plan_gib"]
    assert eager["losses"] == pytest.approx(sdpa["losses"], rel=1e-4)
    assert [(r["attention"], len(r["first_over_this"])) for r in report["attention_ratios"]] == [("eager", 2)]
    assert report["precision_ratios"] == report["head_ratios"] == []
    assert "sdpa / eager, micro-batch 8, head loss, fp32" in capsys.readouterr().out


@pytest.mark.parametrize("flag, value", [("--repeats", "0"), ("--threads", "-1")])
def test_bad_counts_are_one_line(flag, value, capsys):
    with pytest.raises(SystemExit):
        load_script("sft_memory").main(["--run-config", str(ROOT / "configs" / "fedse-cpu.toml"), flag, value])
    assert f"{flag} {value}" in capsys.readouterr().err


def test_a_missing_run_config_is_one_line(capsys):
    with pytest.raises(SystemExit):
        load_script("sft_memory").main(["--run-config", "missing.toml"])
    assert "--run-config missing.toml" in capsys.readouterr().err
