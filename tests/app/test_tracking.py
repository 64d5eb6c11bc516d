"""tracker=tensorboard logs what metrics.jsonl holds, the run config and the episode texts, readable by
TensorBoard's own reader."""

import json

import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from fedagent_flwr.config import RunConfig


def test_a_run_with_tracker_tensorboard_logs_every_metric_the_config_and_the_episodes(tmp_path, run_identity):
    from fedagent_flwr.agent.loading import load_agent
    from fedagent_flwr.federation import run_federation
    from loopback_grid import LoopbackGrid

    torch.set_num_threads(1)
    run_config = RunConfig().to_run_config() | {
        "num-server-rounds": 2, "clients-per-round": 2, "tasks-per-epoch": 1, "group-size": 2, "eval-tasks": 2,
        "eval-samples-per-task": 1, "eval-every": 1, "num-clients": 2, "tracker": "tensorboard",
        "output-dir": str(tmp_path), "run-name": "tb"}
    try:
        run_federation(LoopbackGrid(run_config, 2), RunConfig.from_run_config(run_config))
    finally:
        load_agent.cache_clear()
    events = EventAccumulator(str(tmp_path / "tb" / "tensorboard"), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    rows = [json.loads(line) for line in (tmp_path / "tb" / "metrics.jsonl").read_text().splitlines()]
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
