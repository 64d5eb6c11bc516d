"""FSDP2's room on the devices a rank computes on (agent/fsdp/): the process group serves every device its
collectives run on, a CPU rank shards onto the CPU wherever the machine has a GPU, and each rank's share of a pass
plan keeps the ranks in step."""

import pytest
import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import BackendConfig

import rank_workers
from fedagent_flwr.agent.fsdp.launch import backend_for
from fedagent_flwr.agent.fsdp.ranks import Ranks, shard

pytestmark = pytest.mark.ranks  # rank processes on gloo: .ci/run runs them apart from the default suite


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_the_group_serves_every_device_its_collectives_run_on(device):
    # CPU tensors on every rank (Ranks.total's sums, all_gather_object's pickles), the rank's own device for FSDP2's
    # gathers: plain "nccl" serves CUDA tensors only, and the first CPU all-reduce would fail on a GPU node
    served = BackendConfig(backend_for(torch.device(device))).get_device_backend_map()
    assert {"cpu", device} <= set(served), served
    assert served[device] == ("nccl" if device == "cuda" else "gloo")


def test_cpu_ranks_shard_onto_the_cpu_on_a_machine_that_reports_a_gpu(tmp_path, monkeypatch):
    # fully_shard's default mesh is on torch's accelerator: what a machine with a GPU reports
    monkeypatch.setattr(torch._C, "_get_accelerator", lambda: torch.device("cuda"))
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        model, tokenizer = rank_workers.tiny_model(lora=False)
        shard(model)
        assert {p.device_mesh.device_type for p in model.parameters()} == {"cpu"}
        logits = model(torch.tensor([[3, 4, 5]])).logits
        assert logits.device.type == "cpu" and torch.isfinite(logits).all()
    finally:
        dist.destroy_process_group()


def test_each_rank_takes_every_worlds_micro_batch_and_runs_as_many_passes_as_the_others():
    plan = [[0, 1], [2, 3], [4], [5, 6], [7]]
    one = Ranks().passes(plan)
    assert [p.rows for p in one] == plan and {p.scale for p in one} == {1.0} and not any(p.spare for p in one)
    first, second = Ranks(0, 2).passes(plan), Ranks(1, 2).passes(plan)
    assert [p.part for p in first] == [0, 2, 4] and [p.part for p in second] == [1, 3, -1]
    assert len(first) == len(second)  # each forward gathers weights with the other ranks
    assert {p.scale for p in first} == {2.0}  # FSDP2 averages the ranks' gradients: world x each share
    assert second[-1].spare and second[-1].scale == 0.0
    # fewer micro-batches than ranks: the ranks without one run a spare pass
    assert [p.spare for p in Ranks(2, 3).passes([[0, 1], [2]])] == [True]
