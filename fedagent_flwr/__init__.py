"""fedagent-flwr: federated reinforcement learning for LLM agents, as a Flower app."""

__version__ = "0.1.0"
