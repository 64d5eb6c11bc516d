"""Memoization of textworld's pure parsing and PDDL translation steps.

Profiling a step of an ALFWorld game shows nearly all its time in re-parsing the
same few grammar strings with TatSu (every admissible command and every feedback
is derived from text that is parsed anew each time) and every reset in translating
the same PDDL problem to SAS twice. These functions are pure, so their results are
cached here:

- `textgen._parse_and_convert(text, rule_name)`: cached; a deep copy is returned
  because derivation attaches a context to the returned symbols.
- `Rule.parse_conjunctive_query(expr)` as textgen calls it: cached (the rule is only read).
- `fast_downward.pddl2sas(domain, problem, optimize)` as textworld's PDDL state calls
  it: an LRU of recent problems, so resetting a game again skips translation. It
  also puts back `sys.argv`, which the translator overwrites. Inside
  `without_replan_translation()` the second, search-optimized translation that every
  PDDL state makes for textworld's `replan` is skipped (an empty task is handed to
  `load_sas_replan`, which only stores it); callers that never use `replan` halve
  their first reset that way.

`install()` is idempotent and affects only textworld's PDDL text engine;
`installed(False)` turns it off (used by a test that compares outputs both ways).
"""

from __future__ import annotations

import sys
from collections import OrderedDict
from contextlib import contextmanager
from copy import deepcopy
from functools import lru_cache
from typing import Any, Iterator

import fast_downward
import textworld.envs.pddl.logic as pddl_logic
import textworld.envs.pddl.textgen as textgen
from textworld.logic import Rule

_ORIGINAL_PARSE = textgen._parse_and_convert
_ORIGINAL_RULE = textgen.Rule
_ORIGINAL_FAST_DOWNWARD = pddl_logic.fast_downward
TRANSLATION_CACHE_SIZE = 32  # about 2 MB per game

_parse_cache: dict[tuple, Any] = {}


def _cached_parse(text: str, rule_name: str, **kwargs: Any) -> Any:
    key = (text, rule_name, tuple(sorted(kwargs.items())))
    if key not in _parse_cache:
        _parse_cache[key] = _ORIGINAL_PARSE(text, rule_name=rule_name, **kwargs)
    return deepcopy(_parse_cache[key])


class _CachedQueryRule(Rule):
    @classmethod
    @lru_cache(maxsize=None)
    def parse_conjunctive_query(cls, expr: str) -> Rule:
        return Rule.parse_conjunctive_query(expr)


class _CachedFastDownward:
    """Stands in for the `fast_downward` module inside textworld's PDDL logic."""

    def __init__(self) -> None:
        self._translations: OrderedDict[tuple, Any] = OrderedDict()
        self.skip_optimized = False

    def __getattr__(self, name: str) -> Any:
        return getattr(fast_downward, name)

    def pddl2sas(self, domain: str, problem: str, verbose: bool = False, optimize: bool = False) -> Any:
        if optimize and self.skip_optimized:
            return None, ""
        key = (domain, problem, bool(optimize))
        if key in self._translations:
            self._translations.move_to_end(key)
            return self._translations[key]
        argv = list(sys.argv)
        try:
            result = fast_downward.pddl2sas(domain, problem, verbose=verbose, optimize=optimize)
        finally:
            sys.argv = argv
        self._translations[key] = result
        if len(self._translations) > TRANSLATION_CACHE_SIZE:
            self._translations.popitem(last=False)
        return result


_FAST_DOWNWARD = _CachedFastDownward()


def install() -> None:
    textgen._parse_and_convert = _cached_parse
    textgen.Rule = _CachedQueryRule
    pddl_logic.fast_downward = _FAST_DOWNWARD


def uninstall() -> None:
    textgen._parse_and_convert = _ORIGINAL_PARSE
    textgen.Rule = _ORIGINAL_RULE
    pddl_logic.fast_downward = _ORIGINAL_FAST_DOWNWARD


@contextmanager
def without_replan_translation() -> Iterator[None]:
    was = _FAST_DOWNWARD.skip_optimized
    _FAST_DOWNWARD.skip_optimized = True
    try:
        yield
    finally:
        _FAST_DOWNWARD.skip_optimized = was


@contextmanager
def installed(enabled: bool) -> Iterator[None]:
    """Run a block with the caches on or off, restoring the previous setting after."""
    was = textgen._parse_and_convert is _cached_parse
    (install if enabled else uninstall)()
    try:
        yield
    finally:
        (install if was else uninstall)()
