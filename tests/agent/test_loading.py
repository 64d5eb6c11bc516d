"""The base fingerprint of a local model folder is remembered on disk (a deployed ClientApp is a new process per
message), and never outlives a change of the weights."""

import torch

from fedagent_flwr.agent.models import loading
from fedagent_flwr.agent.models.pretrained import fingerprint


def test_fingerprint_is_remembered_per_folder_and_follows_new_weights(tmp_path, monkeypatch, tiny_lm):
    monkeypatch.setenv("FEDAGENT_CACHE", str(tmp_path / "cache"))
    folder = tmp_path / "model"
    tiny_lm.save_pretrained(folder)
    first = loading.base_fingerprint(str(folder), tiny_lm)
    assert first == fingerprint(tiny_lm)

    calls = []
    monkeypatch.setattr(loading, "fingerprint", lambda m: calls.append(m) or fingerprint(m))
    assert loading.base_fingerprint(str(folder), tiny_lm) == first and calls == []  # read back, not rehashed

    with torch.no_grad():
        tiny_lm.model.norm.weight.add_(1.0)
    tiny_lm.save_pretrained(folder)  # new bytes, new size or mtime: the memo must not answer
    assert loading.base_fingerprint(str(folder), tiny_lm) == fingerprint(tiny_lm) != first and len(calls) == 1


def test_a_model_build_says_when_it_starts_and_how_long_it_took_once(tmp_path, capsys):
    from fedagent_flwr.agent.models.model_cache import MARKER, build_once

    def build(folder):
        (folder / MARKER).write_text("{}")

    assert build_once(tmp_path / "m", build, what="the test model") == tmp_path / "m"
    err = capsys.readouterr().err
    assert "building the test model into" in err and "built the test model in" in err
    build_once(tmp_path / "m", build, what="the test model")
    assert capsys.readouterr().err == ""  # cached: nothing to say


def _counting_build(calls):
    from fedagent_flwr.agent.models.model_cache import MARKER

    def build(folder):
        calls.append(folder)
        (folder / "weights.bin").write_bytes(bytes(range(256)) * 64)
        (folder / "tokenizer.json").write_text('{"vocab": {}}')
        (folder / MARKER).write_text("{}")

    return build


def test_a_damaged_or_partial_cached_model_is_built_again_never_loaded(tmp_path, capsys):
    """Truncated or overwritten bytes (same size) and a folder left without its marker are rebuilt, naming the
    file; the rebuilt folder is byte-identical to a fresh build."""
    import os

    from fedagent_flwr.agent.models.model_cache import MARKER, build_once

    calls = []
    target = tmp_path / "m"
    build = _counting_build(calls)
    build_once(target, build)
    fresh = (target / "weights.bin").read_bytes()
    for damage, said in (
        (lambda: (target / "weights.bin").write_bytes(fresh[:100]), "weights.bin has 100 bytes"),
        (lambda: (target / "weights.bin").write_bytes(b"\xff" + fresh[1:]), "weights.bin was changed after it was built"),
        (lambda: (target / "tokenizer.json").unlink(), "tokenizer.json is missing"),
        (lambda: (target / MARKER).unlink(), "is a partial build"),
    ):
        capsys.readouterr()
        before = len(calls)
        damage()
        if (target / "weights.bin").exists():  # a write moves the mtime; make sure it did within the clock's resolution
            os.utime(target / "weights.bin", ns=(1, 1))
        assert build_once(target, build) == target
        assert len(calls) == before + 1, said
        assert said in capsys.readouterr().err
        assert (target / "weights.bin").read_bytes() == fresh
    build_once(target, build)
    assert len(calls) == 5  # intact now: loaded as is


def test_a_cache_built_before_checksums_is_adopted_once(tmp_path):
    from fedagent_flwr.agent.models.model_cache import CHECKSUMS, build_once

    calls = []
    target = tmp_path / "m"
    build_once(target, _counting_build(calls))
    (target / CHECKSUMS).unlink()  # what an older version left
    build_once(target, _counting_build(calls))
    assert len(calls) == 1 and (target / CHECKSUMS).exists()


