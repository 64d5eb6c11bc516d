import dataclasses

import pytest

from envs import make_env
from fedagent_flwr.agent.play.evaluation import summarize
from fedagent_flwr.agent.play.prompts import build_prompt
from fedagent_flwr.agent.play.rollout import ExpertPolicy, LMPolicy, PromptEncoder, RolloutConfig, run_episodes


class CountingPolicy:
    """Wraps a policy and records how many episodes each call had to serve."""

    def __init__(self, inner):
        self.inner = inner
        self.batch_sizes = []

    def act(self, episodes):
        self.batch_sizes.append(len(episodes))
        return self.inner.act(episodes)


def test_all_live_episodes_advance_together_and_finished_ones_drop_out(maze_tokenizer):
    env = make_env("maze")
    tasks = env.tasks()
    policy = CountingPolicy(ExpertPolicy(maze_tokenizer))
    trajs = run_episodes(policy, lambda: make_env("maze"), tasks, PromptEncoder(maze_tokenizer), RolloutConfig(history_length=2))
    lengths = sorted(len(t.steps) for t in trajs)
    # one call per step of the longest episode, each serving the episodes still running
    assert len(policy.batch_sizes) == lengths[-1]
    assert policy.batch_sizes == [sum(n > step for n in lengths) for step in range(lengths[-1])]
    assert all(t.won and t.reward == 10.0 for t in trajs)
    assert summarize(trajs)["success_rate"] == 1.0


def test_batched_generation_equals_one_episode_at_a_time(tiny_lm, maze_tokenizer):
    """Left padding must not change what the model writes: greedy batched == greedy alone."""
    env = make_env("maze")
    tasks = env.tasks()[:6]
    cfg = RolloutConfig(history_length=2, temperature=0.0, max_new_tokens=12)
    encoder = PromptEncoder(maze_tokenizer)
    policy = LMPolicy(tiny_lm, maze_tokenizer, cfg)
    batched = run_episodes(policy, lambda: make_env("maze", max_steps=3), tasks, encoder, cfg)
    single = [run_episodes(policy, lambda: make_env("maze", max_steps=3), [t], encoder, cfg)[0] for t in tasks]
    for b, s in zip(batched, single):
        assert [x.completion_ids for x in b.steps] == [x.completion_ids for x in s.steps]


def test_invalid_actions_are_penalised_and_counted(tiny_lm, maze_tokenizer):
    # A random model writes no valid action: every step is penalised.
    cfg = RolloutConfig(history_length=2, temperature=0.0, max_new_tokens=8, invalid_penalty=0.1)
    env = make_env("maze", max_steps=4)
    trajs = run_episodes(LMPolicy(tiny_lm, maze_tokenizer, cfg), lambda: make_env("maze", max_steps=4),
                         env.tasks()[:2], PromptEncoder(maze_tokenizer), cfg)
    for t in trajs:
        assert len(t.steps) == 4 and t.num_invalid == 4
        assert t.penalty == 0.4 and t.reward == -0.4  # success reward 0, minus 4 x 0.1
    assert summarize(trajs)["invalid_action_rate"] == 1.0


def test_a_noisy_expert_takes_random_admissible_moves_at_its_rate_and_repeats_by_seed(maze_tokenizer):
    env = make_env("maze")
    tasks = [t for t in env.tasks() for _ in range(4)]
    encoder, cfg = PromptEncoder(maze_tokenizer), RolloutConfig(history_length=2)

    def play(epsilon, seed):
        trajs = run_episodes(ExpertPolicy(maze_tokenizer, epsilon=epsilon, seed=seed), lambda: make_env("maze"), tasks, encoder, cfg)
        off_expert, steps = 0, 0
        for t in trajs:
            replay = make_env("maze")
            replay.reset(t.task)
            for s in t.steps:
                assert s.valid and s.completion == f"<think>next: {s.action}</think><action>{s.action}</action>"
                off_expert += s.action != replay.expert_action()
                steps += 1
                replay.step(s.action)
        return [[s.action for s in t.steps] for t in trajs], off_expert / steps

    plain, off = play(0.0, 0)
    assert off == 0.0
    noisy, off = play(0.5, 3)
    # A random move differs from the expert's 3 times in 4: about 0.5 x 3/4 of the steps.
    assert 0.28 < off < 0.47
    assert play(0.5, 3)[0] == noisy and play(0.5, 4)[0] != noisy


def test_prompts_encoded_together_equal_prompts_encoded_one_by_one(maze_tokenizer):
    encoder = PromptEncoder(maze_tokenizer)
    env = make_env("maze")
    prompts = []
    for task in env.tasks()[:5]:
        obs, _ = env.reset(task)
        prompts.append(build_prompt(env, obs, [], 0))
    assert encoder.has_chat_template
    assert encoder.encode_many(prompts) == [encoder(p) for p in prompts]
    assert encoder.encode_many([]) == []


