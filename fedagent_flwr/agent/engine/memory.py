"""A memory plan: how many bytes a GRPO client and the evaluating server need, from the model's shape and
the run's settings, computed before round 1 without loading any weights.

Terms (bytes; P = the model's distinct parameters, T = the trained ones: P, or the LoRA adapter's A):
- weights: P x 4 (fp32 master weights, whatever the precision: agent/engine/precision.py), except under bf16-base (LoRA
  only), where the frozen base is held in bf16: P x 2;
- autocast copies under bf16-mixed: autocast keeps the bf16 copy of a weight it casts until the autocast region
  ends only when the weight requires grad (checked here on CPU in tests/agent/test_memory.py, and on an H200: a
  7B LoRA round peaked 16.7 GiB below a plan that counted P x 2). So: P x 2 with full fine-tuning; with LoRA, the
  adapter's A x 2 plus one frozen matrix at a time, the largest being the output head (vocab x H x 2); under
  bf16-base the frozen weights are bf16 already, so only the adapter's A x 2; with engine.param-dtype = 'bf16' (full
  fine-tuning) the row is the working copy GRPO's passes compute on, P x 2 as well (agent/engine/master_weights.py);
- gradients: T x 4; AdamW moments: 2 x T x 4;
- KL reference (grpo.beta > 0): round-start with full fine-tuning = a frozen copy, P x 4 (P x 2 with engine.param-dtype =
  'bf16', which computes on bf16 weights and holds the copy so); round-start with LoRA =
  the round-start adapter, A x 4; base with LoRA = nothing (the adapter switched off);
- KV cache of a rollout batch: 2 x layers x kv-heads x head-dim x S x rollout.generation-batch-size x a, with S the
  context (prompt + generated tokens) and a = 2 bytes under bf16-mixed and bf16-base, 4 in fp32;
- generation logits: rollout.generation-batch-size x vocab x 4 (the last position, in fp32);
- training logits: 3 x micro-batch x S x vocab x 4 (the fp32 log-softmax kept for backward, and in backward the
  picked tokens' gradient scattered over the vocabulary, zeros and the scatter's result, before the log-softmax's own);
  with chunked log-probs (engine.logprob-chunk-tokens = C > 0) the head scores C completion tokens at a time and
  checkpointing recomputes them one chunk at a time in backward: 3 x min(C, micro-batch x S) x vocab x 4, and with
  full fine-tuning the head's gradients of the chunks, added up out of place, 2 x vocab x H x 4 more (measured pass
  by pass on CPU in tests/agent/test_pass_memory.py, within 5 % of these rows with the activations below);
- activations kept for backward, per token and layer (layer_activations; counted tensor by tensor, as autograd saves
  them, on CPU in tests/agent/test_layer_activations.py): SDPA's q, k, v and output and its fp32 log-sum-exp per head;
  the MLP's gate output, its activation, the up projection's output and their product (down's input, kept when down or
  its adapter learns); and the two RMSNorms, which is where the precision tells. With H the hidden size, in the
  compute dtype (c bytes: 2 under bf16 compute, 4 in fp32) and the residual stream's dtype (r: the weights' dtype, so 4
  under bf16-mixed's fp32 weights and 2 under engine.param-dtype = 'bf16' or bf16-base): every norm keeps its input upcast to
  fp32 (4H); with a trained norm weight also the normalized value and its output, in fp32 (4H) under fp32 weights,
  where each linear reading the output then keeps its own bf16 cast (2H each: q, k, v, gate, up), or 2H + 2H under
  bf16 weights. Under LoRA (frozen norms and base linears) the adapters keep their inputs as autocast hands them (the
  adapter takes its input in the dtype it arrives in: training/lora.py keep_input_dtype): under bf16-mixed each
  adapted linear its own bf16 cast of the fp32 norm output, under bf16-base the adapters reading one bf16 norm output
  that one tensor, in fp32 the norm output itself; o's adapter reads SDPA's output as it is. For the 1.5B shape
  under bf16-mixed that is 116 KiB a token and layer with fp32 weights and 101 KiB with the bf16 working copy (an earlier plan counted 95 for both; a pass planned so ran out of
  memory on an H100). Models other than Qwen2/Qwen3 get a 4-D padding mask (agent/engine/tokens.py), with which SDPA gets
  the KV heads expanded to every query head: k and v are counted so; the copy of the mask SDPA keeps per layer (rows x
  S x S) is not. The update keeps layers x micro-batch x S of these; with gradient checkpointing each checkpointed
  layer keeps only its input (H x r) and one layer's full set is recomputed in backward;
  engine.gradient-checkpointing = 'auto' checkpoints a micro-batch's first k layers only, k the fewest that fit the memory the
  rest of the plan leaves (layers_to_checkpoint); the plan counts its worst case, every layer; with
  grpo.ppo-max-token-len-per-gpu = B > 0 a pass holds at most max(B, S) padded tokens in place of micro-batch x S, here and in
  the training logits (grpo.log-prob-max-token-len-per-gpu likewise for the no-grad passes below);
- the no-grad log-prob passes (old policy, KL reference) at grpo.log-prob-micro-batch-size-per-gpu L keep no activations: their
  peak is one moment of one layer or of the head, over L x S tokens (no_grad_pass_bytes: a few hidden states and the
  MLP's I-wide tensors, or fp32 logits and their log-softmax for L x S rows, min(C, L x S) when chunked). They never
  run beside the update's passes: the plan's row for them is what they hold beyond the update's logits and
  activations (0 when the update's passes hold more).
A client's round has two phases, and the plan's total is its peak over them: the rollout (the KV cache, the generation
logits, the static engine's weight copy and graphs, released when it ends; on N ranks the weights gathered: whole for
the hf engine, a unit at a time for the static one's copy) and the update with its no-grad passes (gradients, dropped
when it ends, training logits, activations). The other rows are held through both, but for autocast's weight copies
where the static engine decodes: it reads its own copy and casts none, so they are the update's (and the server's
plan, evaluating so, holds none). It is an estimate: allocator slack, CUDA context (~0.5 GB) and fragmentation come
on top.
"""

