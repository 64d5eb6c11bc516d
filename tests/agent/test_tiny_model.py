import json

import torch

from fedagent_flwr.agent.models.loading import load_agent
from fedagent_flwr.agent.models.pretrained import ModelSpec, fingerprint, load_model, load_tokenizer, resolve_model
from fedagent_flwr.agent.models.tiny_model import TinyRecipe, ensure_tiny_model, tiny_model_dir

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
    import fedagent_flwr.agent.models.pretrained as models

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


def test_training_progress_says_step_elapsed_and_time_left_at_every_tenth(monkeypatch, caplog):
    import logging
    from types import SimpleNamespace

    from fedagent_flwr.agent.models import tiny_model

    now = [0.0]
    monkeypatch.setattr(tiny_model, "time", SimpleNamespace(perf_counter=lambda: now[0]))  # one second per step
    progress = tiny_model.TrainingProgress("tiny:maze", every_seconds=1e9)
    state = SimpleNamespace(global_step=0, max_steps=100)
    with caplog.at_level(logging.INFO, logger=tiny_model.log.name):
        progress.on_train_begin(None, state, None)
        for step in range(1, 101):
            now[0], state.global_step = float(step), step
            progress.on_step_end(None, state, None)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 10  # a line per tenth: readable in a Flower log, not one per step
    assert lines[0] == "tiny:maze training: step 10/100 (10%), 10.0 s elapsed, 1:30 left"
    assert lines[-1] == "tiny:maze training: step 100/100 (100%), 1:40 elapsed, 0.0 s left"

    caplog.clear()  # a slow build (WebShop: a tenth is ~6 min) also says something every every_seconds
    progress = tiny_model.TrainingProgress("tiny:webshop", every_seconds=60)
    now[0], state = 0.0, SimpleNamespace(global_step=0, max_steps=2000)
    with caplog.at_level(logging.INFO, logger=tiny_model.log.name):
        progress.on_train_begin(None, state, None)
        for step in range(1, 201):
            now[0], state.global_step = 2.0 * step, step
            progress.on_step_end(None, state, None)
    assert caplog.records[0].getMessage() == "tiny:webshop training: step 30/2000 (1%), 1:00 elapsed, 1:05:40 left"
    assert [r.getMessage().split(",")[0] for r in caplog.records] == [
        "tiny:webshop training: step 30/2000 (1%)", "tiny:webshop training: step 60/2000 (3%)",
        "tiny:webshop training: step 90/2000 (4%)", "tiny:webshop training: step 120/2000 (6%)",
        "tiny:webshop training: step 150/2000 (7%)", "tiny:webshop training: step 180/2000 (9%)",
        "tiny:webshop training: step 200/2000 (10%)"]


