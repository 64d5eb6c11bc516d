"""The FedAgent reference's procedure as run-config values: the per-step, format-only rollout.invalid-action penalty, and
the KL term anchored to the run's initial model under full fine-tuning (docs/presets.md)."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from envs import Task, make_env
from fedagent_flwr.agent.training.advantages import StepSample, step_advantages, trajectories_to_samples
from fedagent_flwr.agent.play.rollout import PromptEncoder, RolloutConfig, StepRecord, Trajectory, run_episodes
from fedagent_flwr.config import RunConfig
from fedagent_flwr.methods.placement import place_run
from placed import grpo_trainer, rollout_config


def _trajectory(won: bool, penalties: list[float]) -> Trajectory:
    steps = [StepRecord([1, 2], [3, 4], "", "", 0.0, p == 0.0, penalty=p) for p in penalties]
    episode = 10.0 if won else 0.0
    return Trajectory(task=Task("t", "c", "train"), steps=steps, won=won, penalty=sum(penalties),
                      reward=episode - sum(penalties), episode_reward=episode)


def test_step_scope_penalises_only_the_invalid_step_and_normalises_over_the_groups_steps():
    """Two winning episodes of two steps, the first with one invalid step: scored per step (the reference), the
    invalid step alone is pushed down and the other three rows share one advantage; scored per trajectory, both
    steps of the first episode are pushed down alike."""
    trajs = [_trajectory(True, [0.1, 0.0]), _trajectory(True, [0.0, 0.0])]
    per_step = step_advantages(trajs, [0, 0], 1e-6, "step")
    rows = np.array([9.9, 10.0, 10.0, 10.0])
    expected = (rows - rows.mean()) / (rows.std() + 1e-6)
    np.testing.assert_allclose(np.concatenate(per_step), expected, rtol=1e-6)
    assert per_step[0][0] < 0 < per_step[0][1] == per_step[1][0] == per_step[1][1]
    per_trajectory = step_advantages(trajs, [0, 0], 1e-6, "trajectory")
    assert per_trajectory[0][0] == per_trajectory[0][1] < 0 < per_trajectory[1][0]


def test_step_scope_weighs_each_step_row_in_the_groups_statistics():
    """Without penalties the per-step rows still differ from per-trajectory statistics: a long failed episode
    counts once per step in the mean (compute_grpo_outcome_advantage over step rows)."""
    trajs = [_trajectory(True, [0.0]), _trajectory(False, [0.0, 0.0, 0.0])]
    per_step = np.concatenate(step_advantages(trajs, [0, 0], 1e-6, "step"))
    rows = np.array([10.0, 0.0, 0.0, 0.0])
    np.testing.assert_allclose(per_step, (rows - rows.mean()) / (rows.std() + 1e-6), rtol=1e-6)
    samples = trajectories_to_samples(trajs, [0, 0], 1e-6, "token-mean", "keep", "step")
    assert [s.advantage for s in samples] == pytest.approx(list(per_step))


class _ScriptedPolicy:
    """Writes each episode's scripted completions in order."""

    def __init__(self, tokenizer, script: list[str]) -> None:
        self.tokenizer, self.script, self.calls = tokenizer, script, 0

    def act(self, episodes):
        text = self.script[self.calls]
        self.calls += 1
        return [(self.tokenizer(text, add_special_tokens=False)["input_ids"], text) for _ in episodes]


@pytest.mark.parametrize("invalid_action, expected", [("inadmissible", [0.1, 0.1]), ("malformed", [0.0, 0.1])])
def test_which_step_draws_the_penalty(maze_tokenizer, invalid_action, expected):
    """A well-formed action the environment rejects is invalid for this project's default, not for the reference's
    projection (tags only); a completion without tags is invalid for both."""
    cfg = RolloutConfig(history_length=0, invalid_penalty=0.1, invalid_action=invalid_action)
    script = ["<think>go</think><action>fly to the moon</action>", "fly to the moon"]
    traj = run_episodes(_ScriptedPolicy(maze_tokenizer, script), lambda: make_env("maze", max_steps=2),
                        make_env("maze").tasks()[:1], PromptEncoder(maze_tokenizer), cfg)[0]
    assert [s.penalty for s in traj.steps] == expected
    assert [s.valid for s in traj.steps] == [False, False]  # validity as reported does not change with the rule
    assert traj.penalty == pytest.approx(sum(expected)) and traj.reward == pytest.approx(traj.episode_reward - sum(expected))


def test_the_run_config_carries_the_penalty_rule_to_the_rollout():
    cfg = RunConfig.from_run_config(RunConfig().to_run_config() | {"rollout.invalid-action": "malformed", "rollout.invalid-penalty-scope": "step"})
    rollout = rollout_config(cfg)
    assert (rollout.invalid_action, rollout.penalty_scope) == ("malformed", "step")
    assert (rollout_config(RunConfig()).invalid_action, rollout_config(RunConfig()).penalty_scope) == ("inadmissible", "trajectory")


@pytest.mark.parametrize("overrides, expected", [
    ({}, "round-start"),
    ({"baseline.name": "centralized"}, "base"),
    ({"baseline.name": "local", "baseline.local-client": 1, "num-clients": 4}, "base"),
    ({"baseline.name": "centralized", "grpo.kl-reference": "round-start"}, "round-start"),
    ({"grpo.kl-reference": "base"}, "base"),
])
def test_a_single_learner_anchors_its_kl_term_to_the_initial_model(overrides, expected):
    """The Centralized and Local baselines are one learner trained for T x tau epochs: like the reference's plain verl
    run, its KL reference is the initial model for the whole run, not a new anchor every round."""
    cfg = RunConfig.from_run_config(RunConfig().to_run_config() | overrides)
    assert place_run(cfg).kl_reference == expected


def test_full_fine_tuning_anchored_to_base_scores_the_kl_term_against_the_base_weights(tiny_lm, maze_tokenizer):
    tok = maze_tokenizer
    base = copy.deepcopy(tiny_lm)
    round_start = copy.deepcopy(tiny_lm)
    with torch.no_grad():  # a model some rounds away from its base
        for p in round_start.parameters():
            p.add_(0.05 * torch.randn_like(p))
    prompt = tok("Step 1. Observation: start")["input_ids"]
    samples = [StepSample(prompt, tok("<think>go</think><action>move up</action>")["input_ids"], 1.0)]
    cfg = RunConfig().updated({"grpo.beta": 0.01, "grpo.kl-reference": "base"})
    trainer = grpo_trainer(round_start, tok, cfg, RolloutConfig(history_length=0), base_model=base)
    anchored = trainer._reference_logprobs(samples)[0]
    assert torch.allclose(anchored, trainer._logprobs(base, samples)[0])
    assert not torch.allclose(anchored, trainer._logprobs(round_start, samples)[0])
    assert all(not p.requires_grad for p in base.parameters())
    with pytest.raises(ValueError, match="base_model"):
        grpo_trainer(copy.deepcopy(tiny_lm), tok, cfg, RolloutConfig(history_length=0))