from __future__ import annotations

import math

from collections.abc import Callable
from dataclasses import dataclass

import torch
from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig

from fedagent_flwr.agent.engine.tokens import MASK_MAPPING_MODELS  # the models handed no 4-D mask, so no expanded KV heads

GB = 1024**3
ACTIVATIONS_ROW = "activations of a micro-batch"  # the client plan's row that engine.gradient-checkpointing='auto' divides up
NO_GRAD_ROW = "no-grad passes beyond the update's"
EAGER_ROW = "eager attention beyond SDPA's"

# The papers' models, from their published config.json files (facts, for configs written offline).
SHAPES: dict[str, dict] = {
    "qwen2.5-0.5b": dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                         intermediate_size=4864, vocab_size=151936, tie_word_embeddings=True),
    "qwen2.5-1.5b": dict(hidden_size=1536, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
                         intermediate_size=8960, vocab_size=151936, tie_word_embeddings=True),
    "qwen2.5-3b": dict(hidden_size=2048, num_hidden_layers=36, num_attention_heads=16, num_key_value_heads=2,
                       intermediate_size=11008, vocab_size=151936, tie_word_embeddings=True),
    "qwen2.5-7b": dict(hidden_size=3584, num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
                       intermediate_size=18944, vocab_size=152064, tie_word_embeddings=False),
}


def shape_config(name: str) -> PretrainedConfig:
    """A Qwen2 config of one of SHAPES (random-init shape only; no weights)."""
    if name not in SHAPES:
        raise ValueError(f"unknown shape {name!r}; known: {', '.join(SHAPES)}")
    return AutoConfig.for_model("qwen2", **SHAPES[name])


