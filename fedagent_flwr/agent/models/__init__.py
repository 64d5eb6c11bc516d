"""Which model the agent is: a name turned into weights (hub id, folder, GGUF file), the builders of tiny,
published-shape and warm-started models and their cache, and the agent a process loads. Imports engine, play and
training (the builders play and behaviour-clone)."""
