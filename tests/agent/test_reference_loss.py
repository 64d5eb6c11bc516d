"""The loss options the FedAgent reference's verl uses (issue 56): dual clip, the KL estimate's clamp, the unbiased
group deviation, verl's per-micro-batch token mean and an entropy bonus. Each is checked against a value computed
by hand; each is off by default, so the default losses are unchanged."""

import copy
from dataclasses import replace

import numpy as np
import pytest
import torch

from fedagent_flwr.agent.engine.tokens import collate, completion_logprobs
from fedagent_flwr.agent.play.rollout import RolloutConfig
from fedagent_flwr.agent.training import grpo
from fedagent_flwr.agent.training.advantages import StepSample, group_advantages
from fedagent_flwr.agent.training.grpo_loss import grpo_loss
from fedagent_flwr.config import RunConfig
from placed import grpo_trainer

ONE = torch.tensor([[True]])


def _loss_and_grad(logprob: float, old: float, advantage: float, **options) -> tuple[float, float]:
    lp = torch.tensor([[logprob]], requires_grad=True)
    loss, _ = grpo_loss(lp, torch.tensor([[old]]), torch.tensor([advantage]), ONE, 0.2, **options)
    loss.backward()
    return float(loss), float(lp.grad)


def test_dual_clip_caps_a_negative_advantages_loss_at_c_times_the_advantage():
    ratio = np.exp(2.0)  # 7.39: far above 1 + clip_eps and above c = 3
    # PPO alone: max(-A r, -A clip(r)) = 7.39 for A = -1, with gradient -A r = 7.39 in the log-prob
    assert _loss_and_grad(2.0, 0.0, -1.0) == pytest.approx((ratio, ratio))
    # dual clip: min(7.39, -A c) = 3, a constant: no gradient pushes this token further down
    assert _loss_and_grad(2.0, 0.0, -1.0, clip_ratio_c=3.0) == pytest.approx((3.0, 0.0))
    # below c, or with a positive advantage, nothing changes
    assert _loss_and_grad(1.0, 0.0, -1.0, clip_ratio_c=3.0) == pytest.approx(_loss_and_grad(1.0, 0.0, -1.0))
    assert _loss_and_grad(2.0, 0.0, 1.0, clip_ratio_c=3.0) == pytest.approx(_loss_and_grad(2.0, 0.0, 1.0))


def test_the_kl_estimate_is_clamped_and_takes_no_gradient_beyond_the_clamp():
    lp = torch.tensor([[-4.0, -1.0]], requires_grad=True)
    ref = torch.tensor([[-1.0, -1.2]])  # k3 = e^3 - 3 - 1 = 16.09 at the first token, e^-0.2 + 0.2 - 1 at the second
    mask = torch.ones(1, 2, dtype=torch.bool)
    k3 = [np.exp(3.0) - 4.0, np.exp(-0.2) - 0.8]
    _, unclamped = grpo_loss(lp, lp.detach(), torch.tensor([0.0]), mask, 0.2, ref, kl_beta=1.0)
    assert float(unclamped["kl"]) == pytest.approx(np.mean(k3), rel=1e-5)
    loss, clamped = grpo_loss(lp, lp.detach(), torch.tensor([0.0]), mask, 0.2, ref, kl_beta=1.0, kl_clamp=10.0)
    assert float(clamped["kl"]) == pytest.approx((10.0 + k3[1]) / 2, rel=1e-5)
    loss.backward()
    assert float(lp.grad[0, 0]) == 0.0 and float(lp.grad[0, 1]) != 0.0


def test_ddof_one_divides_by_the_unbiased_deviation_as_torch_std_does():
    rewards, groups = [1.0, 0.0, 0.0, 0.0, 2.0, 2.0], [0, 0, 0, 0, 1, 1]
    # group 0: mean 0.25; population deviation sqrt(3/16) = 0.433, unbiased sqrt(1/4) = 0.5
    np.testing.assert_allclose(group_advantages(rewards, groups)[:4], np.array([0.75, -0.25, -0.25, -0.25]) / np.sqrt(3 / 16), rtol=1e-5)
    unbiased = group_advantages(rewards, groups, ddof=1)
    np.testing.assert_allclose(unbiased[:4], np.array([0.75, -0.25, -0.25, -0.25]) / 0.5, rtol=1e-5)
    np.testing.assert_allclose(unbiased[:4], ((torch.tensor(rewards[:4]) - 0.25) / torch.tensor(rewards[:4]).std()).numpy(), rtol=1e-5)
    assert np.all(unbiased[4:] == 0.0)  # a uniform group still carries nothing
    batch = group_advantages(rewards, groups, scale="batch", ddof=1)
    np.testing.assert_allclose(batch[:4], np.array([0.75, -0.25, -0.25, -0.25]) / np.std(rewards, ddof=1), rtol=1e-5)


