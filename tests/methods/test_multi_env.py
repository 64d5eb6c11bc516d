"""Multi-environment federation: env specs, routing, by-environment partition, per-env results."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from envs import Task, env_names, make_env, task_env
from envs.babyai import BabyAIEnv
from envs.maze import MazeEnv
from envs.multi import per_env_spread, per_env_sample
from envs.wordle import WordleEnv
from fedagent_flwr.config import RunConfig
from fedagent_flwr.runs.preflight import preflight
from fedagent_flwr.agent.play.evaluation import summarize
from fedagent_flwr.methods.tasks import learner_tasks as client_tasks
from fedagent_flwr.agent.play.multi_env import environment_table, format_row, per_env_summary
from fedagent_flwr.runs.reporting import RunReporter
from fedagent_flwr.agent.play.rollout import ExpertPolicy, PromptEncoder, RolloutConfig, Trajectory, run_episodes
from partitions import by_environment, make_partitioner, task_table

SPEC = "babyai,maze,wordle"


@pytest.fixture(scope="module")
def pool():
    return make_env(SPEC)


# ---------------------------------------------------------------- spec and config


def test_spec_names_are_checked_one_by_one():
    assert env_names(" babyai , maze") == ["babyai", "maze"]
    with pytest.raises(ValueError, match="unknown environment 'chess'"):
        env_names("babyai,chess")
    with pytest.raises(ValueError, match="empty name"):
        env_names("babyai,,maze")
    with pytest.raises(ValueError, match="maze more than once"):
        env_names("maze,babyai,maze")
    with pytest.raises(ValueError, match=r"env='maze,chess' is not allowed: .*unknown environment 'chess'"):
        preflight(RunConfig.from_run_config({"env": "maze,chess"}))  # the registry is asked at start-up
    with pytest.raises(ValueError, match=r"env='maze,,wordle' is not allowed: .*none empty"):
        RunConfig.from_run_config({"env": "maze,,wordle"})  # the spec's form, by the run config itself
    with pytest.raises(ValueError, match=r"model='tiny:maze,chess'"):
        preflight(RunConfig.from_run_config({"model": "tiny:maze,chess"}))
    with pytest.raises(ValueError, match=r"num-clients=4 is not allowed: expected 3 \(one client per environment"):
        RunConfig.from_run_config({"env": SPEC, "partition.scheme": "by-environment", "num-clients": 4, "clients-per-round": 2})
    cfg = RunConfig.from_run_config({"env": SPEC, "partition.scheme": "by-environment"})
    assert cfg.check_federation(3) == 3
    with pytest.raises(ValueError, match="needs 3 clients, but the federation has K=5"):
        cfg.check_federation(5)


# ---------------------------------------------------------------- the combined pool and routing


def test_pool_is_the_union_with_the_env_in_every_task_identity(pool):
    parts = {name: make_env(name).tasks() for name in env_names(SPEC)}
    tasks = pool.tasks()
    assert len(tasks) == sum(len(p) for p in parts.values())
    assert len({t.id for t in tasks}) == len(tasks)  # unique across envs
    for t in tasks:
        name = task_env(t)
        inner = t.data["task"]
        assert t.id == f"{name}/{inner.id}" and t.category == f"{name}/{inner.category}" and t.split == inner.split
    # The order follows the spec, and each env's own order is kept.
    assert [t.data["task"].id for t in tasks if task_env(t) == "maze"] == [t.id for t in parts["maze"]]
    assert [task_env(t) for t in tasks] == sorted((task_env(t) for t in tasks), key=env_names(SPEC).index)
    assert {t.split for t in pool.tasks_of_split("test")} == {"test"}


def test_every_episode_runs_in_its_own_environment(pool):
    """One batched rollout over tasks of three envs: each episode lands in an instance of its task's env."""
    train = pool.tasks_of_split("train")
    chosen = [next(t for t in train if task_env(t) == n) for n in ("wordle", "babyai", "maze", "babyai")]
    seen = []

    class Recorder(ExpertPolicy):
        def act(self, episodes):
            seen.extend((e.trajectory.task.id, type(e.env._active), id(e.env._active)) for e in episodes)
            return super().act(episodes)

    tokenizer = _CharTokenizer()
    trajectories = run_episodes(Recorder(tokenizer), lambda: make_env(SPEC), chosen, PromptEncoder(tokenizer),
                                RolloutConfig(history_length=1))
    assert [t.task.id for t in trajectories] == [t.id for t in chosen]
    assert all(t.won for t in trajectories)  # the expert of each env wins only in that env
    kinds = {"wordle": WordleEnv, "babyai": BabyAIEnv, "maze": MazeEnv}
    for task_id, kind, _ in seen:
        assert kind is kinds[task_id.split("/")[0]]
    # The two babyai episodes ran in different instances.
    babyai_ids = {(task_id, inst) for task_id, kind, inst in seen if kind is BabyAIEnv}
    assert len({inst for _, inst in babyai_ids}) == 2
    # Wordle's long action list is summarised through its own hook, reached through the router.
    env = make_env(SPEC)
    env.reset(chosen[0])
    assert env.action_hint() == WordleEnv().action_hint()
    assert env.intro == WordleEnv.intro and env.max_steps == WordleEnv.default_max_steps


