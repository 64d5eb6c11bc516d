"""A model built on each of a client's ranks holding that rank's shard only (FSDP2's meta-device start).

Loading the whole model on every rank and sharding it after puts N whole models in the machine at once: a 7B model
in fp32 on 4 ranks is 112 GB of host memory, and each card holds the whole model before it is cut. Instead a rank
builds the model's modules with their weights on the meta device (no memory: accelerate's init_empty_weights; the
buffers stay real, since RoPE's inverse frequencies are computed at construction, not stored), shards it, gives its own
part of each weight memory on its device, and copies that part from the model folder's safetensors files, which are
mapped: a rank reads only its rows of each tensor. The numbers equal those `from_pretrained` loads
(tests/agent/test_sharded_load.py compares them byte for byte, tied embeddings, bf16 and a LoRA-wrapped model too).

A Hugging Face hub id is read from its snapshot in the node's Hugging Face cache (model_folder), which the client
process fills before its ranks start where it lacks the files (fetch_snapshot): a rank never downloads, and never
loads the whole model to find its rows. A model that is not a folder of safetensors files, or one that needs a PEFT
adapter merged into it at load, is loaded whole and then sharded, as `load_sharded` says when it does so.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

import torch

from fedagent_flwr.agent.fsdp.ranks import local_part, shard
from fedagent_flwr.agent.models.pretrained import ModelSpec, is_hub_id, load_model, transformers_bars_off

# what a rank's load reads of a hub model: its config, tokenizer and chat template, and its safetensors weights (not
# the .bin, .pt, .onnx or .gguf copies some repositories carry beside them)
SNAPSHOT_PATTERNS = ["*.json", "*.safetensors", "*.txt", "*.model", "*.jinja", "*.tiktoken"]
_FETCHED: set[str] = set()  # the hub ids this process has made sure of


def model_folder(source: str) -> Path | None:
    """The local folder a model loads from: `source` where it is a folder; a hub id's snapshot in the local Hugging Face
    cache (read offline: no request); else None."""
    if Path(source).is_dir():
        return Path(source)
    if not is_hub_id(source):
        return None
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return Path(snapshot_download(source, local_files_only=True))
    except LocalEntryNotFoundError:
        return None


def fetch_snapshot(model: str) -> None:
    """A hub id's files (SNAPSHOT_PATTERNS) in this node's Hugging Face cache, downloaded where they are missing, once a
    process: the client's, before its ranks load, so that each rank reads its rows from the cached files. Two clients of
    a node share the download (huggingface_hub locks each file while one process fetches it); a cached snapshot costs
    one request, or none offline (HF_HUB_OFFLINE), and a hub that does not answer leaves the cache as it is. Anything
    that is not a hub id is left alone."""
    if model in _FETCHED or not is_hub_id(model):
        return
    from huggingface_hub import snapshot_download

    snapshot_download(model, allow_patterns=SNAPSHOT_PATTERNS)
    _FETCHED.add(model)


def weight_files(spec: ModelSpec) -> list[Path]:
    """The safetensors files a rank fills its shard from; empty when the model cannot be loaded so (no local folder or
    cached snapshot with its config and every weight file, or an adapter to merge first)."""
    folder = model_folder(spec.source)
    if spec.adapter or folder is None or not (folder / "config.json").is_file():
        return []
    index = folder / "model.safetensors.index.json"
    if index.is_file():  # a model saved in several files names each weight's file
        files = [folder / name for name in sorted(set(json.loads(index.read_text())["weight_map"].values()))]
        return files if all(f.is_file() for f in files) else []  # a snapshot cached in part (its config alone)
    return sorted(folder.glob("*.safetensors"))


def empty_model(source: str, dtype: torch.dtype) -> torch.nn.Module:
    """The model of the folder `source`, its weights on the meta device in `dtype` (buffers real), as from_pretrained
    sets it up otherwise: its generation config read, in eval mode."""
    from accelerate import init_empty_weights
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    config = AutoConfig.from_pretrained(source)
    with transformers_bars_off(), init_empty_weights(include_buffers=False):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.tie_weights()  # init_empty_weights registers each weight anew, untying the head from the embeddings
    if (Path(source) / "generation_config.json").is_file():
        model.generation_config = GenerationConfig.from_pretrained(source)
    return model.eval()


def materialize(model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """A sharded model's meta weights given memory on `device` (each rank its own part; the values undefined until
    filled), its buffers kept as they were computed (to_empty would leave them undefined too)."""
    buffers = {name: b.detach().clone() for name, b in model.named_buffers()}
    model.to_empty(device=device)
    with torch.no_grad():
        for name, b in model.named_buffers():
            b.copy_(buffers[name])
    return model


def fill_from_files(model: torch.nn.Module, files: list[Path]) -> None:
    """Every weight and stored buffer of the base model in `model` (a PEFT model's base too: PEFT moves a wrapped
    layer's weight to `<layer>.base_layer`), each rank its own part, read from `files`. Raises naming a weight the files
    lack; adapter weights are left as they are (each round loads the sent adapter)."""
    from safetensors import safe_open

    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    targets = {name.replace(".base_layer.", "."): t for name, t in inner.state_dict(keep_vars=True).items()
               if ".lora_" not in name}
    filled: set[int] = set()
    with torch.no_grad():
        for path in files:
            with safe_open(str(path), framework="pt") as f:  # torch's reader maps the file: only the rows read are read
                for key in f.keys():
                    if key in targets:
                        target = targets[key]
                        local = target.to_local() if hasattr(target, "to_local") else target
                        local.copy_(local_part(f.get_tensor(key), target))
                        filled.add(id(target))
    missing = [name for name, t in targets.items() if id(t) not in filled]  # a tied weight counts as filled once
    if missing:
        raise ValueError(f"the model's files {[p.name for p in files]} lack {len(missing)} weights, e.g. {missing[0]!r}")


def load_sharded(spec: ModelSpec, device: torch.device, dtype: torch.dtype = torch.float32,
                 wrap: Callable[[torch.nn.Module], torch.nn.Module] | None = None) -> torch.nn.Module:
    """The model of `spec` on this rank, sharded over the process group, with this rank's part of its weights only.
    `wrap` is applied before sharding (a LoRA adapter attached: sharded with its layer), its result returned."""
    files = weight_files(spec)
    if not files:
        print(f"[fedagent] {spec.source}: no model folder of safetensors files to read a shard from (or an adapter "
              "to merge): each rank loads it whole, then shards it", file=sys.stderr, flush=True)
        model = load_model(spec, device, dtype)
        return shard(wrap(model) if wrap else model)
    model = empty_model(str(files[0].parent), dtype)
    model = wrap(model) if wrap else model
    materialize(shard(model, device), device)
    fill_from_files(model, files)
    return model


def empty_sharded_copy(source: str, device: torch.device, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """A sharded model of the folder or cached hub id `source`, its weights allocated but not read (a round-start KL
    anchor: every round loads the sent weights into it), so no whole copy of the model is ever made."""
    return materialize(shard(empty_model(str(model_folder(source) or source), dtype), device), device)
