"""How a batch of samples is cut into the passes that compute it: by rows, or by a budget of padded tokens, in the
order given (longest first, `by_length`, so a pass holds samples of similar length). Only lengths are read: the same
cut serves GRPO's update and its no-grad log-prob passes, one process or N ranks (agent/fsdp/ranks.py shares the cut)."""

from __future__ import annotations

from collections.abc import Sequence


def chunks(items: Sequence, size: int) -> list[list]:
    return [list(items[i : i + size]) for i in range(0, len(items), size)]


def micro_batches(indices: Sequence[int], lengths: Sequence[int], size: int, tokens: int = 0) -> list[list[int]]:
    """`indices`, in their order, cut into micro-batches: `size` samples each, or, with `tokens` > 0, runs of
    consecutive samples of at most `tokens` padded positions each (rows x the longest row, `lengths[i]` being sample i's
    prompt and completion: what collate pads a batch to and the forward computes over), a sample longer than that alone.

    A budget in tokens rather than rows is verl's dynamic batch size (ppo_max_token_len_per_gpu): short agent steps
    share a pass by the dozen and long ones go a few at a time, so a GPU runs fewer, larger kernels. The fewest passes
    the budget allows, evened out: the cut is that of the smallest budget that needs no more passes than the full one,
    so a minibatch that needs two passes gets two of about half its tokens, not a full one and a remnant. Cuts are
    contiguous: with the order by length (length-grouped-micro-batches) each pass holds samples of similar length."""
    if tokens <= 0:
        return chunks(list(indices), size)
    indices = list(indices)

    def cut(budget: int) -> list[list[int]]:  # greedy: each pass as long as the budget allows
        out: list[list[int]] = []
        current: list[int] = []
        longest = 0
        for i in indices:
            if current and (len(current) + 1) * max(longest, lengths[i]) > budget:
                out.append(current)
                current, longest = [], 0
            current.append(i)
            longest = max(longest, lengths[i])
        return out + [current] if current else out

    # greedy's count of passes never rises with the budget, so bisect for the smallest budget with as few as `tokens`
    fewest, low, high = len(cut(tokens)), 1, tokens
    while low < high:
        middle = (low + high) // 2
        if len(cut(middle)) <= fewest:
            high = middle
        else:
            low = middle + 1
    return cut(low)


def by_length(indices: Sequence[int], lengths: Sequence[int]) -> list[int]:
    """Sample indices longest first (stable: equal lengths keep their shuffled order), so that consecutive
    micro-batches hold samples of similar length; longest first also meets a micro-batch that does not fit at once."""
    return sorted(indices, key=lambda i: -lengths[i])