def test_router_keeps_the_invalid_action_contract(pool):
    env = make_env(SPEC)
    with pytest.raises(RuntimeError, match="reset"):
        env.step("move up")
    maze_task = next(t for t in pool.tasks() if task_env(t) == "maze")
    obs, info = env.reset(maze_task)
    obs2, reward, terminated, truncated, info = env.step("fly to the moon")
    assert obs2.startswith("Invalid action") and not info["valid"] and reward == -4.0 and env.steps == 1
    with pytest.raises(ValueError, match="names no environment"):
        env.reset(Task("plain", "x", "train"))
    with pytest.raises(ValueError, match="not part of the spec"):
        env.reset(next(t for t in make_env("babyai,textcraft").tasks() if task_env(t) == "textcraft"))


def test_per_env_caps_keep_every_environment(pool):
    test = pool.tasks_of_split("test")
    first = per_env_spread(test, 2)
    assert [task_env(t) for t in first] == ["babyai", "babyai", "maze", "maze", "wordle", "wordle"]
    assert per_env_spread(test, 0) == test
    plain = make_env("maze").tasks()
    assert per_env_spread(plain, 3) == [plain[0], plain[8], plain[16]]  # evenly spaced over the pool
    categories = {t.category for t in per_env_spread(plain, 5)}
    assert categories == {t.category for t in plain}
    sample = per_env_sample(pool.tasks_of_split("train"), 5, seed=1)
    assert {n: sum(task_env(t) == n for t in sample) for n in env_names(SPEC)} == {"babyai": 5, "maze": 5, "wordle": 5}
    assert sample == per_env_sample(pool.tasks_of_split("train"), 5, seed=1)
    assert sample != per_env_sample(pool.tasks_of_split("train"), 5, seed=2)


def test_horizons_and_caps_may_be_set_per_environment(pool):
    """rollout.max-steps and eval.tasks take "name=number,..." (Fed-SE v2 limits BabyAI to 20 turns and WebShop to 10 and
    plays test sets of other sizes per environment): the named environments take their number, the others keep their
    default horizon or all their held-out tasks; a single environment reads its own entry."""
    env = make_env(SPEC, "babyai=7,wordle=3")
    assert {n: env.env(n).max_steps for n in env.names} == {"babyai": 7, "maze": MazeEnv.default_max_steps, "wordle": 3}
    assert make_env("maze", "maze=5").max_steps == 5 and make_env("maze", 4).max_steps == 4
    episode = make_env(SPEC, "babyai=2")
    episode.reset(next(t for t in episode.tasks() if task_env(t) == "babyai"))
    for _ in range(2):
        *_, terminated, truncated, _ = episode.step("no such action")
    assert terminated or truncated  # the routed episode ends at its own horizon
    test = pool.tasks_of_split("test")
    counts = lambda tasks: {n: sum(task_env(t) == n for t in tasks) for n in env_names(SPEC)}  # noqa: E731
    sizes = counts(test)
    assert counts(per_env_spread(test, "babyai=3,wordle=2")) == {"babyai": 3, "maze": sizes["maze"], "wordle": 2}
    plain = make_env("maze").tasks_of_split("test")
    assert per_env_spread(plain, "maze=3") == per_env_spread(plain, 3)


