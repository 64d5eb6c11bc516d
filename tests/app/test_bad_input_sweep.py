"""Bad input generated from the run config's own declarations: every key, every kind of bad value, every rule.

1. Every key. The keys, their types, bounds and choices come from RunConfig's fields and their `_key` metadata, never
   from a hand list. Each key gets four kinds of bad value: a value of the wrong type; one outside each bound (the
   declared `at_least` / `above` / `interval`, and the `>= x`, `> x` or `(a, b]` its `allowed` text opens with, so a
   bound that a section's `check` holds, such as federation.round-timeout's, is swept too, and dropping a declared bound whose
   text still promises it fails here); one outside its `choices`; and the empty string. A string key whose default
   is "" takes "" (the defaults are a valid run config: test_config.py checks it), so its empty value is not bad:
   run-name, eval.initial-evaluation, partition.success-labels and resilience.fault-injection are exempted by that rule, not by name.
   Each value is given at every front door that turns text or TOML into a run config:
     server-app  RunConfig.from_run_config(dict) and the preflight: what the ServerApp (server_app.py) and every ClientApp
                 (client_app.py `_method`) call on Flower's context.run_config, typed values;
     toml        simulation.main(["--run-config", FILE, "--dry-run"]): a TOML file, as run_simulation.py reads it;
     flag        simulation.main(["--KEY=TEXT", "--dry-run"]): run_simulation.py's command line;
     set         simulation.parse_overrides(["KEY=TEXT"]) then from_run_config: the experiment commands' --set.
   The edge of every bound and choice is tried deterministically; Hypothesis adds generated values (newlines, control
   and non-ASCII characters, huge and non-finite numbers).
2. Every rule. The rules are the `need(...)` calls in the sections' `check` methods and in `check_across`: a rule
   that does not call `need` refuses nothing, so the `ast` of config/run_config.py and runs/preflight.py (the checks
   that ask the machine, which every front door runs after the run config's) lists them all, and a new rule joins the
   list by itself. Some sites compute their key in a loop (the gigpo-* keys, the GRPO-only keys, the
   privacy.secure-aggregation table), so the keys each site can name are recorded at run time: every call of the real
   `need` (allowed or not) made while validating the table's combinations and the defaults, caught with
   sys.setprofile, so no copy of `__post_init__`'s loop can drift from it. `violations()` is a table of (combination,
   key it must name); the test fails naming any site no combination violates, and any (site, key) pair seen that no
   combination refuses. A generated search for violating combinations was not used: the rules depend on files,
   installed packages and split sizes, a search over 128 keys is slow, and what it misses it misses silently,
   whereas an incomplete table fails loudly, naming the rule.
3. Malformed --set strings and --run-config files (unclosed quotes, a key without `=`, unknown and duplicate keys, a
   table where a scalar belongs, non-UTF-8 bytes, an empty file, a folder, a missing file).

Every refusal must be a ValueError (the front ends print it and exit 2, argparse's own refusals exit 2 too), before
any model is built, in one line naming the kebab-case key where there is one. A few cases also go through a real
`python run_simulation.py ... --dry-run`: exit code 2, one stderr line (Python warnings filtered), no traceback.
The default run keeps a sample (every key and kind at the server-app and set doors, every key once at the toml
and flag doors, a few Hypothesis examples); `pytest -m slow` sweeps every key, kind and edge at every door with
many more Hypothesis examples. Each sweep prints how many values it tried (`-s` or `-rP` shows it).
"""

from __future__ import annotations

import ast
import contextlib
import importlib.machinery
import importlib.util
import inspect
import io
import json
import math
import re
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import transformers
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fedagent_flwr.config.run_config as config_module
import fedagent_flwr.runs.preflight as preflight_module
from fedagent_flwr import simulation
from fedagent_flwr.config import RunConfig
from fedagent_flwr.runs.preflight import preflight

ROOT = Path(__file__).resolve().parents[2]
FIELDS = [f for _, f, _ in RunConfig.keys()]
KEY_OF = {id(f): key for key, f, _ in RunConfig.keys()}  # a field's name repeats across sections; its key does not
DEFAULTS = RunConfig().to_run_config()
TRIED: Counter = Counter()  # values tried, by sweep and door
TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)  # no lone surrogates: they cannot be UTF-8


def uncoerced(values: dict) -> RunConfig:
    """The run config of `values` (dotted keys) built by its dataclasses, its values' types as they are."""
    top, grouped = {}, {}
    for key, value in values.items():
        _, f, section = next(k for k in RunConfig.keys() if k[0] == key)
        (grouped.setdefault(section, {}) if section else top)[f.name] = value
    return RunConfig(**top, **{section.NAME: section(**own) for section, own in grouped.items()})


def kebab(f) -> str:
    return KEY_OF[id(f)]


def names_key(message: str, key: str) -> bool:
    """`key` as a whole name in `message` (seed, not partition.seed; --seed and partition.coverage-l-min/avg/max count)."""
    return re.search(rf"(?<![\w-])(?:--)?{re.escape(key)}(?![\w-])", message) is not None


