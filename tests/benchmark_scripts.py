"""Load a script of benchmarks/ as a module, for the tests of its pure parts (the scripts are not a package)."""

import importlib.util
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def load_script(name: str):
    """benchmarks/<name>.py as a module; the folder is on sys.path while it loads, as a script sees it beside
    the scripts it imports (decode_profile and update_profile import gpu_round)."""
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    sys.path.insert(0, str(BENCHMARKS))
    try:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(BENCHMARKS))
    return module
