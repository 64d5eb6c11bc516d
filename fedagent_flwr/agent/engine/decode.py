"""A decoder with a preallocated KV cache for Qwen2- and Llama-shaped causal LMs: the rollout's "static" engine.

Why it exists: on an H100 the transformers forward takes 38 ms per token step of a 1.5B model at batch 128 where
reading the weights and the KV cache takes about 3 ms (docs/gpu-measurements.md). The time goes to the
host: about 1,130 kernel launches per step, autocast casting every fp32 weight to bf16 in every forward, the
KV cache growing by `torch.cat`, and the masked attention path expanding 2 KV heads to 12. This decoder removes
each of those causes:

- its own copy of the weights in the rollout's dtype (bf16 when the rollout runs under bf16 autocast), q/k/v and
  gate/up fused into one matrix each, refreshed in place from the model at every `start` (a few ms; on N ranks
  once a rollout, one FSDP unit gathered at a time: `pinned`), so no forward casts a weight; a PEFT LoRA model's
  adapters are copied beside it, unmerged (x W + (x A) B', B' = B x scaling, the adapters of a fused matrix's parts
  side by side: A stacked, B' block by block), as PEFT's forward computes them. Why not merged: in bf16 a weight
  moves only by steps of 2^-8 of its size, and an adapter's delta smaller than half a step rounds away whole (a LoRA
  trained for a few steps at a small learning rate is mostly such deltas); only an adapter on the output head is
  merged;
- a KV cache preallocated as [layers, rows, kv_heads, max_len, head_dim]: a token step writes one column;
- per-row positions (each row's RoPE position is its own token count, so left padding changes nothing) and a
  boolean mask of the key slots each row may attend to;
- a prefill of each distinct prompt once, and of a prefix that a group of prompts shares (a task's text under
  its episodes' histories) once per group (prefill_plan.py), into the cache layout of whole prompts;
- attention through `scaled_dot_product_attention` with the query heads that share a KV head folded into the
  query-length axis, so the KV heads are never expanded. Why not `enable_gqa=True`: combined with a mask, torch
  sends `enable_gqa` to its math kernel, which expands the heads itself (torch's memory-efficient and flash
  kernels take no GQA with a mask); the fold is exact, and any kernel that takes a mask runs it;
- on CUDA, each token step captured once as a CUDA graph per (rows bucket, attention window) and replayed: one
  launch per step instead of one per kernel. Finished rows stay in the batch, masked out of the sampling, until
  the live rows fit the next smaller bucket; then the batch is compacted;
- optionally (`kernels="compile"`, the run-config key rollout.kernels), each layer's element-wise work in the token
  step fused by torch.compile around the matrix products (`_layer_halves`).

Numerics: in fp32 the rows equal the transformers model's up to rounding (same RMSNorm eps, RoPE inverse
frequencies read from the model, attention biases, tied head); tests/agent/test_decode.py checks the greedy
tokens against the "hf" sampler and the per-step log-probs within 1e-4. In bf16 the matmuls, attention and KV
cache are bf16 while the residual stream and the norms stay fp32 (as under autocast).

What it refuses (`UnsupportedModel`, so the "auto" engine falls back to the transformers loop): other
architectures, RoPE scaling, sliding-window layers, activations other than SiLU, LoRA variants (DoRA, lora_bias)
and adapter types other than LoRA on linear layers, models spread over devices.

Memory it keeps per model (until `release(model)`): the weight copy (2 bytes a parameter in bf16), the KV cache
at the largest batch x context seen, and on CUDA the graphs' memory pool (their logits and activations).
The sampling loop that drives it is `sampling.fast_sample_batch`.
"""

from __future__ import annotations

import contextlib
import functools
import math
import sys
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from fedagent_flwr.agent.engine.attention import variable_shape_attention
from fedagent_flwr.agent.engine.prefill_plan import PrefillPlan, plan_prefill
from fedagent_flwr.config.choices import KERNELS

SUPPORTED = {"Qwen2ForCausalLM": "qwen2", "LlamaForCausalLM": "llama"}
# The cache grows in steps of this many columns (a reallocation drops the CUDA graphs, which hold its address).
CAPACITY_STEP = 1024
# With CUDA graphs, attention reads a fixed window of key slots per graph: the context rounded up to this. A
# coarser step means fewer graphs, a finer one fewer masked slots read per step.
WINDOW_STEP = 256
# Prefill processes the distinct prompts in chunks of about this many (padded) tokens, bounding its activations.
PREFILL_TOKENS = 16384
# A layer's linear groups, each one matrix in the copy (q/k/v and gate/up fused): [weight, bias, lora_a, lora_b]
_GROUPS = ("qkv", "out", "gate_up", "down")


class UnsupportedModel(ValueError):
    """The model is not one this decoder reproduces exactly; the message says why."""


def _refuse(reason: str):
    raise UnsupportedModel(f"static decode engine: {reason}; use the 'hf' engine for this model")


def _lora_types():
    if "peft" not in sys.modules:  # no adapter without peft imported; importing it would cost seconds
        return (), ()
    from peft.tuners.lora.layer import Linear as LoraLinear
    from peft.tuners.tuners_utils import BaseTunerLayer
    return LoraLinear, BaseTunerLayer