def assert_one_line_naming(message: str, key: str | None, what: str) -> None:
    lines = message.strip().splitlines()
    assert len(lines) == 1, f"{what}: refused in {len(lines)} lines:\n{message}"
    assert key is None or names_key(lines[0], key), f"{what}: the message does not name {key}: {lines[0]}"
    assert "Traceback" not in message, f"{what}: {message}"


# ----- the bad values, from the declarations ------------------------------------------------------------------

# the bound an `allowed` text opens with: "integer >= 1", "> 0; ...", ">= 0.01", "in (0, 1]", "(0, 1)"
OPENING_BOUND = re.compile(r"(?:an? )?(?:integer )?(>=|>) ?(-?\d+(?:\.\d+)?)(?![\w.])")
OPENING_INTERVAL = re.compile(r"(?:in )?([(\[])(-?\d+(?:\.\d+)?), ?(-?\d+(?:\.\d+)?)([)\]])")


def bounds(f) -> list[tuple]:
    """Each bound of a key: ("at_least", a), ("above", b) or ("interval", "(", lo, hi, "]"), declared or promised."""
    meta, found = f.metadata, []
    if meta["at_least"] is not None:
        found.append(("at_least", meta["at_least"]))
    if meta["above"] is not None:
        found.append(("above", meta["above"]))
    for text in (meta["interval"], meta["allowed"]):
        if m := OPENING_INTERVAL.match(text):
            found.append(("interval", m[1], float(m[2]), float(m[3]), m[4]))
    if m := OPENING_BOUND.match(meta["allowed"]):
        found.append(("at_least" if m[1] == ">=" else "above", float(m[2])))
    return list(dict.fromkeys(found))


def _outside(bound: tuple, integer: bool) -> tuple[list, st.SearchStrategy]:
    """Edge values that break one bound, and a strategy of more."""
    if bound[0] in ("at_least", "above"):
        limit = bound[1]
        if integer:
            top = math.ceil(limit) - 1 if bound[0] == "at_least" else math.floor(limit)
            return [top, top - 1], st.integers(max_value=top)
        edges = [math.nextafter(limit, -math.inf), -math.inf] + ([limit] if bound[0] == "above" else [])
        return edges, st.floats(max_value=limit, exclude_max=bound[0] == "at_least")
    _, opening, low, high, closing = bound
    if integer:
        below, over = math.ceil(low) - (opening == "["), math.floor(high) + (closing == "]")
        return [below, over], st.integers(max_value=below) | st.integers(min_value=over)
    edges = [low if opening == "(" else math.nextafter(low, -math.inf),
             high if closing == ")" else math.nextafter(high, math.inf), math.inf, -math.inf]
    return edges, (st.floats(max_value=low, exclude_max=opening == "[")
                   | st.floats(min_value=high, exclude_min=closing == "]"))


def _parses(kind: type, text: str) -> bool:
    """Whether the flag / --set parsers read `text` as a value of `kind` (bool: simulation._bool's words)."""
    if kind is bool:
        return text.lower() in ("true", "1", "yes", "false", "0", "no")
    try:
        kind(text)
    except ValueError:
        return False
    return True


@dataclass(frozen=True)
class Cell:
    """One key and one kind of bad value: edge values and a strategy, typed (TOML, ServerApp) or as text."""

    key: str
    kind: str
    typed_edges: tuple
    typed: st.SearchStrategy
    text_edges: tuple = ()
    text: st.SearchStrategy | None = None  # None: no such value as text (a text is always a string)


def cells_of(f) -> list[Cell]:
    key, kind, words, choices = kebab(f), type(f.default), f.metadata["words"], f.metadata["choices"]
    out = []
    # wrong type: typed, any of the other TOML scalar types; as text, what the key's parser cannot read
    if kind is str:
        out.append(Cell(key, "wrong-type", (1, 1.5, True), st.integers() | st.floats() | st.booleans()))
    else:
        typed = {bool: st.integers() | st.floats() | TEXT.filter(lambda s: s not in words),
                 int: TEXT | st.booleans() | st.floats().filter(lambda x: not x.is_integer()),
                 float: TEXT | st.booleans()}[kind]
        typed_edges = {bool: (1, 0.0, "true"), int: ("1", True, 1.5, math.nan), float: ("1.0", True)}[kind]
        text_edges = {bool: ("ture", "2", "on"), int: ("1.5", "one", "0x10", "1e3"), float: ("one", "1,5")}[kind]
        out.append(Cell(key, "wrong-type", typed_edges, typed, text_edges,
                        TEXT.filter(lambda s: s not in words and not _parses(kind, s))))
    # out of range: every bound
    if kind in (int, float) and (found := bounds(f)):
        edges, strategies = [], []
        for bound in found:
            e, s = _outside(bound, kind is int)
            edges += e
            strategies.append(s)
        if kind is float:
            edges.append(math.nan)
        typed = st.one_of(strategies)
        out.append(Cell(key, "out-of-range", tuple(dict.fromkeys(edges)), typed, tuple(dict.fromkeys(map(repr, edges))),
                        typed.map(repr)))
    # outside the choices
    if choices:
        if kind is str:
            first = list(choices)[0]
            edges = tuple(e for e in (first.upper(), first + " ", " " + first, first + "\n", "none-of-these")
                          if e not in choices)
            strategy = TEXT.filter(lambda s: s not in choices)
            out.append(Cell(key, "outside-choices", edges, strategy, edges, strategy))
        else:
            edges = (max(choices) + 1, min(choices) - 1)
            strategy = st.integers().filter(lambda x: x not in choices)
            out.append(Cell(key, "outside-choices", edges, strategy, tuple(map(str, edges)), strategy.map(str)))
    # empty: bad unless the key's default is empty (a valid config by construction)
    if f.default != "":
        out.append(Cell(key, "empty", ("",), st.just(""), ("",), st.just("")))
    return out


