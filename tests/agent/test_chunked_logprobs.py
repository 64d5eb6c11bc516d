"""Chunked log-probs (engine.logprob-chunk-tokens > 0): the same values and gradients as the full-logits path, without a
[batch, tokens, vocab] tensor, through a plain model and a PEFT LoRA wrapper, and the same GRPO update."""

import copy

import numpy as np
import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from fedagent_flwr.agent.training.advantages import StepSample
from fedagent_flwr.agent.training.lora import attached_lora
from fedagent_flwr.config import LoRASection
from fedagent_flwr.agent.play.rollout import RolloutConfig
from fedagent_flwr.agent.engine.tokens import collate, completion_logprobs
from fedagent_flwr.config import RunConfig
from placed import grpo_trainer

TEMPERATURE = 0.7  # the rollout temperature scales the logits on both paths
CHUNK = 5  # the samples below hold 21 completion tokens: four full chunks and a remainder


def _qwen(vocab: int = 4096) -> torch.nn.Module:
    """A small random Qwen2 with a vocabulary of a few thousand and its own (untied) output head."""
    torch.manual_seed(0)
    config = AutoConfig.for_model("qwen2", vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False)
    return AutoModelForCausalLM.from_config(config).eval()


def _batch(vocab: int, seed: int = 0) -> dict[str, torch.Tensor]:
    rng = np.random.default_rng(seed)
    pairs = [(rng.integers(3, vocab, size=p).tolist(), rng.integers(3, vocab, size=c).tolist()) for p, c in [(12, 5), (4, 9), (20, 7)]]
    return collate(pairs, pad_id=0)


def _logprobs_and_grads(model, batch, chunk_tokens):
    """Log-probs, their mask, and the gradient of a position-weighted sum of them w.r.t. every trained tensor."""
    model.zero_grad(set_to_none=True)
    logprobs, mask = completion_logprobs(model, batch, TEMPERATURE, chunk_tokens)
    weights = torch.linspace(-1.0, 2.0, logprobs.shape[1])  # every position's gradient counts differently
    (logprobs * weights).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
    return logprobs.detach(), mask, grads


def _assert_same(model, batch):
    full, full_mask, full_grads = _logprobs_and_grads(model, batch, 0)
    chunked, chunked_mask, chunked_grads = _logprobs_and_grads(model, batch, CHUNK)
    assert int(full_mask.sum()) == 21 and torch.equal(chunked_mask, full_mask)
    torch.testing.assert_close(chunked, full, rtol=0, atol=1e-5)
    assert (full[full_mask] < 0).all()  # real log-probs were compared, not zeros
    assert full_grads.keys() == chunked_grads.keys() and full_grads
    for name, grad in full_grads.items():
        torch.testing.assert_close(chunked_grads[name], grad, rtol=1e-5, atol=1e-5, msg=name)
    assert sum(float(g.abs().sum()) for g in full_grads.values()) > 0


def test_chunked_logprobs_and_their_gradients_equal_the_full_logits_on_the_tiny_model(tiny_lm):
    _assert_same(tiny_lm, _batch(tiny_lm.config.vocab_size))


def test_chunked_logprobs_and_their_gradients_equal_the_full_logits_with_a_vocabulary_of_thousands():
    model = _qwen()
    _assert_same(model, _batch(model.config.vocab_size))


def test_chunked_logprobs_equal_through_a_lora_wrapper_with_the_adapter_on_and_off():
    """The LoRA layers sit inside the body (and here the head too): the chunked path runs them; with the adapter
    switched off (the KL anchor 'base') it scores the base."""
    model = _qwen()
    batch = _batch(model.config.vocab_size)
    with torch.no_grad():
        base, _ = completion_logprobs(model, batch, TEMPERATURE)
    with attached_lora(model, LoRASection(r=4, target_modules="q_proj,v_proj,lm_head"), seed=1) as peft_model:
        with torch.no_grad():  # B starts at 0, which would leave A without gradient and the adapter without effect
            for name, p in peft_model.named_parameters():
                if "lora_B" in name:
                    p.normal_(0.0, 0.05)
        _assert_same(peft_model, batch)
        with torch.no_grad(), peft_model.disable_adapter():
            switched_off, _ = completion_logprobs(peft_model, batch, TEMPERATURE, CHUNK)
        with torch.no_grad():
            adapted, _ = completion_logprobs(peft_model, batch, TEMPERATURE, CHUNK)
    torch.testing.assert_close(switched_off, base, rtol=0, atol=1e-5)
    assert (adapted - base).abs().max() > 1e-3  # the adapter was on in the comparison above


