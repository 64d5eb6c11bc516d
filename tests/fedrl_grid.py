"""QAvg / PAvg without Flower's runtime: the problem and strategy the app builds, and a grid that runs clients in process."""

from __future__ import annotations

from flwr.app import Context, Message, RecordDict

from fedagent_flwr.config import RunConfig
from fedagent_flwr.methods import method_for


def build_problem(cfg: RunConfig, num_clients: int):
    """The problem the run's method builds on the server and on every client."""
    return method_for(cfg).problem(num_clients)


def strategy_for(cfg: RunConfig, problem, node_of_partition: dict[int, int]):
    """The strategy the one server loop would start for this run config."""
    method = method_for(cfg)
    assert method.fingerprint(len(node_of_partition)) == problem.fingerprint()
    return method.make_strategy(node_of_partition)


class LocalGrid:
    """Delivers a round's messages to in-process ClientApp handlers (each node with its own persistent state),
    replying in reverse order so the strategy cannot rely on arrival order."""

    def __init__(self, cfg: RunConfig, num_clients: int, node_base: int = 100):
        self.cfg, self.K = cfg, num_clients
        self.contexts = {
            node_base + k: Context(run_id=1, node_id=node_base + k, node_config={"partition-id": k, "num-partitions": num_clients},
                                   state=RecordDict(), run_config=cfg.to_run_config())
            for k in range(num_clients)
        }
        self.sent: list[Message] = []
        self.replies: list[Message] = []

    def send_and_receive(self, messages, timeout=None):
        messages = list(messages)
        self.sent += messages
        out = []
        for m in reversed(messages):
            ctx = self.contexts[m.metadata.dst_node_id]
            out.append(method_for(self.cfg).train(m, ctx, int(ctx.node_config["partition-id"]), self.K, load_agent=None))
        self.replies += out
        return out