CELLS = [cell for f in FIELDS for cell in cells_of(f)]
KEY_KINDS = {key: [c for c in CELLS if c.key == key] for key in dict.fromkeys(c.key for c in CELLS)}


# ----- the front doors --------------------------------------------------------------------------------------------


def toml_literal(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):  # a TOML basic string is JSON's, once DEL is escaped too
        return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")
    return repr(value)  # ints, and floats as TOML spells them (inf, nan, 1e-05)


def _main(argv: list[str]) -> tuple[Any, str, str]:
    """simulation.main as the command line runs it: its exit code (argparse's SystemExit too), stdout, stderr."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = simulation.main(argv)
        except SystemExit as stop:
            code = stop.code
    return code, out.getvalue(), err.getvalue()


def _refused_by_main(argv: list[str], what: str) -> str:
    code, out, err = _main(argv)
    assert code == 2, f"{what}: exit {code!r} (expected 2; accepted if 0)\nstdout: {out[-500:]}\nstderr: {err}"
    assert "$ flwr run" not in out, f"{what}: went on to the run command"
    return err


def _refused(call, what: str) -> str:
    try:
        call()
    except ValueError as err:
        return str(err)
    raise AssertionError(f"{what}: accepted")


def refusal(door: str, key: str, value: Any, folder: Path) -> str:
    """The message `door` refuses key=value with, asserting it refused (exit 2 or ValueError, nothing else)."""
    what = f"{door} {key}={value!r}"
    TRIED[door] += 1
    if door == "server-app":
        return _refused(lambda: preflight(RunConfig.from_run_config(DEFAULTS | {key: value}), "server"), what)
    if door == "set":
        return _refused(lambda: preflight(RunConfig.from_run_config(DEFAULTS | simulation.parse_overrides([f"{key}={value}"]))), what)
    if door == "flag":
        return _refused_by_main([f"--{key}={value}", "--dry-run"], what)
    path = folder / f"{TRIED[door]}.toml"
    path.write_text(f"{key} = {toml_literal(value)}\n", encoding="utf-8")
    return _refused_by_main(["--run-config", str(path), "--dry-run"], what)


DOORS = ("server-app", "toml", "flag", "set")
TYPED = {"server-app": True, "toml": True, "flag": False, "set": False}


def edges(cell: Cell, door: str) -> tuple:
    return cell.typed_edges if TYPED[door] else cell.text_edges


@pytest.fixture(scope="module", autouse=True)
def no_model_is_built():
    """A refusal must come before any model exists: building one while checking a config fails the test."""
    def refuse(*args, **kwargs):
        raise AssertionError("a model was built while the run config was checked")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(transformers.PreTrainedModel, "__init__", refuse)
        yield


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("bad-input")


def sweep(doors_cells: list[tuple[str, Cell]], folder: Path, label: str, floor: int) -> None:
    before = sum(TRIED.values())
    for door, cell in doors_cells:
        for value in edges(cell, door):
            assert_one_line_naming(refusal(door, cell.key, value, folder), cell.key, f"{door} {cell.key}={value!r}")
    tried = sum(TRIED.values()) - before
    print(f"bad-input sweep, {label}: {tried} values tried ({dict(TRIED)} so far)")
    assert tried >= floor


def test_the_declarations_give_every_key_a_bad_value_of_each_kind_that_applies():
    keys = {kebab(f) for f in FIELDS}
    assert set(KEY_KINDS) == keys  # every key has at least its wrong-type value
    ranged = {c.key for c in CELLS if c.kind == "out-of-range"}
    assert {kebab(f) for f in FIELDS if f.metadata["at_least"] is not None or f.metadata["above"] is not None
            or f.metadata["interval"]} <= ranged
    assert {"federation.round-timeout", "seed", "grpo.num-generations", "rollout.temperature"} <= ranged  # bounds held by a section's check
    assert {c.key for c in CELLS if c.kind == "outside-choices"} == {kebab(f) for f in FIELDS if f.metadata["choices"]}
    assert {k for k in keys if not any(c.kind == "empty" for c in KEY_KINDS[k])} == {
        kebab(f) for f in FIELDS if f.default == ""}


def test_every_key_and_kind_is_refused_in_one_line_at_the_server_app_and_set_doors(folder):
    """Default run: every edge of every cell through the two cheap doors; the toml and flag doors get every key once,
    its kind taken in turn, so each kind meets both of those doors somewhere."""
    sample = [(door, cell) for cell in CELLS for door in ("server-app", "set") if edges(cell, door)]
    for i, (key, cells) in enumerate(KEY_KINDS.items()):
        text_cells = [c for c in cells if c.text_edges]
        sample.append(("toml", cells[i % len(cells)]))
        if text_cells:
            sample.append(("flag", text_cells[(i + 1) % len(text_cells)]))
    sweep(sample, folder, "default edges", floor=1000)


@pytest.mark.slow
@pytest.mark.parametrize("door", DOORS)
def test_every_key_kind_and_edge_is_refused_in_one_line_at_every_door(door, folder):
    sweep([(door, cell) for cell in CELLS if edges(cell, door)], folder, f"all edges at the {door} door", floor=300)


def _generated(door: str, examples: int, derandomize: bool):
    cells = [c for c in CELLS if (c.typed if TYPED[door] else c.text) is not None]

    @settings(max_examples=examples, deadline=None, database=None, derandomize=derandomize,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
    @given(data=st.data())
    def run(data, folder):
        cell = data.draw(st.sampled_from(cells), label="cell")
        value = data.draw(cell.typed if TYPED[door] else cell.text, label=f"{cell.key} ({cell.kind})")
        message = refusal(door, cell.key, value, folder)
        assert_one_line_naming(message, cell.key, f"{door} {cell.key}={value!r}")
    return run


def _sweep(door: str, folder, examples: int, derandomize: bool) -> None:
    before = TRIED[door]
    _generated(door, examples=examples, derandomize=derandomize)(folder=folder)
    print(f"bad-input sweep, generated at the {door} door: {TRIED[door] - before} values tried")
    assert TRIED[door] - before >= examples


@pytest.mark.parametrize("door", DOORS)
def test_generated_bad_values_are_refused_in_one_line(door, folder):
    _sweep(door, folder, examples=25, derandomize=True)


@pytest.mark.slow
@pytest.mark.parametrize("door", DOORS)
def test_many_generated_bad_values_are_refused_in_one_line(door, folder):
    _sweep(door, folder, examples=600, derandomize=False)


# ----- every rule: a table of violating combinations, checked complete against the need(...) sites -------------------


def need_sites() -> dict[tuple[str, int], tuple[str, int, str]]:
    """Every need(...) call in a section's check, in check_across and in the preflight's checks: {(file, first line):
    (function, last line, its key)}."""
    sites = {}
    for module in (config_module, preflight_module):
        tree = ast.parse(inspect.getsource(module))
        functions = [(f"{cls.name}.", fn) for cls in tree.body if isinstance(cls, ast.ClassDef) for fn in cls.body]
        functions += [("", fn) for fn in tree.body]
        for prefix, fn in functions:
            # _declared_keys checks each key against its declaration: the sweep of every key's cells covers it
            if not isinstance(fn, ast.FunctionDef) or fn.name in ("__post_init__", "preflight", "_declared_keys"):
                continue
            for call in ast.walk(fn):
                if isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "need":
                    sites[(module.__file__, call.lineno)] = (f"{prefix}{fn.name}", call.end_lineno, ast.unparse(call.args[1]))
    return sites


@contextlib.contextmanager
def recording_need(calls: list):
    """Record every call of the run config's `need` (config/run_config.py's _collector) and the preflight's as ((file, line of the call), key, ok),
    calling nothing else."""
    def profile(frame, event, arg):
        if event == "call" and frame.f_code.co_name == "need" and frame.f_code.co_qualname.split(".")[0] in (
                "_collector", "preflight"):
            calls.append(((frame.f_back.f_code.co_filename, frame.f_back.f_lineno), frame.f_locals["key"],
                          bool(frame.f_locals["ok"])))

    previous = sys.getprofile()
    sys.setprofile(profile)
    try:
        yield
    finally:
        sys.setprofile(previous)


@dataclass(frozen=True)
class Violation:
    values: dict  # kebab-case keys over the defaults
    key: str  # the key the refusal must name
    absent: tuple = ()  # packages made to look uninstalled
    present: tuple = ()  # packages made to look installed


def violations(tmp: Path) -> list[Violation]:
    """One combination per rule (per key for rules in a loop), each breaking that rule alone."""
    a_file = tmp / "a-file"
    a_file.write_text("x")
    a_model = tmp / "a-model"  # a folder: a model name that needs neither a hub nor a package to pass the preflight
    a_model.mkdir(exist_ok=True)
    bad_labels = tmp / "labels.json"
    bad_labels.write_text("not json")
    evaluated = tmp / "evaluated-run"
    (evaluated / "episodes").mkdir(parents=True, exist_ok=True)
    (evaluated / "episodes" / "round-0000.json").write_text("{}")
    fedse, qavg, sa = {"strategy": "fedse-lora"}, {"strategy": "qavg", "env": "random-mdp"}, {"privacy.secure-aggregation": True}
    V = Violation
    return [
        # FederationConfig
        V({"federation.round-timeout": 0.5}, "federation.round-timeout"), V({"seed": -1}, "seed"),
        V({"num-clients": 1, "clients-per-round": 2}, "clients-per-round"), V({"federation.min-replies": 3}, "federation.min-replies"),
        # EnvironmentConfig
        V({"env": "maze,chess"}, "env"), V({"env": "chess"}, "env"), V({"env": "maze,maze"}, "env"),
        V({"strategy": "pavg", "env": "hopper"}, "env", absent=("mujoco",)),
        # ModelConfig, SpeedConfig
        V({"model": "tiny:chess"}, "model"), V({"model": " "}, "model"), V({"device": "gpu"}, "device"), V({"engine.server-device": "tpu"}, "engine.server-device"),
        V({"engine.client-memory-gb": -1.0}, "engine.client-memory-gb"), V({"engine.rank-timeout-s": 30.0}, "engine.rank-timeout-s"), V({"engine.server-memory-gb": -1.0}, "engine.server-memory-gb"),
        V({"rollout.kernels": "compile", "rollout.name": "hf"}, "rollout.kernels"),
        V({"rollout.generation-batch-size": -1}, "rollout.generation-batch-size"),
        V({"grpo.ppo-max-token-len-per-gpu": -1}, "grpo.ppo-max-token-len-per-gpu"), V({"grpo.log-prob-micro-batch-size-per-gpu": -1}, "grpo.log-prob-micro-batch-size-per-gpu"),
        V({"grpo.log-prob-max-token-len-per-gpu": -1}, "grpo.log-prob-max-token-len-per-gpu"), V({"engine.logprob-chunk-tokens": -1}, "engine.logprob-chunk-tokens"),
        V({"engine.gradient-checkpointing": "sometimes"}, "engine.gradient-checkpointing"),
        V({"engine.shared-prompt-prefix": True, "engine.gradient-checkpointing": True}, "engine.shared-prompt-prefix"),
        V({"engine.attn-implementation": "eager", "engine.gradient-checkpointing": True}, "engine.attn-implementation"),
        # LoRAConfig, RolloutSection, GRPOSection
        V({"lora.target-modules": "q_proj,,v_proj"}, "lora.target-modules"), V({"rollout.temperature": 0.001}, "rollout.temperature"),
        V({"rollout.prompt-template": "reference", "rollout.prompt-roles": "system"}, "rollout.prompt-roles"),
        V({"rollout.prompt-template": "agentgym"}, "rollout.answer-parsing"),
        V({"grpo.num-generations": 1}, "grpo.num-generations"), V({"grpo.clip-ratio-c": 0.5}, "grpo.clip-ratio-c"),
        # EvaluationConfig
        V({"eval.temperature": 0.001}, "eval.temperature"),
        V({"tracker": "tensorboard"}, "tracker", absent=("tensorboard",)), V({"tracker": "wandb"}, "tracker", absent=("wandb",)),
        V({"run-name": "a/b"}, "run-name"), V({"eval.tasks": 1000}, "eval.tasks"),
        V({"rollout.max-context-tokens": 60}, "rollout.max-context-tokens"),
        V({"rollout.max-steps": "maze=5"}, "rollout.max-steps"), V({"eval.tasks": "babyai=3"}, "eval.tasks"),  # per env: not the run's env
        V({"grpo.balance-micro-batches": True, "grpo.ppo-max-token-len-per-gpu": 4096}, "grpo.balance-micro-batches"),
        V({"strategy": "fedse-lora", "grpo.balance-micro-batches": True}, "grpo.balance-micro-batches"),
        V({"strategy": "fedse-lora", "grpo.batch-padding": "copy"}, "grpo.batch-padding"),
        V({"eval.initial-evaluation": "runs/a"}, "eval.initial-evaluation"),
        V({"eval.initial-evaluation": str(tmp / "no-run")}, "eval.initial-evaluation"),
        V({"output-dir": "runs"}, "output-dir"), V({"output-dir": str(a_file / "runs")}, "output-dir"),
        # PartitionConfig
        V({"partition.seed": -2}, "partition.seed"),
        V({"partition.preference-mix": "dirichlet", "partition.preference-omega": 1.0}, "partition.preference-omega"),
        V({"partition.preference-omega": -0.1}, "partition.preference-omega"),
        V({"partition.coverage-l-min": 600}, "partition.coverage-l-min/avg/max"), V({"partition.hardness-r": -1.0}, "partition.hardness-r"),
        V({"partition.scheme": "hardness", "partition.success-labels": "labels.json"}, "partition.success-labels"),
        V({"partition.scheme": "hardness", "partition.success-labels": str(tmp / "no-labels.json")}, "partition.success-labels"),
        V({"partition.scheme": "hardness", "partition.success-labels": str(bad_labels)}, "partition.success-labels"),
        # BaselineConfig, FedRLConfig, FedSEConfig, ResilienceConfig
        V({"baseline.local-client": -1}, "baseline.local-client"),
        V({"fedrl.local-updates": -1}, "fedrl.local-updates"), V({"fedrl.step-size": -1.0}, "fedrl.step-size"),
        V({"fedse.sft-micro-batch-size": 3}, "fedse.sft-micro-batch-size"), V({"fedse.buffer-dir": "rel"}, "fedse.buffer-dir"),
        V(fedse | {"fedse.buffer-dir": str(a_file / "buffers")}, "fedse.buffer-dir"),
        V({"resilience.fault-injection": "explode"}, "resilience.fault-injection"),
        # check_across
        V({"precision": "bf16-base"}, "precision"),
        V({"grpo.gamma": 0.5}, "grpo.gamma"), V({"grpo.gigpo-mode": "mean_std_norm"}, "grpo.gigpo-mode"),
        V({"grpo.step-advantage-w": 0.5}, "grpo.step-advantage-w"),
        V({"model": f"warm:{a_model}", "rollout.history-length": 0}, "rollout.history-length"),
        V({"model": f"warm:{a_model}", "rollout.history-length": 2, "rollout.prompt-roles": "system"}, "rollout.prompt-roles"),
        V({"model": "warm:smollm2-135m", "rollout.history-length": 2}, "model"),  # a hub id neither cached nor on a hub here
        V(fedse | {"engine.training-kernels": "compile"}, "engine.training-kernels"),
        V(qavg | {"eval.initial-evaluation": str(evaluated)}, "eval.initial-evaluation"),
        V(fedse | {"grpo.ppo-max-token-len-per-gpu": 64}, "grpo.ppo-max-token-len-per-gpu"),
        V(fedse | {"grpo.log-prob-max-token-len-per-gpu": 64}, "grpo.log-prob-max-token-len-per-gpu"),
        V(fedse | {"grpo.adv-estimator": "gigpo"}, "grpo.adv-estimator"), V(fedse | {"grpo.clip-ratio-c": 2.0}, "grpo.clip-ratio-c"),
        V(fedse | {"grpo.kl-clamp": 1.0}, "grpo.kl-clamp"), V(fedse | {"grpo.entropy-coeff": 0.1}, "grpo.entropy-coeff"),
        V(fedse | {"grpo.reward-std-ddof": 1}, "grpo.reward-std-ddof"),
        V(fedse | {"engine.param-dtype": "bf16", "precision": "bf16-mixed"}, "engine.param-dtype"),
        V(fedse | {"engine.ranks-per-client": 2}, "engine.ranks-per-client"),
        V({"engine.ranks-per-client": 2, "engine.param-dtype": "bf16", "precision": "bf16-mixed"}, "engine.param-dtype"),
        V({"engine.ranks-per-client": 2, "engine.training-kernels": "compile"}, "engine.training-kernels"),
        V({"engine.ranks-per-client": 2, "engine.attn-implementation": "eager"}, "engine.attn-implementation"),
        V({"engine.ranks-per-client": 2, "device": "cuda:1"}, "device"),
        V(fedse | {"federation.client-sampling": "reference"}, "federation.client-sampling"),
        V({"engine.training-kernels": "liger", "device": "cpu"}, "engine.training-kernels", present=("liger_kernel",)),
        V({"engine.training-kernels": "liger", "device": "cuda"}, "engine.training-kernels", absent=("liger_kernel",)),
        V({"strategy": "qavg", "env": "hopper"}, "env"),
        V(qavg | {"fedrl.local-updates": 0, "fedrl.clients": "sampled"}, "fedrl.clients"),
        V({"env": "random-mdp"}, "env"),
        V({"strategy": "pavg", "env": "hopper", "fedrl.pavg-variant": "proj"}, "fedrl.pavg-variant", present=("mujoco",)),
        V({"fedrl.env-embedding-dim": 4}, "fedrl.env-embedding-dim"), V(qavg | {"fedrl.env-embedding-dim": 4}, "fedrl.env-embedding-dim"),
        V({"partition.scheme": "by-environment", "env": "maze,wordle", "num-clients": 3}, "num-clients"),
        V({"baseline.name": "local", "num-clients": 2, "baseline.local-client": 2}, "baseline.local-client"),
        V(fedse | {"fedse.explore-samples": 0, "fedse.seed-demos": 0}, "fedse.seed-demos"),
        V({"fedse.seed-demos": "maze=5"}, "fedse.seed-demos"),  # per env: not the run's env
        V(fedse | {"baseline.name": "local"}, "baseline.name"), V(fedse | {"grpo.finetuning": "lora"}, "grpo.finetuning"),
        V(sa | {"grpo.finetuning": "lora"}, "grpo.finetuning"),
        V({"federation.transfer-dtype": "bf16", "privacy.dp-mode": "server-side"}, "federation.transfer-dtype"),
        # _check_resilience_across
        V({"resume": True}, "resume"), V(qavg | {"resume": True, "run-name": "r"}, "resume"),
        V({"resume": True, "run-name": "r", "baseline.name": "local"}, "resume"),
        V(qavg | {"privacy.dp-mode": "server-side"}, "privacy.dp-mode"),
        V(sa | fedse, "strategy"), V(sa | {"clients-per-round": 1}, "clients-per-round"),
        V(sa | {"privacy.dp-mode": "server-side"}, "privacy.dp-mode"), V(sa | {"resume": True, "run-name": "r"}, "resume"),
        V(sa | {"baseline.name": "centralized"}, "baseline.name"),
        V({"resilience.fault-injection": "raise:partition=4", "num-clients": 4}, "resilience.fault-injection"),
        V({"resilience.fault-injection": "timeout:prob=0.5"}, "federation.round-timeout"),
    ]


def _installed_as(monkeypatch, absent: tuple, present: tuple) -> None:
    real = importlib.util.find_spec

    def find_spec(name, *args, **kwargs):
        if name in absent:
            return None
        if name in present:
            return importlib.machinery.ModuleSpec(name, None)
        return real(name, *args, **kwargs)
    monkeypatch.setattr(importlib.util, "find_spec", find_spec)


def test_every_rule_has_a_combination_that_breaks_it_alone_and_is_refused_in_one_line(tmp_path, monkeypatch):
    sites = need_sites()
    site_of = {(file, line): (file, first) for (file, first), (_, last, _) in sites.items() for line in range(first, last + 1)}
    seen, broken = set(), set()  # (site, key) pairs: called at all / refused
    calls: list = []
    with recording_need(calls):
        preflight(RunConfig())
    seen |= {(site_of[line], key) for line, key, _ in calls if line in site_of}
    for v in violations(tmp_path):
        calls = []
        with monkeypatch.context() as patch:
            _installed_as(patch, v.absent, v.present)
            with recording_need(calls):
                # the dataclasses themselves, not from_run_config: a wrong-typed value must reach its section's rule too
                message = _refused(lambda: preflight(uncoerced(v.values)), f"{v.values}")
        TRIED["rules"] += 1
        assert_one_line_naming(message, v.key, f"{v.values}")
        refused = {(site_of[line], key) for line, key, ok in calls if not ok and line in site_of}
        assert any(key == v.key for _, key in refused), f"{v.values}: no rule refused it with key {v.key}: {message}"
        seen |= {(site_of[line], key) for line, key, _ in calls if line in site_of}
        broken |= refused
    unbroken_sites = sorted(set(sites) - {site for site, _ in broken})
    assert not unbroken_sites, "no combination in violations() breaks these rules: " + "; ".join(
        f"{Path(site[0]).name}:{site[1]} {sites[site][0]} need(..., {sites[site][2]}, ...)" for site in unbroken_sites)
    assert not seen - broken, f"rules that can name these keys but no combination makes them: {sorted(seen - broken)}"
    print(f"bad-input sweep, rules: {len(sites)} need sites, {len(broken)} (site, key) pairs broken, "
          f"{TRIED['rules']} combinations tried")


# ----- malformed --set strings and --run-config files -----------------------------------------------------------------

RUN_CONFIG_FILES = [  # (what, file name, bytes, the key the message must name)
    ("an unclosed quote", "a.toml", b'model = "tiny\n', "model"),
    ("an unclosed array", "a.toml", b"seed = [\n", "seed"),  # tomli: at the end of the document, past the last line
    ("a key without =", "a.toml", b"seed\n", "seed"),
    ("an unknown key", "a.toml", b"no-such-key = 1\n", "no-such-key"),
    ("a duplicate key", "a.toml", b"seed = 1\nseed = 2\n", "seed"),
    ("a table for a scalar", "a.toml", b"[seed]\nvalue = 1\n", "seed"),
    ("an inline table for a scalar", "a.toml", b"seed = { value = 1 }\n", "seed"),
    ("an array for a scalar", "a.toml", b"seed = [1, 2]\n", "seed"),
    ("a date for a scalar", "a.toml", b"seed = 1979-05-27\n", "seed"),
    ("a string for an integer", "a.toml", b'seed = "1"\n', "seed"),
    ("non-UTF-8 bytes", "a.toml", b'model = "\xff\xfe"\n', None),
    ("a byte-order mark", "a.toml", "\ufeffseed = 1\n".encode(), None),
    ("an empty file", "a.toml", b"", None),
    ("a file of comments only", "a.toml", b"# seed = 1\n", None),
    ("a file not named .toml", "a.cfg", b"seed = -1\n", None),  # Flower reads only *.toml as TOML
]


@pytest.mark.parametrize("what, name, content, key", RUN_CONFIG_FILES, ids=[c[0] for c in RUN_CONFIG_FILES])
def test_a_malformed_run_config_file_is_refused_in_one_line(what, name, content, key, tmp_path):
    path = tmp_path / name
    path.write_bytes(content)
    assert_one_line_naming(_refused_by_main(["--run-config", str(path), "--dry-run"], what), key, what)


@pytest.mark.parametrize("what, path, key", [
    ("a folder", ".", None), ("a missing file", "no-such-file.toml", None),
    ("key=value text", "seed=-1", "seed"),  # run_simulation.py's --run-config takes a file; keys are flags
])
def test_a_run_config_that_is_not_a_file_is_refused_in_one_line(what, path, key, tmp_path):
    assert_one_line_naming(_refused_by_main(["--run-config", str(tmp_path / path) if path != "seed=-1" else path,
                                             "--dry-run"], what), key, what)


SETS = [  # (--set items, the key the message must name)
    (["seed"], "seed"), (["=1"], None), (["no-such-key=1"], "no-such-key"), (["seed =1"], "seed"),
    (["seed=1", "seed=2"], "seed"), (["seed=1", "seed=1"], "seed"),  # duplicates: one would be dropped silently
    (["seed=1 seed=2"], "seed"), (['seed="1'], "seed"), (["seed='1'"], "seed"), (['strategy="fedagent-avg'], "strategy"),
    (["resume=maybe"], "resume"), (["engine.gradient-checkpointing=Auto"], "engine.gradient-checkpointing"),
    (["grpo.learning-rate=1e-5", "rollout.top-p=0"], "rollout.top-p"),
    (['model="tiny'], "model"),  # not a hub id: refused before the hub is asked (agent/models/pretrained.py)
]


@pytest.mark.parametrize("items, key", SETS)
def test_a_malformed_set_is_refused_in_one_line(items, key):
    what = f"--set {items}"
    message = _refused(lambda: preflight(RunConfig.from_run_config(DEFAULTS | simulation.parse_overrides(items))), what)
    assert_one_line_naming(message, key, what)


@pytest.mark.parametrize("argv, key", [
    (["--seed"], "seed"), (["--no-such-key", "1"], "no-such-key"), (["--run-config"], "run-config"),
    (["--resume", "maybe"], "resume"), (["--output-dir="], "output-dir"),
])
def test_a_malformed_command_line_is_refused_in_one_line(argv, key):
    assert_one_line_naming(_refused_by_main([*argv, "--dry-run"], str(argv)), key, str(argv))


# ----- a real subprocess: exit code 2, one line, no traceback -------------------------------------------------------

WARNING = re.compile(r"^\S.*:\d+: \w*Warning: ")


def _subprocess_cases(tmp: Path, every: bool) -> list[tuple[list[str], str | None]]:
    """(arguments, key) of run_simulation.py runs. Each run imports torch and flwr (~10 s of CPU), so the default run
    takes two: a refusal by argparse and a malformed file (test_validation.py runs RunConfig's refusals); the slow
    run adds the first key of each kind at the flag door and a non-UTF-8 file."""
    files = {what: (name, content, key) for what, name, content, key in RUN_CONFIG_FILES}
    picked = ["a duplicate key"] + (["non-UTF-8 bytes"] if every else [])
    cases = []
    for what in picked:
        name, content, key = files[what]
        (tmp / what).mkdir()
        (tmp / what / name).write_bytes(content)
        cases.append((["--run-config", str(tmp / what / name)], key))
    first = {}
    for cell in CELLS:
        if cell.text_edges and cell.kind not in first:
            first[cell.kind] = cell
    flags = [([f"--{c.key}={c.text_edges[0]}"], c.key) for c in first.values()]
    if not every:
        return cases + flags[:1]  # flags[0]: a wrong type, refused by argparse
    return cases + flags


def _run_all(cases: list, tmp: Path) -> None:
    procs = [(args, key, subprocess.Popen([sys.executable, str(ROOT / "run_simulation.py"), *args, "--dry-run"],
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp))
             for args, key in cases]
    for args, key, proc in procs:
        out, err = proc.communicate(timeout=300)
        TRIED["subprocess"] += 1
        lines = [line for line in err.splitlines() if line.strip() and not WARNING.match(line)
                 and not line.startswith("  warnings.warn(")]
        assert proc.returncode == 2, f"{args}: exit {proc.returncode}\n{out[-500:]}\n{err}"
        assert "Traceback" not in err and "$ flwr run" not in out, f"{args}:\n{err}"
        assert_one_line_naming("\n".join(lines), key, str(args))


def test_run_simulation_refuses_a_sample_with_exit_code_2_and_one_line(tmp_path):
    _run_all(_subprocess_cases(tmp_path, every=False), tmp_path)


@pytest.mark.slow
def test_run_simulation_refuses_a_value_of_every_kind_and_malformed_files_with_exit_code_2_and_one_line(tmp_path):
    cases = _subprocess_cases(tmp_path, every=True)
    for start in range(0, len(cases), 3):  # three at a time: each imports torch and flwr
        _run_all(cases[start:start + 3], tmp_path)
