"""A real 2-round `flwr run` of strategy fedse-lora on the tiny model (run_simulation.py -> flwr run -> Ray)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_two_round_fedse_simulation_on_the_tiny_model(tmp_path):
    out, buffers = tmp_path / "runs", tmp_path / "buffers"
    cmd = [
        sys.executable, str(ROOT / "run_simulation.py"), "--strategy", "fedse-lora",
        "--num-clients", "2", "--num-server-rounds", "2", "--partition.tasks-per-client", "4",
        "--fedse.explore-samples", "2", "--fedse.seed-demos", "2", "--fedse.max-steps", "3", "--fedse.sft-batch-size", "8",
        "--lora.r", "4", "--eval.samples-per-task", "1", "--eval.test-freq", "1",
        "--fedse.buffer-dir", str(buffers), "--output-dir", str(out), "--run-name", "fedse-ci", "--seed", "3",
        "--clients-per-round", "1",  # not Fed-SE's key: fedse.fraction-train (default all) picks its clients
    ]
    env = os.environ | {"FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1", "FLWR_TELEMETRY_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1200)
    run_dir = out / "fedse-ci"
    assert (run_dir / "summary.json").exists(), proc.stdout[-4000:] + proc.stderr[-4000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["failed_replies"] == {}
    assert {r: sorted(p) for r, p in summary["sampled_clients"].items()} == {"1": [0, 1], "2": [0, 1]}  # all clients
    assert summary["clients_per_round"] == 2  # what the strategy sampled, not the unused clients-per-round

    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == [0, 1, 2]
    r1, r2 = rows[1], rows[2]
    assert r1["train/replies"] == 2.0 and r1["train/episodes"] == 8.0  # 4 tasks x 2 samples per client
    # Every client's buffer grows across rounds (mean over the 2 clients).
    assert r2["train/fedse/buffer-trajectories"] >= r1["train/fedse/buffer-trajectories"] >= 2.0
    # Measured bytes: the adapter's parameter count x 4 (float32), to and from each client.
    first = run_dir / "checkpoints" / "round-0000"
    last = run_dir / "checkpoints" / "round-0002"
    config = json.loads((first / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == "tiny"  # the run's model, not a cache path of this machine
    from fedagent_flwr.agent.models.tiny_model import ensure_tiny_model

    base = AutoModelForCausalLM.from_pretrained(ensure_tiny_model("maze"))
    model = PeftModel.from_pretrained(base, last)
    n = sum(p.numel() for name, p in model.named_parameters() if "lora_" in name)
    assert r1["train/comm/bytes-sent-per-client"] == n * 4 == r1["train/comm/bytes-received-per-client"]
    assert r2["train/comm/bytes-sent-total"] == 2 * 2 * n * 4
    # The saved global adapter changed from round 0 and is finite.
    b_last = {k: v for k, v in model.state_dict().items() if "lora_B" in k}
    assert b_last and any(float(v.abs().max()) > 0 for v in b_last.values())
    assert all(torch.isfinite(v).all() for v in b_last.values())
    # The buffers are on the clients' disk, one per partition, and hold the expert seed set.
    files = sorted(buffers.glob("run-*/partition-*/buffer.json"))
    assert [f.parent.name for f in files] == ["partition-0", "partition-1"]
    assert all(len(json.loads(f.read_text())["entries"]) >= 2 for f in files)


@pytest.mark.slow
def test_protocol_writes_table_and_rank_sweep(tmp_path):
    """The CPU protocol end to end at its smallest: every Table 1 method, one ablation, a 2-point rank sweep."""
    from fedagent_flwr.experiments.fedse_protocol import main

    out = tmp_path / "protocol"
    small = ["num-server-rounds=1", "num-clients=2", "partition.tasks-per-client=1", "eval.tasks=2", "eval.samples-per-task=1",
             "fedse.max-steps=1", "fedse.explore-samples=1", "fedse.seed-demos=1",
             "rollout.max-steps=12"]  # the farthest Maze start is 12 moves away: every expert seed demo succeeds
    args = ["--out", str(out), "--methods", "fed-se,fedavg-static,local,centralized,no-filter", "--ranks", "2"]
    assert main(args + [a for s in small for a in ("--set", s)]) == 0
    table = json.loads((out / "table.json").read_text())
    assert set(table["methods"]) == {"fed-se", "fedavg-static", "local", "centralized", "no-filter"}
    assert all(0.0 <= m["final"] <= 1.0 and set(m["by_round"]) == {"0", "1"} for m in table["methods"].values())
    assert set(table["checks"]) == {"fed-se > fedavg-static", "no-filter is the worst ablation"}
    # MB per client per round = 2 x adapter float32 bytes; rank 2 has a quarter of rank 8's parameters.
    sweep = (out / "rank_sweep.md").read_text().splitlines()[2:]
    size = {int(line.split("|")[1]): int(line.split("|")[2]) for line in sweep}
    assert set(size) == {2, 8} and size[8] == 4 * size[2] and size[2] % 4 == 0
    rows = [json.loads(line) for line in (out / "fed-se" / "metrics.jsonl").read_text().splitlines()]
    assert rows[1]["train/fedse/buffer-trajectories"] >= 1 and "eval/success_rate" in rows[1]
