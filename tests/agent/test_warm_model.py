"""`model = "warm:<base>"`: a real model's warm start, built once into the model cache and reused."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from fedagent_flwr.agent.models import warm_start
from fedagent_flwr.agent.engine.placement import place
from fedagent_flwr.agent.models.model_cache import CHECKSUMS


@pytest.fixture()
def small_recipe(monkeypatch):
    monkeypatch.setattr(warm_start, "WARM_RECIPE", warm_start.WARM_RECIPE | {"steps": 2, "batch_size": 4, "demo_episodes": 2,
                                                                              "eval_tasks": 1, "history_length": 0})


def test_a_warm_model_is_built_once_with_progress_and_reused(tiny_lm, maze_tokenizer, tmp_path, small_recipe, capsys):
    base = tmp_path / "base"
    tiny_lm.save_pretrained(base)
    maze_tokenizer.save_pretrained(base)
    cache = tmp_path / "cache"
    folder = warm_start.ensure_warm_model("my-base", str(base), "maze", place(device="cpu"), cache_root=cache)
    said = capsys.readouterr().err
    assert "building the warm start of my-base on maze" in said and "[warm-start] before:" in said and "warm start training: step" in said
    report = json.loads((folder / "warm_start.json").read_text())
    assert report["config"]["steps"] == 2 and report["base"]["name"] == "my-base" and len(report["losses"]) == 2
    assert (folder / CHECKSUMS).is_file()
    model = AutoModelForCausalLM.from_pretrained(folder)  # a plain model: the adapter was merged
    moved = any(not torch.equal(a, b) for a, b in zip(model.state_dict().values(), tiny_lm.state_dict().values()))
    assert moved
    again = warm_start.ensure_warm_model("my-base", str(base), "maze", place(device="cpu"), cache_root=cache)
    assert again == folder and "building" not in capsys.readouterr().err  # reused, not rebuilt
    other = warm_start.ensure_warm_model("my-base", str(base), "gridworld", place(device="cpu"), cache_root=cache)
    assert other != folder  # the environment is part of the key
    assert sorted(p.name for p in cache.iterdir()) == sorted([folder.name, f"{folder.name}.lock", other.name, f"{other.name}.lock"])


def test_the_recipe_key_changes_with_the_base_weights_and_not_with_their_file_times(tmp_path):
    import json

    folders = {name: tmp_path / name for name in ("a", "a-later", "b")}
    for name, folder in folders.items():
        folder.mkdir()
        entry = {"size": 3, "mtime_ns": 2 if name == "a-later" else 1, "sha256": "22" if name == "b" else "11"}
        (folder / CHECKSUMS).write_text(json.dumps({"model.safetensors": entry}))
    identity = {name: warm_start.base_identity(str(folder)) for name, folder in folders.items()}
    assert identity["a"] == identity["a-later"] != identity["b"]  # a conversion made again elsewhere keys alike
    assert warm_start.base_identity("org/name") == "org/name"


def test_a_warm_model_needs_the_prompts_it_was_cloned_on():
    from fedagent_flwr.config import RunConfig
    from fedagent_flwr.runs.preflight import preflight

    with pytest.raises(ValueError, match="rollout.history-length=0 is not allowed: expected 2 with model='warm:smollm2-135m-instruct'"):
        preflight(RunConfig.from_run_config(RunConfig().to_run_config() | {"model": "warm:smollm2-135m-instruct"}))
    with pytest.raises(ValueError, match="model='warm:tiny' is not allowed"):
        preflight(RunConfig.from_run_config(RunConfig().to_run_config() | {"model": "warm:tiny", "rollout.history-length": 2}))
