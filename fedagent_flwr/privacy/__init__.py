"""Privacy of client updates: differential privacy (Flower's wrappers and the client's clipping mod) and SecAgg+."""