Adapter = tuple[torch.Tensor, torch.Tensor]  # a LoRA adapter as the decoder applies it: (A [r, in], B x scaling [out, r])


def _effective_linear(module: torch.nn.Module, name: str) -> tuple[torch.Tensor, torch.Tensor | None, list[Adapter]]:
    """A linear layer's weight, bias and active LoRA adapters (unmerged) as its forward applies them (PEFT's rules)."""
    lora_linear, tuner_layer = _lora_types()
    if lora_linear and isinstance(module, lora_linear):
        base = module.get_base_layer()
        if not isinstance(base, torch.nn.Linear):
            _refuse(f"{name}: LoRA over a {type(base).__name__}")
        weight = base.weight
        if module.disable_adapters:
            if module.merged:  # PEFT's forward would unmerge the weights in place here
                _refuse(f"{name}: adapters merged into the weights and then disabled")
            return weight, base.bias, []
        if module.merged:  # the merged adapters are already in the base weights
            return weight, base.bias, []
        adapters = []
        for adapter in module.active_adapters:
            if adapter not in module.lora_A:
                continue
            if adapter in getattr(module, "lora_variant", {}) or module.use_dora.get(adapter, False):
                _refuse(f"{name}: LoRA variant (DoRA or similar) in adapter {adapter!r}")
            if module.lora_bias.get(adapter, False):
                _refuse(f"{name}: lora_bias in adapter {adapter!r}")
            adapters.append((module.lora_A[adapter].weight, module.lora_B[adapter].weight * module.scaling[adapter]))
        return weight, base.bias, adapters
    if tuner_layer and isinstance(module, tuner_layer):
        _refuse(f"{name}: adapter layer {type(module).__name__} (only LoRA on linear layers is applied)")
    if type(module) is not torch.nn.Linear:
        _refuse(f"{name}: {type(module).__name__} where a torch.nn.Linear is expected")
    return module.weight, module.bias, []


@dataclass
class _Shape:
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    hidden: int
    vocab: int
    eps: float


def _base_model(model):
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def check_supported(model) -> None:
    """Raise UnsupportedModel, naming the reason, unless the decoder reproduces this model's forward."""
    base = _base_model(model)
    cls = type(base)
    # FSDP2's fully_shard gives a sharded module the class FSDP<name>(FSDPModule, <its class>)
    cls = next((b for b in cls.__bases__ if "FSDP" + b.__name__ == cls.__name__), cls)
    kind = cls.__name__
    if kind not in SUPPORTED:
        _refuse(f"{kind} is not supported (only {', '.join(SUPPORTED)})")
    config = base.config
    if getattr(config, "model_type", None) != SUPPORTED[kind]:
        _refuse(f"{kind} with model_type {getattr(config, 'model_type', None)!r}")
    rotary = base.model.rotary_emb
    if getattr(rotary, "rope_type", "default") != "default":
        _refuse(f"rope scaling {rotary.rope_type!r} is not supported")
    if any(t != "full_attention" for t in (getattr(config, "layer_types", None) or [])):
        _refuse("sliding-window attention layers are not supported")
    if getattr(config, "use_sliding_window", False) and getattr(config, "sliding_window", None):
        _refuse("sliding-window attention is not supported")
    if getattr(config, "hidden_act", "silu") != "silu":
        _refuse(f"activation {config.hidden_act!r} is not supported (only silu)")
    if config.num_attention_heads % config.num_key_value_heads:
        _refuse("query heads are not a multiple of the KV heads")
    devices = {p.device for p in model.parameters()}
    if len(devices) != 1:
        _refuse(f"parameters on {len(devices)} devices")
    if any(not p.is_floating_point() for p in model.parameters()):
        _refuse("quantized (non-floating-point) weights")
    for i, layer in enumerate(base.model.layers):
        for norm in (layer.input_layernorm, layer.post_attention_layernorm):
            if not hasattr(norm, "variance_epsilon") or not type(norm).__name__.endswith("RMSNorm"):
                _refuse(f"layer {i}: {type(norm).__name__} where an RMSNorm is expected")
    if type(base.model.embed_tokens) is not torch.nn.Embedding:
        _refuse(f"input embedding {type(base.model.embed_tokens).__name__} (adapters on embeddings are not applied)")


def _shape(base) -> _Shape:
    c = base.config
    attn = base.model.layers[0].self_attn
    return _Shape(layers=c.num_hidden_layers, heads=c.num_attention_heads, kv_heads=c.num_key_value_heads,
                  head_dim=attn.head_dim, hidden=c.hidden_size, vocab=base.lm_head.out_features,
                  eps=base.model.norm.variance_epsilon)


