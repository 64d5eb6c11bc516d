"""Token-level plumbing shared by behaviour cloning and GRPO.

A training sample is one agent step: the prompt's token ids and the completion
the model wrote (or should write). Only completion tokens are scored; prompt and
padding tokens - the environment's text - are masked out.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence

import torch
from torch.utils.checkpoint import checkpoint

from fedagent_flwr.agent.engine.attention import variable_shape_attention
from fedagent_flwr.agent.fsdp.ranks import as_root_forward


# Below this many shared tokens a separate prefix pass costs more than it saves.
MIN_SHARED_PREFIX = 8


def shared_prefix(prompts: Sequence[Sequence[int]]) -> list[int]:
    """The longest common prefix, always leaving every prompt at least one token of its own."""
    first = list(prompts[0])
    n = min(len(p) for p in prompts) - 1
    for p in prompts[1:]:
        k = 0
        while k < n and p[k] == first[k]:
            k += 1
        n = k
    return first[:max(n, 0)]


def forward_parameters(model) -> set[str]:
    """The keywords the transformers model's forward takes (a PEFT wrapper's forward only passes them on)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return set(inspect.signature(base.forward).parameters)


def last_logits_only(model) -> dict:
    """The forward keyword that scores the last position only: prefill needs its next-token logits alone, and the LM
    head over every prompt token is a sizeable share of a small model's prefill.

    The position is given as an index tensor, not as logits_to_keep=1: transformers then slices the hidden states
    with a slice, a [batch, 1, hidden] view that is not contiguous, and torch's matmul, given such a view and a
    weight that does not require grad (a frozen base under LoRA, an evaluated model), does not fold the batch into one
    matrix product but expands the weight to [batch, hidden, vocab] and copies it: a bf16 SmolLM2 prefill of 32
    prompts took about twice as long (benchmarks/prefill_head.py; docs/performance.md). An index tensor makes a
    contiguous copy instead, of one row per prompt."""
    if "logits_to_keep" not in forward_parameters(model):
        return {}
    return {"logits_to_keep": torch.tensor([-1], device=next(model.parameters()).device)}


def cache_name(model) -> str:
    """The KV cache's keyword and output field: transformers 5.24 renamed `past_key_values` to `cache` and
    drops the old name in 5.40; earlier 5.x releases know only the old one."""
    return "cache" if "cache" in forward_parameters(model) else "past_key_values"


def collate(samples: Sequence[tuple[Sequence[int], Sequence[int]]], pad_id: int,
            share_prefix: bool = False) -> dict[str, torch.Tensor]:
    """Right-pad prompt+completion sequences; mark which positions hold completion tokens.

    share_prefix: where the prompts share at least MIN_SHARED_PREFIX leading tokens (the chat template's system
    message, the environment's instructions and task), those go to "prefix_ids" once and every row holds only the
    rest; completion_logprobs then computes the prefix's keys and values once for the whole batch."""
    prefix = shared_prefix([p for p, _ in samples]) if share_prefix and len(samples) > 1 else []
    cut = len(prefix) if len(prefix) >= MIN_SHARED_PREFIX else 0
    lengths = [len(p) - cut + len(c) for p, c in samples]
    width = max(lengths)
    input_ids = torch.full((len(samples), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(samples), width), dtype=torch.long)
    completion_mask = torch.zeros((len(samples), width), dtype=torch.bool)
    for i, (prompt, completion) in enumerate(samples):
        n_p, n_c = len(prompt) - cut, len(completion)
        input_ids[i, : n_p + n_c] = torch.tensor(list(prompt[cut:]) + list(completion), dtype=torch.long)
        attention_mask[i, : n_p + n_c] = 1
        completion_mask[i, n_p : n_p + n_c] = True
    batch = {"input_ids": input_ids, "attention_mask": attention_mask, "completion_mask": completion_mask}
    if cut:
        batch["prefix_ids"] = torch.tensor(prefix[:cut], dtype=torch.long)
    return batch


