"""ALFWorld TextEnv on the real alfworld + textworld[pddl] engine (skipped without alfworld)."""

from __future__ import annotations

import gzip
import json
import random
import string
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import pytest

from envs import available_envs

REPO = Path(__file__).resolve().parents[2]


def _require_alfworld() -> None:
    pytest.importorskip("alfworld")
    pytest.importorskip("fast_downward")
    pytest.importorskip("textworld.envs.pddl")


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("alfworld-cache")


@pytest.fixture(scope="module")
def env(cache_dir):
    _require_alfworld()
    from envs.alfworld import AlfWorldEnv

    e = AlfWorldEnv(train_games_per_type=2, valid_games_per_type=2, cache_dir=cache_dir, source="generated")
    yield e
    e.close()


def _first(env, subset: str, category: str):
    return next(t for t in env.tasks() if t.data["subset"] == subset and t.category == category)


def _play_expert(env, task) -> list[tuple[str, float, bool, bool, dict]]:
    env.reset(task)
    trace = []
    while not env.done:
        action = env.expert_action()
        obs, reward, terminated, truncated, info = env.step(action)
        trace.append((action, reward, terminated, truncated, info))
    return trace


# ----- registry and optional dependency ---------------------------------------------
def test_registered_without_importing_alfworld():
    # A process where alfworld cannot be imported still lists the env and explains how to install it.
    code = textwrap.dedent(
        """
        import sys
        for name in ("alfworld", "textworld", "fast_downward"):
            sys.modules[name] = None  # makes `import name` fail
        import envs
        assert "alfworld" in envs.available_envs(), envs.available_envs()
        assert "alfworld" not in [m for m in sys.modules if sys.modules[m] is not None]
        try:
            envs.make_env("alfworld")
        except ImportError as err:
            assert 'pip install "fedagent-flwr[alfworld]"' in str(err), err
            print("OK")
        else:
            raise AssertionError("make_env('alfworld') should fail without alfworld")
        """
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "OK"
    assert "alfworld" in available_envs()


def test_make_env_defaults(monkeypatch, tmp_path):
    _require_alfworld()
    from envs import make_env
    from envs.alfworld import AlfWorldEnv

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path / "no-official-data"))
    env = make_env("alfworld")
    assert isinstance(env, AlfWorldEnv)
    assert env.max_steps == 50 and env.source == "generated"
    assert env.generator_settings()["games_per_type"] == {"train": 24, "valid_seen": 24, "valid_unseen": 24}
    assert make_env("alfworld", max_steps=7).max_steps == 7


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"source": "web"}, "source must be one of"),
        ({"expert": "oracle"}, "expert must be one of"),
        ({"train_games_per_type": -1}, "train_games_per_type must be a non-negative int or None"),
        ({"valid_games_per_type": 2.5}, "valid_games_per_type must be a non-negative int"),
        ({"train_games_per_type": 0, "valid_games_per_type": 0}, "the task pool would be empty"),
    ],
)
def test_bad_arguments(kwargs, message, tmp_path):
    _require_alfworld()
    from envs.alfworld import AlfWorldEnv

    with pytest.raises(ValueError, match=message):
        AlfWorldEnv(cache_dir=tmp_path, **kwargs)


def test_official_source_requires_data(tmp_path):
    _require_alfworld()
    from envs.alfworld import AlfWorldEnv

    with pytest.raises(ValueError, match="no official ALFWorld games"):
        AlfWorldEnv(source="official", data_dir=tmp_path)


