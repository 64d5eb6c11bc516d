"""The layering the project keeps: every module imports only the layers below it (and its own package).

apps -> federation / deployment -> methods -> runs -> agent / privacy / faults -> atomic / config; experiments
(and the evaluation command) on top. The run config (fedagent_flwr/config) is the bottom: it imports no other
module of the project and no torch, so every layer may import it, the libraries too;
envs, partitions, fedrl and strategies import nothing else of the app. A function-level import counts too,
so one cannot be used to dodge a circle.
"""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# rank of each part of fedagent_flwr: a module may import parts of a lower rank, or its own part
RANKS = {"atomic": 0, "config": 0, "agent": 1, "faults": 1, "privacy": 1, "runs": 3, "methods": 4, "federation": 5,
         "deployment": 5, "server_app": 6, "client_app": 6, "simulation": 6, "experiments": 7, "evaluation": 8}
LIBRARIES = ("envs", "partitions", "fedrl", "strategies")


def _imports(path: Path) -> set[str]:
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            out |= {base} | {f"{base}.{a.name}" for a in node.names}
    return out


def _part(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "fedagent_flwr" and len(parts) > 1 and parts[1] in RANKS else None


@pytest.mark.parametrize("path", sorted((ROOT / "fedagent_flwr").rglob("*.py")), ids=lambda p: str(p.relative_to(ROOT)))
def test_app_modules_import_only_lower_layers(path):
    own = _part(".".join(path.relative_to(ROOT).with_suffix("").parts))
    if own is None:  # fedagent_flwr/__init__.py
        return
    upward = sorted(m for m in _imports(path) if (p := _part(m)) and p != own and RANKS[p] >= RANKS[own])
    assert not upward, f"{path.relative_to(ROOT)} ({own}, rank {RANKS[own]}) imports {upward}"


@pytest.mark.parametrize("library", LIBRARIES)
def test_libraries_never_import_the_app(library):
    """Only the run config, the bottom layer, which imports nothing of the project: a library takes its choices from it."""
    for path in sorted((ROOT / library).rglob("*.py")):
        assert not [m for m in _imports(path) if m.split(".")[0] == "fedagent_flwr" and _part(m) not in (None, "config")
                    and m != "fedagent_flwr"], path


def test_the_run_config_imports_nothing_of_the_project_and_no_torch():
    """fedagent_flwr/config is the settings layer at the bottom: parsing a run config must not load the stack."""
    for path in sorted((ROOT / "fedagent_flwr" / "config").rglob("*.py")):
        imported = _imports(path)
        foreign = sorted(m for m in imported if m.split(".")[0] in ("fedagent_flwr", *LIBRARIES)
                         and not m.startswith("fedagent_flwr.config"))
        assert not foreign, f"{path.relative_to(ROOT)} imports {foreign}"
        assert not [m for m in imported if m.split(".")[0] in ("torch", "transformers", "peft", "trl", "flwr")], path
    code = ("import sys, time; t = time.perf_counter(); from fedagent_flwr.config import RunConfig; RunConfig(); "
            "print(time.perf_counter() - t); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'envs', 'strategies', 'partitions', 'fedrl') "
            "or (m.startswith('fedagent_flwr.') and not m.startswith('fedagent_flwr.config'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT).stdout.split("\n")
    assert out[1] == "[]", out[1]  # nothing of the stack loaded (the time, out[0], is the note's figure, not asserted)


def test_the_app_package_keeps_a_short_top_level():
    top = sorted(p.name for p in (ROOT / "fedagent_flwr").glob("*.py"))
    assert len(top) <= 10, top


def test_every_package_folder_is_a_regular_package():
    """A folder without __init__.py imports in a checkout but is left out of a built wheel."""
    for library in ("fedagent_flwr",) + LIBRARIES:
        for folder in [ROOT / library, *(p for p in (ROOT / library).rglob("*") if p.is_dir())]:
            if any(folder.glob("*.py")):
                assert (folder / "__init__.py").exists(), folder.relative_to(ROOT)


def test_no_test_folder_shadows_a_package():
    """tests/ is on sys.path under pytest; a folder there named like a top-level package would be imported
    in its place (as an empty namespace package) whenever the project itself is not on sys.path."""
    packages = {p.parent.name for p in ROOT.glob("*/__init__.py")}
    folders = {p.name for p in (ROOT / "tests").iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert not folders & packages, folders & packages


AGENT_ROOMS = ("fsdp", "engine", "play", "training", "models")  # agent/'s rooms, each importing only the rooms before it


@pytest.mark.parametrize("path", sorted((ROOT / "fedagent_flwr" / "agent").rglob("*.py")),
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_agent_rooms_import_only_the_rooms_before_them(path):
    parts = path.relative_to(ROOT / "fedagent_flwr" / "agent").parts
    if len(parts) == 1:  # agent/__init__.py and self_evolution.py, which use every room
        return
    own = AGENT_ROOMS.index(parts[0])
    later = sorted(m for m in _imports(path) if m.startswith("fedagent_flwr.agent.")
                   and (room := m.split(".")[2]) in AGENT_ROOMS and AGENT_ROOMS.index(room) > own)
    assert not later, f"{path.relative_to(ROOT)} ({parts[0]}) imports a later room: {later}"
    assert not any(m == "fedagent_flwr.agent.self_evolution" for m in _imports(path)), path
