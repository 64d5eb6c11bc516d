"""What a run says when it starts, where its numbers would otherwise be misread."""

import pytest

from fedagent_flwr.config import RunConfig
from fedagent_flwr.methods.base import Method

pytest.importorskip("alfworld")


def test_a_run_on_the_generated_alfworld_pool_says_so_at_start_up(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path))  # no official games there
    Method(RunConfig(env="alfworld")).announce(tmp_path, 2)
    out = capsys.readouterr().out
    assert "NOTE: ALFWorld plays our 144 generated training games" in out and "ALFWORLD_DATA" in out
    Method(RunConfig(env="gridworld")).announce(tmp_path, 2)
    assert "ALFWorld" not in capsys.readouterr().out