# ----- the generated pool -------------------------------------------------------------
def test_pool_layout(env):
    from envs.alfworld import TASK_TYPES

    tasks = env.tasks()
    assert len(tasks) == 3 * 6 * 2 and len({t.id for t in tasks}) == len(tasks)
    counts = Counter((t.data["subset"], t.category) for t in tasks)
    assert counts == {(s, c): 2 for s in ("train", "seen", "unseen") for c in TASK_TYPES}
    assert {t.split for t in tasks if t.data["subset"] == "train"} == {"train"}
    assert {t.split for t in tasks if t.data["subset"] != "train"} == {"test"}
    train_plans = {t.data["floor_plan"] for t in tasks if t.data["subset"] == "train"}
    seen_plans = {t.data["floor_plan"] for t in tasks if t.data["subset"] == "seen"}
    unseen_plans = {t.data["floor_plan"] for t in tasks if t.data["subset"] == "unseen"}
    assert seen_plans <= train_plans
    assert not unseen_plans & train_plans
    for t in tasks:
        p = t.data["pddl_params"]
        if t.category == "look_at_obj_in_light":
            assert p["toggle_target"] in ("DeskLamp", "FloorLamp") and p["parent_target"] == ""
        else:
            assert p["parent_target"] and not p["toggle_target"]


def test_generator_is_seeded():
    _require_alfworld()
    from envs.alfworld.generator import generate_pool

    counts = {"train": 1, "valid_seen": 1, "valid_unseen": 1}
    a, b, c = generate_pool(0, counts), generate_pool(0, counts), generate_pool(1, counts)
    assert a == b
    assert [g["pddl_problem"] for g in a] != [g["pddl_problem"] for g in c]
    # Game i of a split does not depend on how many games are asked for.
    more = generate_pool(0, {"train": 3})
    assert [g for g in more if g["id"].endswith("-000")] == [g for g in a if g["split"] == "train"]


def test_generated_problem_respects_alfred_rules():
    _require_alfworld()
    import alfworld.gen.constants as constants
    from envs.alfworld.generator import generate_split, pddl_name
    from envs.alfworld.scenes import load_scene

    for task_type in ("pick_two_obj_and_place", "pick_heat_then_place_in_recep", "look_at_obj_in_light"):
        game = generate_split("valid_unseen", task_type, 1, seed=3)[0]
        problem, params = game["pddl_problem"].split("(:goal")[0], game["pddl_params"]
        scene = load_scene(int(game["floor_plan"][len("FloorPlan") :]))
        rtype_of = {pddl_name(r.id): r.type for r in scene.receptacles}
        otype_of = dict(
            line.strip("() ").split()[1:3] for line in problem.splitlines() if line.strip().startswith("(objectType ")
        )
        placements = [line.strip("() ").split()[1:3] for line in problem.splitlines() if line.strip().startswith("(inReceptacle ")]
        target = params["object_target"] + "Type"
        targets = [o for o, r in placements if otype_of[o] == target]
        assert len(targets) >= (2 if task_type == "pick_two_obj_and_place" else 1)
        for o, r in placements:
            otype = otype_of[o][: -len("Type")]
            if otype in ("DeskLamp", "FloorLamp"):
                continue
            assert otype in constants.VAL_RECEPTACLE_OBJECTS[rtype_of[r]], (otype, rtype_of[r])
            if otype_of[o] == target:  # no target starts where the goal wants it
                assert rtype_of[r] != params["parent_target"]
        if "SinkBasin" in rtype_of.values():
            assert any(n.startswith("Sink_bar_") and n.endswith("_bar_SinkBasin") for n in rtype_of)


