"""A grid that runs the real ClientApp in this process: the ServerApp's logic without Flower's runtime."""

from __future__ import annotations

from functools import lru_cache

from flwr.app import Context, Message, RecordDict

from fedagent_flwr import client_app
from fedagent_flwr.agent.models.loading import load_agent


class LoopbackGrid:
    """Delivers each message to the ClientApp of its node, in this process, and keeps every exchange."""

    def __init__(self, run_config: dict, num_nodes: int) -> None:
        self.contexts = {
            1000 + k: Context(run_id=1, node_id=1000 + k, node_config={"partition-id": k, "num-partitions": num_nodes},
                              state=RecordDict(), run_config=run_config)
            for k in range(num_nodes)
        }
        self.exchanges: list[tuple[Message, Message]] = []
        # The clients' process has its own model cache, apart from the server's (as in simulation,
        # where ClientApps live in Ray workers): one cache shared by all clients, like one worker.
        self.client_load_agent = lru_cache(maxsize=2)(load_agent.__wrapped__)

    def get_node_ids(self):
        return list(self.contexts)

    def send_and_receive(self, messages, timeout=None):
        replies = []
        for msg in messages:
            node = msg.metadata.dst_node_id
            server_load_agent, client_app.load_agent = client_app.load_agent, self.client_load_agent
            try:
                reply = client_app.app(msg, self.contexts[node])
            finally:
                client_app.load_agent = server_load_agent
            assert reply.metadata.src_node_id == node  # a reply is addressed from the node it was sent to
            self.exchanges.append((msg, reply))
            replies.append(reply)
        return replies
