"""Batched sampling from a causal LM that drops finished rows as it goes.

Why not `model.generate`: it keeps every row in the batch until the slowest one
stops, so one long (often malformed) completion makes all the others pay for
`max_new_tokens` decode steps; a rollout batch at temperature 1 almost always
holds such a row. This loop removes a row from the batch and its KV cache as soon
as it emits a stop token, so the work per step shrinks with the live rows, and the
prompt prefix every row shares (instructions, task text) is encoded once. It is
plain ancestral sampling (temperature, rollout.top-p) or greedy decoding; `sampler` says how a row's token is drawn
from its softmax (TOKEN_SAMPLERS). It can hand back each
drawn token's log-probability (`logprobs=`), which GRPO takes as the round-start policy's
under grpo.old-logprobs = rollout; by default GRPO recomputes them from the tokens, and then
nothing depends on how the sampler was written. Measured against `generate` on the same batch (benchmarks/rollout_throughput.py,
warm SmolLM2-135M, 2 CPU cores): 2.2-2.5x the tokens/s on GRPO-shaped batches (4 tasks x G = 8), 1.3x on
8 distinct tasks (docs/agent.md); it stays only while it is faster.

Two engines run that loop (`sample_batch(..., engine=)`): "hf" calls the transformers model's forward with its
dynamic cache (the reference); "static" runs decode.py's preallocated-KV-cache decoder (CUDA graphs on a GPU),
for Qwen2/Llama-shaped models. The caller passes the engine its placement resolved (rollout.name=auto: "static" on
CUDA, "hf" for a model the decoder refuses and everywhere else; agent/engine/placement.py).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from fedagent_flwr.agent.engine.attention import variable_shape_attention
from fedagent_flwr.agent.engine.decode import StaticDecoder, decoder_for
from fedagent_flwr.agent.engine.tokens import MIN_SHARED_PREFIX, cache_name, last_logits_only, shared_prefix
from fedagent_flwr.config.choices import RESOLVED_ENGINES, TOKEN_SAMPLERS


def pick_tokens(logits: torch.Tensor, temperature: float, top_p: float, sampler: str = "multinomial") -> torch.Tensor:
    """One token per row: greedy at temperature 0, else a sample from the (rollout.top-p) softmax, drawn by `sampler`."""
    if temperature == 0:
        return logits.argmax(dim=-1)
    # At temperature 1 the division is the identity, and softmax casts to fp32 inside its one kernel: the same
    # numbers without two passes over [rows, vocab] in fp32 (a 1.5B model's 152k vocabulary at 128 rows: 78 MB each)
    scaled = logits if temperature == 1.0 else logits.float() / temperature
    probs = torch.softmax(scaled, dim=-1, dtype=torch.float32)
    if top_p < 1.0:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        # Keep the smallest prefix whose mass reaches top_p (the first token always stays).
        outside = sorted_probs.cumsum(dim=-1) - sorted_probs >= top_p
        sorted_probs = sorted_probs.masked_fill(outside, 0.0)
        probs = torch.zeros_like(probs).scatter_(-1, order, sorted_probs)
    if sampler == "inverse-cdf":
        return inverse_cdf_draw(probs)
    return torch.multinomial(probs, num_samples=1).squeeze(1)


def inverse_cdf_draw(probs: torch.Tensor) -> torch.Tensor:
    """One index per row of non-negative `probs` (each row's sum need not be 1), token i with probability
    probs[i] / sum: a uniform number u in [0, sum) falls in token i's interval [c[i-1], c[i]) of the running sum c.
    torch.rand draws one number a row, so a batch of n rows advances the generator by n numbers."""
    cumulative = probs.cumsum(dim=-1)
    total = cumulative[:, -1:]
    u = torch.rand(total.shape, dtype=cumulative.dtype, device=cumulative.device) * total
    # rand < 1, yet rand x total can round up to total itself: held below it, u lies in an interval of some mass
    u = torch.minimum(u, torch.nextafter(total, torch.zeros_like(total)))
    return torch.searchsorted(cumulative, u, right=True).squeeze(1)


def sample_batch(
    model,
    prompts: Sequence[Sequence[int]],
    pad_id: int,
    stop_ids: Sequence[int],
    max_new_tokens: int,
    temperature: float,
    top_p: float = 1.0,
    engine: str = "hf",
    kernels: str = "eager",
    logprobs: list[list[float]] | None = None,
    sampler: str = "multinomial",
) -> list[list[int]]:
    """Completion token ids per prompt, each ending at its first stop token (kept) or at the cap. `kernels`: the
    static engine's token step (decode.KERNELS); the hf engine has none to choose. `sampler`: TOKEN_SAMPLERS.
    `logprobs`: a list that receives, per prompt, each drawn token's log-probability under the temperature-scaled
    softmax (before rollout.top-p), the quantity GRPO's ratio divides by (engines' rounding included: these come from the
    decode passes, not a training forward)."""
    if engine not in RESOLVED_ENGINES:  # placement.py resolves rollout.name=auto, with the model
        raise ValueError(f"decode engine must be one of {RESOLVED_ENGINES}, got {engine!r}")
    if sampler not in TOKEN_SAMPLERS:
        raise ValueError(f"token sampler must be one of {TOKEN_SAMPLERS}, got {sampler!r}")
    if engine == "static":
        return fast_sample_batch(model, prompts, pad_id, stop_ids, max_new_tokens, temperature, top_p, kernels=kernels,
                                 logprobs=logprobs, sampler=sampler)
    return hf_sample_batch(model, prompts, pad_id, stop_ids, max_new_tokens, temperature, top_p, logprobs=logprobs,
                           sampler=sampler)


def rollout_dtype(device: torch.device) -> torch.dtype | None:
    """The dtype forward passes run in here: autocast's where it is on (bf16 precisions), else the model's own."""
    return torch.get_autocast_dtype(device.type) if torch.is_autocast_enabled(device.type) else None


@torch.no_grad()
def fast_sample_batch(
    model,
    prompts: Sequence[Sequence[int]],
    pad_id: int,
    stop_ids: Sequence[int],
    max_new_tokens: int,
    temperature: float,
    top_p: float = 1.0,
    decoder: StaticDecoder | None = None,
    kernels: str = "eager",
    logprobs: list[list[float]] | None = None,
    sampler: str = "multinomial",
) -> list[list[int]]:
    """`sample_batch` on decode.py's static decoder (raises UnsupportedModel for a model it does not reproduce).

    The loop is the hf engine's step for step: the same rows reach `pick_tokens` in the same order at every
    step, so with the same seed it draws the same random numbers; only the logits' rounding differs.
    `decoder`: one the caller built from this model (benchmarks and tests pick its mode); by default the
    model's own (decode.decoder_for), with CUDA graphs on a GPU and the token step's `kernels`."""
    n_rows = len(prompts)
    if max_new_tokens <= 0 or n_rows == 0:
        if logprobs is not None:
            logprobs[:] = [[] for _ in range(n_rows)]
        return [[] for _ in range(n_rows)]
    device = next(model.parameters()).device
    decoder = decoder or decoder_for(model, rollout_dtype(device), kernels=kernels)
    stops = torch.as_tensor(list(stop_ids), dtype=torch.long, device=device)
    logits = decoder.start([list(p) for p in prompts], pad_id, max_new_tokens)
    return _sample_rows(decoder, logits, n_rows, stops, max_new_tokens, temperature, top_p, logprobs, sampler)


def _sample_rows(decoder, logits: torch.Tensor, n_rows: int, stops: torch.Tensor, max_new_tokens: int,
                 temperature: float, top_p: float, logprobs: list[list[float]] | None = None,
                 sampler: str = "multinomial") -> list[list[int]]:
    """The token loop both engines share: draw a token per live row, drop the rows that stopped (decoder.keep), and
    advance the rest one step (decoder.step -> next logits). One loop, so both engines hand `pick_tokens` the same
    rows in the same order and a seed draws the same numbers."""
    rows = torch.arange(n_rows, device=logits.device)  # which prompt each live batch row belongs to
    completions: list[list[int]] = [[] for _ in range(n_rows)]
    if logprobs is not None:
        logprobs[:] = [[] for _ in range(n_rows)]
    for step in range(max_new_tokens):
        tokens = pick_tokens(logits, temperature, top_p, sampler)
        for row, tok in zip(rows.tolist(), tokens.tolist()):
            completions[row].append(tok)
        if logprobs is not None:  # as tokens.completion_logprobs scores them: fp32 logits over the temperature
            scaled = logits.float() / temperature if temperature not in (0, 1.0) else logits.float()
            drawn = torch.log_softmax(scaled, dim=-1).gather(1, tokens[:, None]).squeeze(1)
            for row, lp in zip(rows.tolist(), drawn.tolist()):
                logprobs[row].append(lp)
        if step == max_new_tokens - 1:
            break
        live = ~torch.isin(tokens, stops)
        if not bool(live.all()):
            if not bool(live.any()):
                break
            keep = live.nonzero().squeeze(1)
            decoder.keep(keep)
            rows, tokens = rows[keep], tokens[keep]
        logits = decoder.step(tokens)
    return completions


class _TransformersStepper:
    """The hf engine's decode state behind the shared loop's keep/step: the model's dynamic cache, the attention
    mask and each row's next position."""

    def __init__(self, model, cache, mask: torch.Tensor, next_position: torch.Tensor, cache_name: str) -> None:
        self.model, self.cache, self.mask, self.next_position, self.cache_name = model, cache, mask, next_position, cache_name

    def keep(self, keep: torch.Tensor) -> None:
        self.cache.batch_select_indices(keep)
        self.mask, self.next_position = self.mask[keep], self.next_position[keep]

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        self.mask = torch.cat([self.mask, self.mask.new_ones((self.mask.size(0), 1))], dim=1)
        out = self.model(input_ids=tokens[:, None], attention_mask=self.mask, position_ids=self.next_position[:, None],
                         use_cache=True, **{self.cache_name: self.cache})
        self.cache = out[self.cache_name]
        self.next_position = self.next_position + 1
        return out.logits[:, -1, :]


