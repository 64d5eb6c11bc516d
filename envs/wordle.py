"""Wordle: LMRL-Gym's word-guessing game.

Facts carried over from LMRL-Gym (llm_rl_scripts/wordle/env): 6 tries; a guess is
shown letter by letter ("a p p l e") with one mark per letter, "g" (right letter,
right place), "y" (the letter is in the word, elsewhere) or "b" (not in the word),
marked letter by letter without Wordle's duplicate bookkeeping; reward -1 for every
step, 0 for the step that solves the game; a word outside the vocabulary is not
scored but still uses up a try and costs -1. One list serves as both the targets
and the allowed guesses. LMRL-Gym redraws the hidden word among those consistent
with the feedback after every guess; here each task fixes its word, which gives
the same distribution of games and makes every episode reproducible.

The word list is the project's own (envs/data/wordle_words.json: JSON, because a
Flower app bundle only carries .py/.toml/.md/.json/.yaml files); `load_word_list`
reads it, or a user's list as a text file with one word per line. The expert guesses the word that maximises
the entropy of the feedback over the words still consistent with what it has seen.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from .base import Task, TextEnv

WORD_LENGTH = 5
N_TRIES = 6
SOLVED_REWARD, STEP_REWARD = 0.0, -1.0
DEFAULT_WORD_FILE = Path(__file__).parent / "data" / "wordle_words.json"

# Feedback codes: mark value (b=0, y=1, g=2) at position i, weighted by 3**i.
_MARKS = "byg"
_N_CODES = 3**WORD_LENGTH
# Keep invalid-word echoes short: tiny models read the observations.
_ECHO_LIMIT = 30


def load_word_list(path: str | Path) -> list[str]:
    """Read a word list: a JSON file {"words": [...]} (or a bare JSON list), or a text file with
    one word per line where '#' starts a comment line and blank lines are skipped.

    Words are lower-cased; duplicates are dropped; the result is sorted.
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"word list {str(path)!r} is not a file")
    if path.suffix == ".json":
        data = json.loads(path.read_text(encoding="utf-8"))
        entries = data.get("words") if isinstance(data, dict) else data
        if not isinstance(entries, list):
            raise ValueError(f"word list {str(path)!r}: expected a JSON list or an object with a 'words' list")
        words = [_check_word(str(w), f"{path}[{i}]") for i, w in enumerate(entries)]
        return _finish_word_list(words, str(path))
    words = []
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        words.append(_check_word(text, f"{path}:{lineno}"))
    return _finish_word_list(words, str(path))


def _check_word(text: str, where: str) -> str:
    word = text.lower()
    if len(word) != WORD_LENGTH or not (word.isascii() and word.isalpha()):
        raise ValueError(f"{where}: {text!r} is not a {WORD_LENGTH}-letter word of a-z letters")
    return word


def _finish_word_list(words: list[str], source: str) -> list[str]:
    unique = sorted(set(words))
    if len(unique) < 2:
        raise ValueError(f"word list {source} needs at least 2 distinct words, got {len(unique)}")
    return unique


def feedback(guess: str, target: str) -> str:
    """LMRL-Gym's marks for `guess` against `target`, e.g. feedback('paper', 'apple') == 'y y g y b'."""
    marks = []
    for i, c in enumerate(guess):
        if c == target[i]:
            marks.append("g")
        elif c in target:
            marks.append("y")
        else:
            marks.append("b")
    return " ".join(marks)


def neighbour_counts(words: Sequence[str]) -> dict[str, int]:
    """How many other words of the list differ from each word in exactly one position."""
    patterns = Counter(w[:i] + "_" + w[i + 1 :] for w in words for i in range(WORD_LENGTH))
    return {w: sum(patterns[w[:i] + "_" + w[i + 1 :]] - 1 for i in range(WORD_LENGTH)) for w in words}


def neighbour_category(count: int) -> str:
    # Words with many one-letter neighbours (light, might, night, ...) take more guesses.
    if count == 0:
        return "isolated"
    if count == 1:
        return "one-neighbour"
    return "crowded"


def feedback_matrix(words: Sequence[str]) -> np.ndarray:
    """codes[g, t]: the feedback code of guessing words[g] when the hidden word is words[t]."""
    letters = np.array([[ord(c) - ord("a") for c in w] for w in words], dtype=np.int64)
    n = len(words)
    present = np.zeros((n, 26), dtype=bool)
    present[np.arange(n)[:, None], letters] = True
    codes = np.zeros((n, n), dtype=np.int64)
    for i in range(WORD_LENGTH):
        green = letters[:, i][:, None] == letters[:, i][None, :]
        in_word = present[:, letters[:, i]].T  # [g, t]: guess letter i occurs in target t
        codes += np.where(green, 2, np.where(in_word, 1, 0)) * 3**i
    return codes.astype(np.uint8)


def _code_of(marks: str) -> int:
    return sum(_MARKS.index(m) * 3**i for i, m in enumerate(marks.split()))