@pytest.mark.parametrize("key, value, allowed", [
    ("rollout.max-steps", "webshop=10", "entries for the envs of env='babyai,maze,wordle' only (not webshop)"),
    ("rollout.max-steps", "babyai=0", "name=integer >= 1"),
    ("rollout.max-steps", "babyai=20,babyai=30", "name=integer >= 1"),
    ("rollout.max-steps", "babyai:20", "name=integer >= 1"),
    ("rollout.max-steps", "", "name=integer >= 1"),
    ("eval.tasks", "wordle=100000", "per env at most its size"),
    ("eval.tasks", "chess=3", "entries for the envs of env='babyai,maze,wordle' only (not chess)"),
])
def test_a_bad_per_environment_value_is_refused_in_one_line_naming_the_key(key, value, allowed):
    with pytest.raises(ValueError) as err:  # the form by the run config, the split sizes by the preflight
        preflight(RunConfig.from_run_config({"env": SPEC, key: value}))
    assert str(err.value).count("\n") == 0 and f"{key}={value!r} is not allowed" in str(err.value) and allowed in str(err.value)
    with pytest.raises(ValueError, match="rollout.max-steps='maze=3'"):  # a table-RL environment takes one number
        RunConfig.from_run_config({"env": "cartpole", "strategy": "qavg", "rollout.max-steps": "maze=3"})


# ---------------------------------------------------------------- by-environment partition


def test_by_environment_gives_client_k_environment_k():
    envs = ["a"] * 6 + ["b"] * 3 + ["c"] * 10
    clients = by_environment(envs, 3, partition_size=4, seed=0)
    assert [sorted({envs[i] for i in c}) for c in clients] == [["a"], ["b"], ["c"]]
    assert [len(c) for c in clients] == [4, 3, 4]  # capped at partition_size, smaller envs whole
    assert all(np.all(np.diff(c) > 0) for c in clients)
    assert [c.tolist() for c in by_environment(envs, 3, 4, seed=0)] == [c.tolist() for c in clients]
    assert any(by_environment(envs, 3, 4, seed=s)[0].tolist() != clients[0].tolist() for s in range(1, 6))  # seeded
    with pytest.raises(ValueError, match=r"got 2 client\(s\) for 3 environment\(s\) \(a, b, c\)"):
        by_environment(envs, 2, 4, seed=0)
    with pytest.raises(ValueError, match="partition_size"):
        by_environment(envs, 3, 0, seed=0)


def test_client_tasks_by_environment(pool):
    cfg = RunConfig.from_run_config({"env": SPEC, "partition.scheme": "by-environment", "partition.tasks-per-client": 12})
    sizes = {n: len(make_env(n).tasks_of_split("train")) for n in env_names(SPEC)}
    for k, name in enumerate(env_names(SPEC)):
        mine = client_tasks(cfg, k, 3)
        assert {task_env(t) for t in mine} == {name} and all(t.split == "train" for t in mine)
        assert len(mine) == min(12, sizes[name])
    with pytest.raises(ValueError, match="number of clients must equal the number of environments"):
        client_tasks(cfg, 0, 4)
    # The flwr-datasets Partitioner reads the env column of the task table.
    part = make_partitioner("by-environment", 3, 0, partition_size=2)
    part.dataset = task_table(pool.tasks_of_split("train"))
    assert set(part.load_partition(2)["env"]) == {"wordle"}


# ---------------------------------------------------------------- per-environment results


def _traj(env: str, won: bool, steps: int = 2, invalid: int = 0) -> Trajectory:
    inner = Task(f"{env}-x", "c", "test")
    task = Task(f"{env}/{inner.id}", f"{env}/c", "test", {"env": env, "task": inner})
    t = Trajectory(task=task, won=won)
    t.steps = [SimpleNamespace(valid=i >= invalid, completion_ids=[]) for i in range(steps)]
    return t