@dataclass(frozen=True)
class ModelShape:
    parameters: int  # distinct (a tied matrix once)
    layers: int
    hidden: int
    intermediate: int
    kv_heads: int
    head_dim: int
    vocab: int
    linear_shapes: tuple[tuple[str, int, int], ...]  # (module name, in, out) of every nn.Linear but the head
    heads: int = 0  # query heads (0: as many as the KV heads)
    model_type: str = ""
    layer_parameters: int = 0  # one decoder layer's (FSDP2's unit on ranks; the rest is the root's: embeddings, head)

    @classmethod
    def of(cls, config: PretrainedConfig) -> ModelShape:
        """Count on the meta device: exact for any architecture transformers builds, no memory used."""
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
        linears = tuple((name, m.in_features, m.out_features) for name, m in model.named_modules()
                        if isinstance(m, torch.nn.Linear) and not name.endswith("lm_head"))
        heads = config.num_attention_heads
        return cls(parameters=sum(p.numel() for p in model.parameters()), layers=config.num_hidden_layers,
                   hidden=config.hidden_size, intermediate=config.intermediate_size,
                   kv_heads=getattr(config, "num_key_value_heads", None) or heads,
                   head_dim=getattr(config, "head_dim", None) or config.hidden_size // heads,
                   vocab=config.vocab_size, linear_shapes=linears, heads=heads, model_type=config.model_type,
                   layer_parameters=sum(p.numel() for n, p in model.named_parameters() if ".layers.0." in n))

    def lora_parameters(self, rank: int, targets: tuple[str, ...] | str) -> int:
        """r x (in + out) for every targeted linear layer (PEFT's all-linear leaves the head out)."""
        return sum(rank * (i + o) for name, i, o in self.linear_shapes
                   if targets == "all-linear" or name.rsplit(".", 1)[-1] in targets)


DECODE, UPDATE = "decode", "update"  # a client's two phases: its rollouts, then its update


@dataclass(frozen=True)
class MemoryPlan:
    """Rows of bytes. A client's round decodes its episodes, then updates: `decode` and `update` name the rows held only
    in that phase (a rollout's KV cache and logits are freed before the update, the update's gradients, logits and
    activations before the next rollout), every other row is held throughout. The plan's `total` is its peak, over the
    phases."""

    who: str
    rows: tuple[tuple[str, int], ...]
    decode: tuple[str, ...] = ()
    update: tuple[str, ...] = ()

    def peak(self, phase: str | None = None) -> int:
        """Bytes held at once in `phase` (DECODE or UPDATE); None: the larger of the two."""
        if phase is None:
            return max(self.peak(DECODE), self.peak(UPDATE))
        other = set(self.update if phase == DECODE else self.decode)
        return sum(b for name, b in self.rows if name not in other)

    @property
    def total(self) -> int:
        return self.peak()

    def table(self) -> str:
        mark = {name: f" [{DECODE}]" for name in self.decode} | {name: f" [{UPDATE}]" for name in self.update}
        lines = [f"{self.who}:"] + [f"  {name + mark.get(name, ''):<43} {b / GB:9.2f} GiB" for name, b in self.rows]
        if self.decode or self.update:
            lines += [f"  {'peak while decoding':<43} {self.peak(DECODE) / GB:9.2f} GiB",
                      f"  {'peak while updating':<43} {self.peak(UPDATE) / GB:9.2f} GiB"]
        return "\n".join(lines + [f"  {'total':<43} {self.total / GB:9.2f} GiB"])

    def as_dict(self) -> dict[str, int]:
        phases = {f"{DECODE} peak": self.peak(DECODE), f"{UPDATE} peak": self.peak(UPDATE)} if self.decode or self.update else {}
        return dict(self.rows) | phases | {"total": self.total}


BF16_COMPUTE = ("bf16-mixed", "bf16-base")  # the precisions whose forward passes run under bf16 autocast


def value_bytes(precision: str) -> int:
    """Bytes of an activation, a KV-cache entry or a compute copy's weight: 2 under bf16 compute, 4 in fp32."""
    return 2 if precision in BF16_COMPUTE else 4


def autocast_copies(shape: ModelShape, finetuning: str, adapter: int, precision: str) -> int:
    """Bytes of bf16 weight copies autocast holds: cached for weights that require grad, transient for frozen ones."""
    if precision not in BF16_COMPUTE:
        return 0
    if precision == "bf16-base":  # a bf16 frozen base is used as it is: only the fp32 adapter is cast
        return adapter * 2
    if finetuning == "lora":
        return adapter * 2 + shape.vocab * shape.hidden * 2
    return shape.parameters * 2


def base_weights(shape: ModelShape, precision: str) -> tuple[str, int]:
    """The plan's row of the model's own weights: fp32, or bf16 for bf16-base's frozen base."""
    if precision == "bf16-base":
        return ("weights (bf16 base)", shape.parameters * 2)
    return ("weights (fp32)", shape.parameters * 4)


def _check_base_precision(finetuning: str, precision: str) -> None:
    if precision == "bf16-base" and finetuning != "lora":
        raise ValueError(f"precision='bf16-base' holds a frozen base in bf16 and needs grpo.finetuning='lora', got {finetuning!r}")