def test_evaluation_command_plays_a_saved_model_on_held_out_tasks(tiny_lm, maze_tokenizer, tmp_path, capsys):
    import json

    from fedagent_flwr.experiments.evaluate import main

    tiny_lm.save_pretrained(tmp_path)
    maze_tokenizer.save_pretrained(tmp_path)
    assert main(["--model", str(tmp_path), "--env", "maze", "--tasks", "2", "--samples-per-task", "2", "--temperature", "0"]) == 0
    metrics = json.loads(capsys.readouterr().out)
    # A random model: 2 tasks x 2 episodes, every step invalid, no success.
    assert metrics["episodes"] == 4.0 and metrics["success_rate"] == 0.0 and metrics["invalid_action_rate"] == 1.0


@pytest.mark.parametrize("name", ["maze", "textcraft"])
def test_the_expert_plays_whole_episodes_in_agentgyms_answer_form(name, maze_tokenizer):
    """rollout.prompt-template = agentgym end to end: the prompts ask for Thought / Action, the expert answers in that form,
    each answer is read by the environment's AgentGym reading, and every step is valid and every episode won; read as
    our strict <think>/<action> answers instead, no step would be well formed."""
    env = make_env(name)
    cfg = RolloutConfig(history_length=2, prompt_template="agentgym", answer_parsing="agentgym", max_new_tokens=8)
    trajs = run_episodes(ExpertPolicy(maze_tokenizer, template="agentgym"), lambda: make_env(name), env.tasks()[:3],
                         PromptEncoder(maze_tokenizer), cfg)
    assert all(t.won and t.num_invalid == 0 for t in trajs)
    step = trajs[0].steps[-1]
    assert step.completion.startswith("Thought:\n") and "\n\nAction:\n" in step.completion and "Thought:" in step.prompt
    strict = run_episodes(ExpertPolicy(maze_tokenizer, template="agentgym"), lambda: make_env(name), env.tasks()[:1],
                          PromptEncoder(maze_tokenizer), dataclasses.replace(cfg, answer_parsing="strict"))
    assert all(not s.valid for s in strict[0].steps)


def test_a_context_limit_leaves_out_the_oldest_steps_until_a_prompt_fits(maze_tokenizer):
    """rollout.max-context-tokens: every prompt plus the generated tokens fits the limit, showing the most past steps that fit
    (one more would not) and still counting every step taken; what is played does not change."""
    tasks, encoder = make_env("maze").tasks()[:4], PromptEncoder(maze_tokenizer)
    play = lambda limit: run_episodes(ExpertPolicy(maze_tokenizer), lambda: make_env("maze"), tasks, encoder,
                                      RolloutConfig(history_length=10, max_new_tokens=8, max_context_tokens=limit))
    whole = play(0)
    first, longest = (len(whole[0].steps[0].prompt_ids), max(len(s.prompt_ids) for t in whole for s in t.steps))
    limit = (first + longest) // 2 + 8
    cut = play(limit)
    assert [[s.action for s in t.steps] for t in cut] == [[s.action for s in t.steps] for t in whole]
    shortened = 0
    for t, w in zip(cut, whole):
        replay = make_env("maze")
        replay.reset(t.task)
        history = []
        for k, (s, full) in enumerate(zip(t.steps, w.steps)):
            assert len(s.prompt_ids) + 8 <= limit
            if s.prompt != full.prompt:
                shortened += 1
                shown = next(n for n in range(1, 11) if s.prompt == build_prompt(replay, s.observation, history, n))
                more = build_prompt(replay, s.observation, history, shown + 1)
                assert len(encoder.encode_many([more])[0]) + 8 > limit and f"You have taken {k} step(s)" in s.prompt
            history.append((s.observation, s.action))
            replay.step(s.action)
    assert shortened > 0
    with pytest.raises(ValueError, match=r"rollout.max-context-tokens=20: a prompt of task .* needs \d+ tokens"):
        play(20)


@pytest.mark.parametrize("evaluation", [False, True])
def test_the_run_configs_token_sampler_draws_the_rollouts_and_the_evaluations_tokens(evaluation, tiny_lm, maze_tokenizer,
                                                                                     monkeypatch):
    from fedagent_flwr.agent.engine import sampling
    from fedagent_flwr.config import RunConfig
    from placed import rollout_config

    drawn_by, pick = [], sampling.pick_tokens
    monkeypatch.setattr(sampling, "pick_tokens", lambda *a: drawn_by.append(a[3]) or pick(*a))
    for sampler in ("inverse-cdf", "multinomial"):
        run = RunConfig.from_run_config({"env": "maze", "rollout.token-sampler": sampler, "rollout.temperature": 1.0, "eval.temperature": 0.5, "rollout.history-length": 2})
        cfg = dataclasses.replace(rollout_config(run, evaluation), max_new_tokens=4)
        run_episodes(LMPolicy(tiny_lm, maze_tokenizer, cfg), lambda: make_env("maze", max_steps=2),
                     make_env("maze").tasks()[:2], PromptEncoder(maze_tokenizer), cfg)
        assert drawn_by and set(drawn_by) == {sampler}
        drawn_by.clear()
