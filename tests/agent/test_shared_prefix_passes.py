"""The prompts' shared prefix computed once per batch (collate(..., share_prefix=True)): the same log-probs and the same
gradients as whole rows, through Qwen2 and Llama bodies, both log-prob paths, and a LoRA adapter on and off."""

import numpy as np
import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from fedagent_flwr.agent.engine.tokens import MIN_SHARED_PREFIX, collate, completion_logprobs
from fedagent_flwr.agent.training.lora import attached_lora
from fedagent_flwr.config import LoRASection

TEMPERATURE = 0.7
PREFIX = 14  # tokens every prompt opens with, as the chat template's system message and the task do


def _model(kind: str, vocab: int = 512) -> torch.nn.Module:
    torch.manual_seed(0)
    config = AutoConfig.for_model(kind, vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False)
    return AutoModelForCausalLM.from_config(config).eval()


def _pairs(vocab: int, seed: int = 0) -> list[tuple[list[int], list[int]]]:
    """Prompts of different lengths after a common prefix, completions of different lengths: padded rows."""
    rng = np.random.default_rng(seed)
    head = rng.integers(3, vocab, size=PREFIX).tolist()
    return [(head + rng.integers(3, vocab, size=p).tolist(), rng.integers(3, vocab, size=c).tolist())
            for p, c in [(6, 5), (1, 9), (17, 3), (9, 7)]]


def _scored(model, batch, chunk_tokens):
    model.zero_grad(set_to_none=True)
    logprobs, mask = completion_logprobs(model, batch, TEMPERATURE, chunk_tokens)
    rows = [row[m] for row, m in zip(logprobs, mask)]  # each row's completion tokens, wherever its row puts them
    # every completion token's gradient counts differently
    sum((row * torch.linspace(-1.0, 2.0, len(row))).sum() for row in rows).backward()
    values = [row.detach() for row in rows]
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad and p.grad is not None}
    return values, grads


def _assert_same(model, pairs, chunk_tokens):
    whole, whole_grads = _scored(model, collate(pairs, 0), chunk_tokens)
    # per-row values, not positions: the shared rows are shorter by the prefix
    shared_batch = collate(pairs, 0, share_prefix=True)
    assert shared_batch["prefix_ids"].tolist() == pairs[0][0][:PREFIX]
    assert shared_batch["input_ids"].shape[1] == max(len(p) + len(c) for p, c in pairs) - PREFIX
    shared, shared_grads = _scored(model, shared_batch, chunk_tokens)
    for row_whole, row_shared, (_, completion) in zip(whole, shared, pairs):
        assert len(row_whole) == len(row_shared) == len(completion)
        torch.testing.assert_close(row_shared, row_whole, rtol=0, atol=2e-5)
    assert whole_grads.keys() == shared_grads.keys() and whole_grads
    for name, grad in whole_grads.items():
        torch.testing.assert_close(shared_grads[name], grad, rtol=1e-4, atol=2e-5, msg=name)
    # the embedding's gradient includes the prefix tokens': the backward reached the one prefix pass
    assert sum(float(g.abs().sum()) for g in whole_grads.values()) > 0


@pytest.mark.parametrize("kind", ["qwen2", "llama"])
@pytest.mark.parametrize("chunk_tokens", [0, 5])
def test_a_shared_prefix_gives_the_log_probs_and_gradients_of_whole_rows(kind, chunk_tokens):
    model = _model(kind)
    _assert_same(model, _pairs(model.config.vocab_size), chunk_tokens)


def test_a_shared_prefix_through_a_lora_adapter_on_and_off():
    model = _model("llama")
    pairs = _pairs(model.config.vocab_size, seed=1)
    with attached_lora(model, LoRASection(r=4, target_modules="q_proj,k_proj,v_proj,o_proj"), seed=1) as peft:
        with torch.no_grad():  # B starts at 0: the adapter would change nothing and A would get no gradient
            for name, p in peft.named_parameters():
                if "lora_B" in name:
                    p.normal_(0.0, 0.05)
        _assert_same(peft, pairs, 5)
        with peft.disable_adapter(), torch.no_grad():  # the KL anchor "base"
            whole, _ = completion_logprobs(peft, collate(pairs, 0), TEMPERATURE, 5)
            shared, _ = completion_logprobs(peft, collate(pairs, 0, share_prefix=True), TEMPERATURE, 5)
        torch.testing.assert_close(shared[:, : shared.shape[1]].sum(), whole.sum(), rtol=0, atol=1e-4)


def test_no_prefix_is_cut_below_the_minimum_or_from_a_single_row():
    short = [([5, 6, 7, 8], [9]), ([5, 6, 7, 2], [9])]
    assert MIN_SHARED_PREFIX > 3 and "prefix_ids" not in collate(short, 0, share_prefix=True)
    one = [(list(range(3, 30)), [4, 5])]
    assert "prefix_ids" not in collate(one, 0, share_prefix=True)
    # a prompt that is all prefix keeps its last token in its row: that position scores the first completion token
    same = [(list(range(3, 20)), [4]), (list(range(3, 20)), [6, 7])]
    batch = collate(same, 0, share_prefix=True)
    assert len(batch["prefix_ids"]) == 16 and batch["completion_mask"][:, 1:].sum() == 3