def _layer_sources(layer, i: int) -> dict:
    """A decoder layer's effective tensors (each linear's weight, bias and adapters), in the layout the decoder copies
    from."""
    attn, mlp = layer.self_attn, layer.mlp
    return {
        "norm_attn": layer.input_layernorm.weight, "norm_mlp": layer.post_attention_layernorm.weight,
        "qkv": [_effective_linear(getattr(attn, n), f"layer {i} {n}") for n in ("q_proj", "k_proj", "v_proj")],
        "out": [_effective_linear(attn.o_proj, f"layer {i} o_proj")],
        "gate_up": [_effective_linear(getattr(mlp, n), f"layer {i} {n}") for n in ("gate_proj", "up_proj")],
        "down": [_effective_linear(mlp.down_proj, f"layer {i} down_proj")],
        "eps": (layer.input_layernorm.variance_epsilon, layer.post_attention_layernorm.variance_epsilon),
    }


def _root_sources(base) -> dict:
    """The tensors outside the decoder layers: embeddings, final norm, head, RoPE frequencies."""
    weight, bias, adapters = _effective_linear(base.lm_head, "lm_head")
    if bias is not None:
        _refuse("an output head with a bias")
    tied = _same(weight, base.model.embed_tokens.weight)
    for a, b in adapters:  # merged (rarely trained, and it would untie the head): the one adapter not kept apart
        weight = weight + (b @ a).to(weight.dtype)
    return {"embed": base.model.embed_tokens.weight, "head": weight, "norm": base.model.norm.weight,
            "tied": tied and not adapters, "inv_freq": base.model.rotary_emb.inv_freq,
            "rope_scaling": float(base.model.rotary_emb.attention_scaling)}


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a is b or (a.data_ptr() == b.data_ptr() and a.shape == b.shape)


def _whole(module) -> contextlib.AbstractContextManager:
    return contextlib.nullcontext()


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # transformers' RMSNorm on the fp32 residual stream (x * rsqrt(mean(x^2) + eps) * weight), as torch's one
    # operator: one kernel on CUDA where the module runs six
    return F.rms_norm(x, weight.shape, weight, eps)