def test_completion_entropy_is_the_entropy_of_the_whole_next_token_distribution(tiny_lm, maze_tokenizer):
    tok = maze_tokenizer
    batch = collate([(tok("Step 1. start")["input_ids"], tok("<action>move up</action>")["input_ids"]),
                     (tok("Step 2. a wall to your left")["input_ids"], tok("<action>up</action>")["input_ids"])],
                    tok.pad_token_id)
    with torch.no_grad():
        logits = tiny_lm(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits[:, :-1].float() / 0.7
        p = torch.softmax(logits, -1)
        expected = -(p * torch.log(p)).sum(-1) * batch["completion_mask"][:, 1:]
        for chunk in (0, 3):  # the whole model's logits, and the chunked head
            logprobs, mask, entropy = completion_logprobs(tiny_lm, batch, 0.7, chunk, with_entropy=True)
            torch.testing.assert_close(entropy, expected, rtol=1e-4, atol=1e-5)
            assert len(completion_logprobs(tiny_lm, batch, 0.7, chunk)) == 2  # without it, as before
    assert float(entropy[mask.bool()].min()) > 0.0


def _samples(vocab: int, count: int = 8) -> list[StepSample]:
    rng = np.random.default_rng(3)
    return [StepSample(rng.integers(3, vocab, size=int(rng.integers(3, 20))).tolist(),
                       rng.integers(3, vocab, size=int(rng.integers(1, 9))).tolist(), float(rng.normal())) for _ in range(count)]


def test_micro_batch_token_mean_averages_each_micro_batchs_token_mean(tiny_lm, maze_tokenizer, monkeypatch):
    """verl's token-mean under gradient accumulation: micro-batches of 2, 5 and 8 completion tokens each weigh a
    third, where token-mean weighs them 2 : 5 : 8."""
    samples = [StepSample([5, 6, 7], list(range(10, 10 + n)), 1.0) for n in (2, 5, 8)]
    normalizers = {}

    def recording(aggregation):
        def loss(*args, **kwargs):
            normalizers.setdefault(aggregation, []).append(args[8])
            return real(*args, **kwargs)
        return loss

    real = grpo.grpo_loss
    for aggregation in ("token-mean", "micro-batch-token-mean"):
        monkeypatch.setattr(grpo, "grpo_loss", recording(aggregation))
        cfg = RunConfig.from_run_config({"grpo.mini-batch-size": 3, "grpo.ppo-micro-batch-size-per-gpu": 1, "grpo.loss-aggregation": aggregation, "device": "cpu", "grpo.group-by-length": False})
        grpo_trainer(copy.deepcopy(tiny_lm), maze_tokenizer, cfg, RolloutConfig(history_length=0)).update(
            samples, np.random.default_rng(0))
    assert normalizers["token-mean"] == [15, 15, 15]
    assert sorted(normalizers["micro-batch-token-mean"]) == [6, 15, 24]  # 3 micro-batches x each one's tokens


def test_the_entropy_bonus_raises_the_policys_entropy_where_nothing_else_pulls(tiny_lm, maze_tokenizer):
    samples = [replace(s, advantage=0.0) for s in _samples(tiny_lm.config.vocab_size)]
    batch = collate([(s.prompt_ids, s.completion_ids) for s in samples], maze_tokenizer.pad_token_id)

    def mean_entropy(model) -> float:
        with torch.no_grad():
            _, mask, entropy = completion_logprobs(model, batch, with_entropy=True)
        return float(entropy.sum() / mask.sum())

    before = mean_entropy(tiny_lm)
    after = {}
    for coeff in (0.0, 0.5):
        model = copy.deepcopy(tiny_lm)
        cfg = RunConfig.from_run_config({"grpo.learning-rate": 1e-2, "grpo.beta": 0.0, "grpo.mini-batch-size": 8, "grpo.ppo-micro-batch-size-per-gpu": 4, "device": "cpu", "grpo.entropy-coeff": coeff, "grpo.uniform-groups": "keep"})
        grpo_trainer(model, maze_tokenizer, cfg, RolloutConfig(history_length=0)).update(samples, np.random.default_rng(0))
        after[coeff] = mean_entropy(model)
    assert after[0.0] == pytest.approx(before, abs=1e-6)  # advantage 0 and no KL: no gradient at all
    assert after[0.5] > before + 1e-3


@pytest.mark.parametrize("key, value", [("grpo.clip-ratio-c", 1.0), ("grpo.clip-ratio-c", -3.0), ("grpo.kl-clamp", -1.0),
                                        ("grpo.entropy-coeff", -0.001), ("grpo.reward-std-ddof", 2)])
def test_out_of_range_loss_options_are_refused_naming_the_key(key, value):
    with pytest.raises(ValueError, match=f"{key}={value}"):
        RunConfig.from_run_config({key: value})