def test_pool_cache_atomic_and_keyed(tmp_path):
    _require_alfworld()
    from envs.alfworld.pool_cache import load_or_generate, pool_path

    calls = []

    def generate():
        calls.append(1)
        return [{"id": "g1"}]

    settings = {"seed": 0, "n": 1}
    assert load_or_generate(settings, generate, tmp_path) == [{"id": "g1"}]
    assert load_or_generate(settings, generate, tmp_path) == [{"id": "g1"}]
    assert len(calls) == 1
    path = pool_path(settings, tmp_path)
    assert path.exists() and [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary left behind
    with gzip.open(path, "rt") as f:
        assert json.load(f)["settings"] == settings
    assert pool_path({"seed": 1, "n": 1}, tmp_path) != path
    path.write_bytes(b"not gzip")  # a damaged file is regenerated
    assert load_or_generate(settings, generate, tmp_path) == [{"id": "g1"}] and len(calls) == 2


# ----- episodes -----------------------------------------------------------------------
def test_reset_observation_in_alfworld_format(env):
    task = _first(env, "unseen", "pick_heat_then_place_in_recep")
    obs, info = env.reset(task)
    assert obs.startswith("-= Welcome to TextWorld, ALFRED! =-\n\nYou are in the middle of a room.")
    assert env.instruction().startswith("Your task is to: ") and obs.endswith(env.instruction())
    assert "microwave 1" in obs and "UNKNOWN GOAL" not in obs
    actions = info["admissible_actions"]
    assert {"look", "inventory", "help"} <= set(actions)
    seen = obs.split("you see ", 1)[1].split(".\n")[0].replace(", and ", ", ").split(", ")
    receptacles = [r.removeprefix("a ").removeprefix("an ") for r in seen]
    assert sorted(f"go to {r}" for r in receptacles) == sorted(a for a in actions if a.startswith("go to "))
    assert info["valid"] and not info["won"] and info["steps"] == 0


@pytest.mark.parametrize(
    "category",
    [
        "pick_and_place_simple",
        "look_at_obj_in_light",
        "pick_clean_then_place_in_recep",
        "pick_heat_then_place_in_recep",
        "pick_cool_then_place_in_recep",
        "pick_two_obj_and_place",
    ],
)
def test_planner_expert_wins_with_reward_ten(env, category):
    trace = _play_expert(env, _first(env, "unseen", category))
    rewards = [r for _, r, *_ in trace]
    assert rewards[-1] == 10.0 and set(rewards[:-1]) <= {0.0}
    assert trace[-1][2] is True and trace[-1][3] is False and trace[-1][4]["won"]
    assert all(info["valid"] for *_, info in trace)
    assert trace[-1][4]["admissible_actions"] == []
    verbs = [a.split()[0] for a, *_ in trace]
    expected = {"pick_clean_then_place_in_recep": "clean", "pick_heat_then_place_in_recep": "heat",
                "pick_cool_then_place_in_recep": "cool", "look_at_obj_in_light": "use"}
    if category in expected:
        assert expected[category] in verbs
    if category == "pick_two_obj_and_place":
        assert verbs.count("move") == 2 and verbs.count("take") == 2
    with pytest.raises(RuntimeError, match="after the episode ended"):
        env.step("look")


def test_scripted_episode_exact_feedback(env):
    task = _first(env, "seen", "pick_and_place_simple")
    obs, _ = env.reset(task)
    plan = []
    while not env.done:  # the expert's plan, recorded
        plan.append(env.expert_action())
        env.step(plan[-1])
    obs, _ = env.reset(task)
    target = task.data["pddl_params"]["object_target"].lower()
    obs, reward, term, trunc, info = env.step("inventory")
    assert (obs, reward, term, info["valid"]) == ("You are not carrying anything.", 0.0, False, True)
    obs, reward, term, trunc, info = env.step("take the moon")
    assert (obs, reward, term, info["valid"]) == ("Nothing happens.", 0.0, False, False)
    rewards = []
    for action in plan:
        obs, reward, term, trunc, info = env.step(action)
        rewards.append(reward)
        if action.startswith("go to "):
            assert obs.startswith(f"You arrive at {action[6:]}.")
        elif action.startswith("take "):
            assert obs == f"You pick up the {action[5:].replace(' from ', ' from the ')}."
            assert action.split()[1] == target
        elif action.startswith("move "):
            assert obs == f"You move the {action[5:].replace(' to ', ' to the ')}."
    assert rewards == [0.0] * (len(plan) - 1) + [10.0]
    assert env.steps == len(plan) + 2 and env.won


def test_truncation_at_max_steps(cache_dir):
    _require_alfworld()
    from envs.alfworld import AlfWorldEnv

    env = AlfWorldEnv(max_steps=3, train_games_per_type=2, valid_games_per_type=2, cache_dir=cache_dir, source="generated")
    env.reset(_first(env, "unseen", "pick_two_obj_and_place"))
    results = [env.step("look") for _ in range(3)]
    assert [r[3] for r in results] == [False, False, True] and not any(r[2] for r in results)
    assert [r[1] for r in results] == [0.0, 0.0, 0.0]
    env.close()


def test_reset_restores_initial_state(env):
    task = _first(env, "unseen", "pick_cool_then_place_in_recep")
    env.reset(task)
    start = env.facts()
    for _ in range(3):
        env.step(env.expert_action())
    assert env.facts() != start
    env.reset(task)
    assert env.facts() == start


def test_unknown_task_rejected(env):
    from envs.base import Task

    with pytest.raises(ValueError, match="not in this ALFWorld pool"):
        env.reset(Task(id="alfworld-train-nope-000", category="pick_and_place_simple", split="train"))


def test_sys_argv_untouched(env):
    argv = list(sys.argv)
    env.reset(_first(env, "unseen", "look_at_obj_in_light"))
    env.expert_action()
    assert sys.argv == argv


def _malformed_actions(admissible: list[str], n: int, seed: int) -> list:
    rng = random.Random(seed)
    pieces = [w for a in admissible for w in a.split()] + ["fridge", "apple", "99", "0", "-1", "to", "from", "with"]
    alphabet = string.printable + "éñ中文🙂\x00\x7f"
    out: list = ["", " ", "\n\t", None, 12, 3.5, "go", "go to", "take", "move apple", "open", "use",
                 "go to nowhere 1", "look look", "inventory please", "x" * 10_000, "\x00" * 5]
    while len(out) < n:
        kind = rng.randrange(5)
        if kind == 0:  # random characters
            out.append("".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 60))))
        elif kind == 1:  # shuffled words of real commands
            out.append(" ".join(rng.sample(pieces, rng.randrange(1, 6))))
        elif kind == 2:  # a real command with one word changed
            words = rng.choice(admissible).split()
            words[rng.randrange(len(words))] = rng.choice(pieces + ["1000", "?", "()", "'"])
            out.append(" ".join(words))
        elif kind == 3:  # a real command with an id that does not exist
            words = rng.choice(admissible).split()
            out.append(" ".join(w if not w.isdigit() else str(int(w) + 50) for w in words) + " 7")
        else:  # truncated real command
            a = rng.choice(admissible)
            out.append(a[: rng.randrange(0, max(1, len(a) - 1))])
    return out


