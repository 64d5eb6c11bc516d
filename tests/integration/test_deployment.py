"""Deployment: certificates and node keys, and a real SuperLink + two SuperNodes on loopback.

The loopback runs take minutes on 2 shared cores (every message starts a
ClientApp subprocess that imports torch), so they sit behind the `deployment`
marker: python -m pytest -q -m deployment tests/test_deployment.py
"""

import json
import os
import re
import time
import tomllib
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec, padding
from cryptography.hazmat.primitives.serialization import load_ssh_private_key, load_ssh_public_key

from fedagent_flwr.agent.fsdp.launch import running
from fedagent_flwr.deployment import LocalFederation, make_node_key, make_tls_certificates

ROOT = Path(__file__).resolve().parents[2]


def test_tls_certificates_chain_to_the_ca_and_name_the_loopback_host(tmp_path):
    paths = make_tls_certificates(tmp_path, hosts=("127.0.0.1", "localhost"))
    ca = x509.load_pem_x509_certificate(paths["ca"].read_bytes())
    server = x509.load_pem_x509_certificate(paths["cert"].read_bytes())
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert server.issuer == ca.subject
    # the CA's key really signed the server certificate (raises if not)
    ca.public_key().verify(server.signature, server.tbs_certificate_bytes, padding.PKCS1v15(), server.signature_hash_algorithm)
    sans = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    assert sans.get_values_for_type(x509.DNSName) == ["localhost"]
    assert paths["key"].stat().st_mode & 0o077 == 0  # private key readable by its owner only


def test_node_keys_are_p384_openssh_pairs(tmp_path):
    private, public = make_node_key(tmp_path, "node0")
    key = load_ssh_private_key(private.read_bytes(), None)
    pub = load_ssh_public_key(public.read_bytes())
    assert isinstance(key.curve, ec.SECP384R1) and public.read_text().startswith("ecdsa-sha2-nistp384 ")
    assert key.public_key().public_numbers() == pub.public_numbers()
    assert private.stat().st_mode & 0o077 == 0


def test_cli_connection_points_at_the_superlink_with_tls_or_insecure(tmp_path):
    secure = LocalFederation(tmp_path / "s", secure=True, port=18123)
    conf = tomllib.loads((secure.cli_home / "config.toml").read_text())["superlink"]
    assert conf["default"] == secure.connection
    assert conf[secure.connection] == {"address": "127.0.0.1:18123", "root-certificates": str(secure.tls["ca"])}
    plain = LocalFederation(tmp_path / "p", secure=False, port=18124)
    conf = tomllib.loads((plain.cli_home / "config.toml").read_text())["superlink"]
    assert conf[plain.connection] == {"address": "127.0.0.1:18124", "insecure": True}


def _wait_exit(proc, timeout):
    deadline = time.time() + timeout
    while proc.popen.poll() is None and time.time() < deadline:
        time.sleep(0.5)
    return proc.popen.poll()


