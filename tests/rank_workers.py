"""What each rank of the multi-rank tests runs (a module of its own: spawned processes import it by name)."""

from __future__ import annotations

import os

import numpy as np
import torch
import torch.distributed as dist


def tiny_model(lora: bool):
    """A 2-layer Qwen2-shaped model over the maze tokenizer's vocabulary, the same weights in every process."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from conftest import build_maze_tokenizer

    tokenizer = build_maze_tokenizer()
    torch.manual_seed(0)
    config = AutoConfig.for_model("qwen2", vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64,
                                  num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                                  max_position_embeddings=512, tie_word_embeddings=False,
                                  pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, bos_token_id=None)
    model = AutoModelForCausalLM.from_config(config).eval()
    if lora:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                                 init_lora_weights="gaussian"))
    return model, tokenizer


def samples(vocab: int, count: int = 13):
    from fedagent_flwr.agent.training.grpo import StepSample

    rng = np.random.default_rng(5)
    return [StepSample(rng.integers(3, vocab, size=int(rng.integers(3, 20))).tolist(),
                       rng.integers(3, vocab, size=int(rng.integers(1, 9))).tolist(), float(rng.normal()),
                       float(rng.uniform(0.2, 1.0))) for _ in range(count)]


def update(lora: bool, settings: dict, out: str, rank: int = 0, world: int = 1, port: int = 0) -> None:
    """One GRPOTrainer.update of the same samples: on one rank, or on `world` ranks under FSDP2 (gloo). Rank 0 writes
    the full trained weights (and the update's statistics) to `out`."""
    if world > 1:
        os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
        dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)
    from dataclasses import replace

    from fedagent_flwr.agent.play.rollout import RolloutConfig
    from fedagent_flwr.agent.training.grpo import GRPOTrainer
    from fedagent_flwr.config import RunConfig
    from fedagent_flwr.methods.library_configs import grpo_config

    model, tokenizer = tiny_model(lora)
    if world > 1:
        from torch.distributed.fsdp import fully_shard

        inner = model.get_base_model() if lora else model
        for layer in inner.model.layers:
            fully_shard(layer)
        fully_shard(model)
    cfg = replace(grpo_config(RunConfig(device="cpu", learning_rate=1e-2, **settings)), tasks_per_epoch=1)
    stats = GRPOTrainer(model, tokenizer, cfg, RolloutConfig(history_length=0)).update(
        samples(len(tokenizer)), np.random.default_rng(0))
    full = {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().clone() for k, v in model.state_dict().items()}
    if rank == 0:
        torch.save({"weights": full, "stats": stats}, out)
    if world > 1:
        dist.destroy_process_group()