def _fuzz(cache_dir, n: int) -> None:
    from envs.alfworld import AlfWorldEnv
    from envs.base import normalize_action

    env = AlfWorldEnv(max_steps=10 * n, train_games_per_type=2, valid_games_per_type=2, cache_dir=cache_dir, source="generated")
    task = _first(env, "unseen", "pick_clean_then_place_in_recep")
    env.reset(task)
    for _ in range(2):  # leave the start so more commands are admissible
        env.step(env.expert_action())
    facts, admissible, steps = env.facts(), env.admissible_actions(), env.steps
    tried = 0
    for action in _malformed_actions(admissible, n, seed=n):
        if normalize_action(action) in admissible:
            continue  # a mutation that happens to be a real command
        obs, reward, term, trunc, info = env.step(action)
        tried += 1
        assert (obs, reward, term, trunc, info["valid"], info["won"]) == ("Nothing happens.", 0.0, False, False, False, False)
        assert info["admissible_actions"] == admissible
    assert tried >= 0.95 * n
    assert env.facts() == facts and env.admissible_actions() == admissible
    assert env.steps == steps + tried
    env.close()


def test_malformed_actions_change_nothing(cache_dir):
    _require_alfworld()
    _fuzz(cache_dir, 500)


@pytest.mark.slow
def test_malformed_actions_change_nothing_10k(cache_dir):
    _require_alfworld()
    _fuzz(cache_dir, 10_000)


def test_handcoded_expert_is_reproducible(cache_dir):
    _require_alfworld()
    from envs.alfworld import AlfWorldEnv

    env = AlfWorldEnv(expert="handcoded", train_games_per_type=2, valid_games_per_type=2, cache_dir=cache_dir, source="generated")
    task = _first(env, "seen", "pick_and_place_simple")
    runs = []
    for _ in range(2):
        trace = _play_expert(env, task)
        runs.append([a for a, *_ in trace])
        assert all(info["valid"] for *_, info in trace)  # it only proposes admissible commands
    assert runs[0] == runs[1] and runs[0][0] == "look"
    env.close()


