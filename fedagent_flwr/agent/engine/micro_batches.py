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
    contiguous: with the order by length (grpo.group-by-length) each pass holds samples of similar length."""
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


def balanced_micro_batches(indices: Sequence[int], lengths: Sequence[int], size: int) -> list[list[int]]:
    """`indices` cut into ceil(n / size) micro-batches of at most `size` samples whose summed lengths are as even as a
    greedy split makes them: longest first, each to the micro-batch with the fewest tokens so far that has room
    (ties to the earlier one). This is what verl does across the GPUs of a data-parallel group before the update
    (seqlen balancing, there by Karmarkar-Karp), done here across one process's micro-batches. Under
    micro-batch-token-mean each micro-batch's token mean then covers about as many tokens, so the loss comes close to
    one mean over the minibatch's tokens. Written here because the rule is a few lines and no library we depend on
    offers it; verl's own is not a dependency. Each micro-batch keeps the order `indices` gave its samples."""
    indices = list(indices)
    if not indices:
        return []
    parts = -(-len(indices) // size)
    room = [size] * parts
    room[-1] = len(indices) - size * (parts - 1)  # the counts a plain cut gives: every part full but the last
    members: list[list[int]] = [[] for _ in range(parts)]
    tokens = [0] * parts
    for i in sorted(indices, key=lambda i: -lengths[i]):
        k = min((k for k in range(parts) if len(members[k]) < room[k]), key=lambda k: tokens[k])
        members[k].append(i)
        tokens[k] += lengths[i]
    position = {i: p for p, i in enumerate(indices)}
    return [sorted(m, key=position.__getitem__) for m in members]


def padding_copies(count: int, multiple: int, rng) -> list[int]:
    """Which of `count` samples to repeat so that the batch holds a multiple of `multiple`: randomly drawn, none twice
    while the batch has enough (then the draw starts again). The FedAgent reference pads so (verl-agent's
    adjust_batch, mode copy), so that every minibatch is whole; a copy is trained on again, its weight counted twice."""
    missing = -count % multiple
    if count == 0 or missing == 0:
        return []
    rounds = -(-missing // count)
    return [int(i) for _ in range(rounds) for i in rng.permutation(count)][:missing]
