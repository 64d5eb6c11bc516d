"""What the rank launcher adds around torch's (agent/fsdp/launch.py), tested without starting ranks: the folders a
killed client leaves, an error file cut short, the sockets' interface."""

import os
import subprocess
import sys

from fedagent_flwr.agent.fsdp.launch import FOLDER_PREFIX, _first_failure, loopback_bootstrap, remove_orphaned_folders


def test_a_rank_folder_whose_client_is_gone_is_removed_by_the_next_start(tmp_path):
    gone_client = subprocess.Popen([sys.executable, "-c", "pass"])
    gone_client.wait()
    gone = tmp_path / (FOLDER_PREFIX + "gone")
    alive = tmp_path / (FOLDER_PREFIX + "alive")
    starting = tmp_path / (FOLDER_PREFIX + "starting")  # client.pid not yet written
    other = tmp_path / "not-a-rank-folder"
    for folder, pid in ((gone, gone_client.pid), (alive, os.getpid()), (starting, None), (other, gone_client.pid)):
        folder.mkdir()
        (folder / "in.safetensors").write_bytes(b"the whole weights")
        if pid is not None:
            (folder / "client.pid").write_text(str(pid))
    assert remove_orphaned_folders(tmp_path) == [gone]
    assert not gone.exists() and alive.exists() and starting.exists() and other.exists()


def test_an_error_file_cut_short_still_names_its_rank(tmp_path):
    (tmp_path / "error-1.txt").write_text("1764800000.5")  # the time, and nothing after it
    assert str(_first_failure(tmp_path, [1, 1])).startswith("rank 1 of the client's 2 failed:")
    (tmp_path / "error-0.txt").write_text("1.0\nTraceback (most recent call last):\nValueError: boom\n")  # raised first
    assert str(_first_failure(tmp_path, [1, 1])).startswith("rank 0 of the client's 2 failed: ValueError: boom")


def test_ranks_bootstrap_on_loopback_unless_an_interface_is_named(monkeypatch):
    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "eth7")
    loopback_bootstrap()
    assert os.environ["GLOO_SOCKET_IFNAME"] in ("lo", "lo0") and os.environ["NCCL_SOCKET_IFNAME"] == "eth7"
