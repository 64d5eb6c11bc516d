"""ClientApp: one client. It answers the server's handshake and runs its method's local round.

Only tensors and numeric metrics leave this process: tasks, prompts and trajectories stay with
the client. The run config is parsed once per run (not per message), and the method is looked
up in the registry.
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

from fedagent_flwr.agent.models.loading import Agent, load_agent
from fedagent_flwr.agent.training.weights import model_to_arrays
from fedagent_flwr.config import RunConfig
from fedagent_flwr.config.fault_plan import FaultPlan
from fedagent_flwr.faults import train_with_faults
from fedagent_flwr.methods import Method, method_for
from fedagent_flwr.methods.placement import run_base_dtype
from fedagent_flwr.privacy.differential_privacy import clip_when_asked
from fedagent_flwr.privacy.reply_filter import reply_filter
from fedagent_flwr.privacy.secure_aggregation import (
    as_fit_reply,
    as_plain_train_message,
    is_secure_fit,
    secure_aggregation_mod,
)
from fedagent_flwr.runs.preflight import preflight

# The reply filter sees every reply last and every exception first (privacy/reply_filter.py). The other two
# act only on the messages meant for them: SecAgg+ protocol messages, and train messages whose config
# carries a DP clipping norm.
app = ClientApp(mods=[reply_filter, secure_aggregation_mod, clip_when_asked])


@lru_cache(maxsize=4)
def _method(items: tuple) -> Method:
    cfg = RunConfig.from_run_config(dict(items))
    preflight(cfg, "client")  # what this client's machine must hold (its seed data, its packages), before any work
    return method_for(cfg)


def method_of(context: Context) -> Method:
    """The run's method, from a run config parsed once per run (the same dict gives the same object)."""
    return _method(tuple(sorted(dict(context.run_config).items())))


def _partition(context: Context) -> tuple[int, int]:
    try:
        return int(context.node_config["partition-id"]), int(context.node_config["num-partitions"])
    except KeyError as missing:
        raise ValueError(
            f"this SuperNode has no {missing} in its node config; start it with "
            '--node-config "partition-id=<k> num-partitions=<K>"'
        ) from None


def _agent_loader(cfg: RunConfig):
    if cfg.engine.ranks_per_client > 1:
        return lambda: fingerprint_agent(cfg.model, cfg.env, run_base_dtype(cfg))
    return lambda: load_agent(cfg.model, cfg.env, cfg.device, run_base_dtype(cfg))  # cached per process (agent/models/loading.py)


@lru_cache(maxsize=1)
def fingerprint_agent(model: str, env: str, base_dtype) -> Agent:
    """The agent of a client on N ranks, whose process only answers the base model's fingerprint (the ranks hold the
    model): loaded once on the CPU (rank 0's card holds no second copy), fingerprinted, and its model dropped, so the
    client process keeps no whole model while its ranks train."""
    agent = load_agent(model, env, "cpu", base_dtype)
    load_agent.cache_clear()
    return replace(agent, model=None)


@app.query()
def handshake(msg: Message, context: Context) -> Message:
    method = method_of(context)
    partition_id, num_partitions = _partition(context)
    fingerprint = method.client_fingerprint(partition_id, num_partitions, _agent_loader(method.cfg))
    info = ConfigRecord({"partition-id": partition_id, "num-partitions": num_partitions, "fingerprint": fingerprint})
    return Message(RecordDict({"info": info}), reply_to=msg)


@app.train()
def train(msg: Message, context: Context) -> Message:
    if is_secure_fit(msg):  # SecAgg+: Flower's legacy fit message in, a legacy fit reply out
        cfg = method_of(context).cfg
        as_plain_train_message(msg, model_to_arrays(load_agent(cfg.model, cfg.env, cfg.device, run_base_dtype(cfg)).model))
        return as_fit_reply(train_plain(msg, context))
    return train_plain(msg, context)


def train_plain(msg: Message, context: Context) -> Message:
    cfg = method_of(context).cfg
    # run-config resilience.fault-injection (faults.py) makes chosen clients fail on purpose; a no-op when empty
    return train_with_faults(_train_round, msg, context, FaultPlan.parse(cfg.resilience.fault_injection), cfg.seed, cfg.federation.round_timeout)


def _train_round(msg: Message, context: Context) -> Message:
    method = method_of(context)
    partition_id, num_partitions = _partition(context)
    config = msg.content.config_records["config"]
    if int(config["partition-id"]) != partition_id:
        raise ValueError(f"message for partition {config['partition-id']} reached partition {partition_id}")
    load = _agent_loader(method.cfg)
    if config["fingerprint"] != method.client_fingerprint(partition_id, num_partitions, load):
        raise ValueError("this node's base model differs from the server's (fingerprint mismatch)")
    return method.train(msg, context, partition_id, num_partitions, load)

