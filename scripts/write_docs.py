"""Write every generated part of the docs from its records: the blocks and figures of fedagent_flwr/experiments/doc_blocks.py.

    python scripts/write_docs.py            # write them
    python scripts/write_docs.py --check    # list the stale ones, exit 1 if any (tests/records does the same)
    python scripts/write_docs.py --registry # each number's generator, page, value and the records it is computed from

The generators are the modules of fedagent_flwr/experiments/ and benchmarks/ that define `doc_parts()`; a marker on a
page of README.md or docs/ that none of them writes is an error."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fedagent_flwr.atomic import atomic_write_text  # noqa: E402
from fedagent_flwr.experiments import doc_blocks  # noqa: E402

DEFINES = re.compile(r"^def doc_parts\(", re.M)


def generator_files(root: Path = ROOT) -> list[Path]:
    """The modules that define doc_parts(), package modules first, each folder in name order."""
    files = sorted((root / "fedagent_flwr" / "experiments").glob("*.py")) + sorted((root / "benchmarks").glob("*.py"))
    return [f for f in files if DEFINES.search(f.read_text())]


def load(path: Path, root: Path = ROOT):
    """A package module by its name; a benchmark script from its file, with benchmarks/ on sys.path while it loads (the
    scripts import each other as siblings)."""
    if path.parent.name == "experiments":
        return importlib.import_module(f"fedagent_flwr.experiments.{path.stem}")
    spec = importlib.util.spec_from_file_location(f"benchmarks_{path.stem}", path)
    sys.path.insert(0, str(path.parent))
    try:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(path.parent))
    return module


def all_parts(root: Path = ROOT) -> dict[str, list]:
    """{generator file relative to root: its parts}."""
    return {f.relative_to(root).as_posix(): list(load(f, root).doc_parts()) for f in generator_files(root)}


def records_read(generator: Path, root: Path = ROOT) -> tuple[list, list[str]]:
    """(its parts, the files under benchmarks/results/ it opened to compute them): the generator loaded and run in this
    process with an audit hook on `open`, so call it in a fresh process (a cache filled by another generator would hide
    a read)."""
    results, opened = (root / "benchmarks" / "results").resolve(), set()

    def audit(event: str, args: tuple) -> None:
        if event == "open" and args and isinstance(args[0], (str, bytes, os.PathLike)):
            path = Path(os.fsdecode(args[0]))
            if path.is_absolute() and results in path.parents:
                opened.add(path.relative_to(results).as_posix())

    sys.addaudithook(audit)  # for the rest of this process: it exists to answer this one question
    parts = list(load(generator, root).doc_parts())
    return parts, sorted(opened)


def registry(root: Path = ROOT) -> list[dict]:
    """One entry per generator: the function that computes its numbers, each part (page, name, value) and the records
    it reads. Each generator runs in a process of its own."""
    out = []
    for f in generator_files(root):
        done = subprocess.run([sys.executable, __file__, "--records-of", str(f)], capture_output=True, text=True,
                              check=True)
        out.append(json.loads(done.stdout.splitlines()[-1]))
    return out


def marked_pages(root: Path = ROOT) -> list[str]:
    """README.md and the pages of docs/ that hold a generated block or figure."""
    pages = [root / "README.md", *sorted((root / "docs").rglob("*.md"))]
    return [p.relative_to(root).as_posix() for p in pages
            if doc_blocks.BLOCK_NAME.search(p.read_text()) or doc_blocks.FIGURE.search(p.read_text())]


def regenerated(root: Path = ROOT) -> dict[str, tuple[str, str]]:
    """{page: (now, regenerated)} for every page a generator writes or a marker stands on."""
    parts = [p for ps in all_parts(root).values() for p in ps]
    out = doc_blocks.pages(parts, root)
    for page in marked_pages(root):  # a page with markers and no generator: rendered() names its orphans
        if page not in out:
            now = (root / page).read_text()
            out[page] = (now, doc_blocks.rendered(now, page, parts))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="write nothing; list the stale parts and exit 1 if any")
    p.add_argument("--registry", action="store_true",
                   help="write nothing; print each generator's function, its parts (page, name, value) and the records "
                        "in benchmarks/results/ it reads, as JSON lines")
    p.add_argument("--records-of", type=Path, help=argparse.SUPPRESS)  # one generator's registry entry (--registry)
    args = p.parse_args(argv)
    if args.records_of:
        parts, records = records_read(args.records_of.resolve())
        print(json.dumps({
            "function": f"{args.records_of.resolve().relative_to(ROOT).as_posix()}:doc_parts",
            "parts": [{"page": x.page, "name": x.name, "kind": type(x).__name__.lower(),
                       "value": x.text if isinstance(x, doc_blocks.Figure) else "\n".join(x.lines)} for x in parts],
            "records": records}))
        return 0
    if args.registry:
        for entry in registry():
            print(json.dumps(entry))
        return 0
    parts = [x for ps in all_parts().values() for x in ps]
    if args.check:
        regenerated()  # raises on a marker no generator writes
        stale = doc_blocks.stale(parts)
        print("\n".join(stale) or "every generated part is up to date")
        return 1 if stale else 0
    for page, (now, new) in regenerated().items():
        if new != now:
            atomic_write_text(ROOT / page, new)
            print(f"wrote {page}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
