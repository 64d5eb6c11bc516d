"""A run never writes over another run, and nothing in a run folder changes until a resume is accepted.

The refusals happen in run_federation before the server loads any model or meets any client: the tests hand it
a grid that fails if it is ever asked for its nodes, and a method whose model loading fails if it is ever called.
"""

import json

import pytest

from fedagent_flwr import federation
from fedagent_flwr.config import RunConfig
from fedagent_flwr.runs.run_folder import claim_run_folder


class NoGrid:
    def get_node_ids(self):
        raise AssertionError("the run reached the federation before refusing")


class LoadsNothing:
    """A method whose model loading fails the test: the refusals must come first."""

    def run_label(self):
        return "fedagent-avg"

    def prepare(self):
        raise AssertionError("a model was loaded before the run folder was checked")


@pytest.fixture()
def nothing_loads(monkeypatch):
    monkeypatch.setattr(federation, "method_for", lambda cfg: LoadsNothing())


def _snapshot(folder):
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _existing_run(tmp_path):
    run = tmp_path / "runs" / "mine"
    (run / "state").mkdir(parents=True)
    (run / "summary.json").write_text('{"rounds": 8}')
    (run / "config.json").write_text(json.dumps({"grpo.learning-rate": 5e-5}))
    (run / "state" / "manifest.json").write_text("{")
    return run


def test_a_new_run_with_a_taken_name_is_refused_and_the_old_run_is_untouched(tmp_path, nothing_loads):
    run = _existing_run(tmp_path)
    before = _snapshot(run)
    cfg = RunConfig(output_dir=str(tmp_path / "runs"), run_name="mine")
    with pytest.raises(ValueError, match="run-name='mine' is not allowed: .* already holds a run; set resume=true"):
        federation.run_federation(NoGrid(), cfg)
    assert _snapshot(run) == before


def test_a_resume_of_a_missing_run_creates_nothing(tmp_path, nothing_loads):
    cfg = RunConfig(output_dir=str(tmp_path / "runs"), run_name="ghost", resume=True)
    with pytest.raises(ValueError, match="run-name='ghost' names no run"):
        federation.run_federation(NoGrid(), cfg)
    assert not (tmp_path / "runs").exists()


def test_a_refused_resume_changes_nothing_in_the_run_folder(tmp_path, nothing_loads):
    run = _existing_run(tmp_path)
    before = _snapshot(run)
    cfg = RunConfig.from_run_config({"output-dir": str(tmp_path / "runs"), "run-name": "mine", "resume": True, "grpo.learning-rate": 0.1})
    with pytest.raises(ValueError, match="no saved state of .* is usable: .*manifest.json is missing or unreadable"):
        federation.run_federation(NoGrid(), cfg)
    assert _snapshot(run) == before


def test_unnamed_runs_started_in_the_same_second_get_their_own_folders(tmp_path):
    folders = {claim_run_folder(tmp_path, "", False, "maze-fedagent-avg") for _ in range(3)}
    assert len(folders) == 3 and all(f.is_dir() and not any(f.iterdir()) for f in folders)


def test_an_empty_folder_of_that_name_is_used(tmp_path):
    (tmp_path / "mine").mkdir()
    assert claim_run_folder(tmp_path, "mine", False, "x") == tmp_path / "mine"
