"""Each of a client's ranks builds the model holding its own shard only (agent/models/sharded_load.py): the weights it
ends with are the ones from_pretrained loads, to the byte."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

import rank_workers
from fedagent_flwr.agent.fsdp.launch import run_ranks
from fedagent_flwr.agent.models.sharded_load import weight_files
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
