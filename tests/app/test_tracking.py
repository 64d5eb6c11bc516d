"""tracker=tensorboard, tracker=wandb and tracker=mlflow log what metrics.jsonl holds, the run config and the episode
texts, each read back with the backend's own format or client; tracker=wandb without wandb is refused before any
work."""

import html
import importlib.util
import json
import struct
from pathlib import Path

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from fedagent_flwr.config import RunConfig
from fedagent_flwr.runs.preflight import preflight


def _run(tmp_path: Path, tracker: str, name: str) -> list[dict]:
    """A two-round federation of the tiny model with `tracker`; its metric rows as metrics.jsonl holds them."""
    from fedagent_flwr.agent.models.loading import load_agent
    from fedagent_flwr.federation import run_federation
    from loopback_grid import LoopbackGrid

    torch.set_num_threads(1)
    run_config = RunConfig().to_run_config() | {
        "num-server-rounds": 2, "clients-per-round": 2, "grpo.tasks-per-epoch": 1, "grpo.num-generations": 2, "eval.tasks": 2,
        "eval.samples-per-task": 1, "eval.test-freq": 1, "num-clients": 2, "tracker": tracker,
        "output-dir": str(tmp_path), "run-name": name}
    try:
        run_federation(LoopbackGrid(run_config, 2), RunConfig.from_run_config(run_config))
    finally:
        load_agent.cache_clear()
    return [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]


def test_a_run_with_tracker_tensorboard_logs_every_metric_the_config_and_the_episodes(tmp_path, run_identity):
    rows = _run(tmp_path, "tensorboard", "tb")
    events = EventAccumulator(str(tmp_path / "tb" / "tensorboard"), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    scalars = set(events.Tags()["scalars"])
    for row in rows:
        for key, value in row.items():
            if key != "round":
                assert key in scalars, key
                logged = {e.step: e.value for e in events.Scalars(key)}
                assert abs(logged[row["round"]] - value) <= 1e-6 * max(1.0, abs(value)), key
    texts = set(events.Tags()["tensors"])  # add_text is stored as a tensor summary
    assert {"config/text_summary", "episodes/text_summary"} <= texts, texts
    config_text = events.Tensors("config/text_summary")[0].tensor_proto.string_val[0].decode()
    assert '"tracker": "tensorboard"' in config_text
    assert [e.step for e in events.Tensors("episodes/text_summary")] == [0, 1, 2]


def read_offline_run(wandb_dir: Path):
    """The one run under `wandb_dir`: its run record, config and history ({step: {key path: value}}), read from its
    run-*.wandb file. That file is LevelDB's log format (a 7-byte wandb header, then 32 KiB blocks of chunks, each
    crc32 | length | type, a record split over FIRST/MIDDLE/LAST chunks) of wandb_internal_pb2.Record protobufs;
    wandb no longer ships its Python reader (sdk/internal/datastore.py), so it is read here."""
    import wandb
    from wandb.proto.wandb_internal_pb2 import Record

    wandb.teardown()  # run.finish() returns before wandb's service has written the file out; this waits for it
    (path,) = wandb_dir.glob("wandb/*run-*/run-*.wandb")
    data, block, pos, pending = path.read_bytes(), 32768, 7, b""
    records = []
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # too little left in the block for a chunk header: zero padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0:  # preallocated tail
            break
        pending += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # FULL or LAST: a whole record
            records.append(Record.FromString(pending))
            pending = b""
    (run,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    updates = list(run.config.update) + [u for r in records if r.WhichOneof("record_type") == "config" for u in r.config.update]
    config = {u.key: json.loads(u.value_json) for u in updates}
    history: dict[int, dict[tuple[str, ...], object]] = {}
    for r in records:
        if r.WhichOneof("record_type") == "history":
            items = {tuple(i.nested_key) or (i.key,): json.loads(i.value_json) for i in r.history.item}
            history.setdefault(items[("_step",)], {}).update(items)
    return run, config, history


def test_a_run_with_tracker_wandb_logs_every_metric_the_config_and_the_episodes(tmp_path, run_identity, monkeypatch):
    pytest.importorskip("wandb")
    for name, folder in (("WANDB_DIR", "wandb-dir"), ("WANDB_CACHE_DIR", "cache"), ("WANDB_CONFIG_DIR", "config")):
        monkeypatch.setenv(name, str(tmp_path / folder))  # nothing written outside tmp_path
        (tmp_path / folder).mkdir()
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_PROJECT", "tracking-test")
    rows = _run(tmp_path, "wandb", "wb")
    run, config, history = read_offline_run(tmp_path / "wandb-dir")
    assert (run.project, run.display_name) == ("tracking-test", "wb")
    for row in rows:
        for key, value in row.items():
            if key != "round":
                assert (key,) in history.get(row["round"], {}), (key, row["round"])
                logged = history[row["round"]][(key,)]
                assert abs(logged - value) <= 1e-6 * max(1.0, abs(value)), key
    assert json.loads((tmp_path / "wb" / "config.json").read_text()).items() <= config.items()
    assert config["tracker"] == "wandb"
    episodes = {step: items[("episodes", "path")] for step, items in history.items() if ("episodes", "path") in items}
    assert list(episodes) == [0, 1, 2]
    (media,) = (tmp_path / "wandb-dir").glob(f"wandb/*run-*/files/{episodes[2]}")
    assert html.escape((tmp_path / "wb" / "episodes" / "round-0002.txt").read_text()) in media.read_text()


def test_tracker_wandb_defaults_to_the_run_folder_and_the_project_fedagent_flwr(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    from fedagent_flwr.runs.tracking import open_tracker

    for name in ("WANDB_DIR", "WANDB_PROJECT"):
        monkeypatch.delenv(name, raising=False)
    for name, folder in (("WANDB_CACHE_DIR", "cache"), ("WANDB_CONFIG_DIR", "config")):
        monkeypatch.setenv(name, str(tmp_path / folder))
    monkeypatch.setenv("WANDB_MODE", "offline")
    run_dir = tmp_path / "maze-run"
    run_dir.mkdir()
    tracker = open_tracker("wandb", run_dir)
    tracker.row({"round": 3, "eval/success_rate": 0.5, "flag": True})
    tracker.close()
    run, _, history = read_offline_run(run_dir)
    assert (run.project, run.display_name) == ("fedagent-flwr", "maze-run")
    assert history[3][("eval/success_rate",)] == 0.5 and ("flag",) not in history[3]  # a bool is no scalar


def test_a_run_with_tracker_mlflow_logs_every_metric_the_config_and_the_episodes(tmp_path, run_identity, monkeypatch):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME"):
        monkeypatch.delenv(name, raising=False)
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")  # MLflow's own default artifact root is ./mlruns: nothing may land there
    rows = _run(tmp_path, "mlflow", "ml")
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'ml' / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("fedagent-flwr").experiment_id])
    assert (run.info.run_name, run.info.status) == ("ml", "FINISHED")
    assert set(run.data.metrics) == {key for row in rows for key in row if key != "round"}
    for key in run.data.metrics:
        logged = {m.step: m.value for m in client.get_metric_history(run.info.run_id, key)}
        expected = {row["round"]: row[key] for row in rows if key in row}
        assert logged.keys() == expected.keys(), key
        for step, value in expected.items():
            assert abs(logged[step] - value) <= 1e-6 * max(1.0, abs(value)), (key, step)
    config = json.loads((tmp_path / "ml" / "config.json").read_text())
    assert run.data.params == {k: v if isinstance(v, str) else json.dumps(v) for k, v in config.items()}
    assert run.data.params["tracker"] == "mlflow"
    episodes = [f.path for f in client.list_artifacts(run.info.run_id, "episodes")]
    assert episodes == [f"episodes/round-{step:04d}.txt" for step in (0, 1, 2)]
    assert run.info.artifact_uri.startswith((tmp_path / "ml" / "mlflow-artifacts").as_uri())
    logged = client.download_artifacts(run.info.run_id, "episodes/round-0002.txt", str(tmp_path))
    assert Path(logged).read_text() == (tmp_path / "ml" / "episodes" / "round-0002.txt").read_text()
    assert not any((tmp_path / "cwd").iterdir())


def test_tracker_mlflow_logs_to_mlflow_tracking_uri_when_it_is_set(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    from fedagent_flwr.runs.tracking import open_tracker

    shared = f"sqlite:///{tmp_path / 'shared.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", shared)
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "maze")
    monkeypatch.chdir(tmp_path)  # a shared store's artifacts go to MLflow's default, ./mlruns
    run_dir = tmp_path / "maze-run"
    run_dir.mkdir()
    tracker = open_tracker("mlflow", run_dir)
    tracker.row({"round": 3, "eval/success_rate": 0.5, "flag": True})
    tracker.close()
    client = MlflowClient(tracking_uri=shared)
    (run,) = client.search_runs([client.get_experiment_by_name("maze").experiment_id])
    assert run.info.run_name == "maze-run" and run.data.metrics == {"eval/success_rate": 0.5}  # a bool is no scalar
    assert [m.step for m in client.get_metric_history(run.info.run_id, "eval/success_rate")] == [3]
    assert not any(run_dir.iterdir())  # nothing in the run folder: the store is elsewhere