def completion_logprobs(model: torch.nn.Module, batch: dict[str, torch.Tensor], temperature: float = 1.0,
                        chunk_tokens: int = 0, padding_mask: bool = False, with_entropy: bool = False) -> tuple[torch.Tensor, ...]:
    """Log-probabilities of each sequence's next token, and the mask of completion targets; with_entropy adds, as
    a third tensor, the entropy of each completion position's whole next-token distribution (0 elsewhere), as
    torch.unique's return_counts adds one.

    All have shape [batch, length - 1]: position t scores token t + 1. Scaling by
    the sampling temperature makes the log-probs those of the distribution the
    rollout actually sampled from. chunk_tokens > 0 takes the chunked path
    (chunked_completion_logprobs: the same values, no [batch, length, vocab] logits);
    0 runs the whole model to full logits. padding_mask: hand the model the padding mask even where a right-padded
    batch needs none (model_attention_mask).
    """
    device = next(model.parameters()).device
    with variable_shape_attention(device):  # a micro-batch's padded length is new almost every time
        if chunk_tokens > 0:
            scored = chunked_completion_logprobs(model, batch, temperature, chunk_tokens, padding_mask, with_entropy)
        else:
            scored = _full_completion_logprobs(model, batch, temperature, device, padding_mask, with_entropy)
    return scored if with_entropy else scored[:2]


def to_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor copied to `device` without the host waiting: a plain copy to a GPU waits for all the work queued
    before it; one from pinned memory with non_blocking is queued behind that work instead (PyTorch's pinned-memory
    allocator keeps the host buffer until the copy is done). On a CPU, the tensor itself."""
    if device.type == "cuda":
        tensor = tensor.pin_memory()
    return tensor.to(device, non_blocking=True)


# Model types whose body takes a prepared mask mapping ({layer type: mask}) in place of a 2-D mask (transformers 5's
# Qwen2 and Qwen3 bodies check for one: "it may already have been prepared by e.g. generate"). Llama's does not.
MASK_MAPPING_MODELS = ("qwen2", "qwen3")


def _takes_mask_mapping(model: torch.nn.Module) -> bool:
    config = model.config
    return (getattr(config, "model_type", None) in MASK_MAPPING_MODELS
            and getattr(config, "_attn_implementation", None) == "sdpa"
            and set(getattr(config, "layer_types", None) or ["full_attention"]) == {"full_attention"})


def right_padded(attention_mask: torch.Tensor) -> bool:
    """Whether every row's pads come after all its real tokens (a 2-D mask, 1 = token)."""
    lengths = attention_mask.sum(dim=1, keepdim=True)
    return bool((attention_mask.bool() == (torch.arange(attention_mask.shape[1]) < lengths)).all())


def model_attention_mask(model: torch.nn.Module, attention_mask: torch.Tensor,
                         device: torch.device, padding_mask: bool = False) -> torch.Tensor | dict | None:
    """The attention mask to hand `model` for a batch of `collate`'s, built on the host from its 2-D mask.

    A right-padded batch needs no padding mask: its pads come after every real token of their row, and the causal mask
    already keeps a token from attending to anything after it, so every real token's output is the same without it
    (a pad's differs, and no loss or log-prob reads it). A Qwen2 or Qwen3 model under SDPA gets the mask mapping
    {"full_attention": None}: SDPA then runs its causal kernel (flash attention on a GPU). With a mask it runs the
    memory-efficient kernel, which on an H100 kept a tensor of rows x heads x width^2 (the mask's shape out to every
    head) for backward in each layer, and peaked 0.9-2.0 GiB higher at passes of 16-32 rows (docs/gpu.md). The
    mapping, not None: handed no mask, transformers looks for packed sequences in the position ids
    and reads the answer back, a wait for the device in every forward pass (seen on an H100).

    Other models: None when no row is padded; else, under SDPA, the 4-D causal-and-padding mask transformers would
    build (True = attend), which it passes through as it is (handed the 2-D mask, transformers would read it back to
    learn whether any token is padded); under other attention kernels the 2-D mask.

    padding_mask=True treats a Qwen model as the others, as before the mapping: a diagnostic that measures the mapping
    against the mask (agent/engine/passes.py, TrainingPasses.padding_mask)."""
    if right_padded(attention_mask) and not padding_mask and _takes_mask_mapping(model):
        return {"full_attention": None}
    if bool(attention_mask.all()):
        return None
    if getattr(model.config, "_attn_implementation", None) != "sdpa":
        return to_device(attention_mask, device)
    length = attention_mask.shape[1]
    causal = torch.ones(length, length, dtype=torch.bool).tril()
    return to_device(causal & attention_mask.bool()[:, None, None, :], device)


