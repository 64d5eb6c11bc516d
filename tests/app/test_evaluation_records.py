"""Each evaluation leaves every episode's outcome in the run folder, and two of a run's evaluations compare room by
room from those records (experiments/paired_rounds.py) without playing again. A round's metric row is written
after its evaluation and counts its time; each client's own metrics get a row of their own, and
eval.save-total-limit keeps the last checkpoints and the best."""

import json
import time
from types import SimpleNamespace

import pytest
import torch

from fedagent_flwr.config import RunConfig
from fedagent_flwr.experiments import paired_rounds
from fedagent_flwr.experiments.seed_statistics import paired_difference
from fedagent_flwr.runs.reporting import checkpoints_kept, round_line

EVALUATION_CLOCK = 1000.0


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    from flwr.supercore.task_identity import TaskIdentity

    from fedagent_flwr import federation
    from fedagent_flwr.agent.play.evaluation import GlobalEvaluator
    from fedagent_flwr.agent.models.loading import load_agent
    from loopback_grid import LoopbackGrid

    out = tmp_path_factory.mktemp("records")
    saved = (TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id)
    TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id = 1, 0, 0
    torch.set_num_threads(1)
    run_config = RunConfig().to_run_config() | {
        "num-server-rounds": 2, "clients-per-round": 2, "grpo.tasks-per-epoch": 1, "grpo.num-generations": 2, "eval.tasks": 6,
        "eval.samples-per-task": 3, "eval.test-freq": 1, "num-clients": 2, "output-dir": str(out), "run-name": "r",
        "eval.save-total-limit": 1}
    # The server's clock jumps EVALUATION_CLOCK seconds inside each evaluation, so a test can tell whether a round's
    # time includes its evaluation.
    jump = [0.0]
    real_time, real_evaluate = time.time, GlobalEvaluator.evaluate

    def evaluate(self, server_round):
        jump[0] += EVALUATION_CLOCK
        return real_evaluate(self, server_round)

    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(GlobalEvaluator, "evaluate", evaluate)
            patch.setattr(federation, "time", SimpleNamespace(time=lambda: real_time() + jump[0], sleep=time.sleep))
            federation.run_federation(LoopbackGrid(run_config, 2), RunConfig.from_run_config(run_config))
    finally:
        load_agent.cache_clear()
        TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id = saved
    return out / "r"


def test_the_server_writes_the_runs_provenance(run_dir):
    record = json.loads((run_dir / "provenance.json").read_text())
    assert record["processor"] and record["software"]["flwr"] and record["resumed"] == []


def test_a_rounds_time_so_far_includes_its_evaluation(run_dir):
    """The round line's seconds come after the round's evaluation: the 3-round SmolLM2 run's said 9 s for a round 0
    whose evaluation took 368 s."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == [0, 1, 2]
    for r in (0, 1, 2):  # r + 1 evaluations have ended by the end of round r, each EVALUATION_CLOCK long
        assert (r + 1) * EVALUATION_CLOCK <= rows[r]["elapsed_seconds"] < (r + 2) * EVALUATION_CLOCK
    assert round_line(rows[0], None).endswith(f"| {rows[0]['elapsed_seconds']:.0f} s")


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
    assert "--rounds: round 5 of" in capsys.readouterr().err


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


def _copy_as_seed(run_dir, dest, seed, wins):
    """A copy of the run's records under another seed, its last evaluation won by `wins` (one bool per episode)."""
    import shutil

    shutil.copytree(run_dir / "episodes", dest / "episodes")
    shutil.copy(run_dir / "metrics.jsonl", dest / "metrics.jsonl")
    config = json.loads((run_dir / "config.json").read_text())
    (dest / "config.json").write_text(json.dumps(config | {"seed": seed}))
    record = json.loads((dest / "episodes" / "round-0002.json").read_text())
    for e, won in zip(record["episodes"], wins, strict=True):
        e["won"] = won
    (dest / "episodes" / "round-0002.json").write_text(json.dumps(record))
    return dest