def client_plan(shape: ModelShape, *, finetuning: str, lora_rank: int, lora_targets, precision: str, kl_beta: float,
                kl_reference: str, micro_batch_size: int, rollout_batch_size: int, context_tokens: int,
                gradient_checkpointing: bool = False, logprob_chunk_tokens: int = 0,
                static_decoder: bool = False, logprob_micro_batch_size: int = 0, param_dtype: str = "fp32",
                micro_batch_tokens: int = 0, logprob_micro_batch_tokens: int = 0, cuda_graphs: bool = False,
                ranks: int = 1, eager_attention: bool = False) -> MemoryPlan:
    """`logprob_micro_batch_size`: rows of the no-grad log-prob passes; 0 = micro_batch_size. `param_dtype`: "bf16"
    holds full fine-tuning's round-start KL reference in bf16 (agent/engine/master_weights.py) and a bf16 residual stream
    (layer_activations). `micro_batch_tokens` > 0: the update's passes are cut by padded tokens (grpo.micro_batches), so
    one holds at most max(that, the context); `logprob_micro_batch_tokens` likewise for the no-grad passes.
    `static_decoder`, `cuda_graphs`: the rollout's engine, whose cache and graphs are counted as it allocates them
    (decode_rows). `ranks` > 1: what each of a client's ranks holds under FSDP2 (engine.ranks-per-client): the weights, the
    gradients, AdamW's moments and a full model's KL reference sharded, a 1/ranks part each, and the whole weights
    gathered while it decodes its share of the episodes; while it updates, the root unit's and a layer's gathered for
    its passes (pass_gathers).
    Its own passes' activations and logits, and its KV cache, are a rank's as they are a process's."""
    _check_base_precision(finetuning, precision)
    a = value_bytes(precision)
    P = shape.parameters
    adapter = shape.lora_parameters(lora_rank, lora_targets) if finetuning == "lora" else 0
    T = adapter if finetuning == "lora" else P
    if kl_beta <= 0 or (finetuning == "lora" and kl_reference == "base"):
        reference = 0
    elif finetuning == "lora":
        reference = adapter * 4
    else:
        reference = P * 2 if param_dtype == "bf16" and kl_reference == "round-start" else P * 4
    S = context_tokens

    def logits_of(tokens: int) -> int:  # positions whose vocabulary logits exist at once
        return min(logprob_chunk_tokens, tokens) if logprob_chunk_tokens > 0 else tokens

    # a pass of the update: micro-batch rows at the full context, or a token budget (a longer row alone)
    update_tokens = max(micro_batch_tokens, S) if micro_batch_tokens > 0 else micro_batch_size * S
    # engine.gradient-checkpointing='auto' checkpoints each micro-batch only as far as memory needs (layers_to_checkpoint):
    # planned here at its worst, every layer, which is what the longest micro-batch may need
    checkpointed = shape.layers if gradient_checkpointing else 0
    lora = (lora_targets, lora_rank) if finetuning == "lora" else ()
    per_token = layer_activations(shape, precision, param_dtype, *lora)
    activations = update_activation_bytes(shape, update_tokens, checkpointed, per_token)
    # a pass with gradients keeps its log-softmax for backward, where the picked tokens' gradient is scattered over the
    # vocabulary (zeros, then the scatter's result) before the log-softmax's own: three [positions, vocab] fp32
    # tensors at once (tests/agent/test_pass_memory.py)
    # a trained head scoring chunk by chunk gets a gradient from each chunk, which autograd adds up out of place: the
    # sum so far, the chunk's and their new sum, [vocab, hidden] in fp32 each, beside the gradient the row above counts
    head_sums = 2 * shape.vocab * shape.hidden * 4 if finetuning == "full" and logprob_chunk_tokens > 0 else 0
    training_logits = 3 * logits_of(update_tokens) * shape.vocab * 4 + head_sums
    eager = eager_attention_bytes(shape, update_tokens, S, precision) if eager_attention else 0
    passes = max(logprob_micro_batch_tokens, S) if logprob_micro_batch_tokens > 0 else (logprob_micro_batch_size or micro_batch_size) * S
    scoring = no_grad_pass_bytes(shape, passes, logits_of(passes), precision, param_dtype, *lora)
    name, weights = base_weights(shape, precision)
    shard = f", 1/{ranks} shard" if ranks > 1 else ""
    decode_rows = [  # the rollout's; the static engine's copy, cache and graphs are released after it (grpo.py)
        *([decode_gathers(shape, weights, adapter, static_decoder)] if ranks > 1 else []),
        kv_cache("KV cache of a rollout batch", shape, S, rollout_batch_size, a, static_decoder, cuda_graphs),
        ("generation logits", rollout_batch_size * shape.vocab * 4),
        static_decoder_copy(shape, precision, static_decoder, adapter),
        decode_graphs(shape, S, rollout_batch_size, a, static_decoder and cuda_graphs),
    ]
    # autocast's bf16 weight copies: the static engine decodes on its own copy and casts nothing, so with it they are
    # the update's alone; the hf engine's forwards cast as the update's do, so then they are held in both phases
    casts = ("autocast bf16 weight copies", autocast_copies(shape, finetuning, adapter, precision))
    update_rows = [  # the update's; its gradients are dropped when it ends (grpo.py)
        *([casts] if static_decoder else []),
        *([("weights gathered for a pass", pass_gathers(shape, weights, adapter))] if ranks > 1 else []),
        ("gradients" + shard, T * 4 // ranks),
        ("training logits", training_logits),
        (ACTIVATIONS_ROW, activations),
        *([(EAGER_ROW, eager)] if eager_attention else []),
        # the no-grad log-prob passes run before the update's, never beside them: what they hold beyond its rows
        (NO_GRAD_ROW, max(0, scoring - training_logits - activations - eager)),
    ]
    rows = [
        (name + shard, weights // ranks),
        ("adapter (fp32)" + shard, adapter * 4 // ranks),
        *([] if static_decoder else [casts]),
        ("AdamW moments" + shard, 2 * T * 4 // ranks),
        ("KL reference" + shard, reference // ranks if finetuning == "full" else reference),
        *decode_rows,
        *update_rows,
    ]
    return MemoryPlan(f"each of a client's {ranks} ranks" if ranks > 1 else "each client", tuple(rows),
                      decode=tuple(n for n, _ in decode_rows), update=tuple(n for n, _ in update_rows))


@dataclass(frozen=True)
class LayerActivations:
    """Bytes one decoder layer keeps for backward per token: `full`, its whole set; `kept`, its input alone (what a
    checkpointed layer keeps)."""
    full: int
    kept: int


_ATTENTION_READERS = ("q_proj", "k_proj", "v_proj")  # the linears reading the first norm's output
_MLP_READERS = ("gate_proj", "up_proj")  # and the second's
_LINEARS = _ATTENTION_READERS + ("o_proj",) + _MLP_READERS + ("down_proj",)


def layer_activations(shape: ModelShape, precision: str, param_dtype: str = "fp32",
                      lora_targets: tuple[str, ...] | str | None = None, lora_rank: int = 0) -> LayerActivations:
    """What a Qwen2/Llama-style decoder layer keeps for backward per token, as the module's text counts it (the
    eager modules; compiled or Liger layers keep less). `lora_targets`: None for full fine-tuning, else the adapted
    module names or 'all-linear', with adapters of rank `lora_rank` (each keeps its A's output for B). The norms'
    per-token fp32 rsqrt is counted; RoPE's cos and sin are one tensor for all layers and are not."""
    c = value_bytes(precision)
    r = 2 if precision == "bf16-base" or param_dtype == "bf16" else 4
    H, I = shape.hidden, shape.intermediate
    heads = shape.heads or shape.kv_heads
    width = heads * shape.head_dim
    kv = shape.kv_heads * shape.head_dim if shape.model_type in MASK_MAPPING_MODELS else width
    adapted = set(_LINEARS) if lora_targets is None or lora_targets == "all-linear" else set(lora_targets)
    attention = (2 * width + 2 * kv) * c + 4 * heads  # q, k, v, the output; fp32 log-sum-exp a head
    mlp = 3 * I * c + (I * c if "down_proj" in adapted else 0)  # gate out, its activation, up out; down's input
    norms = 2 * (4 * H + 4)  # each norm's input in fp32 (the residual itself under fp32 weights) and its rsqrt
    if lora_targets is None:  # a learning norm weight keeps the normalized value; the output feeds the linears
        if c == 4:
            norms += 2 * (4 * H + 4 * H)  # normalized and output, read by the linears as they are
        elif r == 4:
            # the fp32 normalized values; a bf16 cast of the output for each linear reading it
            norms += 2 * 4 * H + 2 * H * (len(_ATTENTION_READERS) + len(_MLP_READERS))
        else:
            norms += 2 * (2 * H + 2 * H)  # normalized and output in bf16
    elif c == 4:  # frozen norms; an adapter reads the fp32 output as it is
        norms += 4 * H * (bool(adapted & set(_ATTENTION_READERS)) + bool(adapted & set(_MLP_READERS)))
    elif r == 4:  # bf16-mixed: each adapter keeps its own bf16 cast of the fp32 norm output it reads
        norms += 2 * H * len(adapted & set(_ATTENTION_READERS + _MLP_READERS))
    else:  # bf16-base: the adapters reading one bf16 norm output keep that one tensor (lora.py keep_input_dtype)
        norms += 2 * H * (bool(adapted & set(_ATTENTION_READERS)) + bool(adapted & set(_MLP_READERS)))
    # o's adapter reads SDPA's bf16 output as it is (counted in attention); down's input is counted in mlp
    adapters = 0 if lora_targets is None else len(adapted) * lora_rank * c
    return LayerActivations(full=attention + mlp + norms + adapters, kept=H * r)


def _root_parameters(shape: ModelShape) -> int:
    """Parameters outside the decoder layers (embeddings, final norm, head): FSDP2's root unit (agent/fsdp/ranks.py)."""
    return shape.parameters - shape.layers * shape.layer_parameters


def pass_gathers(shape: ModelShape, weights: int, adapter: int) -> int:
    """What a rank's training or no-grad pass holds gathered whole under FSDP2 (agent/fsdp/ranks.py shard): the root
    unit's weights (embeddings, head, final norm), which the root keeps gathered from its forward through backward (and
    after a no-grad forward), and the decoder layer computing, in the dtype the weights are held in, an adapter's fp32
    share with its layer (counted on 2 gloo ranks: tests/agent/test_sharded_load.py)."""
    per_weight = weights / shape.parameters  # bytes of a base weight: 2 under bf16-base, else 4
    return int(_root_parameters(shape) * per_weight + shape.layer_parameters * per_weight + adapter * 4 / shape.layers)


def decode_gathers(shape: ModelShape, weights: int, adapter: int, static_decoder: bool) -> tuple[str, int]:
    """The row of what a rank holds gathered to decode its own episodes (agent/training/grpo.py _decoding_weights). The
    hf engine runs the model itself: every weight whole, in the dtype it is held in, and the adapter. The static engine
    copies the weights into its own buffers (their own row), one unit gathered at a time: the larger of the root unit
    and a layer with its adapter share (counted on 2 gloo ranks: tests/agent/test_sharded_load.py)."""
    if not static_decoder:
        return ("weights gathered whole to decode", weights + adapter * 4)
    per_weight = weights / shape.parameters
    layer = shape.layer_parameters * per_weight + adapter * 4 / shape.layers
    return ("a unit gathered to copy for the decoder", int(max(_root_parameters(shape) * per_weight, layer)))


def no_grad_pass_bytes(shape: ModelShape, tokens: int, logit_positions: int, precision: str, param_dtype: str = "fp32",
                       lora_targets: tuple[str, ...] | str | None = None, lora_rank: int = 0) -> int:
    """The most a no-grad log-prob pass over `tokens` positions holds at once, its vocabulary logits at
    `logit_positions` at a time (the weights and their autocast copies apart). It keeps nothing for backward, so its peak
    is one moment of one layer, or of the head (measured tensor by tensor on CPU: tests/agent/test_pass_memory.py):
    - inside a layer, four hidden states in the residual stream's dtype (r bytes: 2 under bf16-base or engine.param-dtype
      'bf16', else 4): the embeddings the model's forward keeps, the layer's input, the residual after attention and
      the second norm's output; beside them the larger of the MLP (its activation, the up projection's output and
      their product, I wide in the compute dtype, with one I-wide adapter output more where gate or up is adapted)
      and the attention (the projections' outputs in the compute dtype, the rotary embedding's products in the
      residual's, which cos and sin come in: bounded by 2 x (query width + key/value width) x (c + r), an upper bound
      checked where attention is the larger; in the models of SHAPES the MLP is);
    - at the head, the fp32 logits and their log-softmax, with two hidden states beside them."""
    c = value_bytes(precision)
    r = 2 if precision == "bf16-base" or param_dtype == "bf16" else 4
    H, I = shape.hidden, shape.intermediate
    heads = shape.heads or shape.kv_heads
    adapted = set() if lora_targets is None else set(_LINEARS) if lora_targets == "all-linear" else set(lora_targets)
    mlp = 3 * I * c + (I * c if adapted & set(_MLP_READERS) else 0)
    attention = 2 * (heads + shape.kv_heads) * shape.head_dim * (c + r)
    layer = tokens * (4 * H * r + max(mlp, attention))
    head = 2 * logit_positions * shape.vocab * 4 + tokens * 2 * H * r
    return max(layer, head)


def eager_attention_bytes(shape: ModelShape, tokens: int, context_tokens: int, precision: str) -> int:
    """What transformers' eager attention keeps for backward beyond what SDPA keeps (layer_activations), over a pass of
    `tokens` padded positions in rows of `context_tokens` (the longest a row may be): in every layer, each row's
    [heads, row, row] softmax in fp32 (the softmax's own backward reads it) and, under a bf16 compute dtype, its bf16
    cast (the product with the values reads that); for a Qwen model, whose keys and values SDPA reads per KV head, the
    copies expanded to every query head that eager multiplies with; and while a layer's backward runs, its softmax's
    gradient in and out, two more [heads, row, row] fp32 tensors a row."""
    c = value_bytes(precision)
    heads = shape.heads or shape.kv_heads
    softmax = heads * context_tokens * (4 + (2 if c == 2 else 0))
    expanded = 2 * (heads - shape.kv_heads) * shape.head_dim * c if shape.model_type in MASK_MAPPING_MODELS else 0
    return shape.layers * tokens * (softmax + expanded) + tokens * heads * context_tokens * 2 * 4


def layer_activation_bytes(shape: ModelShape, tokens: int, per_token: LayerActivations) -> int:
    """What one decoder layer keeps for backward over `tokens` positions."""
    return tokens * per_token.full


def update_activation_bytes(shape: ModelShape, tokens: int, checkpointed: int, per_token: LayerActivations) -> int:
    """The update's activations over `tokens` positions (rows x padded width) with the first `checkpointed` layers
    checkpointed. A checkpointed layer keeps its input only; the others keep their full set. Backward reaches the first
    layers last, when every later layer's set is freed, so recomputing one of them adds one layer's set only when no
    layer keeps its own (all checkpointed): k inputs + max(layers - k, 1) sets for k >= 1, layers sets for k = 0."""
    full = layer_activation_bytes(shape, tokens, per_token)
    if checkpointed <= 0:
        return shape.layers * full
    checkpointed = min(checkpointed, shape.layers)
    return checkpointed * tokens * per_token.kept + max(shape.layers - checkpointed, 1) * full


def layers_to_checkpoint(shape: ModelShape, tokens: int, room_bytes: float, per_token: LayerActivations) -> int:
    """The fewest leading layers to checkpoint so that the update's activations over `tokens` positions fit
    `room_bytes` (engine.gradient-checkpointing='auto'); every layer when even that does not fit."""
    for k in range(shape.layers + 1):
        if update_activation_bytes(shape, tokens, k, per_token) <= room_bytes:
            return k
    return shape.layers


def server_plan(shape: ModelShape, *, finetuning: str, lora_rank: int, lora_targets, precision: str,
                eval_batch_size: int, context_tokens: int, static_decoder: bool = False,
                cuda_graphs: bool = False) -> MemoryPlan:
    _check_base_precision(finetuning, precision)
    a = value_bytes(precision)
    adapter = shape.lora_parameters(lora_rank, lora_targets) if finetuning == "lora" else 0
    rows = [
        base_weights(shape, precision),
        ("adapter (fp32)", adapter * 4),
        # the static engine evaluates on its own copy of the weights: autocast casts none of them
        ("autocast bf16 weight copies", 0 if static_decoder else autocast_copies(shape, finetuning, adapter, precision)),
        kv_cache("KV cache of an evaluation batch", shape, context_tokens, eval_batch_size, a, static_decoder, cuda_graphs),
        ("generation logits", eval_batch_size * shape.vocab * 4),
        static_decoder_copy(shape, precision, static_decoder, adapter),
        decode_graphs(shape, context_tokens, eval_batch_size, a, static_decoder and cuda_graphs),
    ]
    return MemoryPlan("the server (evaluation)", tuple(rows))


# How the static engine sizes what it allocates (agent/engine/decode.py: _ensure_capacity, _start): cache columns in
# steps of CAPACITY_STEP, and with CUDA graphs rows rounded up to a power of two (its largest row bucket). Kept equal
# to decode.py's by a test; not imported from it, so that the planner stays free of the engine's torch code paths.
CAPACITY_STEP = 1024
WINDOW_STEP = 256


def decode_rows(rows: int, context_tokens: int, static_decoder: bool, cuda_graphs: bool) -> tuple[int, int]:
    """(rows, columns) of the KV cache a rollout of `rows` episodes at `context_tokens` holds: the hf engine's as they
    are, the static engine's as it rounds them."""
    if not static_decoder or rows == 0:
        return rows, context_tokens
    columns = CAPACITY_STEP * math.ceil(context_tokens / CAPACITY_STEP)
    return (1 << (rows - 1).bit_length() if cuda_graphs else rows), columns


def kv_cache(name: str, shape: ModelShape, context_tokens: int, rows: int, a: int, static_decoder: bool,
             cuda_graphs: bool) -> tuple[str, int]:
    rows, columns = decode_rows(rows, context_tokens, static_decoder, cuda_graphs)
    return name, 2 * shape.layers * shape.kv_heads * shape.head_dim * columns * rows * a


def decode_graphs(shape: ModelShape, context_tokens: int, rows: int, a: int, used: bool) -> tuple[str, int]:
    """The static engine's CUDA graphs: each row bucket's captured logits [bucket, vocab] stay alive with its graph
    (the buckets 1, 2, 4, ... sum to under twice the largest), and one memory pool, shared by the graphs because they
    replay one at a time, holds the largest step's temporaries: its logits in the compute dtype and fp32, the MLP's
    three [bucket, intermediate] tensors, a few [bucket, hidden] fp32 ones, and the attention mask over the window.
    An estimate from the step's code, not a measurement."""
    if not used or rows == 0:
        return "decode graphs (outputs and pool)", 0
    bucket, _ = decode_rows(rows, context_tokens, True, True)
    window = WINDOW_STEP * math.ceil(context_tokens / WINDOW_STEP)
    outputs = (2 * bucket - 1) * shape.vocab * a
    pool = bucket * (shape.vocab * (a + 4) + 3 * shape.intermediate * a + 6 * shape.hidden * 4 + window * a)
    return "decode graphs (outputs and pool)", outputs + pool


def static_decoder_copy(shape: ModelShape, precision: str, used: bool, adapter: int = 0) -> tuple[str, int]:
    """The static decode engine's own copy of the weights (agent/engine/decode.py), in the rollout's dtype: bf16 under bf16
    compute, else fp32, and of a LoRA adapter's `adapter` parameters, which it keeps beside them unmerged. Its KV cache
    takes the place of the KV-cache row (preallocated to the batch's context)."""
    return ("static decoder's weight copy", (shape.parameters + adapter) * value_bytes(precision) if used else 0)


def rows_that_fit(plan_for: Callable[[int], MemoryPlan], budget_bytes: float, most: int) -> int:
    """The most rollout rows, 1 to `most`, whose plan fits `budget_bytes` (1 where none does). The plan never shrinks as
    rows grow, but with the static engine's rounding (decode_rows) it grows in steps, not linearly: bisect."""
    if plan_for(most).total <= budget_bytes:
        return most
    low, high = 1, most  # plan_for(high) does not fit
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if plan_for(middle).total <= budget_bytes else (low, middle)
    return low


def device_budget(device: torch.device) -> float | None:
    """Bytes this process can plan with on a GPU: what is free on the card plus what its allocator already holds
    (the weights loaded so far are in both the plan and the held part). None on a CPU: no budget is known there."""
    if device.type != "cuda":
        return None
    free, _ = torch.cuda.mem_get_info(device)
    return float(free + torch.cuda.memory_reserved(device))
