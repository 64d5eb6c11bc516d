"""A client and its ranks hand weights through safetensors files written one tensor at a time
(agent/fsdp/tensor_files.py): the safetensors library reads them, the writer holds one tensor at a time, and a folder
without room is refused before anything is written."""

from __future__ import annotations

import collections
import tracemalloc

import numpy as np
import pytest
from safetensors.numpy import load_file

from fedagent_flwr.agent.fsdp import tensor_files
from fedagent_flwr.agent.fsdp.tensor_files import Streamed, mapped, write_streamed

MIB = 1024**2


def test_what_is_written_a_tensor_at_a_time_is_what_safetensors_reads(tmp_path):
    arrays = {"w": np.arange(7, dtype=np.float32).reshape(7, 1), "step": np.array(3, dtype=np.int64),
              "mask": np.array([True, False, True]), "empty": np.zeros((0, 4), np.float32),
              "half": np.linspace(0, 1, 5).astype(np.float16)}
    size = write_streamed(tmp_path / "t.safetensors", Streamed.of(arrays))
    assert size == (tmp_path / "t.safetensors").stat().st_size
    for read in (load_file(str(tmp_path / "t.safetensors")), mapped(tmp_path / "t.safetensors")):
        assert sorted(read) == sorted(arrays)
        for name, values in arrays.items():
            assert read[name].dtype == values.dtype and read[name].shape == values.shape
            np.testing.assert_array_equal(read[name], values)
    assert [p.name for p in tmp_path.iterdir()] == ["t.safetensors"]  # no temporary file left


def test_a_computed_stream_produces_each_tensor_once_in_one_order_and_holds_one_at_a_time(tmp_path):
    asked = []

    def produce(name):
        asked.append(name)
        return np.full((MIB // 4,), float(int(name[1:])), np.float32)  # 1 MiB each

    layout = {f"t{i}": (np.float32, (MIB // 4,)) for i in range(24)}
    tracemalloc.start()
    try:
        write_streamed(tmp_path / "t.safetensors", Streamed.computed(layout, produce))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert asked == list(layout)
    assert peak < 3 * MIB  # a whole set at once would be 24 MiB
    read = mapped(tmp_path / "t.safetensors")
    assert [float(read[f"t{i}"][0]) for i in range(24)] == list(map(float, range(24)))


def test_streams_join_widest_first_and_keep_their_names_order(tmp_path):
    weights = Streamed.of({"b": np.ones(3, np.float32), "a": np.zeros(2, np.float32)}).prefixed("trained/")
    optimizer = Streamed.of({"m": np.ones(1, np.float32), "step": np.array([5], np.int64)}).prefixed("optimizer/")
    joined = weights + optimizer
    assert joined.names() == ["trained/b", "trained/a", "optimizer/m", "optimizer/step"]
    assert [dtype.itemsize for _, dtype, _ in joined.layout] == [8, 4, 4, 4]
    write_streamed(tmp_path / "t.safetensors", joined)
    assert load_file(str(tmp_path / "t.safetensors"))["optimizer/step"].tolist() == [5]
    with pytest.raises(ValueError, match="in common"):
        weights + weights


def test_a_stream_that_breaks_its_layout_is_refused_and_leaves_no_file(tmp_path):
    streamed = Streamed.computed({"w": (np.float32, (2,))}, lambda name: np.zeros(3, np.float32))
    with pytest.raises(ValueError, match=r"w: expected float32 \(2,\)"):
        write_streamed(tmp_path / "t.safetensors", streamed)
    assert not (tmp_path / "t.safetensors").exists()


def test_a_folder_without_room_is_refused_in_one_line_before_writing(tmp_path, monkeypatch):
    usage = collections.namedtuple("usage", "total used free")
    monkeypatch.setattr(tensor_files.shutil, "disk_usage", lambda folder: usage(10 * MIB, 9 * MIB, MIB))
    produced = []
    streamed = Streamed.computed({"w": (np.float32, (MIB,))}, lambda name: produced.append(name) or np.zeros(MIB, np.float32))
    with pytest.raises(OSError) as err:
        write_streamed(tmp_path / "t.safetensors", streamed)
    assert str(tmp_path) in str(err.value) and "0.00 GiB free" in str(err.value) and "TMPDIR" in str(err.value)
    assert "\n" not in str(err.value)
    assert produced == [] and list(tmp_path.iterdir()) == []
