"""How a model computes: precision, decoding (the transformers loop and the static engine), attention and training
kernels, the bf16 working copy, activation checkpointing, token-level plumbing, and the memory plan. Imports nothing
else of the agent."""
