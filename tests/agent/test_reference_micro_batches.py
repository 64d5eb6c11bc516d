"""How the FedAgent reference splits an update (issue 72): micro-batches of even summed lengths (verl balances sequence
lengths across the GPUs of a client; here across one process's micro-batches) and a batch padded to whole minibatches
with copies of random samples (verl-agent's adjust_batch, mode copy)."""


import numpy as np
import pytest

from envs import make_env
from fedagent_flwr.agent.engine.micro_batches import balanced_micro_batches, by_length, micro_batches, padding_copies
from fedagent_flwr.agent.play.rollout import RolloutConfig
from fedagent_flwr.agent.training import grpo
from fedagent_flwr.agent.training.advantages import StepSample
from fedagent_flwr.config import RunConfig
from placed import grpo_trainer


def _sums(parts, lengths):
    return [sum(lengths[i] for i in part) for part in parts]


def test_balanced_micro_batches_hold_every_sample_once_in_plain_counts_with_even_token_sums():
    rng = np.random.default_rng(0)
    lengths = rng.integers(40, 900, size=70).tolist()
    order = rng.permutation(70).tolist()
    parts = balanced_micro_batches(order, lengths, 16)
    assert [len(p) for p in parts] == [len(p) for p in micro_batches(order, lengths, 16)] == [16, 16, 16, 16, 6]
    assert sorted(i for p in parts for i in p) == list(range(70))
    assert all(p == sorted(p, key=order.index) for p in parts)  # each keeps the order it was given
    full = _sums(parts[:4], lengths)
    assert max(full) - min(full) <= max(lengths)  # greedy longest-first: within one sample's length
    grouped = _sums(micro_batches(by_length(order, lengths), lengths, 16)[:4], lengths)
    assert max(full) - min(full) < (max(grouped) - min(grouped)) / 10
    assert balanced_micro_batches([], lengths, 16) == []


def test_padding_copies_make_whole_minibatches_of_distinct_random_samples_while_there_are_enough():
    rng = np.random.default_rng(1)
    copies = padding_copies(70, 64, rng)
    assert len(copies) == 58 and len(set(copies)) == 58 and all(0 <= i < 70 for i in copies)
    assert padding_copies(128, 64, rng) == [] and padding_copies(0, 64, rng) == []
    few = padding_copies(10, 64, rng)  # more copies needed than samples: each drawn again only after all were
    assert len(few) == 54 and all(sorted(few[k:k + 10]) == list(range(10)) for k in range(0, 50, 10))
    assert padding_copies(70, 64, np.random.default_rng(3)) == padding_copies(70, 64, np.random.default_rng(3))


def _samples(vocab: int, count: int, seed: int) -> list[StepSample]:
    rng = np.random.default_rng(seed)
    return [StepSample(rng.integers(3, vocab, size=int(rng.integers(3, 60))).tolist(),
                       rng.integers(3, vocab, size=int(rng.integers(1, 12))).tolist(),
                       float(rng.normal()), 1.0) for _ in range(count)]


@pytest.mark.parametrize("balanced", [False, True])
def test_the_update_cuts_its_minibatches_by_even_lengths_when_asked(tiny_lm, maze_tokenizer, monkeypatch, balanced):
    """With grpo.balance-micro-batches each forward of the update holds grpo.ppo-micro-batch-size-per-gpu rows of about equal
    summed length; the log-prob passes are cut as before (their cut changes no number)."""
    samples = _samples(tiny_lm.config.vocab_size, 32, seed=2)
    cfg = RunConfig.from_run_config({"grpo.beta": 0.0, "grpo.mini-batch-size": 32, "grpo.ppo-micro-batch-size-per-gpu": 8, "device": "cpu", "grpo.loss-aggregation": "micro-batch-token-mean", "grpo.balance-micro-batches": balanced})
    seen = []
    real = grpo.collate
    monkeypatch.setattr(grpo, "collate", lambda pairs, pad, share=False: seen.append([len(p) + len(c) for p, c in pairs]) or real(pairs, pad, share))
    grpo_trainer(tiny_lm, maze_tokenizer, cfg, RolloutConfig(history_length=0)).update(samples, np.random.default_rng(0))
    update = seen[-4:]  # a single minibatch: no old-policy pass, so these are the update's four micro-batches
    assert [len(rows) for rows in update] == [8, 8, 8, 8]
    spread = max(map(sum, update)) - min(map(sum, update))
    longest = max(s.length for s in samples)
    assert (spread <= longest) if balanced else (spread > longest)


def test_an_epoch_pads_its_samples_to_whole_minibatches_only_with_batch_padding_copy(tiny_lm, maze_tokenizer, monkeypatch):
    """The same epoch played twice: with grpo.batch-padding none the update gets the samples as played; with copy, the same
    samples and after them copies of some of them, up to the next multiple of grpo.mini-batch-size."""
    import torch

    updated = {}
    for padding in ("none", "copy"):
        cfg = RunConfig.from_run_config({"grpo.batch-padding": padding, "grpo.mini-batch-size": 8, "grpo.uniform-groups": "keep", "device": "cpu"}).updated({"grpo.tasks-per-epoch": 3, "grpo.num-generations": 2})
        trainer = grpo_trainer(tiny_lm, maze_tokenizer, cfg, RolloutConfig(history_length=0, max_new_tokens=4))
        monkeypatch.setattr(trainer, "update", lambda samples, rng, p=padding: updated.setdefault(p, list(samples)) and {})
        torch.manual_seed(0)
        trainer.train_epoch(lambda: make_env("maze", max_steps=3), make_env("maze").tasks_of_split("train")[:3],
                            np.random.default_rng(0))
    played, padded = updated["none"], updated["copy"]
    assert len(played) % 8 != 0  # else this epoch would test nothing
    assert padded[:len(played)] == played and len(padded) == -(-len(played) // 8) * 8
    assert all(extra in played for extra in padded[len(played):])
    with pytest.raises(ValueError, match="grpo.batch-padding='copy'"):
        RunConfig.from_run_config({"strategy": "fedse-lora", "grpo.batch-padding": "copy"})
