"""`python -m fedagent_flwr.experiments.build_tiny`: build tiny models ahead of a run, showing their progress.

    python -m fedagent_flwr.experiments.build_tiny --env maze
    python -m fedagent_flwr.experiments.build_tiny --env maze --env wordle    # two models, one after the other
    python -m fedagent_flwr.experiments.build_tiny --env babyai,maze          # the one model of a multi-env run
    python -m fedagent_flwr.experiments.build_tiny --env maze --force         # build it again

Each model is the one `model='tiny'` gives a run with that `env`: the same recipe and the same cache folder
(under $FEDAGENT_CACHE, default ~/.cache/fedagent-flwr), so the run finds it built. A model already built is
reported, not built again. `--force` builds it again; the cached folder is replaced only once the new one is
complete, so an interrupted rebuild leaves the old one in place. Build times: docs/environments.md.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from pathlib import Path

from fedagent_flwr.agent.model_cache import MARKER, is_built
from fedagent_flwr.agent.models import tiny_model_env
from fedagent_flwr.agent.tiny_model import (
    clock,
    default_recipe,
    ensure_tiny_model,
    tiny_model_dir,
)


def _build_times(folder: Path) -> str:
    """"2:23 wall, 4:10 CPU" as the build recorded them, or "" for a folder that does not say."""
    try:
        meta = json.loads((folder / MARKER).read_text())
        return f"{clock(meta['build_seconds'])} wall, {clock(meta['build_cpu_seconds'])} CPU"
    except (OSError, ValueError, KeyError, TypeError):
        return ""


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m fedagent_flwr.experiments.build_tiny", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--env", action="append", required=True, metavar="ENV",
                   help="an environment, or a comma-separated multi-env spec (one model over its envs); repeat for several models")
    p.add_argument("--force", action="store_true", help="build again even a model already built")
    args = p.parse_args(argv)
    try:
        envs = [tiny_model_env(env) for env in args.env]
    except ValueError as err:
        p.error(str(err))
    for env in envs:
        recipe = default_recipe(env)
        folder = tiny_model_dir(recipe)
        if not args.force and is_built(folder):
            took = _build_times(folder)
            print(f"{env}: already built: {folder}" + (f" (its build took {took})" if took else ""), flush=True)
            continue
        started = time.perf_counter()
        ensure_tiny_model(env, recipe=recipe, force=args.force)
        took = _build_times(folder) or f"{clock(time.perf_counter() - started)} wall"
        print(f"{env}: built in {took}: {folder}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