class WordleEnv(TextEnv):
    name = "wordle"
    intro = "You are playing Wordle: find a hidden 5-letter English word by guessing words."
    # LMRL-Gym's number of tries; the horizon is the number of tries.
    default_max_steps = N_TRIES

    def __init__(
        self,
        max_steps: int | None = None,
        words: Sequence[str] | None = None,
        word_file: str | Path | None = None,
        test_fraction: float = 0.2,
        split_seed: int = 0,
    ) -> None:
        super().__init__(max_steps)
        if words is not None and word_file is not None:
            raise ValueError("give either words or word_file, not both")
        if words is not None:
            self.words = _finish_word_list([_check_word(str(w), "words") for w in words], "words")
        else:
            self.words = load_word_list(word_file if word_file is not None else DEFAULT_WORD_FILE)
        self._index = {w: i for i, w in enumerate(self.words)}
        self._tasks = self._build_tasks(test_fraction, split_seed)
        self._codes: np.ndarray | None = None  # feedback matrix, built on the expert's first call
        self._opening: int | None = None  # the expert's first guess, the same in every game
        self.target = ""
        self.guesses: list[str] = []
        self._candidates = np.arange(len(self.words))
        self._narrowed = 0  # how many of self.guesses _candidates already reflects

    def _build_tasks(self, test_fraction: float, split_seed: int) -> list[Task]:
        if not 0.0 < test_fraction < 1.0:
            raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
        counts = neighbour_counts(self.words)
        category = {w: neighbour_category(counts[w]) for w in self.words}
        # Hold out the same share of every category.
        rng = np.random.default_rng(split_seed)
        split_of: dict[str, str] = {}
        for cat in sorted(set(category.values())):
            members = [w for w in self.words if category[w] == cat]
            n_test = max(1, round(test_fraction * len(members))) if len(members) > 1 else 0
            for rank, idx in enumerate(rng.permutation(len(members))):
                split_of[members[idx]] = "test" if rank < n_test else "train"
        return [
            Task(id=f"wordle-{w}", category=category[w], split=split_of[w], data={"target": w, "neighbours": counts[w]})
            for w in self.words
        ]

    def tasks(self) -> list[Task]:
        return list(self._tasks)

    def instruction(self) -> str:
        return (
            f"Guess the hidden {WORD_LENGTH}-letter word in {self.max_steps} tries. After each guess you see its "
            "letters and one mark per letter: g = right letter in the right place, y = the letter is in the word "
            "but in another place, b = the letter is not in the word."
        )

    def action_hint(self) -> str:
        return f"any {WORD_LENGTH}-letter English word from the game's word list ({len(self.words)} words)"

    def admissible_actions(self) -> list[str]:
        return list(self.words)

    # ----- expert ------------------------------------------------------------------
    def expert_action(self) -> str:
        cands = self.candidates()
        if len(cands) == 1:
            return self.words[int(cands[0])]
        if not self.guesses:
            if self._opening is None:
                self._opening = self._most_informative(cands)
            return self.words[self._opening]
        return self.words[self._most_informative(cands)]

    def candidates(self) -> np.ndarray:
        """Indices of the words consistent with every mark seen so far in this episode."""
        # Narrowed lazily, so that playing without the expert never builds the feedback matrix.
        while self._narrowed < len(self.guesses):
            guess = self.guesses[self._narrowed]
            row = self._feedback_codes()[self._index[guess]]
            self._candidates = self._candidates[row[self._candidates] == _code_of(feedback(guess, self.target))]
            self._narrowed += 1
        return self._candidates

    def _feedback_codes(self) -> np.ndarray:
        if self._codes is None:
            self._codes = feedback_matrix(self.words)
        return self._codes

    def _most_informative(self, cands: np.ndarray) -> int:
        """The guess whose feedback over `cands` has the highest entropy; ties go to a possible answer."""
        codes = self._feedback_codes()[:, cands].astype(np.int64)
        n_words = codes.shape[0]
        offsets = np.arange(n_words, dtype=np.int64)[:, None] * _N_CODES
        counts = np.bincount((codes + offsets).ravel(), minlength=n_words * _N_CODES).reshape(n_words, _N_CODES)
        p = counts / len(cands)
        with np.errstate(divide="ignore", invalid="ignore"):
            entropy = -np.where(counts > 0, p * np.log2(p), 0.0).sum(axis=1)
        is_candidate = np.zeros(n_words, dtype=bool)
        is_candidate[cands] = True
        # Round so that float noise does not break ties between equal partitions.
        order = np.lexsort((np.arange(n_words), ~is_candidate, -np.round(entropy, 9)))
        return int(order[0])

    # ----- episode -----------------------------------------------------------------
    def _reset(self, task: Task) -> str:
        target = str(task.data.get("target", ""))
        if target not in self._index:
            raise ValueError(f"Wordle task {task.id!r}: target {target!r} is not in the word list")
        self.target = target
        self.guesses = []
        self._candidates = np.arange(len(self.words))
        self._narrowed = 0
        return f"Make your first guess. {self._left()}"

    def _left(self) -> str:
        left = self.max_steps - self.steps
        return f"{left} guess{'es' if left != 1 else ''} left."

    def _ending(self) -> str:
        return f" Out of guesses; the word was {self.target}." if self.steps >= self.max_steps else ""

    def _step(self, action: str) -> tuple[str, float]:
        self.guesses.append(action)
        marks = feedback(action, self.target)
        spelled = " ".join(action)
        if action == self.target:
            self.won = True
            return f"{spelled}\n{marks}\nSolved.", SOLVED_REWARD
        return f"{spelled}\n{marks}\n{self._left()}{self._ending()}", STEP_REWARD

    def _invalid(self, action: str) -> tuple[str, float]:
        shown = " ".join(str(action).split())
        if len(shown) > _ECHO_LIMIT:
            shown = shown[:_ECHO_LIMIT] + "..."
        return (
            f"Invalid guess {shown!r}: not a word from the word list. {self._left()}{self._ending()}",
            STEP_REWARD,
        )