def test_the_backward_keeps_no_vocabulary_sized_tensor():
    """Each chunk's logits are recomputed in backward (checkpointing), so nothing [.., vocab] is kept for it;
    the full-logits path keeps [batch, tokens, vocab]."""
    model = _qwen()
    vocab = model.config.vocab_size
    batch = _batch(vocab)

    def kept(chunk_tokens):
        shapes = []

        def pack(tensor):
            shapes.append(tuple(tensor.shape))
            return tensor

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            logprobs, _ = completion_logprobs(model, batch, TEMPERATURE, chunk_tokens)
        logprobs.sum().backward()
        return [s for s in shapes if s and s[-1] == vocab]

    assert kept(0)  # the full path's logits
    assert kept(CHUNK) == []


def test_the_chunked_path_refuses_a_model_that_transforms_its_logits_after_the_head():
    model = _qwen(vocab=256)
    model.config.final_logit_softcapping = 30.0  # Gemma 2 style: the head's output is not the logits
    with pytest.raises(ValueError, match="engine.logprob-chunk-tokens=0"):
        completion_logprobs(model, _batch(256), chunk_tokens=CHUNK)


def _samples(vocab: int, n: int = 8) -> list[StepSample]:
    rng = np.random.default_rng(3)
    return [StepSample(rng.integers(3, vocab, size=int(rng.integers(4, 20))).tolist(),
                       rng.integers(3, vocab, size=int(rng.integers(2, 9))).tolist(), 1.0 if i % 3 else -1.5, 1.0 / (1 + i % 2))
            for i in range(n)]


@pytest.mark.parametrize("lora", [False, True])
def test_a_grpo_update_is_the_same_with_chunked_logprobs(tiny_lm, maze_tokenizer, lora):
    """Two minibatches (old log-probs from a separate pass), a KL term, micro-batches: the loss, the statistics and
    the updated weights match, and the trainer's head really saw chunks."""
    # device="cpu" as the model is: on a GPU machine auto would run the comparison in bf16
    cfg = RunConfig.from_run_config({"grpo.learning-rate": 1e-3, "grpo.beta": 0.05, "grpo.mini-batch-size": 4, "grpo.ppo-micro-batch-size-per-gpu": 2, "device": "cpu"}).updated({"grpo.kl-reference": "base" if lora else "round-start"})
    samples = _samples(tiny_lm.config.vocab_size)

    def trained(chunk_tokens):
        model = copy.deepcopy(tiny_lm)
        head_inputs = []
        hook = model.lm_head.register_forward_hook(lambda m, inputs, out: head_inputs.append(tuple(inputs[0].shape)))
        rollout = RolloutConfig(history_length=0, temperature=TEMPERATURE)
        config = cfg.updated({"engine.logprob-chunk-tokens": chunk_tokens})
        if lora:
            with attached_lora(model, LoRASection(r=2), seed=1) as peft_model:
                before = {k: v.clone() for k, v in peft_model.state_dict().items() if "lora_" in k}
                stats = grpo_trainer(peft_model, maze_tokenizer, config, rollout).update(samples, np.random.default_rng(0))
                weights = {k: v.clone() for k, v in peft_model.state_dict().items() if "lora_" in k}
        else:
            before = {k: v.clone() for k, v in model.state_dict().items()}
            stats = grpo_trainer(model, maze_tokenizer, config, rollout).update(samples, np.random.default_rng(0))
            weights = model.state_dict()
        hook.remove()
        assert any(not torch.equal(weights[k], before[k]) for k in before)  # the update moved the trained tensors
        return stats, weights, head_inputs

    full_stats, full, full_heads = trained(0)
    chunked_stats, chunked, chunked_heads = trained(3)
    assert all(len(s) == 3 for s in full_heads)  # [batch, tokens, hidden]
    assert chunked_heads and all(len(s) == 2 and s[0] <= 3 for s in chunked_heads)  # [<= chunk, hidden]
    assert full_stats["optimizer_steps"] == chunked_stats["optimizer_steps"] == 2
    for key in ("loss", "kl", "clip_frac", "grad_norm"):
        assert chunked_stats[key] == pytest.approx(full_stats[key], rel=1e-5, abs=1e-7), key
    assert full_stats["kl"] > 0  # the reference pass ran and differs after the first step
    # AdamW divides a step by the gradient's size, so where a gradient is near zero float rounding can move a weight
    # by a fraction of a step: 1 % of a step (lr 1e-3) is the tolerance; a wrong log-prob moves them by whole steps.
    for key in full:
        torch.testing.assert_close(chunked[key], full[key], rtol=0, atol=1e-5, msg=key)
