"""Models of a published shape with random weights (`model = "shape:qwen2.5-0.5b"`), built offline.

What they are for: running the pipeline at the size of the papers' models where no hub is reachable -
memory, speed and weight transfer of a Qwen2.5-0.5B/1.5B/3B/7B-shaped model over real SuperNodes or on a
GPU. They are not agents: their weights are random, so they write no valid action and learn nothing
visible in a round. The architecture is Qwen2 at the published sizes (agent/engine/memory.py SHAPES, vocabulary
included, since the embedding is a large share of a small model). The tokenizer is a small byte-level BPE
trained on the environment's prompts and expert answers (the tiny models' recipe); ids the model samples
beyond it decode to nothing.

Every machine that builds the same shape for the same environment gets bit-identical weights (a fixed
seed on the CPU), so SuperNodes that build their own copy agree with the server's fingerprint.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig

from envs import make_env
from fedagent_flwr.agent.engine.memory import SHAPES
from fedagent_flwr.agent.models.model_cache import MARKER, build_once, default_cache_root
from fedagent_flwr.agent.play.prompts import build_prompt, expert_completion
from fedagent_flwr.agent.models.tiny_model import train_tokenizer

PREFIX = "shape:"
SEED = 0
RECIPE_VERSION = 1


def environment_tokenizer(env_name: str, vocab_size: int = 2000, tasks: int = 64):
    """A byte-level BPE over an environment's first prompts and expert answers (seconds to train)."""
    env, texts = make_env(env_name), []
    for task in env.tasks_of_split("train")[:tasks]:
        observation, _ = env.reset(task)
        texts += [build_prompt(env, observation, [], 0), expert_completion(env.expert_action())]
    return train_tokenizer(texts, vocab_size)


def shaped_config(shape: str, tokenizer, **overrides) -> PretrainedConfig:
    """A Qwen2 config of a published shape (or of `overrides` alone), with the tokenizer's special ids."""
    fields = SHAPES[shape] if shape in SHAPES else {}
    return AutoConfig.for_model("qwen2", **(fields | overrides), pad_token_id=tokenizer.pad_token_id,
                                eos_token_id=tokenizer.eos_token_id, bos_token_id=None, max_position_embeddings=32768)


def random_model(config: PretrainedConfig, device: torch.device | str = "cpu", seed: int = SEED):
    """fp32 random-init weights, created on `device` (a 7B model never passes through host memory)."""
    torch.manual_seed(seed)
    with torch.device(device):
        return AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()


def ensure_shaped_model(name: str, env: str, cache_root: Path | None = None) -> Path:
    """The cached folder of `shape:<name>` for an environment, built first if needed."""
    shape = name.removeprefix(PREFIX)
    if shape not in SHAPES:
        raise ValueError(f"model {name!r}: no such shape; known: {', '.join(PREFIX + s for s in SHAPES)}")
    target = (cache_root or default_cache_root()) / f"shape-{shape}-{env.replace(',', '+')}-v{RECIPE_VERSION}"

    def build(folder: Path) -> None:
        tokenizer = environment_tokenizer(env)
        model = random_model(shaped_config(shape, tokenizer))
        model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        (folder / MARKER).write_text(json.dumps({"shape": shape, "env": env, "seed": SEED, "version": RECIPE_VERSION,
                                                 "parameters": sum(p.numel() for p in model.parameters())}, indent=2))

    return build_once(target, build, what=f"a random-init {shape}-shaped model for {env}")
