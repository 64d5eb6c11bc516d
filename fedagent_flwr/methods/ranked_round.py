"""A FedAgent client's local round on its N ranks (run-config ranks-per-client): one process a rank, each with its own
device (a card of the client's, or a share of the CPU), the model sharded over them by FSDP2.

Every rank runs methods/local_round.py's round on the same tasks and seed: it plays a stride of the epoch's groups
with the whole weights gathered, receives every rank's episodes, computes the advantages over the whole epoch, and
takes its stride of each minibatch's passes (agent/fsdp/ranks.py). The gradients FSDP2 averages over the ranks are
one rank's over the whole minibatch, so the weights move as one process's would; rank 0's full weights (and the AdamW
state a baseline carries) are the reply. Nothing of the client leaves the machine: the ranks talk over its own
process group (NCCL between cards, gloo on a CPU).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord

from envs import Task
from fedagent_flwr.agent.fsdp.launch import backend_for, rank_device, run_ranks
from fedagent_flwr.agent.fsdp.ranks import shard
from fedagent_flwr.agent.models.loading import load_agent
from fedagent_flwr.agent.models.pretrained import pick_device
from fedagent_flwr.config import RunConfig
from fedagent_flwr.methods.local_round import local_round
from strategies.transfer import array_view, numpy_array

SENT, TRAINED, OPTIMIZER = "sent/", "trained/", "optimizer/"


def train_on_ranks(cfg: RunConfig, sent: ArrayRecord, tasks: Sequence[Task], server_round: int, partition_id: int,
                   optimizer: dict[str, np.ndarray] | None = None) -> tuple[ArrayRecord, dict[str, float]]:
    """`local_round` on cfg.ranks_per_client ranks; the same return value. `optimizer`, where given, is continued
    from and updated in place as one process's round would."""
    tensors = {SENT + k: array_view(sent[k]) for k in sent.keys()}
    tensors.update({OPTIMIZER + k: np.asarray(v) for k, v in (optimizer or {}).items()})
    out, info = run_ranks(cfg.ranks_per_client, backend_for(pick_device(cfg.device)), _round_on_rank, tensors,
                          cfg, list(tasks), server_round, partition_id, optimizer is not None, timeout_s=cfg.rank_timeout_s)
    if optimizer is not None:
        optimizer.clear()
        optimizer.update({k[len(OPTIMIZER):]: v for k, v in out.items() if k.startswith(OPTIMIZER)})
    # in the order they were sent (a safetensors file keeps its keys sorted): a reply is the weights sent, in order
    trained = ArrayRecord({k: numpy_array(out[TRAINED + k]) for k in sent.keys()})
    return trained, info["metrics"]


def _round_on_rank(rank: int, world: int, tensors: dict[str, np.ndarray], cfg: RunConfig, tasks: list[Task],
                   server_round: int, partition_id: int, carries_optimizer: bool) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    device = rank_device(pick_device(cfg.device), rank)
    cfg = replace(cfg, device=str(device))
    if device.type == "cpu":  # the ranks share the client's cores
        torch.set_num_threads(max(1, torch.get_num_threads() // world))
    agent = load_agent(cfg.model, cfg.env, cfg.device, cfg.base_dtype())
    sent = ArrayRecord({k[len(SENT):]: numpy_array(v) for k, v in tensors.items() if k.startswith(SENT)})
    optimizer = {k[len(OPTIMIZER):]: v for k, v in tensors.items() if k.startswith(OPTIMIZER)} if carries_optimizer else None
    trained, metrics = local_round(cfg, agent, sent, tasks, server_round, partition_id, optimizer, shard=shard)
    out = {TRAINED + k: array_view(trained[k]) for k in trained.keys()}
    out.update({OPTIMIZER + k: np.asarray(v) for k, v in (optimizer or {}).items()})
    return out, {"metrics": metrics}
