"""Wordle environment: LMRL-Gym marks and rewards, word lists, expert, robustness to bad actions."""

from __future__ import annotations

import random
import string
from collections import Counter

import pytest

from env_contract import BAD_ACTION_RUNS, check_bad_actions, play_expert
from envs import make_env
from envs.wordle import (
    DEFAULT_WORD_FILE,
    WordleEnv,
    _code_of,
    feedback,
    feedback_matrix,
    load_word_list,
)


@pytest.fixture(scope="module")
def env() -> WordleEnv:
    return make_env("wordle")


def _task(env: WordleEnv, word: str):
    return next(t for t in env.tasks() if t.data["target"] == word)


def test_shipped_word_list():
    words = load_word_list(DEFAULT_WORD_FILE)
    assert len(words) >= 800
    assert all(len(w) == 5 and w.isascii() and w.isalpha() and w.islower() for w in words)
    assert words == sorted(set(words))
    assert {"apple", "crane", "light", "night", "zebra"} <= set(words)


def test_pool_is_deterministic_unique_and_stratified(env):
    other = WordleEnv()
    assert [(t.id, t.category, t.split) for t in env.tasks()] == [(t.id, t.category, t.split) for t in other.tasks()]
    ids = [t.id for t in env.tasks()]
    assert len(ids) == len(set(ids)) == len(env.words)
    by_cat = Counter(t.category for t in env.tasks())
    assert set(by_cat) == {"isolated", "one-neighbour", "crowded"}
    for cat, n in by_cat.items():
        n_test = sum(1 for t in env.tasks() if t.category == cat and t.split == "test")
        assert n_test == round(0.2 * n)
    assert _task(env, "night").category == "crowded"  # light, might, fight, ... are one letter away


def test_marks_follow_lmrl_gym():
    assert feedback("paper", "apple") == "y y g y b"
    assert feedback("crane", "crane") == "g g g g g"
    # Every copy of a letter that occurs elsewhere is marked y (no duplicate bookkeeping).
    assert feedback("speed", "abide") == "b b y y y"
    assert feedback("geese", "agree") == "y y y b g"  # Wordle itself would give "y y b b g"


def test_feedback_matrix_agrees_with_feedback():
    words = load_word_list(DEFAULT_WORD_FILE)[:120]
    codes = feedback_matrix(words)
    rng = random.Random(0)
    for _ in range(2000):
        g, t = rng.randrange(len(words)), rng.randrange(len(words))
        assert codes[g, t] == _code_of(feedback(words[g], words[t]))


def test_rewards_observations_and_win(env):
    obs, info = env.reset(_task(env, "apple"))
    assert obs == "Make your first guess. 6 guesses left." and not info["won"]
    obs, reward, terminated, truncated, info = env.step("Crane")
    assert obs == "c r a n e\nb b y b g\n5 guesses left." and reward == -1.0 and info["valid"]
    obs, reward, terminated, truncated, info = env.step("aplpe")
    assert obs == "Invalid guess 'aplpe': not a word from the word list. 4 guesses left."
    assert reward == -1.0 and not info["valid"] and not terminated and env.guesses == ["crane"]
    obs, reward, terminated, truncated, info = env.step("apple")
    assert obs == "a p p l e\ng g g g g\nSolved." and reward == 0.0
    assert terminated and not truncated and info["won"] and env.won and env.steps == 3


def test_six_tries_then_the_game_is_over(env):
    env.reset(_task(env, "apple"))
    total = 0.0
    for word in ["crane", "zzzzz", "light", "night", "sword", "tiger"]:
        obs, reward, terminated, truncated, info = env.step(word)
        total += reward
    assert total == -6.0 and truncated and not terminated and not info["won"]
    assert obs.endswith("0 guesses left. Out of guesses; the word was apple.")
    with pytest.raises(RuntimeError):
        env.step("apple")


def test_user_word_list(tmp_path):
    path = tmp_path / "words.txt"
    path.write_text("# my words\nHOUSE\nmouse\n\nhouse\nlouse\n", encoding="utf-8")
    assert load_word_list(path) == ["house", "louse", "mouse"]
    custom = WordleEnv(word_file=path)
    assert [t.id for t in custom.tasks()] == ["wordle-house", "wordle-louse", "wordle-mouse"]
    custom.reset(custom.tasks()[0])
    assert custom.admissible_actions() == ["house", "louse", "mouse"]
    assert WordleEnv(words=["Mouse", "house"]).words == ["house", "mouse"]

    bad = tmp_path / "bad.txt"
    bad.write_text("house\nhorses\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"bad.txt:2: 'horses' is not a 5-letter word"):
        load_word_list(bad)
    with pytest.raises(ValueError, match="at least 2 distinct words"):
        WordleEnv(words=["house", "HOUSE"])
    with pytest.raises(ValueError, match="not a file"):
        load_word_list(tmp_path / "missing.txt")
    with pytest.raises(ValueError, match="either words or word_file"):
        WordleEnv(words=["house", "mouse"], word_file=path)
    with pytest.raises(ValueError, match="not in the word list"):
        custom.reset(_task(WordleEnv(), "apple"))


def test_action_hint_is_short(env):
    hint = env.action_hint()
    assert "5-letter" in hint and str(len(env.words)) in hint and len(hint) < 100


def test_expert_solves_the_test_split_in_few_guesses(env):
    guesses = []
    for task in env.tasks_of_split("test"):
        assert play_expert(env, task), task.id
        guesses.append(env.steps)
    assert sum(guesses) / len(guesses) < 3.5


def test_candidates_track_the_marks_seen(env):
    env.reset(_task(env, "night"))
    for word in ["crane", "light"]:
        env.step(word)
    remaining = {env.words[i] for i in env.candidates()}
    assert "night" in remaining and "light" not in remaining
    assert all(feedback("light", w) == feedback("light", "night") for w in remaining)
    assert env.expert_action() in env.words


_NEAR_MISSES = ["apple pie", "app le", "a p p l e", "applee", "appl", "<guess>apple</guess>", "ÄPFEL", "12345", "a-p-p-l-e"]


def _five_letters(rng: random.Random) -> str:
    return "".join(rng.choice(string.ascii_letters) for _ in range(5))  # almost never a word


@pytest.mark.parametrize("n, seed", BAD_ACTION_RUNS)
def test_bad_actions_change_nothing_but_the_step_count(env, n, seed):
    # Half the episodes already hold a guess; the echo of a bad guess stays short even for 10,000 characters.
    check_bad_actions(env, n, seed, lambda: (env.target, list(env.guesses)), -1.0, vocabulary=lambda: env.words,
                      extras=_NEAR_MISSES, makers=[_five_letters], expert_steps=1, prefix="Invalid guess",
                      max_obs_chars=149)


@pytest.mark.slow
def test_expert_on_every_word(env):
    guesses = [env.steps if play_expert(env, task) else None for task in env.tasks()]
    assert guesses.count(None) == 0
    assert sum(guesses) / len(guesses) < 3.3


def test_json_word_lists_load_and_bad_ones_are_rejected(tmp_path):
    good = tmp_path / "words.json"
    good.write_text('{"words": ["Mouse", "house", "mouse"]}')
    assert load_word_list(good) == ["house", "mouse"]
    bare = tmp_path / "bare.json"
    bare.write_text('["crane", "slate"]')
    assert load_word_list(bare) == ["crane", "slate"]
    bad = tmp_path / "bad.json"
    bad.write_text('{"list": ["crane"]}')
    with pytest.raises(ValueError, match="'words' list"):
        load_word_list(bad)
