"""What the rank launcher adds around torch's (agent/fsdp/launch.py), tested without starting ranks: the folders a
killed client leaves, an error file cut short, the sockets' interface."""

import os
import subprocess
import sys
from pathlib import Path

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


_FREED = """
import sys
sys.path.insert(0, sys.argv[2])
from fedagent_flwr.agent.fsdp.launch import return_freed_memory
import rank_workers
if sys.argv[1] == "returned":
    assert return_freed_memory()
print(rank_workers.freed_blocks_held_mib())
"""


def test_a_rank_gives_the_memory_it_frees_back_to_the_system():
    # in fresh interpreters: glibc's threshold, once moved, stays moved
    tests = str(Path(__file__).resolve().parents[1])
    held = {variant: float(subprocess.run([sys.executable, "-c", _FREED, variant, tests], capture_output=True, text=True,
                                          check=True).stdout) for variant in ("returned", "default")}
    assert held["returned"] < 10  # MiB: the one block still alive
    assert held["default"] > 60, held  # glibc's moving threshold keeps what was freed: the case the ranks avoid
