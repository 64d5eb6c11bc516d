"""ClientApp: one client's LLM agent. It answers the server's handshake and trains locally.

Only tensors and numeric metrics leave this process: tasks, prompts and
trajectories stay with the client.
"""

from __future__ import annotations

from flwr.app import ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from strategies.differential_privacy import clip_when_asked, update_norm

from .agent import load_agent
from .config import FEDRL_STRATEGIES, RunConfig
from .faults import with_fault_injection
from .local_training import client_tasks, train_locally
from .secure_aggregation import as_fit_reply, as_plain_train_message, is_secure_fit, secure_aggregation_mod
from .weights import arrays_to_model, model_to_arrays

# Both mods act only on the messages meant for them: SecAgg+ protocol messages, and train
# messages whose config carries a DP clipping norm.
app = ClientApp(mods=[secure_aggregation_mod, clip_when_asked])


def _partition(context: Context) -> tuple[int, int]:
    try:
        return int(context.node_config["partition-id"]), int(context.node_config["num-partitions"])
    except KeyError as missing:
        raise ValueError(
            f"this SuperNode has no {missing} in its node config; start it with "
            '--node-config "partition-id=<k> num-partitions=<K>"'
        ) from None


@app.query()
def handshake(msg: Message, context: Context) -> Message:
    cfg = RunConfig.from_run_config(dict(context.run_config))
    partition_id, num_partitions = _partition(context)
    if cfg.strategy in FEDRL_STRATEGIES:  # QAvg / PAvg: no LLM; the fingerprint is the RL problem's
        from . import fedrl_client

        return Message(RecordDict({"info": fedrl_client.handshake_info(cfg, partition_id, num_partitions)}), reply_to=msg)
    agent = load_agent(cfg.model, cfg.env, cfg.device)
    info = ConfigRecord({"partition-id": partition_id, "num-partitions": num_partitions, "fingerprint": agent.base_fingerprint})
    return Message(RecordDict({"info": info}), reply_to=msg)


@app.train()
def train(msg: Message, context: Context) -> Message:
    if is_secure_fit(msg):  # SecAgg+: Flower's legacy fit message in, a legacy fit reply out
        cfg = RunConfig.from_run_config(dict(context.run_config))
        as_plain_train_message(msg, model_to_arrays(load_agent(cfg.model, cfg.env, cfg.device).model))
        return as_fit_reply(train_plain(msg, context))
    return train_plain(msg, context)


@with_fault_injection  # run-config fault-injection (faults.py); a no-op when it is empty
def train_plain(msg: Message, context: Context) -> Message:
    cfg = RunConfig.from_run_config(dict(context.run_config))
    partition_id, num_partitions = _partition(context)
    config = msg.content.config_records["config"]
    if int(config["partition-id"]) != partition_id:
        raise ValueError(f"message for partition {config['partition-id']} reached partition {partition_id}")
    if cfg.strategy in FEDRL_STRATEGIES:
        from . import fedrl_client

        return fedrl_client.train(msg, context, cfg, partition_id, num_partitions)
    agent = load_agent(cfg.model, cfg.env, cfg.device)
    if config["fingerprint"] != agent.base_fingerprint:
        raise ValueError("this node's base model differs from the server's (fingerprint mismatch)")
    if cfg.strategy == "fedse-lora":  # Fed-SE: self-evolution of a LoRA adapter (self_evolution.py)
        from .self_evolution import train_fedse_client

        adapter, metrics = train_fedse_client(agent, cfg, msg.content.array_records["arrays"], partition_id,
                                              num_partitions, int(config["server-round"]), str(config["fedse-run-key"]))
        return Message(RecordDict({"arrays": adapter, "metrics": MetricRecord(metrics)}), reply_to=msg)
    sent = msg.content.array_records["arrays"]
    arrays_to_model(agent.model, sent)
    tasks = client_tasks(cfg, partition_id, num_partitions)
    metrics = train_locally(agent, cfg, tasks, int(config["server-round"]), partition_id)
    trained = model_to_arrays(agent.model)
    metrics["update_norm"] = update_norm(trained, sent)  # what a DP clipping norm is compared with
    content = RecordDict({"arrays": trained, "metrics": MetricRecord(metrics)})
    return Message(content, reply_to=msg)
