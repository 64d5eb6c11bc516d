"""GRPO's loss: PPO-clip per token with verl's details, and what a micro-batch's token sum is divided by under each
loss aggregation."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from fedagent_flwr.agent.training.advantages import StepSample

def grpo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_eps: float,
    ref_logprobs: torch.Tensor | None = None,
    kl_beta: float = 0.0,
    token_weights: torch.Tensor | None = None,
    normalizer: float | None = None,
    clip_ratio_c: float = 0.0,
    kl_clamp: float = 0.0,
    entropy: torch.Tensor | None = None,
    entropy_coeff: float = 0.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO-clip token loss with an optional k3 KL penalty, dual clip, KL clamp and entropy bonus (the grpo section).

    logprobs/old_logprobs/ref_logprobs/mask/entropy: [batch, tokens]; advantages and
    token_weights: [batch]. The loss is sum(weight * per-token loss over `mask`) /
    normalizer, where the normalizer defaults to sum(weight * mask): a (weighted)
    token mean. Positions outside `mask` contribute nothing, so they get no gradient.
    The statistics (mean KL and clipped fraction over `mask`) are detached 0-d tensors on the
    loss's device: reading one waits for the device, so the caller reads them when it is done.
    """
    mask = mask.float()
    weights = mask if token_weights is None else mask * token_weights.unsqueeze(-1)
    ratio = torch.exp(logprobs - old_logprobs)
    adv = advantages.unsqueeze(-1)
    per_token = -torch.minimum(ratio * adv, torch.clamp(ratio, 1 - clip_eps, 1 + clip_eps) * adv)
    if clip_ratio_c > 0:  # dual clip: a negative advantage's loss grows with the ratio only up to ratio c
        per_token = torch.where(adv < 0, torch.minimum(per_token, -adv * clip_ratio_c), per_token)
    kl = torch.zeros_like(per_token)
    if ref_logprobs is not None and kl_beta > 0:
        delta = ref_logprobs - logprobs
        kl = torch.exp(delta) - delta - 1
        if kl_clamp > 0:
            kl = torch.clamp(kl, min=-kl_clamp, max=kl_clamp)
        per_token = per_token + kl_beta * kl
    if entropy is not None and entropy_coeff > 0:
        per_token = per_token - entropy_coeff * entropy
    denom = float(weights.sum()) if normalizer is None else normalizer
    loss = (per_token * weights).sum() / max(denom, 1e-12)
    n = mask.sum().clamp(min=1)
    stats = {
        "kl": (kl.detach() * mask).sum() / n,
        "clip_frac": (((ratio.detach() - 1).abs() > clip_eps).float() * mask).sum() / n,
    }
    return loss, stats


def loss_normalisers(minibatch: Sequence[int], plan: Sequence[Sequence[int]], samples: Sequence[StepSample],
                     aggregation: str) -> list[float]:
    """What each micro-batch of a minibatch's `plan` (its sample indices, cut as one process cuts it) divides its weighted
    token sum by, so that the micro-batches' losses add up to the minibatch's. "trajectory-mean" and "token-mean": the
    minibatch's weighted token count, however it is cut (StepSample.weight carries the per-trajectory mean);
    "micro-batch-token-mean" (verl's dp_actor): the micro-batch's own token count times the number of micro-batches, so
    each micro-batch's token mean weighs the same and a token in a short one weighs more."""
    if aggregation == "micro-batch-token-mean":
        return [float(len(plan) * sum(len(samples[i].completion_ids) for i in micro)) for micro in plan]
    whole = sum(samples[i].weight * len(samples[i].completion_ids) for i in minibatch)  # in the minibatch's order
    return [whole] * len(plan)


GAP_NATS = 0.01  # a token whose two log-probs differ by more than this is counted (grpo.old-logprobs = rollout's check)


def rollout_gap(logprobs: torch.Tensor, old_logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Trained pass minus rollout completion log-probs over `mask`, as sums on the device: [signed sum, absolute sum,
    largest absolute value, tokens beyond GAP_NATS, tokens]. Before the first step both score the round-start policy,
    so this is how far the decode passes' rounding (or a sampler holding other weights) puts the one from the other."""
    diff = (logprobs.detach() - old_logprobs) * mask
    return torch.stack([diff.sum(), diff.abs().sum(), diff.abs().max(), ((diff.abs() > GAP_NATS) & (mask > 0)).sum(),
                        mask.sum()]).float()
