"""The base fingerprint of a local model folder is remembered on disk (a deployed ClientApp is a new process per
message), and never outlives a change of the weights."""

import torch

from fedagent_flwr.agent import loading
from fedagent_flwr.agent.models import fingerprint


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
    from fedagent_flwr.agent.model_cache import MARKER, build_once

    def build(folder):
        (folder / MARKER).write_text("{}")

    assert build_once(tmp_path / "m", build, what="the test model") == tmp_path / "m"
    err = capsys.readouterr().err
    assert "building the test model into" in err and "built the test model in" in err
    build_once(tmp_path / "m", build, what="the test model")
    assert capsys.readouterr().err == ""  # cached: nothing to say