def test_build_command_shows_each_phase_and_training_progress_then_reports_the_cached_model(tmp_path, monkeypatch,
                                                                                             capsys, caplog):
    """`python -m fedagent_flwr.experiments.build_tiny --env maze` on a tiny recipe: the four phases and the training
    steps with time left are logged and reach stderr (what a Flower run's log shows); a second call reports the
    cached folder without building; --force builds it again and leaves no half folder."""
    import logging

    from fedagent_flwr.agent.models.tiny_model import log
    from fedagent_flwr.experiments import build_tiny

    monkeypatch.setenv("FEDAGENT_CACHE", str(tmp_path))
    recipe = TinyRecipe(**FAST)
    monkeypatch.setattr(build_tiny, "default_recipe", lambda env: recipe)
    folder = tiny_model_dir(recipe)
    assert folder.parent == tmp_path

    with caplog.at_level(logging.INFO, logger=log.name):
        assert build_tiny.main(["--env", "maze"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("maze: built in ") and out.rstrip().endswith(str(folder)) and "CPU" in out
    lines = [r.getMessage() for r in caplog.records if r.name == log.name]
    for i, phase in enumerate(("expert text", "tokenizer", "demonstrations", "training"), 1):
        assert any(m.startswith(f"tiny:maze {i}/4 {phase}: ") for m in lines), (phase, lines)
    steps = [m for m in lines if m.startswith("tiny:maze training: step ")]
    assert [m.split(",")[0] for m in steps] == [f"tiny:maze training: step {i}/3 ({100 * i // 3}%)" for i in (1, 2, 3)]
    assert all(m.endswith(" left") and " elapsed, " in m for m in steps)
    assert "[fedagent] tiny:maze 4/4 training: behaviour cloning, 3 steps" in err
    assert "[fedagent] tiny:maze training: step 3/3 (100%)" in err
    meta = json.loads((folder / "recipe.json").read_text())
    assert list(meta["phase_seconds"]) == ["expert text", "tokenizer", "demonstrations", "training"]

    caplog.clear()
    mtime = (folder / "model.safetensors").stat().st_mtime_ns
    with caplog.at_level(logging.INFO, logger=log.name):
        assert build_tiny.main(["--env", "maze"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith(f"maze: already built: {folder} (its build took ") and not caplog.records and err == ""
    assert (folder / "model.safetensors").stat().st_mtime_ns == mtime

    assert build_tiny.main(["--env", "maze", "--force"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("maze: built in ") and "rebuilding the tiny model for maze" in err
    assert (folder / "model.safetensors").stat().st_mtime_ns != mtime
    assert sorted(p.name for p in tmp_path.iterdir()) == [folder.name, f"{folder.name}.lock"]  # nothing half-built


def test_build_command_rejects_an_unknown_environment(capsys):
    import pytest

    from fedagent_flwr.experiments import build_tiny

    with pytest.raises(SystemExit):
        build_tiny.main(["--env", "chess"])
    assert "no environment 'chess'" in capsys.readouterr().err


def test_build_lines_reach_the_log_flower_uploads(monkeypatch):
    """Flower's ServerApp (flwr-serverapp, flwr-simulation) mirrors whatever is written to stderr into the run's
    log (`flwr run --stream`, `flwr log`): the build's lines must be written there, not only to logging records."""
    import io
    import sys
    from queue import Queue

    from flwr.supercore import logger as flwr_logger

    from fedagent_flwr.agent.models.tiny_model import BuildPhases

    monkeypatch.setattr(sys, "stdout", io.StringIO())
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    monkeypatch.setattr(flwr_logger.console_handler, "stream", flwr_logger.console_handler.stream)
    uploaded: Queue = Queue()
    flwr_logger.mirror_output_to_queue(uploaded)
    BuildPhases("tiny:maze", ("expert text", "training")).start("training", "behaviour cloning")
    lines = []
    while not uploaded.empty():
        lines.append(uploaded.get())
    assert "[fedagent] tiny:maze 2/2 training: behaviour cloning\n" in lines


def test_build_command_set_changes_the_recipe_and_names_its_own_folder(tmp_path, monkeypatch, capsys):
    """`--set bc-steps=2` builds the default recipe with that field changed, into a folder of its own (a run names
    it as its model); a key that is no recipe field, or a value of the wrong type, is a one-line error."""
    import dataclasses

    import pytest

    from fedagent_flwr.experiments import build_tiny

    monkeypatch.setenv("FEDAGENT_CACHE", str(tmp_path))
    base = TinyRecipe(**FAST)
    monkeypatch.setattr(build_tiny, "default_recipe", lambda env: base)
    assert build_tiny.main(["--env", "maze", "--set", "bc-steps=2", "--set", "bc-expert-epsilon=0.5"]) == 0
    changed = dataclasses.replace(base, bc_steps=2, bc_expert_epsilon=0.5)
    folder = tiny_model_dir(changed)
    assert folder != tiny_model_dir(base) and (folder / "model.safetensors").is_file()
    assert capsys.readouterr().out.rstrip().endswith(str(folder))
    assert json.loads((folder / "recipe.json").read_text())["recipe"]["bc_steps"] == 2

    for bad, message in ((["--set", "bc-step=2"], "--set bc-step: not a tiny-model recipe key; allowed: "),
                         (["--set", "bc-steps=many"], "--set bc-steps='many': expected int"),
                         (["--set", "bc-steps"], "--set 'bc-steps': expected KEY=VALUE")):
        with pytest.raises(SystemExit):
            build_tiny.main(["--env", "maze", *bad])
        assert message in capsys.readouterr().err


def test_a_prompt_revision_gives_the_models_of_that_environment_a_new_folder(monkeypatch):
    """A model behaviour-cloned on an environment's old prompt text must not be reused once the text changes;
    models of the other environments keep their folders (and the tables measured with them stay valid)."""
    from envs import env_class
    from fedagent_flwr.agent.models.tiny_model import default_recipe

    before = {spec: default_recipe(spec).digest() for spec in ("maze", "babyai", "babyai,maze", "babyai,wordle")}
    monkeypatch.setattr(env_class("maze"), "prompt_revision", env_class("maze").prompt_revision + 1)
    after = {spec: default_recipe(spec).digest() for spec in before}
    assert after["maze"] != before["maze"] and after["babyai,maze"] != before["babyai,maze"]
    assert after["babyai"] == before["babyai"] and after["babyai,wordle"] == before["babyai,wordle"]
    # Environments still at revision 0 add nothing to the recipe, so their folders predate the field.
    assert default_recipe("gridworld").prompt_revisions is None
    assert default_recipe("textcraft").prompt_revisions == "textcraft:1"
