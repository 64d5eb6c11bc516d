"""The rollout keeps each drawn token's log-probability, and GRPO with grpo.old-logprobs = rollout takes them as the round-start
policy's instead of recomputing them: the same numbers (up to rounding), one no-grad pass fewer, the same update."""

import copy

import numpy as np
import pytest
import torch

from envs import make_env
from fedagent_flwr.agent.engine.tokens import collate, completion_logprobs
from fedagent_flwr.agent.play.rollout import ExpertPolicy, LMPolicy, PromptEncoder, RolloutConfig, run_episodes
from fedagent_flwr.agent.training import grpo
from fedagent_flwr.agent.training.advantages import trajectories_to_samples
from fedagent_flwr.config import RunConfig
from placed import grpo_trainer


def _play(model, tokenizer, temperature: float, seed: int = 0):
    torch.manual_seed(seed)
    cfg = RolloutConfig(history_length=2, temperature=temperature, max_new_tokens=10)
    env = make_env("maze", max_steps=3)
    tasks = [t for t in env.tasks()[:3] for _ in range(4)]  # groups of 4
    return run_episodes(LMPolicy(model, tokenizer, cfg), lambda: make_env("maze", max_steps=3), tasks,
                        PromptEncoder(tokenizer), cfg), cfg


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_the_rollout_keeps_the_log_probs_a_training_pass_computes(tiny_lm, maze_tokenizer, temperature):
    trajectories, _ = _play(tiny_lm, maze_tokenizer, temperature)
    steps = [s for t in trajectories for s in t.steps]
    assert steps and all(s.logprobs is not None and len(s.logprobs) == len(s.completion_ids) for s in steps)
    with torch.no_grad():
        batch = collate([(s.prompt_ids, s.completion_ids) for s in steps], maze_tokenizer.pad_token_id)
        recomputed, mask = completion_logprobs(tiny_lm, batch, temperature)
    for step, row, m in zip(steps, recomputed, mask):
        torch.testing.assert_close(torch.tensor(step.logprobs), row[m], rtol=0, atol=1e-4)
    assert min(min(s.logprobs) for s in steps) < -0.5  # sampled, not near-certain tokens: a real comparison


def test_greedy_decoding_and_scripted_policies_keep_none(tiny_lm, maze_tokenizer):
    greedy, _ = _play(tiny_lm, maze_tokenizer, 0.0)
    assert all(s.logprobs is None for t in greedy for s in t.steps)
    cfg = RolloutConfig(history_length=2)
    expert = run_episodes(ExpertPolicy(maze_tokenizer), lambda: make_env("maze"), make_env("maze").tasks()[:2],
                          PromptEncoder(maze_tokenizer), cfg)
    assert all(s.logprobs is None for t in expert for s in t.steps)


def test_an_update_on_the_rollouts_log_probs_skips_the_old_policy_pass_and_takes_the_same_steps(tiny_lm, maze_tokenizer,
                                                                                                 monkeypatch):
    trajectories, rollout = _play(tiny_lm, maze_tokenizer, 1.0, seed=3)
    rng = np.random.default_rng(0)
    rewards = rng.normal(size=len(trajectories))  # every group informative, as a won/lost split makes it
    for t, r in zip(trajectories, rewards):
        t.reward = float(r)
    samples = trajectories_to_samples(trajectories, [i // 4 for i in range(len(trajectories))], 1e-6)
    cfg = RunConfig.from_run_config({"grpo.learning-rate": 1e-3, "grpo.beta": 0.05, "grpo.mini-batch-size": 8, "grpo.ppo-micro-batch-size-per-gpu": 4, "device": "cpu"})
    assert len(samples) > cfg.grpo.mini_batch_size  # more than one step: the old log-probs are needed
    real = grpo.completion_logprobs

    def run(source):
        passes = {"no_grad": 0}

        def counting(*args, **kwargs):
            passes["no_grad"] += not torch.is_grad_enabled()
            return real(*args, **kwargs)

        monkeypatch.setattr(grpo, "completion_logprobs", counting)
        model = copy.deepcopy(tiny_lm)
        trainer = grpo_trainer(model, maze_tokenizer, cfg.updated({"grpo.old-logprobs": source}), rollout)
        stats = trainer.update(samples, np.random.default_rng(1))
        return stats, model.state_dict(), passes["no_grad"]

    recomputed, recomputed_weights, recomputed_passes = run("recompute")
    kept, kept_weights, kept_passes = run("rollout")
    micro = -(-len(samples) // cfg.grpo.log_prob_rows())
    assert recomputed_passes == 2 * micro and kept_passes == micro  # the reference's pass stays
    assert recomputed["optimizer_steps"] == kept["optimizer_steps"] >= 2
    assert "rollout_logprob_gap" not in recomputed and 0 <= kept["rollout_logprob_gap"] < 1e-4  # fp32: rounding only
    # The round's report of that gap: signed mean, largest, share of tokens beyond 0.01 nats, and the first step's
    # clip fraction, which is 0 when both score the same policy (the ratio starts at 1).
    assert abs(kept["rollout_logprob_gap_signed"]) <= kept["rollout_logprob_gap"] <= kept["rollout_logprob_gap_max"] < 1e-3
    assert kept["rollout_logprob_gap_over_001"] == 0.0 and kept["first_step_clip_frac"] == 0.0
    for key in ("loss", "kl", "grad_norm"):
        assert kept[key] == pytest.approx(recomputed[key], rel=1e-3, abs=1e-6), key
    # AdamW moves a weight by about lr (1e-3) a step whatever its gradient's size, so where a gradient is near 0 the
    # rollout's rounding (1e-7 a log-prob) can move it a little: on an AMD EPYC one weight of 2,048 ended 5e-6 apart.
    # 1e-5 (1 % of one step) allows that and still fails on log-probs of the wrong policy or tokens (whole steps apart).
    for name, weight in recomputed_weights.items():
        torch.testing.assert_close(kept_weights[name], weight, rtol=1e-4, atol=1e-5, msg=lambda m, name=name: f"{name}: {m}")
    assert any(not torch.equal(w, tiny_lm.state_dict()[n]) for n, w in kept_weights.items())  # it did train


def test_the_rollout_gap_counts_what_lies_apart(monkeypatch):
    """rollout_gap's sums over the completion mask: signed and absolute differences, the largest, the tokens beyond
    0.01 nats; a masked position counts for nothing whatever its values."""
    from fedagent_flwr.agent.training.grpo_loss import rollout_gap

    trained = torch.tensor([[-1.0, -2.0, -3.0, -9.0]])
    rollout = torch.tensor([[-1.0, -2.05, -2.995, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    signed, absolute, largest, over, n = rollout_gap(trained, rollout, mask).tolist()
    assert (signed, absolute, largest) == pytest.approx((0.045, 0.055, 0.05), abs=1e-6)
    assert (over, n) == (1.0, 3.0)  # 0.05 is beyond 0.01, 0.005 is not, the masked 9 nats not at all
