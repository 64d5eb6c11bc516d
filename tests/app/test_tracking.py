"""tracker=tensorboard and tracker=wandb log what metrics.jsonl holds, the run config and the episode texts, each
read back with the backend's own format; tracker=wandb without wandb is refused before any work."""

import html
import importlib.util
import json
import struct
from pathlib import Path

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from fedagent_flwr.config import RunConfig


def _run(tmp_path: Path, tracker: str, name: str) -> list[dict]:
    """A two-round federation of the tiny model with `tracker`; its metric rows as metrics.jsonl holds them."""
    from fedagent_flwr.agent.models.loading import load_agent
    from fedagent_flwr.federation import run_federation
    from loopback_grid import LoopbackGrid

    torch.set_num_threads(1)
    run_config = RunConfig().to_run_config() | {
        "num-server-rounds": 2, "clients-per-round": 2, "tasks-per-epoch": 1, "group-size": 2, "eval-tasks": 2,
        "eval-samples-per-task": 1, "eval-every": 1, "num-clients": 2, "tracker": tracker,
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


def test_tracker_wandb_without_wandb_is_refused_with_the_install_command(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    with pytest.raises(ValueError) as err:
        RunConfig.from_run_config(RunConfig().to_run_config() | {"tracker": "wandb"})
    assert "tracker='wandb' is not allowed" in str(err.value) and 'pip install -e ".[wandb]"' in str(err.value)


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
    from fedagent_flwr.config import TRACKERS
    from fedagent_flwr.runs.tracking import BACKENDS

    assert set(TRACKERS) == {"none", *BACKENDS}
