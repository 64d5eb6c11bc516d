"""A FedAgent client's local round on its N ranks (run-config engine.ranks-per-client): one process a rank, each with its own
device (a card of the client's, or a share of the CPU), the model sharded over them by FSDP2.

Every rank runs methods/local_round.py's round on the same tasks and seed: it plays a stride of the epoch's groups
with the whole weights gathered, receives every rank's episodes, computes the advantages over the whole epoch, and
takes its stride of each minibatch's passes (agent/fsdp/ranks.py). The gradients FSDP2 averages over the ranks are
one rank's over the whole minibatch, so the weights move as one process's would; rank 0's full weights (and the AdamW
state a baseline carries) are the reply. Nothing of the client leaves the machine: the ranks talk over its own
process group (NCCL between cards, gloo on a CPU).

The ranks live as long as the client process (agent/fsdp/launch.py's RankPool): each keeps its model loaded and
sharded, with the LoRA adapter attached or the KL anchor built, and a round only loads the weights the server sent into
it. Nothing the ranks keep is the client's: every weight is overwritten by the next round's, AdamW's state travels in
each round's request, and the update drops its gradients when it ends.
"""

from __future__ import annotations

import atexit
import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord

from envs import Task
from fedagent_flwr.agent.fsdp.launch import MMAP_THRESHOLD, RankPool, RankTarget, backend_for, kept_pool, rank_device
from fedagent_flwr.agent.fsdp.rank_service import NodeRanks, deployed
from fedagent_flwr.agent.fsdp.tensor_files import Streamed
from fedagent_flwr.agent.models.sharded_load import empty_sharded_copy, fetch_snapshot, load_sharded
from fedagent_flwr.agent.models.loading import Agent, frozen
from fedagent_flwr.agent.models.pretrained import load_tokenizer, pick_device, resolve_model
from fedagent_flwr.agent.training.lora import attached_lora
from fedagent_flwr.agent.training.weights import arrays_to_model
from fedagent_flwr.config import RunConfig
from fedagent_flwr.methods.local_round import train_in_place, trained_weights
from fedagent_flwr.methods.placement import process_placement, run_base_dtype
from strategies.transfer import array_view, numpy_array

SENT, TRAINED, OPTIMIZER = "sent/", "trained/", "optimizer/"


def train_on_ranks(cfg: RunConfig, sent: ArrayRecord, tasks: Sequence[Task], server_round: int, partition_id: int,
                   optimizer: dict[str, np.ndarray] | None = None, pool: RankPool | None = None) -> tuple[ArrayRecord, dict[str, float]]:
    """`local_round` on cfg.engine.ranks_per_client ranks (`pool`, default this process's `client_ranks`); the same return
    value. `optimizer`, where given, is continued from and updated in place as one process's round would."""
    trained, info = round_on_ranks(cfg, sent, tasks, server_round, partition_id, optimizer, pool)
    return trained, info["metrics"]


def round_on_ranks(cfg: RunConfig, sent: ArrayRecord, tasks: Sequence[Task], server_round: int, partition_id: int,
                   optimizer: dict[str, np.ndarray] | None = None, pool: RankPool | NodeRanks | None = None,
                   target: RankTarget | None = None) -> tuple[ArrayRecord, dict[str, Any]]:
    """train_on_ranks's round, with rank 0's whole info; `target` in place of each rank's round (a benchmark's
    recording wrapper around it)."""
    fetch_snapshot(cfg.model)  # a hub model's files cached on the node before its ranks read their rows of them
    tensors = {SENT + k: array_view(sent[k]) for k in sent.keys()}
    tensors.update({OPTIMIZER + k: np.asarray(v) for k, v in (optimizer or {}).items()})
    out, info = (pool or client_ranks(cfg)).run(target or _round_on_rank, tensors, cfg, list(tasks), server_round,
                                                partition_id, optimizer is not None)
    print(f"[fedagent] client {partition_id}, round {server_round}: trained on {len(info['rank_pids'])} ranks, pids "
          f"{' '.join(map(str, info['rank_pids']))}", flush=True)  # the same pids each round: ranks kept
    if optimizer is not None:
        optimizer.clear()
        optimizer.update({k[len(OPTIMIZER):]: v for k, v in out.items() if k.startswith(OPTIMIZER)})
    # in the order they were sent (a safetensors file keeps its keys sorted): a reply is the weights sent, in order
    return ArrayRecord({k: numpy_array(out[TRAINED + k]) for k in sent.keys()}), info


