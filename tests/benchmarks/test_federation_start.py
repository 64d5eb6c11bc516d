"""benchmarks/federation_start.py: the start-up line it fits, without starting a federation (each size stubbed)."""

import json

import pytest
from benchmark_scripts import load_script


def test_the_start_up_line_is_fitted_over_the_sizes(monkeypatch, capsys):
    script = load_script("federation_start")
    monkeypatch.setattr(script, "time_start", lambda k, out: {"clients": k, "round_1_s": 20.0 + 0.5 * k, "total_s": 99.0})
    assert script.main(["--clients", "4,32,128", "--json"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["start_s"] == pytest.approx(20.0) and result["node_s"] == pytest.approx(0.5)
    assert [r["clients"] for r in result["runs"]] == [4, 32, 128]


@pytest.mark.parametrize("clients", ["8", "0,4", "4,x"])
def test_it_needs_two_sizes_of_one_node_or_more(clients):
    script = load_script("federation_start")
    with pytest.raises(SystemExit) as stop:
        script.main(["--clients", clients])
    assert stop.value.code == 2
