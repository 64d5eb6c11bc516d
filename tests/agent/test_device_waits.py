"""GRPO's log-prob and update passes queue all their micro-batches before the host waits for the device (agent/training/grpo.py,
agent/engine/tokens.py).

On a GPU the host waits for the device when it reads a value the device computed (float(), .item(), .cpu(), a boolean
index, nonzero) and when it copies a host tensor to the device without non_blocking; a wait between two micro-batches
keeps the host from queuing the next one while the device computes this one. There is no GPU here, so the test stands
in for one: every tensor that would live on the device is followed through each aten op, and the models' forward
passes and the host's waits are recorded in order.
"""

import copy
import itertools
import traceback

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.weak import WeakIdKeyDictionary

from fedagent_flwr.agent.training.advantages import StepSample
from fedagent_flwr.agent.play.rollout import RolloutConfig
from fedagent_flwr.agent.engine.tokens import collate
from fedagent_flwr.config import RunConfig
from placed import grpo_trainer

aten = torch.ops.aten
# ops whose result the host needs at once: the value itself, or a size that depends on the values
READS = {aten._local_scalar_dense.default, aten.nonzero.default, aten.masked_select.default, aten.is_nonzero.default}
# indexing with a boolean mask: the number of positions it selects is read first
BOOLEAN_INDEXED = {aten.index.Tensor, aten.index_put.default, aten.index_put_.default, aten._index_put_impl_.default}


class DeviceWaits(TorchDispatchMode):
    """Records "forward" (a model's pass begins) and "wait" (the host waits for the "device"), in order.

    On the "device": the models' parameters and buffers, what `.to(a torch.device)` returns (a copy to the device),
    what a factory op makes inside a model's body, and what any op computes from such a tensor. The host waits when it
    reads one (`.cpu()` included: its result is on the host), and when it copies a host tensor to the device without
    non_blocking."""

    def __init__(self, models, monkeypatch):
        super().__init__()
        self.events: list[str] = []
        self.on_device = WeakIdKeyDictionary()
        self.in_body = 0  # inside a model's body (its decoder) now
        for model in models:
            for tensor in itertools.chain(model.parameters(), model.buffers()):
                self.on_device[tensor] = True
            model.get_input_embeddings().register_forward_pre_hook(lambda *_: self.events.append("forward"))
            model.get_decoder().register_forward_pre_hook(lambda *_: setattr(self, "in_body", self.in_body + 1))
            model.get_decoder().register_forward_hook(lambda *_: setattr(self, "in_body", self.in_body - 1))
        inner_cpu, inner_to = torch.Tensor.cpu, torch.Tensor.to

        def cpu(tensor, *args, **kwargs):  # on a CPU, .cpu() and .to(device) return the tensor itself: copy instead
            self._note_wait([tensor])
            out = inner_cpu(tensor, *args, **kwargs).clone()
            self.on_device.pop(out, None)
            return out

        def to(tensor, *args, **kwargs):
            out = inner_to(tensor, *args, **kwargs)
            if any(isinstance(a, torch.device) for a in (*args, kwargs.get("device"))) and tensor not in self.on_device:
                if not kwargs.get("non_blocking"):  # a copy to a GPU that waits for the work queued before it
                    self.events.append("wait")
                out = out.clone()
                self.on_device[out] = True
            return out

        monkeypatch.setattr(torch.Tensor, "cpu", cpu)
        monkeypatch.setattr(torch.Tensor, "to", to)

    def _note_wait(self, tensors) -> None:
        if any(t in self.on_device for t in tensors):
            self.events.append("wait")

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        inputs = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        boolean_index = func in BOOLEAN_INDEXED and any(i is not None and i.dtype == torch.bool for i in args[1])
        if func in READS or boolean_index:
            self._note_wait(inputs)
        out = func(*args, **kwargs)
        # what a factory op makes inside a model's body (transformers' torch.arange(..., device=embeddings.device)) is
        # made on the device
        if any(t in self.on_device for t in inputs) or (not inputs and self.in_body and kwargs.get("device") is not None):
            for t in tree_leaves(out):
                if isinstance(t, torch.Tensor):
                    self.on_device[t] = True
        return out


def _samples(vocab: int, n: int) -> list[StepSample]:
    rng = np.random.default_rng(3)
    return [StepSample(rng.integers(3, vocab, size=int(rng.integers(3, 20))).tolist(),
                       rng.integers(3, vocab, size=int(rng.integers(1, 8))).tolist(), float(rng.normal()))
            for _ in range(n)]


@pytest.mark.parametrize("chunk_tokens", [0, 4])
def test_the_passes_do_not_wait_for_the_device_between_their_micro_batches(tiny_lm, maze_tokenizer, monkeypatch, chunk_tokens):
    """12 samples, micro-batches of 2, minibatches of 4: the old-policy and KL-reference passes run 6 micro-batches
    each and the update 6 over 3 optimizer steps. The host waits only after the old-policy pass and after the reference
    pass (their log-probs, to the host) and after the update's last micro-batch (its statistics), never between."""
    model = copy.deepcopy(tiny_lm)
    cfg = RunConfig.from_run_config({"grpo.learning-rate": 1e-3, "grpo.beta": 0.05, "grpo.mini-batch-size": 4, "grpo.ppo-micro-batch-size-per-gpu": 2, "device": "cpu", "engine.logprob-chunk-tokens": chunk_tokens}).updated({})
    trainer = grpo_trainer(model, maze_tokenizer, cfg, RolloutConfig(history_length=0))
    with DeviceWaits([model, trainer.reference], monkeypatch) as recorder:
        stats = trainer.update(_samples(tiny_lm.config.vocab_size, 12), np.random.default_rng(0))
    assert stats["optimizer_steps"] == 3 and stats["kl"] > 0
    assert recorder.events.count("forward") == 18
    runs = [kind for kind, _ in itertools.groupby(recorder.events)]
    # old-policy pass, waits, reference pass, waits, update, waits
    assert runs == ["forward", "wait", "forward", "wait", "forward", "wait"], runs


