"""A node's rank service (agent/fsdp/rank_service.py): ranks that outlive the ClientApp processes of a deployment, and
end with the process that starts them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from multiprocessing import AuthenticationError
from multiprocessing.connection import Client
from pathlib import Path

import pytest

from fedagent_flwr.agent.fsdp.launch import running
from fedagent_flwr.agent.fsdp.rank_service import SERVICE_PREFIX, service_folder

pytestmark = pytest.mark.ranks  # rank processes on gloo: .ci/run runs them apart from the default suite

TESTS = Path(__file__).resolve().parents[1]
ROUND = """
import json, sys
import numpy as np
import rank_workers
from fedagent_flwr.agent.fsdp.rank_service import NodeRanks
out, info = NodeRanks((2, "gloo", 300.0, 0, None), owner=int(sys.argv[1])).run(rank_workers.count_rounds, {"x": np.zeros(2)})
print(json.dumps({"x": out["x"].tolist(), "rounds": info["rounds"], "pids": info["rank_pids"]}))
"""

HELLO = """
import sys
import rank_workers
from fedagent_flwr.agent.fsdp.rank_service import NodeRanks
NodeRanks((2, "gloo", 300.0, 0, None), owner=int(sys.argv[1])).run(rank_workers.say_hello, {})
"""


def _service_pid(folder: Path) -> int:
    for line in (folder / "service.log").read_text().splitlines():
        if line.startswith("[rank-service] pid "):
            return int(line.split()[2])
    raise AssertionError("the service did not say its pid")


def test_a_nodes_ranks_outlive_each_client_process_and_end_with_their_owner(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # the service's folder and its pool's, in this test's folder
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    owner = subprocess.Popen(["sleep", "600"])  # the node's SuperExec, as the ClientApps see it
    try:
        rounds = []
        for _ in range(2):  # each round in a process of its own, as flower-supernode runs each message
            done = subprocess.run([sys.executable, "-c", ROUND, str(owner.pid)], capture_output=True, text=True, timeout=300)
            assert done.returncode == 0, done.stderr[-3000:]
            rounds.append(json.loads(done.stdout.strip().splitlines()[-1]))
        assert rounds[0]["pids"] == rounds[1]["pids"] and len(set(rounds[0]["pids"])) == 2  # the same two ranks
        assert [r["rounds"] for r in rounds] == [1.0, 2.0]  # and they remember the first round in the second
        assert rounds[1]["x"] == [1.0, 1.0]
        folder = service_folder(owner.pid)
        assert folder.stat().st_mode & 0o777 == 0o700 and (folder / "authkey").stat().st_mode & 0o777 == 0o600
        # a key other than the folder's is refused, and the service answers on
        with pytest.raises(AuthenticationError):
            Client(str(folder / "socket"), "AF_UNIX", authkey=b"not the key")
        again = subprocess.run([sys.executable, "-c", ROUND, str(owner.pid)], capture_output=True, text=True, timeout=300)
        assert json.loads(again.stdout.strip().splitlines()[-1])["pids"] == rounds[0]["pids"], again.stderr[-3000:]
        # what the ranks print in a round reaches the client process's output (the SuperNode's console), not only the log
        hello = subprocess.run([sys.executable, "-c", HELLO, str(owner.pid)], capture_output=True, text=True, timeout=300)
        assert "rank 0 of 2 says hello" in hello.stdout and "rank 1 of 2 says hello" in hello.stdout, hello.stderr[-3000:]
        service = _service_pid(folder)
    finally:
        owner.kill()
        owner.wait()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and (running(service) or any(running(p) for p in rounds[0]["pids"])):
        time.sleep(0.5)
    assert not running(service) and not any(running(p) for p in rounds[0]["pids"]), "the service or a rank outlived its owner"
    assert not list(tmp_path.glob(SERVICE_PREFIX + "*")) and not list(tmp_path.glob("fedagent-ranks-*"))


def test_a_service_folder_someone_else_can_enter_is_refused(tmp_path, monkeypatch):
    from fedagent_flwr.agent.fsdp.launch import RankFailed
    from fedagent_flwr.agent.fsdp.rank_service import ensure_service

    folder = tmp_path / "service"
    folder.mkdir(mode=0o755)
    folder.chmod(0o755)
    with pytest.raises(RankFailed, match="not this user's alone"):
        ensure_service(folder, os.getpid())
    assert not (folder / "authkey").exists()
