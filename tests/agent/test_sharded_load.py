"""Each of a client's ranks builds the model holding its own shard only (agent/models/sharded_load.py): the weights it
ends with are the ones from_pretrained loads, to the byte."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

import rank_workers
from fedagent_flwr.agent.fsdp.launch import run_ranks
from fedagent_flwr.agent.models.sharded_load import model_folder, weight_files
from fedagent_flwr.agent.models.pretrained import ModelSpec

pytestmark = pytest.mark.ranks  # rank processes on gloo: .ci/run runs them apart from the default suite


@pytest.mark.parametrize("tied, dtype, lora", [(True, "float32", False), (False, "bfloat16", True)])
def test_two_ranks_load_their_shards_of_what_from_pretrained_loads(tmp_path, tied, dtype, lora):
    model, tokenizer = rank_workers.tiny_model(lora=False, tied=tied)
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    whole = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=getattr(torch, dtype))
    expected = {name: t.detach().float().numpy() for name, t in list(whole.state_dict().items()) + list(whole.named_buffers())}
    got, info = run_ranks(2, "gloo", rank_workers.sharded_load, {}, str(tmp_path), dtype, lora)
    assert sorted(got) == sorted(expected)
    for name in expected:
        np.testing.assert_array_equal(got[name], expected[name], err_msg=name)
    # neither rank holds the whole model: each about half its bytes (a layer's odd row makes one a little larger)
    size = sum(p.nbytes for p in whole.parameters())
    held = info["held"]
    adapter = 2 * 4 * (32 + 32) * 4 + 2 * 4 * (32 + 16) * 4 if lora else 0  # r x (in + out) fp32, q and v, 2 layers
    assert sum(held.values()) == pytest.approx(size + adapter, abs=64)
    assert max(held.values()) < 0.6 * (size + adapter)
    assert (info["adapter"] > 0) == lora


COMMIT = "3f2a9c0d5b7e1f4a6c8d0e2b4a6c8e0f1a3b5c7d"  # a snapshot's name in the hub cache: the commit it holds


def hub_cache_snapshot(cache, repo: str, model, tokenizer=None):
    """`model` saved where huggingface_hub keeps a downloaded snapshot of `repo` (models--org--name/snapshots/<commit>,
    refs/main naming it), as a cache filled by `hf download` lays it out; the snapshot's folder."""
    root = cache / ("models--" + repo.replace("/", "--"))
    snapshot = root / "snapshots" / COMMIT
    model.save_pretrained(snapshot)
    if tokenizer is not None:
        tokenizer.save_pretrained(snapshot)
    (root / "refs").mkdir()
    (root / "refs" / "main").write_text(COMMIT)
    return snapshot


def test_a_hub_id_in_the_cache_loads_sharded_on_two_ranks_with_no_whole_copy(tmp_path, monkeypatch):
    model, tokenizer = rank_workers.tiny_model(lora=False, tied=False)
    hub_cache_snapshot(tmp_path / "hub", "org/tiny-agent", model, tokenizer)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))  # the ranks' huggingface_hub reads it as it is imported
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    expected = {name: t.detach().float().numpy() for name, t in list(model.state_dict().items()) + list(model.named_buffers())}
    got, info = run_ranks(2, "gloo", rank_workers.sharded_load, {}, "org/tiny-agent", "float32", False, True)
    assert sorted(got) == sorted(expected)
    for name in expected:
        np.testing.assert_array_equal(got[name], expected[name], err_msg=name)
    size = sum(p.nbytes for p in model.parameters())
    assert max(info["held"].values()) < 0.6 * size


def test_a_hub_id_reads_its_cached_snapshot_and_one_cached_in_part_loads_whole(tmp_path, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    model, _ = rank_workers.tiny_model(lora=False)
    snapshot = hub_cache_snapshot(tmp_path / "hub", "org/tiny-agent", model)
    assert model_folder("org/tiny-agent") == snapshot
    assert weight_files(ModelSpec("org/tiny-agent", built_here=False)) == [snapshot / "model.safetensors"]
    assert model_folder("org/not-cached") is None
    assert model_folder("tiny") is None
    # an index naming a file the cache lacks (a snapshot whose config alone was read, e.g. for the memory plan)
    (snapshot / "model.safetensors.index.json").write_text('{"weight_map": {"lm_head.weight": "model-00002-of-00002.safetensors"}}')
    assert weight_files(ModelSpec("org/tiny-agent", built_here=False)) == []


def test_the_client_fetches_a_hub_id_once_and_nothing_else(tmp_path, monkeypatch):
    import huggingface_hub
    from fedagent_flwr.agent.models import sharded_load

    asked = []
    monkeypatch.setattr(huggingface_hub, "snapshot_download", lambda repo, **kw: asked.append((repo, kw)))
    monkeypatch.setattr(sharded_load, "_FETCHED", set())
    for model in ("org/tiny-agent", "org/tiny-agent", "tiny", "warm:smollm2-135m-instruct", str(tmp_path)):
        sharded_load.fetch_snapshot(model)
    assert asked == [("org/tiny-agent", {"allow_patterns": sharded_load.SNAPSHOT_PATTERNS})]


def test_a_folder_without_safetensors_or_with_an_adapter_is_loaded_whole(tmp_path):
    model, tokenizer = rank_workers.tiny_model(lora=False)
    model.save_pretrained(tmp_path)
    assert weight_files(ModelSpec(str(tmp_path), built_here=True)) == [tmp_path / "model.safetensors"]
    assert weight_files(ModelSpec(str(tmp_path), built_here=True, adapter=str(tmp_path / "adapter"))) == []
    assert weight_files(ModelSpec(str(tmp_path / "nowhere"), built_here=False)) == []


@pytest.mark.parametrize("lora", [False, True])
def test_a_ranks_passes_hold_the_root_and_one_layer_gathered_as_the_plan_counts(lora):
    """Under FSDP2 a pass gathers each decoder layer while it computes, and the root unit (embeddings, head, final
    norm) from its forward through backward: the memory plan's "weights gathered for a pass" row (pass_gathers)
    counts exactly that, for a no-grad log-prob pass and for a training pass with its backward, on 2 gloo ranks."""
    _, info = run_ranks(2, "gloo", rank_workers.pass_gathers, {}, lora)
    no_grad, training = info["peaks"]
    assert no_grad == training == info["planned"] > 0


@pytest.mark.parametrize("lora,tied", [(False, False), (True, False), (False, True)])
def test_a_ranks_static_decoder_copies_the_weights_one_unit_gathered_at_a_time(lora, tied):
    """On N ranks the static engine builds its bf16 copy of the weights one FSDP unit gathered at a time (the root,
    then each layer): the copy and a prefill's logits are bit for bit those of the model whole in one process, the
    most gathered at once is the plan's row (memory.decode_gathers), less than the whole weights the hf engine
    gathers, and decoding inside gathers nothing."""
    _, info = run_ranks(2, "gloo", rank_workers.static_copy, {}, lora, tied)
    assert info["same_weights"] and info["tensors"] > 4 and info["same_logits"]
    assert info["peak"] == info["after"] == info["planned"] < info["whole"]
