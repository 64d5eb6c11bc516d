from envs import make_env
from fedagent_flwr.evaluation import summarize
from fedagent_flwr.rollout import ExpertPolicy, LMPolicy, PromptEncoder, RolloutConfig, run_episodes


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
    trajs = run_episodes(policy, lambda: make_env("maze"), tasks, PromptEncoder(maze_tokenizer), RolloutConfig())
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
    cfg = RolloutConfig(temperature=0.0, max_new_tokens=12)
    encoder = PromptEncoder(maze_tokenizer)
    policy = LMPolicy(tiny_lm, maze_tokenizer, cfg)
    batched = run_episodes(policy, lambda: make_env("maze", max_steps=3), tasks, encoder, cfg)
    single = [run_episodes(policy, lambda: make_env("maze", max_steps=3), [t], encoder, cfg)[0] for t in tasks]
    for b, s in zip(batched, single):
        assert [x.completion_ids for x in b.steps] == [x.completion_ids for x in s.steps]


def test_invalid_actions_are_penalised_and_counted(tiny_lm, maze_tokenizer):
    # A random model writes no valid action: every step is penalised.
    cfg = RolloutConfig(temperature=0.0, max_new_tokens=8, invalid_penalty=0.1)
    env = make_env("maze", max_steps=4)
    trajs = run_episodes(LMPolicy(tiny_lm, maze_tokenizer, cfg), lambda: make_env("maze", max_steps=4),
                         env.tasks()[:2], PromptEncoder(maze_tokenizer), cfg)
    for t in trajs:
        assert len(t.steps) == 4 and t.num_invalid == 4
        assert t.penalty == 0.4 and t.reward == -0.4  # success reward 0, minus 4 x 0.1
    assert summarize(trajs)["invalid_action_rate"] == 1.0
