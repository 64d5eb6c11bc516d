"""Lean transfer: tied weights travel once, and federation.transfer-dtype=bf16 halves the bytes of every message."""

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, MessageType

from fedagent_flwr.agent.training.weights import arrays_to_model, model_to_arrays, tied_names
from fedagent_flwr.config import RunConfig
from strategies.communication import payload_bytes
from strategies.transfer import decode, encode, from_bf16_bits, to_bf16_bits


def test_bf16_bits_round_like_torch_and_decode_exactly():
    x = np.random.default_rng(0).normal(size=5000).astype(np.float32) * np.float32(7.0)
    ours = from_bf16_bits(to_bf16_bits(x))
    np.testing.assert_array_equal(ours, torch.from_numpy(x).to(torch.bfloat16).float().numpy())
    record = ArrayRecord({"w": Array(x), "step": Array(np.arange(3, dtype=np.int64))})
    sent = encode(record, "bf16")
    assert sent["w"].numpy().dtype == np.uint16 and sent["step"].numpy().dtype == np.int64  # integers as they are
    back = decode(sent, "bf16", template=record)
    assert back["w"].numpy().dtype == np.float32 and np.array_equal(back["step"].numpy(), np.arange(3))
    with pytest.raises(ValueError, match="uint16"):
        decode(record, "bf16", template=record)  # fp32 where bf16 bits were due


def test_tied_weights_travel_once_and_are_tied_again_on_arrival(tiny_lm):
    assert tied_names(tiny_lm) == {"lm_head.weight": "model.embed_tokens.weight"}
    arrays = model_to_arrays(tiny_lm)
    distinct = sum(p.numel() for p in tiny_lm.parameters())  # parameters() lists a tied matrix once
    assert "lm_head.weight" not in arrays.keys() and payload_bytes(arrays) == 4 * distinct
    shifted = ArrayRecord({k: Array(arrays[k].numpy() + 1.0) for k in arrays.keys()})
    arrays_to_model(tiny_lm, shifted)
    assert tiny_lm.lm_head.weight.data_ptr() == tiny_lm.model.embed_tokens.weight.data_ptr()
    np.testing.assert_array_equal(tiny_lm.lm_head.weight.detach().numpy(), shifted["model.embed_tokens.weight"].numpy())


@pytest.mark.parametrize("dtype, width", [("fp32", 4), ("bf16", 2)])
def test_a_federated_round_sends_each_distinct_parameter_once_in_the_transfer_dtype(dtype, width, tmp_path, run_identity):
    from fedagent_flwr.agent.models.loading import load_agent
    from fedagent_flwr.federation import run_federation
    from loopback_grid import LoopbackGrid

    torch.set_num_threads(1)
    run_config = RunConfig().to_run_config() | {
        "num-server-rounds": 1, "clients-per-round": 2, "grpo.tasks-per-epoch": 1, "grpo.num-generations": 2, "eval.tasks": 1,
        "eval.samples-per-task": 1, "num-clients": 2, "output-dir": str(tmp_path), "run-name": dtype, "federation.transfer-dtype": dtype,
    }
    grid = LoopbackGrid(run_config, 2)
    try:
        summary = run_federation(grid, RunConfig.from_run_config(run_config))
        distinct = sum(p.numel() for p in load_agent("tiny", RunConfig.env, "auto").model.parameters())
    finally:
        load_agent.cache_clear()
    trains = [(sent, reply) for sent, reply in grid.exchanges if sent.metadata.message_type == MessageType.TRAIN]
    assert len(trains) == 2 and summary["failed_replies"] == {}
    for sent, reply in trains:
        for message in (sent, reply):
            arrays = message.content.array_records["arrays"]
            assert payload_bytes(arrays) == width * distinct
            assert {arrays[k].numpy().dtype for k in arrays.keys()} == {np.dtype(np.uint16 if dtype == "bf16" else np.float32)}
    rows = (tmp_path / dtype / "metrics.jsonl").read_text().splitlines()
    assert f'"train/comm/bytes-sent-per-client": {float(width * distinct)}' in rows[1]
    assert 0.0 <= summary["final_success_rate"] <= 1.0


def test_bf16_transfer_is_refused_where_the_weights_must_stay_exact():
    for bad in ({"privacy.dp-mode": "server-side"}, {"privacy.secure-aggregation": True, "clients-per-round": 2},
                {"strategy": "qavg", "env": "random-mdp"}):
        with pytest.raises(ValueError, match="federation.transfer-dtype='bf16'"):
            RunConfig.from_run_config(RunConfig().to_run_config() | {"federation.transfer-dtype": "bf16"} | bad)
