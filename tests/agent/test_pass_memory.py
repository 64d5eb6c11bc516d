"""The memory plan's update rows (gradients, training logits, activations, autocast copies) against the tensor bytes a
real training pass holds at once, forward and backward, on CPU, and its no-grad pass against a no-grad log-prob pass:
every storage an op creates is counted from its creation to its collection, and the pass's peak compared with the plan
at the pass's own rows and width. The plan
once counted two [positions, vocab] fp32 tensors for a pass with gradients; its backward holds three at once (the
log-softmax kept for backward, the zeros the picked tokens' gradient is scattered into, and the scatter's result)."""

import contextlib
import weakref

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map_only
from transformers import AutoConfig, AutoModelForCausalLM

from fedagent_flwr.agent.engine.memory import EAGER_ROW, ModelShape, autocast_copies, client_plan, no_grad_pass_bytes
from fedagent_flwr.agent.engine.precision import autocast
from fedagent_flwr.agent.engine.tokens import collate, completion_logprobs
from fedagent_flwr.agent.training.lora import attached_lora
from fedagent_flwr.config import LoRASection

# a vocabulary large beside the layers, as a real model's is, so that the logits' share decides the comparison
FIELDS = dict(hidden_size=48, intermediate_size=80, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
              vocab_size=4096, tie_word_embeddings=False)
ROWS, WIDTH = 4, 40
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")


