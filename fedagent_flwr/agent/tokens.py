"""Token-level plumbing shared by behaviour cloning and GRPO.

A training sample is one agent step: the prompt's token ids and the completion
the model wrote (or should write). Only completion tokens are scored; prompt and
padding tokens - the environment's text - are masked out.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def collate(samples: Sequence[tuple[Sequence[int], Sequence[int]]], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-pad prompt+completion sequences; mark which positions hold completion tokens."""
    lengths = [len(p) + len(c) for p, c in samples]
    width = max(lengths)
    input_ids = torch.full((len(samples), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(samples), width), dtype=torch.long)
    completion_mask = torch.zeros((len(samples), width), dtype=torch.bool)
    for i, (prompt, completion) in enumerate(samples):
        n_p, n_c = len(prompt), len(completion)
        input_ids[i, : n_p + n_c] = torch.tensor(list(prompt) + list(completion), dtype=torch.long)
        attention_mask[i, : n_p + n_c] = 1
        completion_mask[i, n_p : n_p + n_c] = True
    return {"input_ids": input_ids, "attention_mask": attention_mask, "completion_mask": completion_mask}


def completion_logprobs(model: torch.nn.Module, batch: dict[str, torch.Tensor], temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probabilities of each sequence's next token, and the mask of completion targets.

    Both have shape [batch, length - 1]: position t scores token t + 1. Scaling by
    the sampling temperature makes the log-probs those of the distribution the
    rollout actually sampled from.
    """
    device = next(model.parameters()).device
    input_ids = batch["input_ids"].to(device)
    attention_mask = batch["attention_mask"].to(device)
    # use_cache=False: a training forward needs no KV cache (transformers would build one for the whole sequence)
    logits = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits[:, :-1].float()
    if temperature != 1.0:
        logits = logits / temperature
    targets = input_ids[:, 1:]
    logprobs = torch.log_softmax(logits, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    mask = batch["completion_mask"][:, 1:].to(device)
    return logprobs * mask, mask