def body_inputs(model: torch.nn.Module, batch: dict[str, torch.Tensor], input_ids: torch.Tensor, device: torch.device,
                padding_mask: bool = False) -> dict:
    """The keywords of a forward over a `collate` batch's rows (`input_ids`: its rows on the device).

    Without "prefix_ids": the rows alone, no KV cache (a training forward needs none; transformers would build one
    for the whole sequence). With them: the prefix runs once, as one row, and its keys and values are repeated for
    every row (repeat_interleave, so in a backward each row's gradient flows back into the one prefix pass); the rows
    follow at positions after the prefix, under the 2-D mask over prefix and row, from which transformers builds the
    causal mask offset by the cache's length (the causal kernel without a mask would align a row's first token with
    the prefix's first, not its last)."""
    if "prefix_ids" not in batch:
        return {"input_ids": input_ids, "attention_mask": model_attention_mask(model, batch["attention_mask"], device,
                                                                                padding_mask), "use_cache": False}
    name = cache_name(model)
    prefix = to_device(batch["prefix_ids"], device)[None]
    cache = model(input_ids=prefix, use_cache=True, **last_logits_only(model))[name]
    rows, width, shared = input_ids.shape[0], input_ids.shape[1], prefix.shape[1]
    cache.batch_repeat_interleave(rows)
    mask = torch.cat([torch.ones((rows, shared), dtype=torch.long), batch["attention_mask"]], dim=1)
    positions = torch.arange(shared, shared + width, dtype=torch.long).expand(rows, width)
    return {"input_ids": input_ids, "attention_mask": to_device(mask, device), "position_ids": to_device(positions, device),
            name: cache, "use_cache": True}