def test_a_right_padded_batch_goes_without_a_padding_mask_and_a_real_tokens_values_stay_the_same(tiny_lm):
    """collate's right-padded batches reach a Qwen2 model under SDPA as the mask mapping {"full_attention": None} (the
    causal kernel: flash attention on a GPU, no per-head mask kept for backward; no mask preparation in transformers).
    Every real token's logits are those the 2-D mask gives, bit for bit, and the gradients agree to float rounding
    (the backward sums in another order; the default job's update statistics move from the seventh digit). Others keep
    what they had: a Llama model under SDPA the 4-D causal-and-padding mask transformers would build, eager attention
    the 2-D mask; a batch padded on the left gets the 4-D mask under SDPA too; an unpadded one, None."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from fedagent_flwr.agent.engine.tokens import model_attention_mask

    torch.manual_seed(0)
    shape = dict(vocab_size=64, hidden_size=48, intermediate_size=96, num_hidden_layers=2, num_attention_heads=6,
                 num_key_value_heads=2)
    gqa = AutoModelForCausalLM.from_config(AutoConfig.for_model("qwen2", **shape)).eval()
    eager = AutoModelForCausalLM.from_config(copy.deepcopy(gqa.config), attn_implementation="eager").eval()
    eager.load_state_dict(gqa.state_dict())
    llama = AutoModelForCausalLM.from_config(AutoConfig.for_model("llama", **shape)).eval()
    batch = collate([([5, 6, 7, 8], [9, 10]), ([5, 6], [11]), ([12, 13, 14, 15, 16, 17], [18, 19])], pad_id=0)
    real = batch["attention_mask"].bool()
    cpu = torch.device("cpu")
    for model in (tiny_lm, gqa, eager, llama):
        given = model_attention_mask(model, batch["attention_mask"], cpu)
        if model is eager:
            assert given.shape == (3, 8)
        elif model is llama:
            assert given.shape == (3, 1, 8, 8) and given.dtype == torch.bool
        else:
            assert given == {"full_attention": None}
        values = []
        for mask in (batch["attention_mask"], given):
            model.zero_grad(set_to_none=True)
            logits = model(input_ids=batch["input_ids"], attention_mask=mask).logits
            logits[real].float().pow(2).mean().backward()
            values.append((logits[real].detach(), [p.grad.clone() for p in model.parameters()]))
        (expected, expected_grads), (got, grads) = values
        assert torch.equal(got, expected)
        assert all(torch.allclose(a, b, rtol=1e-5, atol=1e-7) for a, b in zip(grads, expected_grads))
    left = batch["attention_mask"].flip(1)  # the same rows padded on the left
    for model in (tiny_lm, gqa, llama):
        mask = model_attention_mask(model, left, cpu)
        assert mask.shape == (3, 1, 8, 8) and mask.dtype == torch.bool
        ids = batch["input_ids"].flip(1)
        with torch.no_grad():
            expected = model(input_ids=ids, attention_mask=left).logits
            got = model(input_ids=ids, attention_mask=mask).logits
        assert torch.equal(got[left.bool()], expected[left.bool()])
    assert model_attention_mask(eager, left, cpu).shape == (3, 8)
    assert model_attention_mask(llama, torch.ones(2, 5, dtype=torch.long), cpu) is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_a_gpu_the_passes_do_not_synchronize_between_their_micro_batches(tiny_lm, maze_tokenizer):
    """The same order on a real GPU, from PyTorch's own account: torch.cuda.set_sync_debug_mode warns at every
    operation that synchronizes the host with the device."""
    import warnings

    model = copy.deepcopy(tiny_lm).cuda()
    cfg = RunConfig.from_run_config({"grpo.learning-rate": 1e-3, "grpo.beta": 0.05, "grpo.mini-batch-size": 4, "grpo.ppo-micro-batch-size-per-gpu": 2, "device": "cuda", "engine.logprob-chunk-tokens": 4})
    trainer = grpo_trainer(model, maze_tokenizer, cfg, RolloutConfig(history_length=0))
    samples = _samples(tiny_lm.config.vocab_size, 12)
    trainer.update(samples, np.random.default_rng(1))  # warm-up: first-use allocations and lazy initialisation
    events: list[str] = []
    waits: list[str] = []  # where each wait was asked for: the innermost frame of this project's code

    def on_warning(message, *_args, **_kwargs):
        # Only the trainer's own waits count: on an H100 one more came before the first pass with no frame of this
        # project's code on the stack (the test's own calls into torch), which no change to the passes can remove.
        ours = [f for f in traceback.extract_stack() if "fedagent_flwr" in f.filename]
        if "synchroniz" in str(message) and ours:
            events.append("wait")
            waits.append(f"{ours[-1].filename.rsplit('fedagent_flwr', 1)[-1]}:{ours[-1].lineno}")

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = on_warning
        for m in (model, trainer.reference):
            m.get_input_embeddings().register_forward_pre_hook(lambda *_: events.append("forward"))
        torch.cuda.set_sync_debug_mode("warn")
        try:
            stats = trainer.update(samples, np.random.default_rng(0))
        finally:
            torch.cuda.set_sync_debug_mode("default")
    assert stats["optimizer_steps"] == 3 and events.count("forward") == 18
    runs = [kind for kind, _ in itertools.groupby(events)]
    assert runs == ["forward", "wait", "forward", "wait", "forward", "wait"], (runs, sorted(set(waits)))