def test_a_forced_rebuild_replaces_the_folder_only_once_the_new_build_is_complete(tmp_path, capsys):
    import pytest

    from fedagent_flwr.agent.models.model_cache import MARKER, build_once, is_built

    target = tmp_path / "m"
    calls = []
    build_once(target, _counting_build(calls))
    before = (target / "weights.bin").read_bytes()

    def failing(folder):
        (folder / "weights.bin").write_bytes(b"half")
        assert is_built(target) and (target / "weights.bin").read_bytes() == before  # the old build stays meanwhile
        raise RuntimeError("interrupted")

    with pytest.raises(RuntimeError):
        build_once(target, failing, force=True)
    assert is_built(target) and (target / "weights.bin").read_bytes() == before  # a failed rebuild changes nothing
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m", "m.lock"]

    def other(folder):
        (folder / "weights.bin").write_bytes(b"new")
        (folder / MARKER).write_text("{}")

    capsys.readouterr()
    build_once(target, other, force=True)
    assert "rebuilding a model into" in capsys.readouterr().err
    assert is_built(target) and (target / "weights.bin").read_bytes() == b"new" and not (target / "tokenizer.json").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m", "m.lock"]  # the old build removed, nothing half-built
    build_once(target, _counting_build(calls))
    assert len(calls) == 1  # not forced: the intact folder is kept


def test_loading_and_checkpointing_draw_no_transformers_bars_and_leave_the_switch_as_found(tiny_lm, maze_tokenizer,
                                                                                           tmp_path, capfd):
    """"Loading weights" / "Writing model shards" bars were half-drawn lines in every client's and checkpoint's log."""
    from transformers.utils import logging as transformers_logging

    from fedagent_flwr.agent.models.pretrained import ModelSpec, load_model
    from fedagent_flwr.runs.reporting import RunReporter

    tiny_lm.save_pretrained(tmp_path / "m")
    capfd.readouterr()
    load_model(ModelSpec(source=str(tmp_path / "m"), built_here=True), torch.device("cpu"))
    RunReporter(tmp_path / "run").checkpoint(1, tiny_lm, maze_tokenizer)
    err = capfd.readouterr().err
    assert "Loading weights" not in err and "Writing model shards" not in err, err
    assert (tmp_path / "run" / "checkpoints" / "round-0001" / "model.safetensors").exists()
    assert transformers_logging.is_progress_bar_enabled()


def test_a_lora_checkpoint_naming_its_base_as_a_run_config_does_loads_with_the_adapter_merged(tmp_path, monkeypatch,
                                                                                              tiny_lm, maze_tokenizer):
    """A LoRA run saves `checkpoints/round-N` as a PEFT folder whose base is the run's `model` ("tiny", "warm:...",
    "shape:..."): from_pretrained cannot resolve those names, so the evaluation command (and `--paired-with`) must."""
    from peft import LoraConfig, get_peft_model

    from fedagent_flwr.agent.models import pretrained as models
    from fedagent_flwr.agent.training.lora import save_adapter

    monkeypatch.setenv("FEDAGENT_CACHE", str(tmp_path / "cache"))
    base_folder = tmp_path / "base"
    tiny_lm.save_pretrained(base_folder)
    maze_tokenizer.save_pretrained(base_folder)
    monkeypatch.setattr(models, "ensure_tiny_model", lambda env: base_folder)  # "tiny:maze" is this folder
    peft_model = get_peft_model(models.load_model(models.ModelSpec(str(base_folder), True), torch.device("cpu")),
                                LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    save_adapter(peft_model, tmp_path / "round-0003", maze_tokenizer, base_model="tiny:maze")

    agent = loading.load_agent.__wrapped__(str(tmp_path / "round-0003"), "maze", "cpu")
    ids = torch.tensor([maze_tokenizer("move up move left")["input_ids"]])
    with torch.no_grad():
        want, base = peft_model(ids).logits, tiny_lm(ids).logits
        got = agent.model(ids).logits
    assert torch.allclose(got, want, atol=1e-5) and not torch.allclose(got, base, atol=1e-3)
    assert agent.base_fingerprint == fingerprint(agent.model) != fingerprint(tiny_lm)
