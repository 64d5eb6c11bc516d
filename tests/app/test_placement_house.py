"""The house rule for `auto`: every run-config `auto` (and rollout.generation-batch-size = 0) is decided by
agent/engine/placement.py's place(), which each process reaches once through methods/placement.py. As
tests/app/test_layers.py pins the rooms' imports, this pins where an `auto` may be decided: no other module of the
package or the benchmarks compares a run-config key with "auto", or takes a default in place of rollout.generation-batch-size,
and nothing compares a placement's field with "auto" (a resolved value never carries the word)."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
THE_PLACEMENT = {"fedagent_flwr/agent/engine/placement.py"}

AUTO_KEYS = {"device", "server_device", "precision", "param_dtype", "decode_engine", "kl_reference",
             "gradient_checkpointing", "engine"}


def _auto_key(node: ast.AST) -> bool:
    """A run-config key that may say auto, or a placement's field of its name; rollout.name (the decode engine) by
    its section, "name" alone being anything's."""
    if isinstance(node, ast.Name):
        return node.id in AUTO_KEYS
    return isinstance(node, ast.Attribute) and (node.attr in AUTO_KEYS or (
        node.attr == "name" and isinstance(node.value, ast.Attribute) and node.value.attr == "rollout"))


def _deciding(tree: ast.AST) -> list[int]:
    """Lines that compare a run-config key (or a bare name for one) with "auto", or default rollout.generation-batch-size's 0,
    outside a `need(...)` check (validation, not a decision); a placement's own field too (it is resolved)."""
    checks = {id(n) for call in ast.walk(tree) if isinstance(call, ast.Call) and getattr(call.func, "id", "") == "need"
              for n in ast.walk(call)}
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and id(node) not in checks:
            sides = [node.left, *node.comparators]
            says_auto = any(isinstance(s, ast.Constant) and s.value == "auto" for s in sides) or any(
                isinstance(s, (ast.Tuple, ast.List, ast.Set)) and any(isinstance(e, ast.Constant) and e.value == "auto"
                                                                      for e in s.elts) for s in sides)
            keys = [s for s in sides if _auto_key(s)]
            if says_auto and keys:
                lines.append(node.lineno)
        if isinstance(node, ast.BoolOp) and isinstance(node.op, ast.Or):
            first = node.values[0]
            if isinstance(first, ast.Attribute) and first.attr in ("generation_batch_size", "rollout_batch_size"):
                lines.append(node.lineno)
    return sorted(lines)


SOURCES = sorted(p for folder in ("fedagent_flwr", "benchmarks") for p in (ROOT / folder).rglob("*.py"))


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_module_but_the_placement_decides_an_auto(path):
    name = str(path.relative_to(ROOT))
    if name in THE_PLACEMENT:
        return
    assert not _deciding(ast.parse(path.read_text())), f"{name} decides an auto at lines {_deciding(ast.parse(path.read_text()))}"


def test_the_rule_finds_what_it_forbids():
    caught = ast.parse('def f(cfg, placement, device):\n'
                       '    a = cfg.engine.gradient_checkpointing == "auto"\n'
                       '    b = device == "auto"\n'
                       '    c = cfg.rollout.generation_batch_size or cfg.epoch_episodes()\n'
                       '    d = placement.gradient_checkpointing == "auto"\n'
                       '    need(cfg.engine.gradient_checkpointing in (True, False, "auto"), "k", 1, "x")\n')
    assert _deciding(caught) == [2, 3, 4, 5]