def test_paired_rounds_over_seeds_tests_the_per_seed_changes(run_dir, tmp_path, capsys):
    from fedagent_flwr.experiments.seed_statistics import paired_difference

    runs = [_copy_as_seed(run_dir, tmp_path / f"s{s}", s, [i < k for i in range(18)]) for s, k in ((0, 3), (1, 9), (2, 12))]
    first = json.loads((run_dir / "episodes" / "round-0000.json").read_text())
    start = sum(e["won"] for e in first["episodes"]) / 18
    assert paired_rounds.main([str(r) for r in runs] + ["--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [d["seed"] for d in out["runs"]] == [0, 1, 2]
    assert [d["later_success"] for d in out["runs"]] == pytest.approx([3 / 18, 9 / 18, 12 / 18])
    want = paired_difference({0: 3 / 18, 1: 9 / 18, 2: 12 / 18}, {0: start, 1: start, 2: start})
    assert out["over_seeds"]["mean"] == pytest.approx(want["mean"]) and out["over_seeds"]["se"] == pytest.approx(want["se"])
    assert out["over_seeds"]["p"] == pytest.approx(want["p"])

    # Two methods: each seed's run against the other method's run of that seed, the difference tested over seeds.
    others = [_copy_as_seed(run_dir, tmp_path / f"o{s}", s, [i < k for i in range(18)]) for s, k in ((0, 2), (1, 6), (2, 7))]
    assert paired_rounds.main([str(r) for r in runs] + ["--against"] + [str(o) for o in others] + ["--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    want = paired_difference({0: 3 / 18, 1: 9 / 18, 2: 12 / 18}, {0: 2 / 18, 1: 6 / 18, 2: 7 / 18})
    assert out["over_seeds"]["mean"] == pytest.approx(want["mean"]) and out["over_seeds"]["p"] == pytest.approx(want["p"])
    assert all(d["rooms"] and d["n"] == 6 for d in out["runs"])


def test_paired_rounds_over_seeds_refuses_unpaired_seeds_and_counts_a_run_without_records(run_dir, tmp_path, capsys):
    runs = [_copy_as_seed(run_dir, tmp_path / f"s{s}", s, [True] * 18) for s in (0, 1)]
    swapped = [_copy_as_seed(run_dir, tmp_path / f"o{s}", s, [False] * 18) for s in (1, 0)]
    with pytest.raises(SystemExit):
        paired_rounds.main([str(r) for r in runs] + ["--against"] + [str(o) for o in swapped])
    assert "ran seed 0" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        paired_rounds.main([str(runs[0]), "--against", str(swapped[0]), str(swapped[1])])
    assert "--against: 2 runs for 1 run_dir" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        paired_rounds.main([str(runs[0]), str(runs[0])])
    assert "repeat" in capsys.readouterr().err

    # A run from before the episode records: its metrics.jsonl success still counts over seeds, with no room line.
    import shutil

    shutil.rmtree(runs[1] / "episodes")
    rows = [json.loads(line) for line in (runs[1] / "metrics.jsonl").read_text().splitlines()]
    assert paired_rounds.main([str(r) for r in runs] + ["--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["runs"][1]["rooms"] is False
    assert out["runs"][1]["later_success"] == pytest.approx(rows[-1]["eval/success_rate"])
    assert out["runs"][1]["earlier_success"] == pytest.approx(rows[0]["eval/success_rate"])
    assert paired_rounds.main([str(r) for r in runs]) == 0
    assert "no test room by room" in capsys.readouterr().out


def test_each_client_has_its_own_row_whose_mean_is_the_rounds_row(run_dir):
    """clients.jsonl: one row per client and round (partition-id, its metrics and reply bytes); metrics.jsonl's train/*
    is their mean, so the drift between clients that the mean hides is in the run folder."""
    rounds = {json.loads(line)["round"]: json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()}
    clients = [json.loads(line) for line in (run_dir / "clients.jsonl").read_text().splitlines()]
    assert sorted((c["round"], c["client"]) for c in clients) == [(1, 0), (1, 1), (2, 0), (2, 1)]
    for r in (1, 2):
        mine = [c for c in clients if c["round"] == r]
        for key in ("success_rate", "loss", "comm/bytes-received"):
            assert all(key in c for c in mine), key
        assert sum(c["success_rate"] for c in mine) / 2 == pytest.approx(rounds[r]["train/success_rate"])
        assert sum(c["comm/bytes-received"] for c in mine) > 0


def test_clients_png_draws_a_line_per_client_in_each_panel(tmp_path, monkeypatch):
    from fedagent_flwr.runs.reporting import RunReporter

    reporter, drawn = RunReporter(tmp_path), []
    real_save = reporter._save
    monkeypatch.setattr(reporter, "_save", lambda fig, name: (drawn.append((fig, name)), real_save(fig, name)))
    for r in (1, 2):
        reporter.log_clients(r, {0: {"success_rate": 0.1 * r, "update_norm": 0.4, "loss": 0.1},
                                 3: {"success_rate": 0.3, "update_norm": 0.2 * r, "loss": 0.2}})
    fig, name = drawn[-1]
    assert name == "clients.png" and (tmp_path / "clients.png").is_file()
    assert [ax.get_title() for ax in fig.axes] == ["training success", "update norm", "loss"]  # no KL in these rows
    for ax in fig.axes:
        assert [line.get_label() for line in ax.get_lines()] == ["client 0", "client 3"]
    assert list(fig.axes[1].get_lines()[1].get_ydata()) == [0.2, 0.4]


def test_save_total_limit_keeps_the_last_checkpoint_and_the_best(run_dir):
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    best = max((r for r in rows if "eval/success_rate" in r), key=lambda r: (r["eval/success_rate"], -r["round"]))["round"]
    kept = sorted(int(d.name.removeprefix("round-")) for d in (run_dir / "checkpoints").iterdir())
    assert kept == sorted({2, best})
    assert not [d for d in (run_dir / "checkpoints").iterdir() if d.name.startswith(".")]


@pytest.mark.parametrize("saved,success,limit,kept", [
    ([0, 2, 4, 6], {0: 0.3, 2: 0.5, 4: 0.4, 6: 0.45}, 1, {2, 6}),  # the last, and the best
    ([0, 2, 4, 6], {0: 0.3, 2: 0.5, 4: 0.4, 6: 0.45}, 2, {2, 4, 6}),
    ([0, 2, 4], {0: 0.5, 2: 0.5, 4: 0.1}, 1, {0, 4}),  # ties: the earliest
    ([0, 2, 4], {0: 0.1, 2: 0.2, 4: 0.3}, 1, {4}),  # the last is the best
    ([0, 2, 4], {0: 0.1}, 0, {0, 2, 4}),  # 0 = keep all
])
def test_checkpoints_kept_is_the_last_n_and_the_best(saved, success, limit, kept):
    assert checkpoints_kept(saved, success, limit) == kept


def test_a_runs_evaluation_replays_from_its_folder_to_the_last_digit(run_dir, capsys):
    """`python -m fedagent_flwr.evaluation --run RUN --round N` plays the run's checkpoint as its server did: every metric
    of the round's row (its time aside) comes back exactly; a round whose checkpoint was not kept is refused in one line."""
    from fedagent_flwr.agent.models.loading import load_agent
    from fedagent_flwr.experiments.evaluate import main

    rows = {json.loads(line)["round"]: json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()}
    out = run_dir.parent / "replay.json"
    try:
        assert main(["--run", str(run_dir), "--round", "2", "--out", str(out)]) == 0
    finally:
        load_agent.cache_clear()
    replayed = json.loads(out.read_text())
    recorded = {k.removeprefix("eval/"): v for k, v in rows[2].items() if k.startswith("eval/") and k != "eval/seconds"}
    assert recorded and {k: replayed[k] for k in recorded} == recorded
    dropped = ({0, 1, 2} - {int(d.name.removeprefix("round-")) for d in (run_dir / "checkpoints").iterdir()}).pop()
    with pytest.raises(SystemExit):
        main(["--run", str(run_dir), "--round", str(dropped)])
    err = capsys.readouterr().err
    assert f"--round {dropped}: {run_dir} keeps checkpoints of rounds" in err and "Traceback" not in err