@pytest.mark.deployment
@pytest.mark.parametrize("secure", [False, True], ids=["insecure", "tls-auth"])
def test_two_rounds_on_a_loopback_superlink_with_two_supernodes(tmp_path, secure):
    out = tmp_path / "runs"
    with LocalFederation(tmp_path / "fed", secure=secure) as fed:
        fed.start_superlink()
        if secure:
            # A SuperNode whose key was never registered must be refused before anything runs.
            intruder = fed.start_supernode(0, 2, key=fed.node_key("intruder", register=False), name="intruder")
            code = _wait_exit(intruder, 120)
            log = intruder.tail(20000)
            assert code not in (None, 0), "an unregistered SuperNode kept running:\n" + log
            assert "Failed to activate SuperNode" in log, log
        nodes = [fed.start_supernode(k, 2, key=fed.node_key(f"node{k}") if secure else None) for k in range(2)]
        run_config = (
            "num-clients=2 clients-per-round=2 num-server-rounds=2 grpo.tasks-per-epoch=1 grpo.num-generations=2 eval.tasks=1 "
            f"eval.samples-per-task=1 eval.test-freq=1 seed=3 output-dir='{out}' run-name='deploy'"
        )
        try:
            result = fed.run_app(run_config, timeout=1500)
        except Exception as err:
            logs = "\n".join(f"--- {p.name}\n{p.tail()}" for p in fed.processes)
            pytest.fail(f"{err}\n{logs}")
        assert (out / "deploy" / "summary.json").exists(), result.stdout[-6000:] + result.stderr[-3000:]
        assert all(n.popen.poll() is None for n in nodes), "a registered SuperNode died during the run"
        pids = [p.popen.pid for p in fed.processes]
    # every process this test started is gone
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)

    summary = json.loads((out / "deploy" / "summary.json").read_text())
    assert summary["clients"] == 2 and summary["failed_replies"] == {}
    assert sorted(summary["sampled_clients"]) == ["1", "2"]
    assert all(sorted(p) == [0, 1] for p in summary["sampled_clients"].values())
    rows = [json.loads(line) for line in (out / "deploy" / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == [0, 1, 2]
    assert all(r["train/replies"] == 2.0 for r in rows[1:])
    assert (out / "deploy" / "checkpoints" / "round-0002").is_dir()


@pytest.mark.deployment
def test_killed_deployment_resumes_to_the_uninterrupted_weights(tmp_path):
    """Kill every process of a real deployment after round 1, start a new federation with resume=true:
    the final global weights are bit-identical to an uninterrupted run's, and so are the sampled clients."""
    from fedagent_flwr.runs.resume import load_state, saved_round

    out = tmp_path / "runs"
    base = ("num-clients=3 clients-per-round=2 num-server-rounds=3 grpo.tasks-per-epoch=1 grpo.num-generations=2 eval.tasks=1 "
            f"eval.samples-per-task=1 eval.test-freq=1 seed=6 output-dir='{out}'")

    def federation(name):
        fed = LocalFederation(tmp_path / name)
        fed.start_superlink()
        for k in range(3):
            fed.start_supernode(k, 3)
        return fed

    with federation("full") as fed:
        fed.run_app(base + " run-name='full'", timeout=1500)
    with federation("killed") as fed:
        fed.flwr("run", str(ROOT), fed.connection, "--run-config", base + " run-name='part'")  # returns once submitted
        deadline = time.time() + 1200
        while (saved_round(out / "part") or 0) < 1 and time.time() < deadline:
            time.sleep(1)
        assert saved_round(out / "part") == 1, "the run did not finish round 1 in time"
    # every process of that federation (SuperLink, ServerApp, SuperNodes, ClientApps) is gone now
    assert saved_round(out / "part") in (1, 2)
    with federation("resumed") as fed:
        result = fed.run_app(base + " run-name='part' resume=true", timeout=1500)
        assert "resuming" in result.stdout, result.stdout[-4000:]

    full, part = (load_state(out / r, json.loads((out / r / "state" / "config.json").read_text())) for r in ("full", "part"))
    assert full.server_round == part.server_round == 3
    for key in full.arrays.keys():
        assert full.arrays[key].numpy().tobytes() == part.arrays[key].numpy().tobytes(), key
    a, b = (json.loads((out / r / "summary.json").read_text()) for r in ("full", "part"))
    assert a["sampled_clients"] == b["sampled_clients"]


class _TreeMemory:
    """Peak resident memory of a set of process trees, sampled every 0.2 s in a thread: the largest sum over all
    of them at one instant, and the largest single process."""

    def __init__(self, roots):
        import threading

        self.roots, self.total, self.single, self._stop = roots, 0, 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        import psutil

        while not self._stop.wait(0.2):
            rss = []
            for pid in self.roots:
                try:
                    root = psutil.Process(pid)
                    for p in [root, *root.children(recursive=True)]:
                        rss.append(p.memory_info().rss)
                except psutil.Error:
                    continue
            self.total, self.single = max(self.total, sum(rss)), max([self.single, *rss])

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def _run_on_two_supernodes(tmp_path, run_config: str) -> tuple[float, str, _TreeMemory]:
    """One run on a loopback SuperLink with two SuperNodes: its wall time, the nodes' logs, the processes' memory."""
    with LocalFederation(tmp_path / "fed") as fed:
        fed.start_superlink()
        nodes = [fed.start_supernode(k, 2) for k in range(2)]
        with _TreeMemory([p.popen.pid for p in fed.processes]) as memory:
            started = time.time()
            try:
                fed.run_app(run_config, timeout=1500)
            except Exception as err:
                pytest.fail(f"{err}\n" + "\n".join(f"--- {p.name}\n{p.tail()}" for p in fed.processes))
            wall = time.time() - started
        return wall, "".join(n.tail(10**7) for n in nodes), memory


@pytest.mark.deployment
def test_a_deployed_clients_ranks_are_the_same_processes_in_every_round(tmp_path):
    """engine.ranks-per-client = 2 on real SuperNodes: flower-supernode starts a ClientApp process per message, and the
    node's rank service (agent/fsdp/rank_service.py) keeps the ranks, so both rounds of a client train on the same two
    rank processes; all of them end with the federation."""
    out = tmp_path / "runs"
    run_config = ("engine.ranks-per-client=2 device='cpu' num-clients=2 clients-per-round=2 num-server-rounds=2 "
                  "grpo.tasks-per-epoch=2 grpo.num-generations=2 eval.tasks=1 eval.samples-per-task=1 eval.test-freq=2 "
                  f"seed=3 output-dir='{out}' run-name='ranks'")
    _, node_logs, _ = _run_on_two_supernodes(tmp_path, run_config)
    trained = re.findall(r"client (\d+), round (\d+): trained on 2 ranks, pids (\d+) (\d+)", node_logs)
    pids = {(client, int(round_)): (int(a), int(b)) for client, round_, a, b in trained}
    assert sorted(pids) == [("0", 1), ("0", 2), ("1", 1), ("1", 2)], node_logs[-5000:]
    assert pids[("0", 1)] == pids[("0", 2)] and pids[("1", 1)] == pids[("1", 2)], pids  # kept, not started again
    assert len({pid for both in pids.values() for pid in both}) == 4  # each node its own two
    deadline = time.time() + 30
    alive = [pid for both in pids.values() for pid in both]
    while alive and time.time() < deadline:
        alive = [pid for pid in alive if running(pid)]
        time.sleep(0.5)
    assert not alive, f"rank processes outlived the federation: {alive}"


@pytest.mark.deployment
def test_a_qwen2_5_0_5b_shaped_model_crosses_real_supernodes(tmp_path):
    """The whole 494M-parameter model (trained in full: every tensor in every message) goes to a client and
    back over a loopback SuperLink for two rounds. K = 2 nodes and M = 1 client a round with one-step episodes
    keep the CPU work small; what is measured is transfer, (de)serialization and the model (re)loads. Flower 1.42
    starts a fresh ClientApp process per message, so the model is loaded once per message: the log says so.
    In bf16 (0.99 GB a message): in fp32 the ServerApp, the SuperLink, a SuperNode and its ClientApp together held
    more than this 24 GiB machine has, and the kernel killed the ServerApp in round 2."""
    from fedagent_flwr.agent.models.shaped_model import ensure_shaped_model

    ensure_shaped_model("shape:qwen2.5-0.5b", "maze")  # built once per machine (~20 s), outside the timed run
    out = tmp_path / "runs"
    run_config = ("model='shape:qwen2.5-0.5b' federation.transfer-dtype='bf16' num-clients=2 clients-per-round=1 num-server-rounds=2 grpo.tasks-per-epoch=1 "
                  "grpo.num-generations=2 rollout.max-steps=1 rollout.max-completion-length=2 rollout.generation-batch-size=2 eval.tasks=1 eval.samples-per-task=1 "
                  f"eval.test-freq=1 seed=1 output-dir='{out}' run-name='big'")
    wall, node_logs, memory = _run_on_two_supernodes(tmp_path, run_config)
    loads = node_logs.count("[fedagent] loaded shape:qwen2.5-0.5b")

    rows = [json.loads(line) for line in (out / "big" / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == [0, 1, 2] and all(r["train/replies"] == 1.0 for r in rows[1:])
    parameters = 494_032_768  # Qwen2.5-0.5B's distinct parameters (tied embedding once)
    assert all(r["train/comm/bytes-sent-per-client"] == 2 * parameters for r in rows[1:])  # every tensor, tied head once
    rounds = [rows[r]["elapsed_seconds"] - rows[r - 1]["elapsed_seconds"] - rows[r]["eval/seconds"] for r in (1, 2)]
    overhead = [w - rows[r]["train/seconds"] for w, r in zip(rounds, (1, 2))]
    print(f"\n[0.5b deployment] run {wall:.0f} s; round wall {', '.join(f'{w:.1f}' for w in rounds)} s; "
          f"of which outside local training (transfer, (de)serialization, process start, model load) "
          f"{', '.join(f'{o:.1f}' for o in overhead)} s; model loads in ClientApps: {loads} "
          f"(a handshake per node + 2 train messages); peak RSS of all processes {memory.total / 2**30:.1f} GiB, "
          f"largest process {memory.single / 2**30:.1f} GiB")
    assert loads == 4  # one per message: Flower 1.42 runs each ClientApp message in a new process


@pytest.mark.deployment
@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs a CUDA GPU")
def test_a_qwen2_5_1_5b_shaped_model_runs_a_round_on_cuda_over_real_supernodes(tmp_path):
    """The GPU user's deployment path: two SuperNodes whose ClientApps load a 1.5B-shaped model on CUDA (bf16-mixed,
    as `precision='auto'` resolves there) and play their episodes, bf16 on the wire, and the ServerApp evaluates
    on the same card. Both clients share one GPU here; on real machines each SuperNode has its own. One round:
    a 1.5B message is 3 GB in bf16, and Flower's four hops per message make a round take minutes whatever the
    card. A random-init model's rewards all tie, so GRPO skips the update here; benchmarks/gpu_round.py
    measures the update on CUDA."""
    import torch

    from fedagent_flwr.agent.models.shaped_model import ensure_shaped_model

    ensure_shaped_model("shape:qwen2.5-1.5b", "maze")  # outside the timed run
    out = tmp_path / "runs"
    run_config = ("model='shape:qwen2.5-1.5b' device='cuda' federation.transfer-dtype='bf16' num-clients=2 clients-per-round=2 "
                  "num-server-rounds=1 grpo.tasks-per-epoch=2 grpo.num-generations=4 rollout.max-steps=3 rollout.max-completion-length=16 rollout.generation-batch-size=8 "
                  "eval.tasks=2 eval.samples-per-task=1 eval.test-freq=1 grpo.learning-rate=1e-6 seed=1 "
                  f"output-dir='{out}' run-name='cuda'")
    wall, logs, _ = _run_on_two_supernodes(tmp_path, run_config)

    rows = [json.loads(line) for line in (out / "cuda" / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == [0, 1] and rows[1]["train/replies"] == 2.0
    assert logs.count("[fedagent] loaded shape:qwen2.5-1.5b on cuda") == 4  # a handshake per node + 2 train messages
    parameters = 1_543_714_304  # Qwen2.5-1.5B's distinct parameters (tied embedding once)
    assert all(r["train/comm/bytes-sent-per-client"] == 2 * parameters for r in rows[1:])
    print(f"\n[1.5b cuda deployment] {torch.cuda.get_device_name(0)}: run {wall:.0f} s; per round: "
          + "; ".join(f"train {r['train/seconds']:.1f} s (rollout {r['train/rollout_seconds']:.1f} s, "
                      f"{r['train/generated_tokens']:.0f} tokens, {r['train/optimizer_steps']:.0f} optimizer steps), "
                      f"eval {r['eval/seconds']:.1f} s" for r in rows[1:]))
