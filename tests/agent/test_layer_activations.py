"""The memory plan's count of what a decoder layer keeps for backward (memory.layer_activations), against what autograd
saves in the trainer's own forward pass, tensor by tensor, on CPU. An H100 ran out of memory at a pass the old count
(95 KiB a token and layer for the 1.5B shape under bf16-mixed, whatever the weights' dtype) admitted: with fp32 weights
the residual stream and the norms stay fp32 and each linear keeps its own bf16 cast of its input, 116 KiB."""

import contextlib

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from fedagent_flwr.agent.engine.kernels import decoder_layers
from fedagent_flwr.agent.training.lora import attached_lora
from fedagent_flwr.config import LoRASection
from fedagent_flwr.agent.engine.master_weights import Bf16WorkingCopy
from fedagent_flwr.agent.engine.memory import ModelShape, layer_activations, shape_config, value_bytes
from fedagent_flwr.agent.engine.precision import autocast
from fedagent_flwr.agent.engine.tokens import MASK_MAPPING_MODELS, collate, completion_logprobs
from fedagent_flwr.config import RunConfig
from fedagent_flwr.methods.memory import plan_layer_activations
from fedagent_flwr.methods.placement import place_run

# every size distinct, so that a term counted at the wrong size cannot pass
FIELDS = dict(hidden_size=48, intermediate_size=80, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
              vocab_size=64, tie_word_embeddings=False)


def _model(model_type: str, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    torch.manual_seed(0)
    config = AutoConfig.for_model(model_type, **FIELDS, attn_implementation="sdpa")
    return AutoModelForCausalLM.from_config(config).to(dtype)


def _saved_by_the_middle_layer(model, precision: str, width: int, rows: int = 2) -> tuple[int, torch.dtype]:
    """Bytes of the distinct storages autograd saves while the middle of three decoder layers runs a right-padded batch
    through the log-prob pass GRPO's update takes (the last row one token short), less the parameters and what another
    layer saved too (RoPE's cos and sin: one tensor for every layer); and the dtype of the layer's input."""
    layers = decoder_layers(model)
    assert len(layers) == 3
    middle = layers[1]
    parameters = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved: dict[object, dict[int, int]] = {layer: {} for layer in layers}
    state = {"layer": None}
    inputs = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if state["layer"] is not None and storage.data_ptr() not in parameters:
            saved[state["layer"]][storage.data_ptr()] = storage.nbytes()
        return tensor

    def enter(layer):
        def hook(module, args, kwargs):
            state["layer"] = layer
            inputs[layer] = args[0] if args else kwargs["hidden_states"]
        return hook

    handles = [layer.register_forward_pre_hook(enter(layer), with_kwargs=True) for layer in layers]
    handles += [layer.register_forward_hook(lambda *_: state.update(layer=None)) for layer in layers]
    batch = collate([(list(range(3, 3 + width // 2)), list(range(3, 3 + width - width // 2 - (i == rows - 1))))
                     for i in range(rows)], 0)
    assert batch["input_ids"].shape == (rows, width)
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), autocast(precision, torch.device("cpu")):
            completion_logprobs(model, batch)
    finally:
        for h in handles:
            h.remove()
    others = {ptr for layer in layers if layer is not middle for ptr in saved[layer]}
    own = {ptr: n for ptr, n in saved[middle].items() if ptr not in others}
    return sum(own.values()), inputs[middle].dtype


NARROW, WIDE, ROWS = 12, 20, 2


def _measured(model, precision: str) -> tuple[float, int]:
    """Bytes a token the middle layer saves (the difference of two widths: per-pass constants such as autocast's bf16
    copies of the weights cancel), and the bytes of one position of its input."""
    (narrow, dtype), (wide, _) = (_saved_by_the_middle_layer(model, precision, w, ROWS) for w in (NARROW, WIDE))
    return (wide - narrow) / (ROWS * (WIDE - NARROW)), FIELDS["hidden_size"] * torch.empty(0, dtype=dtype).element_size()


def _mask_copy_per_token(model_type: str, precision: str) -> float:
    """What the plan leaves out for a model handed a 4-D mask (not Qwen2/Qwen3): SDPA converts the boolean mask to the
    query's dtype in every layer and keeps that [rows, 1, width, width] copy for backward. Its bytes grow with the
    width squared, so no per-token count holds them; the papers' models take no mask (tokens.model_attention_mask)."""
    if model_type in MASK_MAPPING_MODELS:
        return 0.0
    c = value_bytes(precision)
    return ROWS * (WIDE**2 - NARROW**2) * c / (ROWS * (WIDE - NARROW))


CASES = [  # (model type, precision, engine.param-dtype, LoRA targets or None)
    ("qwen2", "fp32", "fp32", None),
    ("qwen2", "bf16-mixed", "fp32", None),
    ("qwen2", "bf16-mixed", "bf16", None),
    ("qwen2", "bf16-mixed", "fp32", ("q_proj", "k_proj", "v_proj", "o_proj")),
    ("qwen2", "bf16-base", "fp32", "all-linear"),
    ("qwen2", "fp32", "fp32", ("gate_proj", "up_proj", "down_proj")),
    ("llama", "bf16-mixed", "fp32", None),
    ("llama", "bf16-mixed", "bf16", None),
]


@pytest.mark.parametrize("model_type,precision,param_dtype,targets", CASES)
def test_the_plan_counts_what_a_layer_saves_for_backward(model_type, precision, param_dtype, targets):
    model = _model(model_type, torch.bfloat16 if precision == "bf16-base" else torch.float32)
    with contextlib.ExitStack() as stack:
        if targets is not None:
            model = stack.enter_context(attached_lora(model, LoRASection(r=4, target_modules=targets if isinstance(targets, str) else ",".join(targets))))
        if param_dtype == "bf16":
            stack.enter_context(Bf16WorkingCopy(model))
        measured, kept = _measured(model, precision)
    planned = layer_activations(ModelShape.of(model.config), precision, param_dtype, targets, 4 if targets else 0)
    assert planned.full == pytest.approx(measured - _mask_copy_per_token(model_type, precision), abs=1e-9), (planned, measured)
    assert planned.kept == kept


def test_for_the_1_5b_shape_a_layer_keeps_116_kib_a_token_with_fp32_weights_and_101_with_the_bf16_copy():
    """The numbers the module's text gives, and what they make of the run config's own count."""
    shape = ModelShape.of(shape_config("qwen2.5-1.5b"))
    fp32_weights = layer_activations(shape, "bf16-mixed", "fp32")
    bf16_copy = layer_activations(shape, "bf16-mixed", "bf16")
    assert (fp32_weights.full, bf16_copy.full) == (118_840, 103_480)
    assert (fp32_weights.kept, bf16_copy.kept) == (4 * 1536, 2 * 1536)
    # the run config hands the plan its resolved engine.param-dtype and adapter
    per_token = lambda cfg: plan_layer_activations(cfg, shape, place_run(cfg))  # noqa: E731
    assert per_token(RunConfig.from_run_config({"precision": "bf16-mixed", "engine.param-dtype": "bf16"})) == bf16_copy
    lora = per_token(RunConfig.from_run_config({"precision": "bf16-mixed", "grpo.finetuning": "lora"}))
    assert lora == layer_activations(shape, "bf16-mixed", "fp32", LoRASection().targets, 8)
    assert lora.full < bf16_copy.full
