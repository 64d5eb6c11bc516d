"""Write every generated part of the docs from its records: the blocks and figures of fedagent_flwr/experiments/doc_blocks.py.

    python scripts/write_docs.py            # write them
    python scripts/write_docs.py --check    # list the stale ones, exit 1 if any (tests/records does the same)

The generators are the modules of fedagent_flwr/experiments/ and benchmarks/ that define `doc_parts()`; a marker on a
page of README.md or docs/ that none of them writes is an error."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import re
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
    args = p.parse_args(argv)
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
