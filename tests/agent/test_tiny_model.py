import json

import torch

from fedagent_flwr.agent.loading import load_agent
from fedagent_flwr.agent.models import ModelSpec, fingerprint, load_model, load_tokenizer, resolve_model
from fedagent_flwr.agent.tiny_model import TinyRecipe, ensure_tiny_model, tiny_model_dir

FAST = dict(env="maze", hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2, num_kv_heads=1, bc_steps=3, bc_batch_size=4)


def test_tiny_model_is_built_once_into_a_loadable_hf_folder(tmp_path):
    recipe = TinyRecipe(**FAST)
    path = ensure_tiny_model("maze", tmp_path, recipe)
    assert path == tiny_model_dir(recipe, tmp_path)
    meta = json.loads((path / "recipe.json").read_text())
    assert meta["recipe"]["bc_steps"] == 3 and meta["bc_samples"] > 0
    assert (path / "model.safetensors").exists() and (path / "tokenizer.json").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no half-built folder left
    mtime = (path / "model.safetensors").stat().st_mtime
    assert ensure_tiny_model("maze", tmp_path, recipe) == path  # cached: not rebuilt
    assert (path / "model.safetensors").stat().st_mtime == mtime

    spec = ModelSpec(str(path), built_here=True)
    tok = load_tokenizer(spec)
    text = "<think>next: move up</think><action>move up</action>"
    assert tok.decode(tok(text)["input_ids"]) == text  # the saved tokenizer reloads with the same ids
    assert tok.padding_side == "left" and tok.eos_token == "<|im_end|>"
    model = load_model(spec, torch.device("cpu"))
    assert fingerprint(model) == fingerprint(load_model(spec, torch.device("cpu")))

    # A checkpoint of it, loaded by path (model='<folder>'), must tokenize identically.
    checkpoint = tmp_path / "checkpoint"
    model.save_pretrained(checkpoint)
    tok.save_pretrained(checkpoint)
    reloaded = load_tokenizer(resolve_model(str(checkpoint), "maze"))
    prompt = "The goal is at position 8, 6. Your current position is at position 1, 1 1."
    assert reloaded(prompt)["input_ids"] == tok(prompt)["input_ids"]


def test_fingerprint_changes_with_any_weight():
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.for_model("qwen2", vocab_size=50, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                               num_attention_heads=2, num_key_value_heads=1)
    model = AutoModelForCausalLM.from_config(cfg)
    before = fingerprint(model)
    with torch.no_grad():
        next(model.parameters()).view(-1)[0] += 1e-6
    assert fingerprint(model) != before


def test_model_names_resolve_to_tiny_or_hub_sources(monkeypatch, tmp_path):
    import fedagent_flwr.agent.models as models

    monkeypatch.setattr(models, "ensure_tiny_model", lambda env: tmp_path / f"tiny-{env}")
    assert resolve_model("tiny", "maze") == ModelSpec(str(tmp_path / "tiny-maze"), built_here=True)
    assert resolve_model("tiny:wordle", "maze") == ModelSpec(str(tmp_path / "tiny-wordle"), built_here=True)
    assert resolve_model("Qwen/Qwen2.5-1.5B-Instruct", "maze") == ModelSpec("Qwen/Qwen2.5-1.5B-Instruct", built_here=False)
    try:
        resolve_model("tiny:chess", "maze")
    except ValueError as err:
        assert "chess" in str(err) and "maze" in str(err)
    else:
        raise AssertionError("unknown tiny env accepted")
    assert load_agent.cache_info().maxsize == 2  # one loaded model per process is reused across rounds