@torch.no_grad()
def hf_sample_batch(
    model,
    prompts: Sequence[Sequence[int]],
    pad_id: int,
    stop_ids: Sequence[int],
    max_new_tokens: int,
    temperature: float,
    top_p: float = 1.0,
    logprobs: list[list[float]] | None = None,
    sampler: str = "multinomial",
) -> list[list[int]]:
    """The "hf" engine: the transformers model's forward with its dynamic cache (the reference)."""
    device = next(model.parameters()).device
    with variable_shape_attention(device):  # the keys grow by one every step: a new shape each time (attention.py)
        return _hf_rows(model, prompts, pad_id, stop_ids, max_new_tokens, temperature, top_p, device, logprobs, sampler)


def _hf_rows(model, prompts, pad_id: int, stop_ids, max_new_tokens: int, temperature: float, top_p: float,
             device: torch.device, logprobs: list[list[float]] | None = None,
             sampler: str = "multinomial") -> list[list[int]]:
    name = cache_name(model)
    stops = torch.as_tensor(list(stop_ids), dtype=torch.long, device=device)
    # Identical prompts are common (a GRPO group's first step; episodes of a Markov task that
    # reach the same state): prefill each distinct prompt once and give every row a copy of its
    # keys, values and next-token logits. Rows still sample independently from there.
    distinct: dict[tuple[int, ...], int] = {}
    source = [distinct.setdefault(tuple(p), len(distinct)) for p in prompts]
    n_rows, prompts = len(prompts), [list(p) for p in distinct]
    prefix = shared_prefix(prompts) if len(prompts) > 1 else []
    cache = None
    if len(prefix) >= MIN_SHARED_PREFIX:
        # Every episode's prompt opens with the same instructions: compute their keys and
        # values once and share them across the batch instead of once per row.
        cache = model(input_ids=torch.as_tensor([prefix], device=device), use_cache=True, **last_logits_only(model))[name]
        cache.batch_repeat_interleave(len(prompts))
    else:
        prefix = []
    suffixes = [list(p)[len(prefix):] for p in prompts]
    width = max(len(p) for p in suffixes)
    # Left padding of the suffixes puts every prompt's last token in the last column; the
    # padding sits between the shared prefix and the suffix, masked out.
    input_ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), len(prefix) + width), dtype=torch.long)
    mask[:, : len(prefix)] = 1
    for i, p in enumerate(suffixes):
        input_ids[i, width - len(p):] = torch.as_tensor(p, dtype=torch.long)
        mask[i, len(prefix) + width - len(p):] = 1
    input_ids, mask = input_ids.to(device), mask.to(device)
    positions = ((mask.cumsum(dim=-1) - 1).clamp(min=0))[:, len(prefix):]

    out = model(input_ids=input_ids, attention_mask=mask, position_ids=positions, use_cache=True,
                **{name: cache}, **last_logits_only(model))
    cache, logits = out[name], out.logits[:, -1, :]
    next_position = positions[:, -1] + 1
    if len(prompts) < n_rows:
        expand = torch.as_tensor(source, dtype=torch.long, device=device)
        cache.batch_select_indices(expand)
        logits, mask, next_position = logits[expand], mask[expand], next_position[expand]
    stepper = _TransformersStepper(model, cache, mask, next_position, name)
    return _sample_rows(stepper, logits, n_rows, stops, max_new_tokens, temperature, top_p, logprobs, sampler)