@pytest.mark.parametrize("tracker", ["wandb", "mlflow"])
def test_a_tracker_without_its_package_is_refused_with_the_install_command(monkeypatch, tracker):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == tracker else real(name, *a))
    with pytest.raises(ValueError) as err:
        preflight(RunConfig.from_run_config(RunConfig().to_run_config() | {"tracker": tracker}))
    assert f"tracker='{tracker}' is not allowed" in str(err.value) and f'pip install -e ".[{tracker}]"' in str(err.value)


def test_a_run_that_fails_midway_still_closes_its_tracker(tmp_path, run_identity, monkeypatch):
    """A failed run's tracker is flushed and finished too: its last rows are what a user reads to see why it failed."""
    from fedagent_flwr.agent.play.evaluation import GlobalEvaluator
    from fedagent_flwr.runs.tracking import TensorBoardTracker

    closed, evaluate = [], GlobalEvaluator.evaluate

    def failing(self, server_round):
        if server_round == 1:
            raise RuntimeError("evaluation failed")
        return evaluate(self, server_round)

    monkeypatch.setattr(GlobalEvaluator, "evaluate", failing)
    monkeypatch.setattr(TensorBoardTracker, "close", lambda self: closed.append(True))
    with pytest.raises(RuntimeError, match="evaluation failed"):
        _run(tmp_path, "tensorboard", "failing")
    assert closed == [True]


def test_every_tracker_the_config_allows_has_a_backend():
    from fedagent_flwr.config.choices import TRACKERS
    from fedagent_flwr.runs.tracking import BACKENDS

    assert set(TRACKERS) == {"none", *BACKENDS}