def idle_ranks_note(cfg: RunConfig) -> str | None:
    """What a run should hear when some of a client's ranks have no pass of the update to run: rank r runs passes
    r, r + N, ... of each minibatch, so with fewer passes a minibatch than ranks the others run spare one-row passes
    (a minibatch cut by grpo.ppo-max-token-len-per-gpu has a count only its lengths decide: not said)."""
    passes = -(-cfg.grpo.mini_batch_size // cfg.grpo.ppo_micro_batch_size_per_gpu)
    if cfg.engine.ranks_per_client < 2 or cfg.grpo.ppo_max_token_len_per_gpu or passes >= cfg.engine.ranks_per_client:
        return None
    return (f"engine.ranks-per-client={cfg.engine.ranks_per_client} with grpo.ppo-micro-batch-size-per-gpu={cfg.grpo.ppo_micro_batch_size_per_gpu} of grpo.mini-batch-size="
            f"{cfg.grpo.mini_batch_size}: {passes} pass(es) a minibatch, so {cfg.engine.ranks_per_client - passes} rank(s) run only "
            f"one-row spare passes in the update; grpo.ppo-micro-batch-size-per-gpu={cfg.grpo.mini_batch_size // cfg.engine.ranks_per_client} or less "
            "shares it")


_POOL: list[RankPool] = []  # this client process's ranks, kept between its rounds


def client_ranks(cfg: RunConfig) -> RankPool | NodeRanks:
    """This client's ranks for `cfg`: in a deployment, its node's (agent/fsdp/rank_service.py: flower-supernode runs
    each message in a new process, which they outlive); else this process's, kept from an earlier round where they
    still run with the same count, backend, deadlines and allocator setting. A round on them may take
    federation.round-timeout, as long as the server waits for it; a collective, torch's own limit or
    engine.rank-timeout-s where that is set."""
    shape = (cfg.engine.ranks_per_client, backend_for(pick_device(cfg.device)), cfg.federation.round_timeout,
             mmap_threshold(cfg), cfg.engine.rank_timeout_s or None)
    return NodeRanks(shape) if deployed() else kept_pool(_POOL, shape)


def mmap_threshold(cfg: RunConfig) -> int:
    """The ranks' mmap threshold for run-config engine.ranks-return-memory (0: the C library's own)."""
    return MMAP_THRESHOLD if cfg.engine.ranks_return_memory else 0


@atexit.register
def end_client_ranks() -> None:
    while _POOL:
        _POOL.pop().close()


@dataclass
class _Held:
    """What a rank keeps between rounds for one run config: the agent, the model it trains (sharded; a LoRA adapter
    attached), and the full fine-tuning's KL anchor (sharded), all built as local_round builds them."""

    key: str
    agent: Agent
    model: torch.nn.Module
    base: torch.nn.Module | None
    anchor: str | None
    attached: contextlib.ExitStack | None = None  # the LoRA adapter's block, left open


_HELD: list[_Held] = []  # in a rank's process: its model, kept for the next round
_STARTING_THREADS = torch.get_num_threads()  # a rank's, as its process started (the client's cores)


def _held(cfg: RunConfig, world: int, tasks: Sequence[Task]) -> _Held:
    key = repr(cfg)  # one run's config; another (a test's, a new run's) builds its own
    if _HELD and _HELD[0].key == key:
        return _HELD[0]
    _HELD.clear()
    if torch.device(cfg.device).type == "cpu":  # the ranks share the client's cores
        torch.set_num_threads(max(1, _STARTING_THREADS // world))
    spec, device = resolve_model(cfg.model, cfg.env), pick_device(cfg.device)

    def agent_of(model: torch.nn.Module) -> Agent:  # the client process answers the fingerprint: none here
        return Agent(model=model, tokenizer=load_tokenizer(spec), spec=spec, device=device, base_fingerprint="")

    if cfg.grpo.finetuning == "lora":  # attached for the rank's life: each round loads the sent adapter into it
        attached = contextlib.ExitStack()  # held, or its collection would close the block and unload the adapter
        model = load_sharded(spec, device, run_base_dtype(cfg),
                             wrap=lambda base: attached.enter_context(attached_lora(base, cfg.lora, seed=cfg.seed)))
        _HELD.append(_Held(key, agent_of(model.get_base_model()), model, None, None, attached))
        return _HELD[0]
    agent = agent_of(load_sharded(spec, device, run_base_dtype(cfg)))
    placement = process_placement(cfg, agent, tasks)  # the anchor chosen as local_round chooses it
    anchor = placement.kl_reference if cfg.grpo.beta > 0 else None
    base = None
    if anchor == "base":
        base = frozen(load_sharded(spec, device))
    elif anchor == "round-start":  # each round loads the sent weights into it
        base = frozen(empty_sharded_copy(spec.source, device, run_base_dtype(cfg)))
    _HELD.append(_Held(key, agent, agent.model, base, anchor))
    return _HELD[0]


def _round_on_rank(rank: int, world: int, tensors: dict[str, np.ndarray], cfg: RunConfig, tasks: list[Task],
                   server_round: int, partition_id: int, carries_optimizer: bool) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    cfg = replace(cfg, device=str(rank_device(pick_device(cfg.device), rank)))
    held = _held(cfg, world, tasks)
    sent = {k[len(SENT):]: v for k, v in tensors.items() if k.startswith(SENT)}  # mapped from the client's file
    optimizer = {k[len(OPTIMIZER):]: v for k, v in tensors.items() if k.startswith(OPTIMIZER)} if carries_optimizer else None
    if held.anchor == "round-start":  # the KL anchor is this round's start
        arrays_to_model(held.base, sent)
    metrics = train_in_place(cfg, held.agent, held.model, sent, tasks, server_round, partition_id, optimizer, held.base)
    # gathered a tensor at a time by every rank, written by rank 0 as each comes: no whole copy of the reply on a rank
    out = trained_weights(cfg, held.model).prefixed(TRAINED)
    out += Streamed.of({OPTIMIZER + k: np.asarray(v) for k, v in (optimizer or {}).items()} if rank == 0 else {})
    return out, {"metrics": metrics}
