"""The memory plan's update rows (gradients, training logits, activations, autocast copies) against the tensor bytes a
real training pass holds at once, forward and backward, on CPU: every storage an op creates is counted from its
creation to its collection, and the pass's peak compared with the plan at the pass's own rows and width. The plan
once counted two [positions, vocab] fp32 tensors for a pass with gradients; its backward holds three at once (the
log-softmax kept for backward, the zeros the picked tokens' gradient is scattered into, and the scatter's result)."""

import contextlib
import weakref

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map_only
from transformers import AutoConfig, AutoModelForCausalLM

from fedagent_flwr.agent.engine.memory import ModelShape, client_plan
from fedagent_flwr.agent.engine.precision import autocast
from fedagent_flwr.agent.engine.tokens import collate, completion_logprobs
from fedagent_flwr.agent.training.lora import LoRASpec, attached_lora

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


def _pass_peak(model, precision: str, chunk: int) -> int:
    half = WIDTH // 2
    batch = collate([(list(range(3, 3 + half)), list(range(3, 3 + WIDTH - half))) for _ in range(ROWS)], 0)
    live = LiveBytes(model)
    with live:
        for _ in range(2):  # two micro-batches of a minibatch: the second runs beside the gradients the first left
            with autocast(precision, torch.device("cpu")):
                logprobs, mask = completion_logprobs(model, batch, 1.0, chunk)
            (-(logprobs * mask).sum() / mask.sum()).backward()
            del logprobs, mask
    return live.peak


CASES = [  # (model type, precision, LoRA, logprob-chunk-tokens)
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
    torch.manual_seed(0)
    config = AutoConfig.for_model(model_type, **FIELDS, attn_implementation="sdpa")
    model = AutoModelForCausalLM.from_config(config).to(torch.bfloat16 if precision == "bf16-base" else torch.float32)
    with contextlib.ExitStack() as stack:
        if lora:
            model = stack.enter_context(attached_lora(model, LoRASpec(rank=4, target_modules=TARGETS)))
        measured = _pass_peak(model, precision, chunk)
    plan = client_plan(ModelShape.of(config), finetuning="lora" if lora else "full", lora_rank=4, lora_targets=TARGETS,
                       precision=precision, kl_beta=0.0, kl_reference="base", micro_batch_size=ROWS,
                       rollout_batch_size=1, context_tokens=WIDTH, logprob_chunk_tokens=chunk).as_dict()
    planned = sum(plan[row] for row in ("gradients", "training logits", "activations of a micro-batch",
                                        "autocast bf16 weight copies"))
    assert 0.95 * planned <= measured <= 1.05 * planned, (measured, planned, measured / planned)
