import pytest

from envs import make_env
from fedagent_flwr.agent.play.action_matching import match_action
from fedagent_flwr.agent.play.evaluation import summarize
from fedagent_flwr.agent.play.prompts import expert_completion
from fedagent_flwr.agent.play.rollout import RolloutConfig, run_episodes


class TextPolicy:
    """Writes `transform(expert action)` in the answer format; no model needed."""

    def __init__(self, transform):
        self.transform = transform

    def act(self, episodes):
        return [([], expert_completion(self.transform(e.env, e.env.expert_action()))) for e in episodes]


def drop_last_id_char(env, action):
    """A near miss on product ids, the tiny model's typical WebShop error: click[b0oju6g7g] for click[b0oju6g7gd]."""
    arg = action[len("click["):-1] if action.startswith("click[") else ""
    return f"click[{arg[:-1]}]" if len(arg) == 10 and any(ch.isdigit() for ch in arg) else action


class NoEncoder:
    def encode_many(self, prompts, systems=None):
        return [[] for _ in prompts]


def _results_page(env):
    env.reset(env.tasks_of_split("test")[0])
    env.step(env.expert_action())  # search
    return env.expert_action()  # click[<asin>] on the results page


def test_closest_matching_takes_the_admissible_action_a_near_miss_was_meant_to_be():
    env = make_env("webshop")
    click = _results_page(env)
    near_miss = drop_last_id_char(env, click)
    assert near_miss != click and not env.is_admissible(near_miss)
    assert match_action(env, near_miss, "closest") == (click, False)
    assert match_action(env, click.upper(), "closest") == (click, True)  # admissible once normalised
    assert match_action(env, near_miss, "exact") == (near_miss, True)  # the env judges it itself
    with pytest.raises(ValueError, match="exact"):
        match_action(env, click, "nearest")


def test_closest_matching_never_picks_a_placeholder():
    env = make_env("webshop")
    env.reset(env.tasks_of_split("test")[0])
    assert env.admissible_actions() == ["search[<your query>]"]
    assert match_action(env, "search[socks", "closest") == ("search[socks", False)  # nothing to match: passed on
    env.step("search[socks]")
    assert match_action(env, "  ", "closest") == ("", False)  # an empty answer is not matched either
    maze = make_env("maze")
    maze.reset(maze.tasks()[0])
    assert match_action(maze, "move uup", "closest") == ("move up", False)


def test_matched_steps_play_on_but_stay_invalid_and_penalised():
    tasks = make_env("webshop").tasks_of_split("test")[:6]
    factory = lambda: make_env("webshop")  # noqa: E731
    matched = run_episodes(TextPolicy(drop_last_id_char), factory, tasks, NoEncoder(),
                           RolloutConfig(history_length=2, action_matching="closest", invalid_penalty=0.1))
    exact = run_episodes(TextPolicy(drop_last_id_char), factory, tasks, NoEncoder(), RolloutConfig(history_length=2, invalid_penalty=0.1))
    for m, e in zip(matched, exact):
        typos = [s for s in m.steps if not s.valid]
        assert m.won and len(typos) >= 1  # every episode clicks at least one product id
        assert all(s.action.startswith("click[b") for s in typos)  # the record holds the executed action
        assert m.reward == pytest.approx(10.0 - 0.1 * len(typos))
        assert not e.won  # as written, the near miss is only an invalid action


def test_webshop_score_is_reported_and_can_be_the_reward():
    env = make_env("webshop")
    tasks = env.tasks_of_split("test")[:10]

    def buy_first_result(env, action):
        # Search as the expert does, then buy whatever product it opens first, options unset.
        return "click[buy now]" if env.session.page == "item" else action

    trajs = run_episodes(TextPolicy(buy_first_result), lambda: make_env("webshop"), tasks, NoEncoder(),
                         RolloutConfig(history_length=2, reward="score", invalid_penalty=0.0))
    scores = [t.score for t in trajs]
    assert all(s is not None and 0.0 <= s <= 1.0 for s in scores)
    assert any(0.0 < s < 1.0 for s in scores)  # partial credit: WebShop's dense signal
    for t in trajs:
        assert t.reward == pytest.approx(10.0 * t.score)
        assert t.won == (t.score == 1.0)
    m = summarize(trajs)
    assert m["mean_score"] == pytest.approx(sum(scores) / len(scores))
    for category in {t.task.category for t in trajs}:
        group = [t.score for t in trajs if t.task.category == category]
        assert m[f"mean_score/{category}"] == pytest.approx(sum(group) / len(group))
    # Environments without a task score report none, and "score" falls back to the success reward.
    maze = run_episodes(TextPolicy(lambda env, a: a), lambda: make_env("maze"), make_env("maze").tasks()[:2], NoEncoder(),
                        RolloutConfig(history_length=2, reward="score"))
    assert all(t.score is None and t.reward == 10.0 for t in maze) and "mean_score" not in summarize(maze)