def _full_completion_logprobs(model: torch.nn.Module, batch: dict[str, torch.Tensor], temperature: float,
                              device: torch.device, padding_mask: bool = False,
                              with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    input_ids = to_device(batch["input_ids"], device)
    logits = model(**body_inputs(model, batch, input_ids, device, padding_mask)).logits[:, :-1].float()
    if temperature != 1.0:
        logits = logits / temperature
    targets = input_ids[:, 1:]
    all_logprobs = torch.log_softmax(logits, dim=-1)
    logprobs = all_logprobs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    mask = to_device(batch["completion_mask"][:, 1:], device)
    entropy = _entropy(all_logprobs) * mask if with_entropy else None
    return logprobs * mask, mask, entropy


def _entropy(all_logprobs: torch.Tensor) -> torch.Tensor:
    """The entropy of each position's distribution over the vocabulary, from its log-probabilities."""
    return -(all_logprobs.exp() * all_logprobs).sum(-1)



# Config fields by which a causal LM transforms its logits after the output head (Gemma 2's soft-capping, Cohere's
# and Granite's scaling): the chunked path applies the head alone, so it refuses such models rather than differ.
_LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling")


def decoder_and_head(model: torch.nn.Module) -> tuple[torch.nn.Module, torch.nn.Module]:
    """The transformer body (its output: the last hidden states, final norm applied) and the output head of a causal
    LM, through a PEFT wrapper: LoRA layers are injected into the modules themselves, so running the body runs them."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    config = getattr(inner, "config", None)
    for key in _LOGIT_TRANSFORMS:
        value = getattr(config, key, None)
        if value not in (None, 1, 1.0):
            raise ValueError(f"chunked log-probs: {type(inner).__name__} transforms its logits after the head "
                             f"({key}={value}); use engine.logprob-chunk-tokens=0")
    decoder = inner.get_decoder() if hasattr(inner, "get_decoder") else None
    head = inner.get_output_embeddings() if hasattr(inner, "get_output_embeddings") else None
    if decoder is None or decoder is inner or head is None:
        raise ValueError(f"chunked log-probs need a causal LM with a separate body and output head; "
                         f"{type(inner).__name__} has none: use engine.logprob-chunk-tokens=0")
    return decoder, head


def _head_logprobs(head: torch.nn.Module, hidden: torch.Tensor, targets: torch.Tensor, temperature: float,
                   with_entropy: bool = False) -> torch.Tensor:
    """log p(target) for rows of hidden states: the head's logits, in fp32, scaled and log-softmaxed as the
    unchunked path does, so the values are the same. with_entropy: [rows, 2], the distributions' entropies second."""
    logits = head(hidden).float()
    if temperature != 1.0:
        logits = logits / temperature
    all_logprobs = torch.log_softmax(logits, dim=-1)
    logprobs = all_logprobs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return torch.stack([logprobs, _entropy(all_logprobs)], dim=-1) if with_entropy else logprobs


def chunked_completion_logprobs(model: torch.nn.Module, batch: dict[str, torch.Tensor], temperature: float,
                                chunk_tokens: int, padding_mask: bool = False,
                                with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """completion_logprobs without the [batch, length, vocab] logits: the body's last hidden states are taken at
    the completion positions only (prompt and padding are never sent through the head), and the head scores
    `chunk_tokens` of them at a time, so at most [chunk_tokens, vocab] logits exist at once. With gradients on,
    each chunk runs under activation checkpointing: its logits are dropped after the forward and recomputed in
    the backward, one chunk at a time, instead of every chunk's being kept for backward.
    """
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be >= 1, got {chunk_tokens}")
    # a model sharded over ranks gathers its embeddings and head in its root's forward, which this path does not call
    return as_root_forward(model, _chunked, model, batch, temperature, chunk_tokens, padding_mask, with_entropy)


def _chunked(model: torch.nn.Module, batch: dict[str, torch.Tensor], temperature: float, chunk_tokens: int,
             padding_mask: bool, with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    decoder, head = decoder_and_head(model)
    device = next(model.parameters()).device
    input_ids = to_device(batch["input_ids"], device)
    host_mask = batch["completion_mask"][:, 1:]
    mask = to_device(host_mask, device)
    # the completion positions from the host's mask: nonzero of the device's would wait for the body's forward
    rows, cols = (to_device(index, device) for index in host_mask.nonzero(as_tuple=True))
    hidden = decoder(**body_inputs(decoder, batch, input_ids, device, padding_mask)).last_hidden_state
    scored = hidden[rows, cols]  # [completion tokens, hidden]: position t predicts token t + 1
    targets = input_ids[rows, cols + 1]
    pieces = []
    for start in range(0, len(targets), chunk_tokens):
        h, t = scored[start : start + chunk_tokens], targets[start : start + chunk_tokens]
        if torch.is_grad_enabled():
            pieces.append(checkpoint(_head_logprobs, head, h, t, temperature, with_entropy, use_reentrant=False))
        else:
            pieces.append(_head_logprobs(head, h, t, temperature, with_entropy))
    logprobs = torch.zeros(mask.shape, dtype=torch.float32, device=device)
    entropy = torch.zeros(mask.shape, dtype=torch.float32, device=device) if with_entropy else None
    if pieces:
        scores = torch.cat(pieces)
        logprobs = logprobs.index_put((rows, cols), scores[:, 0] if with_entropy else scores)
        if with_entropy:
            entropy = entropy.index_put((rows, cols), scores[:, 1])
    return logprobs, mask, entropy