@functools.cache
def _layer_halves(heads: int, kv_heads: int, head_dim: int, eps: tuple[float, float], dtype: torch.dtype,
                  compiled: bool):
    """A decoder layer's two halves around its attention, as functions of tensors alone: (attention_inputs,
    layer_output). Compiled (`kernels="compile"`), torch.compile fuses each half's element-wise operations (the
    norms and their casts, RoPE, SiLU times up, the residual adds) into a few kernels around the matrix products:
    in a token step they are small, so their number, not their bytes, sets their time. Dynamo keeps what it
    compiles with the functions' code, guarded on the shapes and on these constants, so every layer and every later
    decoder of the model (a rollout builds one per call) reuses it; the batch dimension turns dynamic at the second
    bucket size. Eager, they are the same code run as it is."""
    split = (heads + kv_heads) * head_dim

    def attention_inputs(h, norm, qkv, cos, sin):
        x = _rms_norm(h, norm, eps[0]).to(dtype)
        y = _linear(x, *qkv)
        qk = y[..., :split].unflatten(-1, (heads + kv_heads, head_dim))  # [n, S, heads + kv, D]
        # RoPE on q and k at once, in fp32 (a bf16 q times fp32 cos is computed in fp32, as under autocast)
        qk = (qk * cos + qk.roll(head_dim // 2, dims=-1) * sin).to(dtype)
        q, k = qk[:, :, :heads].transpose(1, 2), qk[:, :, heads:].transpose(1, 2)
        v = y[..., split:].unflatten(-1, (kv_heads, head_dim)).transpose(1, 2)
        return q, k, v

    def layer_output(h, attended, out, norm, gate_up, down):
        # the residual stream stays fp32: adding a bf16 output to it promotes inside the one add kernel
        h = h + _linear(attended, *out)
        x = _rms_norm(h, norm, eps[1]).to(dtype)
        gate, up = _linear(x, *gate_up).chunk(2, dim=-1)
        return h + _linear(F.silu(gate) * up, *down)

    if compiled:
        return torch.compile(attention_inputs, fullgraph=True), torch.compile(layer_output, fullgraph=True)
    return attention_inputs, layer_output


def _linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, lora_a: torch.Tensor | None,
            lora_b: torch.Tensor | None) -> torch.Tensor:
    """x W^T + b, plus the adapters' (x A^T) B'^T where the matrix has any (a fused matrix's parts' side by side)."""
    y = F.linear(x, weight, bias)
    return y if lora_a is None else y + F.linear(F.linear(x, lora_a), lora_b)


def _adapter_ranks(parts) -> int:
    return sum(a.shape[0] for _, _, adapters in parts for a, _ in adapters)


def _fused(parts: list[tuple[torch.Tensor, torch.Tensor | None, list[Adapter]]], dtype, device) -> list:
    """Buffers [weight, bias, lora_a, lora_b] for the row-stacked weights of `parts`: the bias where any part has one,
    and where any part has adapters, their A matrices stacked [ranks, in] and their B' matrices placed block by block
    [rows, ranks] (zero off each adapter's own block, so each part's rows read only its own adapters)."""
    rows, ranks = sum(w.shape[0] for w, _, _ in parts), _adapter_ranks(parts)
    weight = torch.empty((rows, parts[0][0].shape[1]), dtype=dtype, device=device)
    bias = torch.zeros(rows, dtype=dtype, device=device) if any(b is not None for _, b, _ in parts) else None
    if not ranks:
        return [weight, bias, None, None]
    return [weight, bias, torch.empty((ranks, weight.shape[1]), dtype=dtype, device=device),
            torch.zeros((rows, ranks), dtype=dtype, device=device)]


def _fits(buffers: list, parts) -> bool:
    """Whether `buffers` (_fused's) hold `parts`' adapters as they are now (an adapter attached, detached or of
    another rank needs new ones)."""
    return (0 if buffers[2] is None else buffers[2].shape[0]) == _adapter_ranks(parts)


def _copy_fused(buffers: list, parts) -> None:
    weight, bias, lora_a, lora_b = buffers
    if lora_b is not None:  # another layout of the same ranks (an adapter moved to another part) leaves no block behind
        lora_b.zero_()
    start = rank = 0
    for w, b, adapters in parts:
        weight[start:start + w.shape[0]].copy_(w)
        if bias is not None:
            if b is None:
                bias[start:start + w.shape[0]].zero_()
            else:
                bias[start:start + w.shape[0]].copy_(b)
        for a, b_scaled in adapters:
            lora_a[rank:rank + a.shape[0]].copy_(a)
            lora_b[start:start + w.shape[0], rank:rank + a.shape[0]].copy_(b_scaled)
            rank += a.shape[0]
        start += w.shape[0]


class StaticDecoder:
    """Prefill and token steps of one model over a preallocated KV cache; see the module docstring.

    Use: `logits = d.start(prompts, pad_id, max_new_tokens)` (next-token logits of every prompt), then per step
    `d.keep(index)` to drop finished rows (index into the live rows) and `logits = d.step(tokens)` with one token
    per live row; the rows keep their order.
    """

    def __init__(self, model, dtype: torch.dtype | None = None, cuda_graphs: bool = True,
                 bucketed: bool | None = None, share_prefixes: bool = True, kernels: str = "eager",
                 gathered: Callable | None = None) -> None:
        if kernels not in KERNELS:
            raise ValueError(f"rollout.kernels={kernels!r} is not allowed: expected {' | '.join(KERNELS)}")
        check_supported(model)
        # The token step's element-wise work: "eager" as written, "compile" fused by torch.compile (_layer_halves).
        # The prefill stays eager: its matrix products dominate, and its shapes change with every batch of prompts.
        self.kernels = kernels
        base = _base_model(model)
        self.shape = _shape(base)
        weight = base.model.embed_tokens.weight  # on N ranks a shard: its device and dtype are the whole weight's
        self.device = weight.device
        self.dtype = dtype or weight.dtype
        self.graphs_on = cuda_graphs and self.device.type == "cuda"
        # Bucketed: steps over power-of-two row counts and a fixed attention window, as a graph replays them.
        # On by itself only with graphs; tests switch it on without them to run the same bookkeeping on a CPU.
        self.bucketed = self.graphs_on or bool(bucketed)
        # Prefill the prefixes that groups of prompts share once per group (prefill_plan.py); off: every distinct
        # prompt whole, for benchmarks/prefill_profile.py to set beside it.
        self.share_prefixes = share_prefixes
        self.embed = None  # the weight copy, allocated by the first refresh, one unit at a time as it copies
        self.layers: list[dict | None] = [None] * self.shape.layers
        self.graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.pool = None
        self.refresh(model, gathered)
        self.capacity = (0, 0)  # rows, columns of the KV cache

    # ----- weights
    @torch.no_grad()
    def refresh(self, model, gathered: Callable | None = None) -> None:
        """Copy the model's current weights in place (the CUDA graphs keep reading the same buffers). `gathered(unit)`
        is a context in which a unit's own weights are whole (fsdp/ranks.py `gathered` on N ranks): the root's (the
        embeddings, the final norm and the head), then each decoder layer's, one at a time, so the whole weights are
        never gathered at once, only this copy in the rollout's dtype."""
        gathered = gathered or _whole
        base = _base_model(model)
        with gathered(model):
            src = _root_sources(base)
            if self.embed is None:
                self._allocate_root(src)
            self.embed.copy_(src["embed"])
            if self.head is not self.embed:
                self.head.copy_(src["head"])
            self.norm.copy_(src["norm"])
            self.inv_freq.copy_(src["inv_freq"])
            self.rope_scaling = src["rope_scaling"]
        for i, module in enumerate(base.model.layers):
            with gathered(module):
                s = _layer_sources(module, i)
                layer = self.layers[i]
                if layer is None or not all(_fits(layer[g], s[g]) for g in _GROUPS):
                    layer = self.layers[i] = self._allocate_layer(s)
                    self.graphs.clear()  # they read the buffers this layer had
                layer["norm_attn"].copy_(s["norm_attn"])
                layer["norm_mlp"].copy_(s["norm_mlp"])
                layer["eps"] = s["eps"]
                for group in _GROUPS:
                    _copy_fused(layer[group], s[group])

    def _allocate_root(self, src: dict) -> None:
        dt, dev = self.dtype, self.device
        self.embed = torch.empty(src["embed"].shape, dtype=dt, device=dev)
        self.head = self.embed if src["tied"] else torch.empty(src["head"].shape, dtype=dt, device=dev)
        self.norm = torch.empty(src["norm"].shape, dtype=torch.float32, device=dev)
        self.inv_freq = torch.empty(src["inv_freq"].shape, dtype=torch.float32, device=dev)

    def _allocate_layer(self, s: dict) -> dict:
        dt, dev = self.dtype, self.device
        return {"norm_attn": torch.empty(s["norm_attn"].shape, dtype=torch.float32, device=dev),
                "norm_mlp": torch.empty(s["norm_mlp"].shape, dtype=torch.float32, device=dev),
                **{group: _fused(s[group], dt, dev) for group in _GROUPS}, "eps": s["eps"]}

    # ----- the model's forward, on one chunk of tokens
    def _rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin [..., 1, D] of transformers' default RoPE (fp32 angles from the model's own inverse
        frequencies), sin with its first half negated: x * cos + rotate_half(x) * sin is then
        x * cos + x.roll(D / 2) * sin, one kernel less, the same numbers (a sign flip is exact)."""
        freqs = positions.float()[..., None] * self.inv_freq
        angles = torch.cat((freqs, freqs), dim=-1)
        cos, sin = angles.cos() * self.rope_scaling, angles.sin() * self.rope_scaling
        half = sin.shape[-1] // 2
        sin = torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)
        return cos[..., None, :], sin[..., None, :]

    def _additive_mask(self, allowed: torch.Tensor) -> torch.Tensor:
        """0 where a key may be attended, -inf elsewhere, in the attention's dtype: built once per forward, not
        once per layer as SDPA would from a boolean mask."""
        return torch.zeros(allowed.shape, dtype=self.dtype, device=allowed.device).masked_fill_(~allowed, float("-inf"))

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """q [n, heads, S, D], k/v [n, kv_heads, T, D], mask [n, 1, group * S or 1, T] (additive) -> [n, S, heads * D].

        The query heads that share a KV head (transformers orders them KV-head-major) become rows of the query
        axis, so each KV head is read as it is: [n, kv, group * S, D] against [n, kv, T, D].
        """
        n, heads, s, d = q.shape
        kv = k.shape[1]
        out = F.scaled_dot_product_attention(q.reshape(n, kv, heads // kv * s, d), k, v, attn_mask=mask, scale=d ** -0.5)
        return out.reshape(n, heads, s, d).transpose(1, 2).reshape(n, s, heads * d)

    def _fold_mask(self, allowed: torch.Tensor) -> torch.Tensor:
        """The additive mask for `_attend` from a boolean [n, S, T]: each query row repeated for its group."""
        n, s, t = allowed.shape
        group = self.shape.heads // self.shape.kv_heads
        if s > 1:
            allowed = allowed[:, None].expand(n, group, s, t).reshape(n, group * s, t)
        return self._additive_mask(allowed[:, None])  # S = 1: [n, 1, 1, T] broadcasts over the group's rows

    def _qkv(self, layer: dict, h: torch.Tensor, cos, sin, compiled: bool = False):
        """The layer's normed input projected to RoPE'd q [n, heads, S, D], k and v [n, kv, S, D]."""
        attention_inputs = self._halves(layer, compiled)[0]
        return attention_inputs(h, layer["norm_attn"], layer["qkv"], cos, sin)

    def _finish_layer(self, layer: dict, h: torch.Tensor, attended: torch.Tensor, compiled: bool = False) -> torch.Tensor:
        """Output projection, residual, MLP, residual."""
        layer_output = self._halves(layer, compiled)[1]
        return layer_output(h, attended, layer["out"], layer["norm_mlp"], layer["gate_up"], layer["down"])

    def _halves(self, layer: dict, compiled: bool):
        sh = self.shape
        return _layer_halves(sh.heads, sh.kv_heads, sh.head_dim, tuple(layer["eps"]), self.dtype, compiled)

    def _logits(self, h: torch.Tensor) -> torch.Tensor:
        return F.linear(_rms_norm(h, self.norm, self.shape.eps).to(self.dtype), self.head)

    # ----- KV cache and row bookkeeping
    def _ensure_capacity(self, rows: int, columns: int) -> None:
        have_rows, have_cols = self.capacity
        if rows <= have_rows and columns <= have_cols:
            return
        rows, columns = max(rows, have_rows), max(CAPACITY_STEP * math.ceil(columns / CAPACITY_STEP), have_cols)
        sh, dev = self.shape, self.device
        self.graphs.clear()  # they hold the old buffers' addresses
        self.k = self.v = None  # free the old cache before the new one is allocated
        kv = (sh.layers, rows, sh.kv_heads, columns, sh.head_dim)
        self.k = torch.zeros(kv, dtype=self.dtype, device=dev)
        self.v = torch.zeros(kv, dtype=self.dtype, device=dev)
        self.valid = torch.zeros((rows, columns), dtype=torch.bool, device=dev)  # key slots a row attends to
        self.pos = torch.zeros(rows, dtype=torch.long, device=dev)  # each row's next RoPE position
        self.tokens = torch.zeros(rows, dtype=torch.long, device=dev)  # each row's input at the next step
        self.col = torch.zeros(1, dtype=torch.long, device=dev)  # the cache column the next step writes
        self.capacity = (rows, columns)

    def _bucket(self, n: int) -> int:
        """Rows a step computes for n live rows: n, or bucketed the smallest power of two that holds them."""
        if not self.bucketed:
            return n
        return min(b for b in self.buckets if b >= n)

    # ----- the token step
    def _step_forward(self, width: int, window: int) -> torch.Tensor:
        """One token step for the first `width` cache rows, attending over the first `window` key slots.

        Reads self.tokens/pos/col and advances pos and col on the device, so that a CUDA graph of it replays
        unchanged from step to step."""
        rows = slice(0, width)
        valid = self.valid[rows]
        valid.index_fill_(1, self.col, True)
        h = F.embedding(self.tokens[rows, None], self.embed).float()  # [width, 1, hidden]
        cos, sin = self._rope(self.pos[rows, None])
        mask = self._fold_mask(valid[:, None, :window])
        compiled = self.kernels == "compile"
        for i, layer in enumerate(self.layers):
            q, k, v = self._qkv(layer, h, cos, sin, compiled)
            self.k[i, rows].index_copy_(2, self.col, k)
            self.v[i, rows].index_copy_(2, self.col, v)
            attended = self._attend(q, self.k[i, rows, :, :window], self.v[i, rows, :, :window], mask)
            h = self._finish_layer(layer, h, attended, compiled)
        logits = self._logits(h)[:, 0]
        self.pos[rows].add_(1)
        self.col.add_(1)
        return logits

    def _capture(self, width: int, window: int) -> None:
        """Record the step for (width, window) as a CUDA graph. Runs before a prefill: its warm-up steps write
        the cache, which the prefill then overwrites."""
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()  # the graphs replay one at a time on one stream
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):  # warm-up off the capture (library handles, workspaces), as CUDA asks
            for _ in range(2):
                self.col.zero_()
                self._step_forward(width, window)
        torch.cuda.current_stream().wait_stream(stream)
        self.col.zero_()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            out = self._step_forward(width, window)
        self.graphs[(width, window)] = (graph, out)

    # ----- the public steps
    @torch.no_grad()
    def start(self, prompts: Sequence[Sequence[int]], pad_id: int, max_new_tokens: int) -> torch.Tensor:
        """Prefill the prompts (each distinct prompt once; a prefix that several share once, prefill_plan.py) and
        return every row's next-token logits [n, V]."""
        with torch.autocast(self.device.type, enabled=False):  # dtypes are this decoder's own
            return self._start(prompts, pad_id, max_new_tokens)

    def _start(self, prompts, pad_id: int, max_new_tokens: int) -> torch.Tensor:
        n = len(prompts)
        width = max(len(p) for p in prompts)  # every row's tokens end in column width - 1, left-padded
        steps = max(max_new_tokens - 1, 0)  # the last sampled token is never fed back
        needed = width + steps
        if self.bucketed:
            # Powers of two: a step is bound by reading the weights, so a few idle rows cost little, while every
            # distinct size would be another graph to capture (the live episodes of a rollout take any count).
            self.buckets = [1 << i for i in range((n - 1).bit_length() + 1)]
            self.window = WINDOW_STEP * math.ceil(needed / WINDOW_STEP)
        self._ensure_capacity(self.buckets[-1] if self.bucketed else n, needed)
        if self.graphs_on and steps:
            for b in self.buckets:
                if (b, self.window) not in self.graphs:
                    self._capture(b, self.window)

        distinct: dict[tuple[int, ...], int] = {}
        source = [distinct.setdefault(tuple(p), len(distinct)) for p in prompts]
        plan = plan_prefill(list(distinct)) if self.share_prefixes else PrefillPlan.whole(list(distinct))
        self.last_plan = plan
        lengths = torch.as_tensor([len(p) for p in prompts], dtype=torch.long, device=self.device)
        self.valid[:n].zero_()
        self.valid[:n, :width] = torch.arange(width, device=self.device) >= width - lengths[:, None]
        if plan.prefixes:  # each group's prefix once, into the columns it takes in every member's row
            self._prefill_prefixes(plan, source, pad_id, width)
        shared = [plan.shared(j) for j in range(len(plan.prompts))]
        rests = [p[k:] for p, k in zip(plan.prompts, shared)]
        logits = torch.empty((len(rests), self.shape.vocab), dtype=self.dtype, device=self.device)
        per_chunk = max(1, PREFILL_TOKENS // width)
        for lo in range(0, len(rests), per_chunk):
            hi = min(lo + per_chunk, len(rests))
            rows = [r for r, s in enumerate(source) if lo <= s < hi]
            logits[lo:hi] = self._prefill(rests[lo:hi], shared[lo:hi], pad_id, width, rows,
                                          [source[r] - lo for r in rows], after_prefixes=bool(plan.prefixes))
        self.pos[:n] = lengths
        self.col.fill_(width)
        self.live = torch.arange(n, device=self.device)  # the cache row of each live row, ascending
        self.width = self._bucket(n)
        self.next_col = width  # host copy of self.col, for the eager window
        return logits[torch.as_tensor(source, device=self.device)]

    def _padded(self, prompts: list, pad_id: int, first_pos: list[int]):
        """Left-padded ids [n, w], which of them are real [n, w] and their RoPE positions, prompt i's from
        first_pos[i] on; w is the longest prompt's length."""
        w = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), w), pad_id, dtype=torch.long)
        real = torch.zeros((len(prompts), w), dtype=torch.bool)
        for i, p in enumerate(prompts):
            ids[i, w - len(p):] = torch.as_tensor(p, dtype=torch.long)
            real[i, w - len(p):] = True
        ids, real = ids.to(self.device), real.to(self.device)
        first = torch.as_tensor(first_pos, dtype=torch.long, device=self.device)
        return ids, real, first[:, None] + (real.long().cumsum(-1) - 1).clamp(min=0)

    def _causal_mask(self, real: torch.Tensor) -> torch.Tensor:
        """Each real position attends to the real ones up to itself; a padding position to itself only, so that
        its row stays finite (no real position attends to it)."""
        w = real.shape[1]
        causal = torch.ones((w, w), dtype=torch.bool, device=self.device).tril()
        return self._fold_mask((causal & real[:, None, :]) | torch.eye(w, dtype=torch.bool, device=self.device))

    def _write(self, cache: torch.Tensor, layer: int, rows: torch.Tensor, lo: int, hi: int, new: torch.Tensor,
               where: torch.Tensor | None = None) -> None:
        """cache[layer, rows, :, lo:hi] = new, or only where `where` is true (keeping what else is there)."""
        if where is not None:
            new = torch.where(where, new, cache[layer, rows, :, lo:hi])
        cache[layer, rows, :, lo:hi] = new

    def _layers(self, ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, store, last_output: bool = True):
        """A prefill's forward through the layers; `store(i, k, v)` writes layer i's keys and values into the cache
        and returns the keys and values its queries attend to. Returns the last hidden states (last_output)."""
        h = F.embedding(ids, self.embed).float()
        cos, sin = self._rope(positions)
        with variable_shape_attention(self.device):  # each turn's prompts have a width of their own (attention.py)
            for i, layer in enumerate(self.layers):
                q, k, v = self._qkv(layer, h, cos, sin)
                keys, values = store(i, k, v)
                if last_output or i + 1 < len(self.layers):  # else the last layer's output feeds nothing
                    h = self._finish_layer(layer, h, self._attend(q, keys, values, mask))
        return h

    def _prefill_prefixes(self, plan: PrefillPlan, source: list[int], pad_id: int, width: int) -> None:
        """Run the plan's group prefixes through the layers and write each one's keys and values into every member
        row, at the columns the prefix takes there (a row's prompt ends in column width - 1)."""
        dev, sh = self.device, self.shape
        prefixes = [list(p) for p in plan.prefixes]
        per_chunk = max(1, PREFILL_TOKENS // plan.prefix_width)
        for lo in range(0, len(prefixes), per_chunk):
            chunk = prefixes[lo:lo + per_chunk]
            rows = [r for r, s in enumerate(source) if lo <= plan.group_of[s] < lo + len(chunk)]
            group = torch.as_tensor([plan.group_of[source[r]] - lo for r in rows], dtype=torch.long, device=dev)
            first = torch.as_tensor([width - len(plan.prompts[source[r]]) for r in rows], dtype=torch.long, device=dev)
            ids, real, positions = self._padded(chunk, pad_id, [0] * len(chunk))
            w = ids.shape[1]
            # cache column c of a row holds its prefix's token t = c - (the row's first column) where 0 <= t < the
            # prefix's length, found in column w - length + t of this pass
            length = torch.as_tensor([len(p) for p in chunk], dtype=torch.long, device=dev)[group][:, None]
            t = torch.arange(width, device=dev)[None, :] - first[:, None]
            placed = ((t >= 0) & (t < length))[:, None, :, None]
            index = (w - length + t).clamp(0, w - 1)[:, None, :, None].expand(len(rows), sh.kv_heads, width, sh.head_dim)
            rows_t = torch.as_tensor(rows, dtype=torch.long, device=dev)

            def store(i, k, v):  # each member row gets its group's prefix, at its own columns
                self._write(self.k, i, rows_t, 0, width, k[group].gather(2, index), placed)
                self._write(self.v, i, rows_t, 0, width, v[group].gather(2, index), placed)
                return k, v

            self._layers(ids, positions, self._causal_mask(real), store, last_output=False)

    def _prefill(self, prompts: list, first_pos: list[int], pad_id: int, width: int, rows: list[int], src: list[int],
                 after_prefixes: bool) -> torch.Tensor:
        """Run left-padded prompts through the layers into the last columns of the cache rows `rows` (row rows[j]
        gets prompt src[j]) and return the last position's logits of each. Prompt i's tokens take RoPE positions
        first_pos[i], first_pos[i] + 1, ... After a prefix pass, they attend to everything valid before them in
        their row (their group's prefix) and are written only where they are real, keeping that prefix."""
        dev, n = self.device, len(prompts)
        ids, real, positions = self._padded(prompts, pad_id, first_pos)
        w = ids.shape[1]
        col0 = width - w
        rows_t = torch.as_tensor(rows, dtype=torch.long, device=dev)
        src_t = torch.as_tensor(src, dtype=torch.long, device=dev)
        if after_prefixes:
            first_row: dict[int, int] = {}  # every row of a prompt holds the same prefix: read it from one
            for r, s in zip(rows, src):
                first_row.setdefault(s, r)
            reads = torch.as_tensor([first_row[i] for i in range(n)], dtype=torch.long, device=dev)
            columns = torch.arange(width, device=dev)
            query_columns = col0 + torch.arange(w, device=dev)
            up_to = columns[None, :] <= query_columns[:, None]  # [w, width]
            allowed = (self.valid[reads, None, :width] & up_to) | (columns[None, :] == query_columns[:, None])
            mask = self._fold_mask(allowed)
            written = real[src_t][:, None, :, None]

            def store(i, k, v):  # the real tokens only, after the prefix; attend to the whole row as it now is
                self._write(self.k, i, rows_t, col0, width, k[src_t], written)
                self._write(self.v, i, rows_t, col0, width, v[src_t], written)
                return self.k[i, reads, :, :width], self.v[i, reads, :, :width]
        else:
            mask = self._causal_mask(real)

            def store(i, k, v):
                self._write(self.k, i, rows_t, col0, width, k[src_t])
                self._write(self.v, i, rows_t, col0, width, v[src_t])
                return k, v
        h = self._layers(ids, positions, mask, store)
        return self._logits(h[:, -1:])[:, 0]

    @torch.no_grad()
    def keep(self, index: torch.Tensor) -> None:
        """Keep only the live rows at `index` (ascending positions in the live rows); compact the cache when the
        rest fits a smaller batch."""
        self.live = self.live[index]
        n = len(self.live)
        if self._bucket(n) == self.width:
            return  # with graphs: finished rows ride along, masked out of the sampling, until a bucket is free
        cols = self.next_col
        for i in range(self.shape.layers):  # layer by layer: the gather's temporary stays one layer's size
            self.k[i, :n, :, :cols] = self.k[i, self.live, :, :cols]
            self.v[i, :n, :, :cols] = self.v[i, self.live, :, :cols]
        self.valid[:n] = self.valid[self.live]
        self.pos[:n] = self.pos[self.live]
        self.live = torch.arange(n, device=self.device)
        self.width = self._bucket(n)

    @torch.no_grad()
    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """Feed one token per live row; returns the live rows' next-token logits [n_live, V] (a new tensor)."""
        self.tokens.index_copy_(0, self.live, tokens.to(self.device))
        with torch.autocast(self.device.type, enabled=False):
            if self.graphs_on:
                graph, out = self.graphs[(self.width, self.window)]
                graph.replay()
            else:
                out = self._step_forward(self.width, self.window if self.bucketed else self.next_col + 1)
        self.next_col += 1
        # index_select copies: a graph's output buffer is overwritten by its next replay
        return out.index_select(0, self.live)


_DECODERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_PINNED: weakref.WeakSet = weakref.WeakSet()  # models whose decoder is used as it is (`pinned`)


def decoder_for(model, dtype: torch.dtype | None = None, cuda_graphs: bool = True, kernels: str = "eager",
                gathered: Callable | None = None) -> StaticDecoder:
    """The model's decoder, built on first use and kept (with its KV cache and graphs) while the model lives;
    its weights are refreshed from the model on every call, except inside `pinned(model)`."""
    d = _DECODERS.get(model)
    want = dtype or next(model.parameters()).dtype
    fits = d is not None and d.dtype == want and d.graphs_on == (cuda_graphs and d.device.type == "cuda") \
        and d.device == next(model.parameters()).device and d.kernels == kernels
    if model in _PINNED:
        if not fits:  # building one here would gather weights without the other ranks
            raise RuntimeError(f"the decoder pinned for this rollout does not match the one asked for (dtype {want}, "
                               f"kernels {kernels!r})")
        return d
    if not fits:
        _DECODERS.pop(model, None)
        d = StaticDecoder(model, want, cuda_graphs, kernels=kernels, gathered=gathered)
        _DECODERS[model] = d
    else:
        d.refresh(model, gathered)
    return d


@contextlib.contextmanager
def pinned(model, dtype: torch.dtype | None = None, cuda_graphs: bool = True, kernels: str = "eager",
           gathered: Callable | None = None):
    """Inside: the model's decoder built or refreshed once, on entry, with `gathered` (see StaticDecoder.refresh), and
    every decoder_for(model) returns it as it is. Why: on N ranks each rank decodes its own episodes, which end after
    their own number of steps, so nothing inside may gather weights from the other ranks."""
    d = decoder_for(model, dtype, cuda_graphs, kernels, gathered)
    _PINNED.add(model)
    try:
        yield d
    finally:
        _PINNED.discard(model)


def release(model) -> None:
    """Drop the model's decoder: its weight copy, KV cache and CUDA graphs."""
    _DECODERS.pop(model, None)
