"""Loading the agent's language model, and fingerprinting its weights.

`model` in the run config is either a Hugging Face model name or local path
(AutoModelForCausalLM + its tokenizer and chat template; fp32, or bf16 for a
frozen LoRA base; remote code is never trusted) or `tiny` / `tiny:<env>` for a tiny model
built offline for that environment (see tiny_model.py), or `shape:<name>` for a
random-init model of a published shape (see shaped_model.py), or a `.gguf` file or
`smollm2-135m-instruct` (see gguf_models.py), or `warm:<one of those>` for a real model warm-started on the
run's environment (see warm_start.py).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast
from transformers.utils import logging as transformers_logging

from envs import available_envs, env_names, is_multi_spec
from envs.multi import normalize_spec
from fedagent_flwr.agent.engine.placement import Machine, place, resolve_device
from fedagent_flwr.agent.engine.memory import SHAPES
from fedagent_flwr.agent.models.gguf_models import INSTALL, ensure_plain_folder, gguf_file, is_gguf_model
from fedagent_flwr.agent.models.shaped_model import PREFIX as SHAPE_PREFIX
from fedagent_flwr.agent.models.shaped_model import ensure_shaped_model
from fedagent_flwr.agent.models.tiny_model import default_recipe, ensure_tiny_model
from fedagent_flwr.agent.models.warm_start import WARM_PREFIX, ensure_warm_model, warm_base


@dataclass(frozen=True)
class ModelSpec:
    source: str  # HF name or local path; for models built here the cached folder
    built_here: bool  # a tiny or shaped model from the cache: its tokenizer loads as saved
    adapter: str | None = None  # a PEFT adapter folder merged into the base at load (a LoRA run's checkpoint)


def adapter_base(name: str) -> str | None:
    """The base model a PEFT adapter folder names (base_model_name_or_path), or None if `name` is no such folder."""
    config = Path(name) / "adapter_config.json"
    if not config.is_file():
        return None
    base = json.loads(config.read_text()).get("base_model_name_or_path")
    if not base:
        raise ValueError(f"model {name!r}: a PEFT adapter folder whose adapter_config.json names no base model")
    return base


def resolve_model(name: str, env: str) -> ModelSpec:
    """Turn run-config `model` into something `from_pretrained` can load (builds tiny models)."""
    base = adapter_base(name)
    if base is not None:
        # A LoRA run's checkpoint names its base as the run config did ("warm:...", "tiny", "shape:...", a .gguf
        # name), which from_pretrained cannot resolve: resolve the base here, then merge the adapter at load.
        spec = resolve_model(base, env)
        return ModelSpec(spec.source, spec.built_here, adapter=name)
    if name == "tiny" or name.startswith("tiny:"):
        try:
            tiny_env = tiny_model_env(name.partition(":")[2] or env)
        except ValueError as err:
            raise ValueError(f"model {name!r}: {err}") from None
        return ModelSpec(str(ensure_tiny_model(tiny_env)), built_here=True)
    if name.startswith(SHAPE_PREFIX):  # a published shape with random weights (shaped_model.py)
        return ModelSpec(str(ensure_shaped_model(name, normalize_spec(env) if is_multi_spec(env) else env)), built_here=True)
    if is_gguf_model(name):  # a .gguf file or a packaged model's short name: converted once to a plain folder
        return ModelSpec(str(ensure_plain_folder(name)), built_here=False)
    if name.startswith(WARM_PREFIX):  # a real instruct model behaviour-cloned on the env's expert, built once (warm_start.py)
        base = warm_base(name)
        placement = place()  # a warm start trains and plays where, and as, a run's device=auto would
        return ModelSpec(str(ensure_warm_model(base, resolve_model(base, env).source, env, placement)), built_here=False)
    return ModelSpec(name, built_here=False)


def model_dims(name: str, env: str) -> tuple[int, int]:
    """(hidden, intermediate) of a run-config `model`, without building it: a tiny model's from its recipe, a shape's
    from SHAPES, warm:<base> and a PEFT adapter folder's from their base; else from its config (a .gguf file converted
    once, as its load would; a hub id read from the hub or its cache)."""
    base = adapter_base(name)
    if base is not None:
        return model_dims(base, env)
    if name.startswith(WARM_PREFIX):  # the warm start trains an adapter and merges it: the base's shape
        return model_dims(warm_base(name), env)
    if name == "tiny" or name.startswith("tiny:"):
        try:
            recipe = default_recipe(tiny_model_env(name.partition(":")[2] or env))
        except ValueError as err:
            raise ValueError(f"model {name!r}: {err}") from None
        return recipe.hidden_size, recipe.intermediate_size
    if name.startswith(SHAPE_PREFIX) and name[len(SHAPE_PREFIX):] in SHAPES:
        fields = SHAPES[name[len(SHAPE_PREFIX):]]
        return fields["hidden_size"], fields["intermediate_size"]
    config = AutoConfig.from_pretrained(resolve_model(name, env).source)
    config = getattr(config, "text_config", None) or config
    return config.hidden_size, getattr(config, "intermediate_size", None) or 4 * config.hidden_size


def looks_like_local_path(model: str) -> bool:
    """A `model` value that can only be a path: a hub id is `name` or `org/name`, never /x, ./x, ~/x or a/b/c."""
    return model.startswith(("/", ".", "~")) or model.count("/") > 1 or os.sep != "/" and os.sep in model


# what the hub accepts as a repo id (huggingface_hub's validate_repo_id: word characters, '-', '.', one '/'); our own
# names (tiny, tiny:<env>, shape:<name>, smollm2-135m-instruct) match it but for their ':'
HUB_ID = re.compile(r"[\w.:-]+(/[\w.-]+)?")


def model_name_problem(model: str) -> str | None:
    """What a `model` value must be, where this one cannot load (the run config's check, before any work); else None."""
    if model.strip() == "":
        return "a HF model name or path, or tiny / tiny:<env>"
    # warm:<base> is a real model warm-started once on the run's env: its base is checked like any model
    base = model[len(WARM_PREFIX):] if model.startswith(WARM_PREFIX) else model
    if base is not model and (base == "" or base.startswith(("tiny", SHAPE_PREFIX, WARM_PREFIX))):
        return "warm:<a real instruct model> (a hub name, a folder, a .gguf file or smollm2-135m-instruct)"
    if model.startswith("tiny:"):
        try:
            env_names(model[5:])
        except ValueError:
            return "tiny:<env> or tiny:<env>,<env>,... with env one of " + ", ".join(available_envs())
    if is_gguf_model(base):
        try:
            gguf_file(base)
        except ValueError:
            return f"a GGUF file that exists, or smollm2-135m-instruct installed ({INSTALL})"
    if model.startswith(SHAPE_PREFIX) and model[len(SHAPE_PREFIX):] not in SHAPES:
        return "shape:<name> with name one of " + ", ".join(SHAPES)
    if looks_like_local_path(base) and not is_gguf_model(base) and not Path(base).expanduser().is_dir():
        return ("a model folder that exists (a local path: it starts with /, ., ~ or has more than one /), "
                "or a Hugging Face hub id such as Qwen/Qwen2.5-1.5B-Instruct")
    if not looks_like_local_path(base) and not HUB_ID.fullmatch(base):  # e.g. a stray quote from a shell or TOML
        return "a Hugging Face hub id (letters, digits, '-', '_', '.', one optional 'owner/'), a folder, or tiny"
    return None


def is_hub_id(model: str) -> bool:
    """Whether `model` names a model on the Hugging Face hub: not one of our own names, a .gguf file or a folder."""
    return not (model == "tiny" or model.startswith(("tiny:", SHAPE_PREFIX, WARM_PREFIX)) or is_gguf_model(model)
                or looks_like_local_path(model) or Path(model).is_dir()) and bool(HUB_ID.fullmatch(model))


def hub_model_problem(model: str) -> str | None:
    """Where `model` (or a warm: model's base) names a Hugging Face hub id: what it must be when this machine can load
    it from neither the local Hugging Face cache nor a hub that answers; else None. One request of at most 5 s, made
    only for an id not in the cache, so a typo is refused at start-up instead of inside the simulation."""
    base = model[len(WARM_PREFIX):] if model.startswith(WARM_PREFIX) else model
    if not is_hub_id(base):  # model_name_problem judges the others
        return None
    from huggingface_hub import HfApi, constants, try_to_load_from_cache
    from huggingface_hub.errors import RepositoryNotFoundError

    if isinstance(try_to_load_from_cache(base, "config.json"), str):
        return None
    if constants.HF_HUB_OFFLINE:
        return f"a model in the local Hugging Face cache ({base!r} is not there, and HF_HUB_OFFLINE is set)"
    try:
        HfApi().model_info(base, timeout=5)
    except RepositoryNotFoundError:
        return f"a model on the Hugging Face hub (the hub has no {base!r}, or it is private), a folder, or tiny"
    except Exception as err:  # no network, a timeout, a server error: the run could not download it either
        return (f"a model in the local Hugging Face cache, or on a hub this machine reaches ({base!r} is not cached "
                f"and the hub did not answer: {type(err).__name__})")
    return None


def tiny_model_env(env: str) -> str:
    """The env name, or the normalized multi-env spec (one model over all its envs), a tiny model is built for;
    ValueError for an unknown environment."""
    if is_multi_spec(env):
        return normalize_spec(env)
    if env not in available_envs():
        raise ValueError(f"no environment {env!r}; available: {', '.join(available_envs())}")
    return env


def pick_device(device: str) -> torch.device:
    """The torch device a device key (auto, cpu, cuda, cuda:N) names here (auto: placement.py decides), asked of the
    hardware itself: where tensors can really go."""
    machine = Machine(cuda=torch.cuda.is_available())
    if device.startswith("cuda") and not machine.cuda:
        raise ValueError(f"device={device!r} but no CUDA GPU is visible here; use device='cpu' or 'auto'")
    return torch.device(resolve_device(device, machine))


# Classes that mean "the tokenizer.json as saved" (transformers 5 writes the second).
GENERIC_TOKENIZER_CLASSES = ("PreTrainedTokenizerFast", "TokenizersBackend")


def _saved_as_generic_tokenizer(source: str) -> bool:
    config = Path(source) / "tokenizer_config.json"
    if not config.is_file():
        return False
    return json.loads(config.read_text()).get("tokenizer_class") in GENERIC_TOKENIZER_CLASSES


def load_tokenizer(spec: ModelSpec):
    # A checkpoint of a tiny model (or any folder saved with a generic tokenizer) must not
    # go through AutoTokenizer either: it would pick the model type's class, as below.
    if spec.built_here or _saved_as_generic_tokenizer(spec.source):
        # A qwen2 folder would reload our tokenizer as Qwen2Tokenizer, whose
        # pre-tokenizer gives different ids: load the fast tokenizer file as saved.
        tok = PreTrainedTokenizerFast.from_pretrained(spec.source, padding_side="left")
    else:
        tok = AutoTokenizer.from_pretrained(spec.source, padding_side="left", trust_remote_code=False)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def tokenizer_of(name: str, env: str):
    """The tokenizer a run-config `model` plays with, without loading its weights: a warm start's and a PEFT adapter's
    are their base's (a warm start trains no tokens); a tiny model is built (seconds, cached once). None for a shape:
    model, whose tokenizer is saved with its random weights (minutes for a large shape)."""
    base = adapter_base(name)
    if base is not None:
        return tokenizer_of(base, env)
    if name.startswith(WARM_PREFIX):
        return tokenizer_of(warm_base(name), env)
    if name.startswith(SHAPE_PREFIX):
        return None
    return load_tokenizer(resolve_model(name, env))


@contextlib.contextmanager
def transformers_bars_off() -> Iterator[None]:
    """transformers draws a progress bar for every load ("Loading weights") and save ("Writing model shards"):
    in a Flower log stream each is a half-drawn carriage-return line per client and checkpoint, for an operation
    of a second. The project says what it loaded and saved in its own lines; the switch is restored after."""
    was_on = transformers_logging.is_progress_bar_enabled()
    transformers_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_on:
            transformers_logging.enable_progress_bar()


LOAD_DTYPES = (torch.float32, torch.bfloat16)


def load_model(spec: ModelSpec, device: torch.device, dtype: torch.dtype = torch.float32):
    # fp32 weights by default, on every device: training runs bf16 through autocast when asked
    # (agent/engine/precision.py), since bf16 weights cannot take AdamW's steps at lr 1e-6. bf16 is for a frozen LoRA
    # base (precision='bf16-base'): loaded in bf16 directly, so an fp32 copy never exists.
    if dtype not in LOAD_DTYPES:
        raise ValueError(f"models load in {' or '.join(map(str, LOAD_DTYPES))}, not {dtype}")
    with transformers_bars_off():
        model = AutoModelForCausalLM.from_pretrained(spec.source, dtype=dtype, trust_remote_code=False)
    if spec.adapter:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, spec.adapter).merge_and_unload()
    return model.to(device)


def fingerprint(model: torch.nn.Module) -> str:
    """SHA-256 of every parameter and buffer (names, shapes, dtypes, bytes), in name order."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        t = tensor.detach().to("cpu").contiguous()
        digest.update(f"{name}|{tuple(t.shape)}|{t.dtype}|".encode())
        digest.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return digest.hexdigest()

