"""benchmarks/cpu_precision.py: each role's start-up line for a run config, and fresh probes of its model's shape."""

import pytest

from benchmark_scripts import load_script

cpu_precision = load_script("cpu_precision")


@pytest.mark.cpu_probe
def test_a_lora_run_config_gets_both_roles_lines_and_fresh_probes_of_its_model(tmp_path):
    preset = tmp_path / "lora.toml"
    preset.write_text('model = "tiny"\nenv = "gridworld"\ngrpo.finetuning = "lora"\ndevice = "cpu"\n')
    report = cpu_precision.main(["--run-config", str(preset), "--repeats", "2", "--json"])
    client, server = report["start_up_lines"]["client"], report["start_up_lines"]["server"]
    assert "(auto: " in client and "GFLOP/s against fp32" in client  # a LoRA run under auto says why, with rates
    assert client.split(" (")[0] == server.split(" (")[0]  # the server holds the clients' base: the same precision
    hidden, intermediate = cpu_precision.model_dims("tiny", "gridworld")
    assert [(r["hidden"], r["intermediate"], r["threads"]) for r in report["fresh"]] == [(hidden, intermediate, 1)] * 2
    s = report["bf16_speedup"]
    assert 0 < s["min"] <= s["median"] <= s["max"] and report["threshold"] == 1.25


def test_bad_repeats_are_refused_in_one_line(tmp_path, capsys):
    preset = tmp_path / "p.toml"
    preset.write_text('model = "tiny"\n')
    with pytest.raises(SystemExit):
        cpu_precision.main(["--run-config", str(preset), "--repeats", "0"])
    assert "--repeats=0 is not allowed: expected an integer >= 1" in capsys.readouterr().err
