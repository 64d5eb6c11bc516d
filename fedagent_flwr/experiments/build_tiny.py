"""`python -m fedagent_flwr.experiments.build_tiny`: build tiny models ahead of a run, showing their progress.

    python -m fedagent_flwr.experiments.build_tiny --env maze
    python -m fedagent_flwr.experiments.build_tiny --env maze --env wordle    # two models, one after the other
    python -m fedagent_flwr.experiments.build_tiny --env babyai,maze          # the one model of a multi-env run
    python -m fedagent_flwr.experiments.build_tiny --env maze --force         # build it again
    python -m fedagent_flwr.experiments.build_tiny --env babyai,maze --set bc-steps=1200   # another recipe

Each model is the one `model='tiny'` gives a run with that `env`: the same recipe and the same cache folder
(under $FEDAGENT_CACHE, default ~/.cache/fedagent-flwr), so the run finds it built. `--set KEY=VALUE` changes a
field of that recipe (TinyRecipe in agent/models/tiny_model.py, kebab-case); such a model has a folder of its own,
printed at the end, which a run names as its `model`. A model already built is reported, not built again.
`--force` builds it again; the cached folder is replaced only once the new one is complete, so an interrupted
rebuild leaves the old one in place. Build times: docs/environments.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from collections.abc import Sequence
from pathlib import Path

from fedagent_flwr.agent.models.model_cache import MARKER, is_built
from fedagent_flwr.agent.models.pretrained import tiny_model_env
from fedagent_flwr.agent.play.progress import clock
from fedagent_flwr.agent.models.tiny_model import (
    TinyRecipe,
    default_recipe,
    ensure_tiny_model,
    tiny_model_dir,
)

# Recipe fields --set may change: all but the environment (from --env), the recipe's version and the
# environments' prompt revisions (both follow the code, not a choice of recipe).
_SETTABLE = {f.name.replace("_", "-"): f for f in dataclasses.fields(TinyRecipe)
             if f.name not in ("env", "version", "prompt_revisions")}


def recipe_overrides(pairs: Sequence[str]) -> dict:
    """`--set` pairs as TinyRecipe fields, each value parsed to its field's type; a bad one is a one-line error."""
    out = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        if not sep:
            raise ValueError(f"--set {pair!r}: expected KEY=VALUE")
        field = _SETTABLE.get(key.strip())
        if field is None:
            raise ValueError(f"--set {key.strip()}: not a tiny-model recipe key; allowed: {', '.join(sorted(_SETTABLE))}")
        kind = str(field.type).split("|")[0].strip()  # "int", "float", "bool" (some are "... | None")
        text = text.strip()
        try:
            if text.lower() == "none" and "None" in str(field.type):
                value = None
            elif kind == "bool":
                if text.lower() not in ("true", "false"):
                    raise ValueError
                value = text.lower() == "true"
            else:
                value = {"int": int, "float": float}[kind](text)
        except ValueError:
            raise ValueError(f"--set {key.strip()}={text!r}: expected {field.type}") from None
        out[field.name] = value
    return out


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
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a recipe field over the default recipe (repeatable), e.g. --set bc-steps=1200")
    args = p.parse_args(argv)
    try:
        envs = [tiny_model_env(env) for env in args.env]
        overrides = recipe_overrides(args.set)
    except ValueError as err:
        p.error(str(err))
    for env in envs:
        recipe = dataclasses.replace(default_recipe(env), **overrides)
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
