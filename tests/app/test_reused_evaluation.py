"""eval.initial-evaluation: a run takes another run's evaluation before round 1, only where that run evaluated exactly the
same thing (runs/reused_evaluation.py). Whole runs of the tiny default model in one process, over a loopback grid."""

import json

import pytest
import torch

from fedagent_flwr.config import RunConfig
from fedagent_flwr.runs.preflight import preflight
from fedagent_flwr.runs.reused_evaluation import IDENTITY, differences, reused_evaluation

BASE = {"num-server-rounds": 1, "clients-per-round": 2, "grpo.tasks-per-epoch": 1, "grpo.num-generations": 2, "eval.tasks": 6,
        "eval.samples-per-task": 3, "num-clients": 2}


def _run(out, name, **keys):
    from flwr.supercore.task_identity import TaskIdentity

    from fedagent_flwr import federation
    from fedagent_flwr.agent.models.loading import load_agent
    from loopback_grid import LoopbackGrid

    saved = (TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id)
    TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id = 1, 0, 0
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    run_config = RunConfig().to_run_config() | BASE | {"output-dir": str(out), "run-name": name} | keys
    try:
        federation.run_federation(LoopbackGrid(run_config, 2), RunConfig.from_run_config(run_config))
    finally:
        load_agent.cache_clear()
        torch.set_num_threads(threads)
        TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id = saved
    return out / name


def _rows(run_dir):
    return {r["round"]: r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())}


def _episodes(run_dir, r):
    return json.loads((run_dir / "episodes" / f"round-{r:04d}.json").read_text())


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A: evaluates itself; B: the same run again; C: the same run taking A's evaluation before round 1."""
    out = tmp_path_factory.mktemp("reuse")
    a = _run(out, "a")
    b = _run(out, "b")
    c = _run(out, "c", **{"eval.initial-evaluation": str(a)})
    return out, a, b, c


def test_the_same_run_evaluates_round_0_alike_so_taking_it_changes_nothing(runs):
    """The premise (B played again what A played) and the use: C's records are A's for round 0 and B's after it."""
    _, a, b, c = runs
    ra, rb, rc = _rows(a), _rows(b), _rows(c)
    evals = lambda row: {k: v for k, v in row.items() if k.startswith("eval/") and k != "eval/seconds"}
    assert evals(ra[0]) == evals(rb[0]) == evals(rc[0])
    assert rc[0]["eval/seconds"] == 0.0 < ra[0]["eval/seconds"]
    assert _episodes(a, 0)["episodes"] == _episodes(b, 0)["episodes"] == _episodes(c, 0)["episodes"]
    assert _episodes(a, 0)[IDENTITY] == _episodes(b, 0)[IDENTITY]
    assert _episodes(c, 0)["taken-from"] == str(a) and "taken-from" not in _episodes(b, 0)
    # training does not depend on who played round 0: the round-1 evaluation is the same in B and C
    assert evals(rb[1]) == evals(rc[1]) and _episodes(b, 1)["episodes"] == _episodes(c, 1)["episodes"]
    assert json.loads((c / "config.json").read_text())["eval.initial-evaluation"] == str(a)


@pytest.mark.parametrize("keys, differs", [
    ({"seed": 1}, "evaluation-seed"),  # other episodes drawn (and another LoRA A in adapter runs)
    ({"eval.temperature": 0.5}, "rollout.temperature"),
    ({"eval.tasks": 5}, "tasks"),
    ({"rollout.history-length": 1}, "rollout.history_length"),
])
def test_a_run_that_evaluated_something_else_is_refused_before_round_1(runs, keys, differs):
    out, a, _, _ = runs
    with pytest.raises(ValueError) as err:
        _run(out, f"refused-{differs}", **{"eval.initial-evaluation": str(a)}, **keys)
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"eval.initial-evaluation={str(a)!r}: that run evaluated something else")
    assert f"{differs}" in message


def test_other_initial_weights_are_refused(runs):
    """The identity holds the weights' digest: the same settings over other weights are another evaluation."""
    _, a, _, _ = runs
    identity = dict(_episodes(a, 0)[IDENTITY])
    metrics, _ = reused_evaluation(str(a), identity)
    assert metrics["success_rate"] == _rows(a)[0]["eval/success_rate"]
    with pytest.raises(ValueError, match=r"weights-sha256: [0-9a-f]{64} there, 0+ here"):
        reused_evaluation(str(a), identity | {"weights-sha256": "0" * 64})
    with pytest.raises(ValueError, match=r"libraries.torch: .* there, 0.0 here"):
        reused_evaluation(str(a), identity | {"libraries": identity["libraries"] | {"torch": "0.0"}})


def test_a_record_without_identity_or_a_folder_without_records_is_refused(runs, tmp_path):
    _, a, _, _ = runs
    old = tmp_path / "old"
    (old / "episodes").mkdir(parents=True)
    record = _episodes(a, 0)
    del record[IDENTITY]
    (old / "episodes" / "round-0000.json").write_text(json.dumps(record))
    (old / "metrics.jsonl").write_text((a / "metrics.jsonl").read_text())
    with pytest.raises(ValueError, match="records no identity"):
        reused_evaluation(str(old), _episodes(a, 0)[IDENTITY])
    base = RunConfig().to_run_config()
    with pytest.raises(ValueError, match=r"eval.initial-evaluation.*a run folder whose evaluation before round 1 finished"):
        preflight(RunConfig.from_run_config(base | {"eval.initial-evaluation": str(tmp_path / "nothing")}), "server")
    with pytest.raises(ValueError, match=r"eval.initial-evaluation.*an absolute path"):
        RunConfig.from_run_config(base | {"eval.initial-evaluation": "runs/a"})
    with pytest.raises(ValueError, match=r"eval.initial-evaluation=.* empty unless the strategy trains a language-model agent"):
        RunConfig.from_run_config(base | {"eval.initial-evaluation": str(a), "strategy": "qavg", "env": "random-mdp"})


def test_differences_name_nested_entries():
    assert differences({"a": 1, "r": {"t": 0.4, "h": 2}}, {"a": 1, "r": {"t": 1.0, "h": 2}}) == ["r.t: 1.0 there, 0.4 here"]
    assert differences({"a": 1}, {}) == ["a: (absent) there, 1 here"]


def test_the_sources_digest_follows_the_agents_and_environments_code(tmp_path):
    from fedagent_flwr.runs.reused_evaluation import SOURCE_ROOTS, source_digest

    assert [p.name for p in SOURCE_ROOTS] == ["agent", "envs"] and SOURCE_ROOTS[0].parent.name == "fedagent_flwr"
    (tmp_path / "agent" / "play").mkdir(parents=True)
    (tmp_path / "agent" / "play" / "rollout.py").write_text("X = 1\n")
    roots = (tmp_path / "agent",)
    before = source_digest(roots)
    (tmp_path / "agent" / "notes.md").write_text("prose does not play episodes")
    assert source_digest(roots) == before
    (tmp_path / "agent" / "play" / "rollout.py").write_text("X = 2\n")
    edited = source_digest(roots)
    assert edited != before
    (tmp_path / "agent" / "play" / "rollout.py").rename(tmp_path / "agent" / "play" / "sampling.py")
    assert source_digest(roots) not in (before, edited)