def test_per_env_summary_reports_each_env_and_their_mean(tmp_path):
    trajs = [_traj("babyai", True), _traj("babyai", False, invalid=1), _traj("babyai", True),
             _traj("maze", False, steps=4, invalid=4), _traj("wordle", True)]
    m = summarize(trajs)
    assert m["success_rate/env/babyai"] == pytest.approx(2 / 3)
    assert m["success_rate/env/maze"] == 0.0 and m["success_rate/env/wordle"] == 1.0
    assert m["success_rate/mean_over_envs"] == pytest.approx((2 / 3 + 0 + 1) / 3)
    assert m["success_rate"] == pytest.approx(3 / 5)  # pooled over episodes (Fed-SE's "Average")
    assert m["invalid_action_rate/env/babyai"] == pytest.approx(1 / 6) and m["invalid_action_rate/env/maze"] == 1.0
    assert m["episodes/env/babyai"] == 3.0
    assert all(isinstance(v, float) for v in m.values())
    assert per_env_summary([t for t in trajs if False]) == {}
    plain = Trajectory(task=Task("maze-1-1", "far", "test"), won=True)
    assert per_env_summary([plain]) == {}  # single-env runs keep their old metrics

    later = dict(m, **{"success_rate/env/maze": 0.5})
    table = environment_table(m, later, ["babyai", "maze", "wordle"])
    assert table["final_success_rate_per_env"]["maze"] == 0.5 and table["initial_success_rate_per_env"]["wordle"] == 1.0
    assert list(table["final_success_rate_per_env"]) == ["babyai", "maze", "wordle"]
    assert format_row(m, ["babyai", "maze", "wordle"]).startswith("babyai 0.667 | maze 0.000 | wordle 1.000 | mean 0.556")
    json.dumps(table)

    reporter = RunReporter(tmp_path / "run")
    reporter.log({"round": 0} | {f"eval/{k}": v for k, v in m.items()})
    reporter.log({"round": 1, "train/success_rate": 0.5} | {f"eval/{k}": v for k, v in later.items()})
    assert (tmp_path / "run" / "learning_curve.png").stat().st_size > 0
    assert "eval/success_rate/env/maze" in (tmp_path / "run" / "metrics.csv").read_text().split("\n")[0]


class _CharTokenizer:
    """Just enough tokenizer for the expert policy and the prompt encoder: one id per character."""

    eos_token_id = 0
    unk_token_id = None
    chat_template = None

    def convert_tokens_to_ids(self, token):
        return None

    def __call__(self, text, add_special_tokens=True):
        if isinstance(text, list):  # a batch, as HF tokenizers take it
            return {"input_ids": [self(t)["input_ids"] for t in text]}
        return {"input_ids": [min(ord(c), 5000) for c in text]}


def test_tiny_recipe_for_a_spec_is_keyed_by_its_env_list(tmp_path):
    from fedagent_flwr.agent.models.tiny_model import SINGLE_ENV_PRESETS, TinyRecipe, default_recipe, ensure_tiny_model, tiny_model_dir

    assert default_recipe("babyai, maze") == default_recipe("babyai,maze")
    assert default_recipe("babyai,maze").digest() != default_recipe("maze,babyai").digest()
    # Single envs keep their own recipe and cache key (a preset where one exists), not the multi-env preset.
    assert default_recipe("babyai") == TinyRecipe(env="babyai")
    assert default_recipe("maze") == TinyRecipe(env="maze", **SINGLE_ENV_PRESETS["maze"])
    assert tiny_model_dir(default_recipe("babyai,maze"), tmp_path).name.startswith("tiny-babyai+maze-")

    torch.set_num_threads(1)
    recipe = TinyRecipe(env="babyai,maze,wordle", hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2,
                        num_kv_heads=1, bc_steps=2, bc_batch_size=4, bc_tasks_per_env=2, vocab_size=500)
    path = ensure_tiny_model("babyai,maze,wordle", tmp_path, recipe)
    meta = json.loads((path / "recipe.json").read_text())
    assert meta["recipe"]["env"] == "babyai,maze,wordle" and meta["bc_samples"] > 0
    from fedagent_flwr.agent.models.pretrained import ModelSpec, load_tokenizer

    tok = load_tokenizer(ModelSpec(str(path), built_here=True))
    for action in ("go forward", "move up", "crane"):
        text = f"<think>next: {action}</think><action>{action}</action>"
        assert tok.decode(tok(text)["input_ids"]) == text


def test_per_environment_values_pass_the_command_line_and_set_as_text():
    """run_simulation.py's flags and the experiments' --set take a per-environment value as text (the run config
    checks it); a plain number stays a number and other text is refused by argparse."""
    from fedagent_flwr.simulation import build_parser, parse_overrides

    args = build_parser().parse_args(["--rollout.max-steps", "babyai=7,maze=3", "--eval.tasks", "3"])
    assert (getattr(args, "rollout.max-steps"), getattr(args, "eval.tasks")) == ("babyai=7,maze=3", 3)
    assert parse_overrides(["rollout.max-steps=babyai=7", "eval.tasks=4"]) == {"rollout.max-steps": "babyai=7", "eval.tasks": 4}
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--rollout.max-steps", "seven"])
