"""The agent's core, with no Flower server or client in it, in five rooms by concern (each imports only the rooms
listed before it):

- fsdp/      one client's passes on N ranks: the process group's shares and collectives, FSDP2's sharding
             (ranks.py), starting and ending a client's rank processes (launch.py)
- engine/    how a model computes: precision, the decode engines (transformers loop, static KV cache), attention and
             training kernels, the bf16 working copy, checkpointing, token-level plumbing, the memory plan
- play/      how the agent plays: prompts and answer parsing, batched multi-turn rollouts, evaluation, transcripts
- training/  how it learns: GRPO, SFT (TRL), LoRA adapters, the weights' wire form, Fed-SE's experience buffer
- models/    which model it is: names to weights (hub, folder, GGUF), the tiny, shaped and warm-started builders,
             their cache, the agent a process loads, a model each rank builds with its own shard only

self_evolution.py is Fed-SE's client round, which uses the last four.
"""