def test_textworld_caches_do_not_change_the_game(env):
    from envs.alfworld import textworld_cache

    task = _first(env, "unseen", "pick_two_obj_and_place")
    env.reset(task)
    plan = []
    while not env.done:
        plan.append(env.expert_action())
        env.step(plan[-1])
    from envs.alfworld.engine import AlfredGame

    transcripts = []
    for enabled in (True, False):
        game = AlfredGame("planner")  # installs the caches; the block below chooses
        with textworld_cache.installed(enabled):
            assert (textworld_cache.textgen._parse_and_convert is textworld_cache._cached_parse) == enabled
            game.load(env._game(env._pool()[task.id]), {"task_type": task.category, "pddl_params": task.data["pddl_params"]}, task.id)
            steps = [(game.reset(), game.admissible_commands)]
            for action in plan[:4]:
                steps.append((game.step(action), game.admissible_commands))
            transcripts.append(steps)
        game.close()
    assert transcripts[0] == transcripts[1]


# ----- official games ($ALFWORLD_DATA) ----------------------------------------------------
def _write_official(root: Path, record: dict, folder: str, solvable: bool = True) -> None:
    from envs.alfworld.engine import ALFRED_DOMAIN, ALFRED_GRAMMAR

    d = root / "json_2.1.1" / record["split"] / folder / "trial_T0"
    d.mkdir(parents=True)
    (d / "traj_data.json").write_text(json.dumps({"task_type": record["task_type"], "pddl_params": record["pddl_params"],
                                                 "scene": {"floor_plan": record["floor_plan"]}}))
    grammar = ALFRED_GRAMMAR.replace("UNKNOWN GOAL", record["task_desc"])
    (d / "game.tw-pddl").write_text(json.dumps({"pddl_domain": ALFRED_DOMAIN, "grammar": grammar,
                                                "pddl_problem": record["pddl_problem"], "solvable": solvable}))


def test_official_games_are_played_when_present(tmp_path, cache_dir, env):
    from envs.alfworld import AlfWorldEnv

    heat = [env._pool()[_first(env, subset, "pick_heat_then_place_in_recep").id] for subset in ("seen", "unseen")]
    for i, r in enumerate(heat):
        _write_official(tmp_path, r, f"pick_heat_then_place_in_recep-Egg-None-Fridge-{i}")
    _write_official(tmp_path, heat[0], "pick_and_place_with_movable_recep-Egg-Bowl-Fridge-9")
    _write_official(tmp_path, heat[1], "pick_heat_then_place_in_recep-Egg-None-Fridge-bad", solvable=False)

    official = AlfWorldEnv(data_dir=tmp_path, cache_dir=cache_dir)  # source="auto" finds them
    assert official.source == "official"
    tasks = official.tasks()
    assert sorted(t.data["subset"] for t in tasks) == ["seen", "unseen"]
    assert all(t.category == "pick_heat_then_place_in_recep" and t.split == "test" for t in tasks)
    for task in tasks:
        record = next(r for r in heat if r["split"] == task.data["alfworld_split"])
        obs, _ = official.reset(task)
        assert obs.endswith(f"Your task is to: {record['task_desc']}.")
        trace = _play_expert(official, task)
        assert trace[-1][1] == 10.0 and official.won
    official.close()


@pytest.mark.slow
def test_planner_expert_wins_95_percent_per_type(cache_dir):
    # The default pool: 24 games per task type in valid_seen and in valid_unseen.
    _require_alfworld()
    from envs.alfworld import AlfWorldEnv

    env = AlfWorldEnv(cache_dir=cache_dir, source="generated")
    wins: Counter = Counter()
    totals: Counter = Counter()
    for task in env.tasks_of_split("test"):
        trace = _play_expert(env, task)
        key = (task.data["subset"], task.category)
        totals[key] += 1
        wins[key] += trace[-1][1] == 10.0
    env.close()
    assert len(totals) == 12 and set(totals.values()) == {24}
    rates = {k: wins[k] / totals[k] for k in totals}
    assert min(rates.values()) >= 0.95, rates
