"""Each evaluation leaves every episode's outcome in the run folder, and two of a run's evaluations compare room by
room from those records (experiments/paired_rounds.py) without playing again."""

import json

import pytest
import torch

from fedagent_flwr.config import RunConfig
from fedagent_flwr.experiments import paired_rounds
from fedagent_flwr.experiments.seed_statistics import paired_difference


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    from flwr.supercore.task_identity import TaskIdentity

    from fedagent_flwr.agent.loading import load_agent
    from fedagent_flwr.federation import run_federation
    from loopback_grid import LoopbackGrid

    out = tmp_path_factory.mktemp("records")
    saved = (TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id)
    TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id = 1, 0, 0
    torch.set_num_threads(1)
    run_config = RunConfig().to_run_config() | {
        "num-server-rounds": 2, "clients-per-round": 2, "tasks-per-epoch": 1, "group-size": 2, "eval-tasks": 6,
        "eval-samples-per-task": 3, "eval-every": 1, "num-clients": 2, "output-dir": str(out), "run-name": "r"}
    try:
        run_federation(LoopbackGrid(run_config, 2), RunConfig.from_run_config(run_config))
    finally:
        load_agent.cache_clear()
        TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id = saved
    return out / "r"


def test_every_evaluation_writes_each_episodes_outcome_matching_its_metrics(run_dir):
    rows = {json.loads(line)["round"]: json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()}
    assert paired_rounds.evaluation_rounds(run_dir) == [0, 1, 2]
    for r in (0, 1, 2):
        record = json.loads((run_dir / "episodes" / f"round-{r:04d}.json").read_text())
        episodes = record["episodes"]
        assert record["round"] == r and len(episodes) == 18 == rows[r]["eval/episodes"]
        assert len({e["task"] for e in episodes}) == 6
        assert sum(e["won"] for e in episodes) / 18 == pytest.approx(rows[r]["eval/success_rate"])
        assert sum(e["steps"] for e in episodes) / 18 == pytest.approx(rows[r]["eval/mean_steps"])


def test_paired_rounds_is_the_paired_t_test_over_tasks_of_two_records(run_dir, capsys):
    d = paired_rounds.compare(run_dir, 2, 0)
    records = [json.loads((run_dir / "episodes" / f"round-{r:04d}.json").read_text()) for r in (2, 0)]
    by_task = []
    for record in records:
        wins = {}
        for e in record["episodes"]:
            wins.setdefault(e["task"], []).append(e["won"])
        by_task.append({t: sum(w) / len(w) for t, w in wins.items()})
    want = paired_difference(*by_task)
    assert d["n"] == 6 and d["mean"] == pytest.approx(want["mean"]) and d["se"] == pytest.approx(want["se"], nan_ok=True)
    assert paired_rounds.main([str(run_dir)]) == 0
    assert "round 2 minus round 0" in capsys.readouterr().out


def test_paired_rounds_refuses_a_round_that_was_not_evaluated(run_dir, capsys):
    with pytest.raises(SystemExit):
        paired_rounds.main([str(run_dir), "--rounds", "5", "0"])
    assert "--rounds: no episodes/round-0005.json" in capsys.readouterr().err


def test_paired_rounds_against_another_run_pairs_the_two_runs_room_by_room(run_dir, tmp_path, capsys):
    import shutil

    other = tmp_path / "other"
    shutil.copytree(run_dir / "episodes", other / "episodes")
    record = json.loads((other / "episodes" / "round-0002.json").read_text())
    for e in record["episodes"][:9]:  # the other run won the first 9 episodes, lost the rest
        e["won"] = True
    for e in record["episodes"][9:]:
        e["won"] = False
    (other / "episodes" / "round-0002.json").write_text(json.dumps(record))
    d = paired_rounds.compare_runs(run_dir, other, 2, 2)
    mine = json.loads((run_dir / "episodes" / "round-0002.json").read_text())
    by_task = []
    for rec in (mine, record):
        wins = {}
        for e in rec["episodes"]:
            wins.setdefault(e["task"], []).append(e["won"])
        by_task.append({t: sum(w) / len(w) for t, w in wins.items()})
    want = paired_difference(*by_task)
    assert d["mean"] == pytest.approx(want["mean"]) and d["later_success"] - d["earlier_success"] == pytest.approx(want["mean"])
    assert paired_rounds.compare_runs(run_dir, run_dir, 2, 2)["mean"] == 0.0
    assert paired_rounds.main([str(run_dir), "--against", str(other)]) == 0
    assert "r round 2 minus other round 2" in capsys.readouterr().out
    record["episodes"] = [e for e in record["episodes"] if e["task"] != record["episodes"][0]["task"]]
    (other / "episodes" / "round-0002.json").write_text(json.dumps(record))
    with pytest.raises(SystemExit):
        paired_rounds.main([str(run_dir), "--against", str(other)])
    assert "evaluated different tasks" in capsys.readouterr().err