class LiveBytes(TorchDispatchMode):
    """The most bytes of op-created storages alive at once (the parameters, made before, are not counted)."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.known = {p.untyped_storage().data_ptr() for p in model.parameters()}
        self.live = self.peak = 0

    def _note(self, tensor: torch.Tensor) -> None:
        storage = tensor.untyped_storage()
        key, size = storage.data_ptr(), storage.nbytes()
        if key in self.known or size == 0:
            return
        self.known.add(key)
        self.live += size
        self.peak = max(self.peak, self.live)
        weakref.finalize(storage, self._gone, key, size)

    def _gone(self, key: int, size: int) -> None:
        self.live -= size
        self.known.discard(key)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        tree_map_only(torch.Tensor, self._note, out)
        return out


def _pass_peak(model, precision: str, chunk: int, width: int = WIDTH) -> int:
    half = width // 2
    batch = collate([(list(range(3, 3 + half)), list(range(3, 3 + width - half))) for _ in range(ROWS)], 0)
    live = LiveBytes(model)
    with live:
        for _ in range(2):  # two micro-batches of a minibatch: the second runs beside the gradients the first left
            with autocast(precision, torch.device("cpu")):
                logprobs, mask = completion_logprobs(model, batch, 1.0, chunk)
            (-(logprobs * mask).sum() / mask.sum()).backward()
            del logprobs, mask
    return live.peak


CASES = [  # (model type, precision, LoRA, engine.logprob-chunk-tokens)
    ("qwen2", "fp32", False, 0),
    ("qwen2", "bf16-mixed", False, 0),
    ("qwen2", "fp32", True, 0),
    ("qwen2", "bf16-base", True, 0),
    ("qwen2", "bf16-base", True, 16),
    ("qwen2", "fp32", False, 16),
    ("qwen2", "bf16-mixed", True, 0),
    ("llama", "fp32", False, 0),
    ("llama", "bf16-base", True, 0),
]


@pytest.mark.parametrize("model_type,precision,lora,chunk", CASES)
def test_the_plans_update_rows_hold_what_a_training_pass_holds(model_type, precision, lora, chunk):
    _check_update_rows(model_type, precision, lora, chunk, "sdpa", FIELDS, WIDTH)


# engine.attn-implementation=eager: each layer keeps its softmax (and on Qwen the keys and values expanded to every head), here
# in rows long and a vocabulary small enough that these are most of what a pass holds, with 8 query heads to a KV head
EAGER_FIELDS = dict(FIELDS, num_attention_heads=8, num_key_value_heads=1, vocab_size=256)
EAGER_WIDTH = 96
EAGER_CASES = [("llama", "fp32", False, 0), ("llama", "bf16-base", True, 0), ("qwen2", "bf16-mixed", True, 0),
               ("qwen2", "fp32", False, 16)]


@pytest.mark.parametrize("model_type,precision,lora,chunk", EAGER_CASES)
def test_the_plans_update_rows_hold_what_a_pass_under_eager_attention_holds(model_type, precision, lora, chunk):
    _check_update_rows(model_type, precision, lora, chunk, "eager", EAGER_FIELDS, EAGER_WIDTH)


def _check_update_rows(model_type: str, precision: str, lora: bool, chunk: int, attention: str, fields: dict,
                       width: int) -> None:
    torch.manual_seed(0)
    config = AutoConfig.for_model(model_type, **fields, attn_implementation=attention)
    model = AutoModelForCausalLM.from_config(config).to(torch.bfloat16 if precision == "bf16-base" else torch.float32)
    with contextlib.ExitStack() as stack:
        if lora:
            model = stack.enter_context(attached_lora(model, LoRASection(r=4, target_modules=",".join(TARGETS))))
        measured = _pass_peak(model, precision, chunk, width)
    plan = client_plan(ModelShape.of(config), finetuning="lora" if lora else "full", lora_rank=4, lora_targets=TARGETS,
                       precision=precision, kl_beta=0.0, kl_reference="base", micro_batch_size=ROWS,
                       rollout_batch_size=1, context_tokens=width, logprob_chunk_tokens=chunk,
                       eager_attention=attention == "eager").as_dict()
    planned = sum(plan.get(row, 0) for row in ("gradients", "training logits", "activations of a micro-batch",
                                               "autocast bf16 weight copies", EAGER_ROW))
    if attention == "sdpa":
        assert 0.95 * planned <= measured <= 1.05 * planned, (measured, planned, measured / planned)
    else:  # a bound: the plan sums a layer's backward gradients onto all layers' softmax, a pass's peak has less at once
        assert measured <= planned <= 1.3 * measured, (measured, planned, planned / measured)


def _no_grad_peak(model, precision: str, chunk: int, vocab: int, rows: int, width: int) -> int:
    ids = lambda n: [3 + i % (vocab - 3) for i in range(n)]  # noqa: E731 - token ids within a small vocabulary
    batch = collate([(ids(width // 2), ids(width - width // 2)) for _ in range(rows)], 0)
    live = LiveBytes(model)
    with live, torch.no_grad(), autocast(precision, torch.device("cpu")):
        logprobs, mask = completion_logprobs(model, batch, 1.0, chunk)
        del logprobs, mask
    return live.peak


MLP_WIDE = dict(hidden_size=96, intermediate_size=512, num_attention_heads=6, num_key_value_heads=2)  # as real models
WIDE_HEADS = dict(hidden_size=128, intermediate_size=32, num_attention_heads=8, num_key_value_heads=2)  # attention larger
NO_GRAD_CASES = [  # (fields, vocabulary, precision, adapted modules or None, engine.logprob-chunk-tokens, what the plan is)
    *[(MLP_WIDE, 64, p, t, 0, "within 5 %") for p, t in [("fp32", None), ("fp32", TARGETS), ("fp32", ("gate_proj", "up_proj")),
                                                         ("bf16-mixed", None), ("bf16-mixed", TARGETS),
                                                         ("bf16-mixed", ("gate_proj", "up_proj")), ("bf16-base", TARGETS),
                                                         ("bf16-base", ("gate_proj", "up_proj", "down_proj"))]],
    # the head's moment: the logits and their log-softmax, whole or a chunk at a time
    *[(dict(MLP_WIDE, hidden_size=64, intermediate_size=176, num_attention_heads=4), 4096, p, t, c, "within 5 %")
      for p, t in [("fp32", None), ("bf16-base", TARGETS)] for c in (0, 16)],
    *[(WIDE_HEADS, 64, p, t, 0, "a bound") for p, t in [("fp32", None), ("bf16-mixed", TARGETS), ("bf16-base", TARGETS)]],
    (dict(WIDE_HEADS, num_key_value_heads=8), 64, "fp32", None, 0, "a bound"),
]


@pytest.mark.parametrize("fields,vocab,precision,targets,chunk,kind", NO_GRAD_CASES)
def test_the_plans_no_grad_pass_holds_what_a_no_grad_log_prob_pass_holds(fields, vocab, precision, targets, chunk, kind):
    """A no-grad log-prob pass (old policy, KL reference) keeps nothing for backward: its peak is one moment of one
    layer (a few hidden states beside the MLP's I-wide tensors, or the attention's) or of the head. The plan's
    no_grad_pass_bytes, with the autocast copies, against the tensor bytes such a pass holds at once: within 5 % where
    the MLP or the head is the larger, as in real models; where attention is, the plan's bound holds it. The plan
    once counted one layer's whole training set with the logits on top (it fails these cases)."""
    torch.manual_seed(0)
    config = AutoConfig.for_model("qwen2", **fields, num_hidden_layers=3, vocab_size=vocab, tie_word_embeddings=False,
                                  attn_implementation="sdpa")
    model = AutoModelForCausalLM.from_config(config).to(torch.bfloat16 if precision == "bf16-base" else torch.float32)
    rows, width = 8, 64
    with contextlib.ExitStack() as stack:
        if targets:
            model = stack.enter_context(attached_lora(model, LoRASection(r=4, target_modules=",".join(targets))))
        measured = _no_grad_peak(model.eval(), precision, chunk, vocab, rows, width)
    shape, tokens = ModelShape.of(config), rows * width
    adapter = (targets, 4) if targets else ()
    planned = (no_grad_pass_bytes(shape, tokens, min(chunk, tokens) if chunk else tokens, precision, "fp32", *adapter)
               + autocast_copies(shape, "lora" if targets else "full", shape.lora_parameters(4, targets) if targets else 0,
                                 precision))
    low = 0.95 if kind == "within 5 %" else 0.8
    assert low * planned <= measured <= 1.05 * planned, (measured, planned, measured / planned)
