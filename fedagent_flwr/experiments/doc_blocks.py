"""Generated parts of the docs. A measured number a page quotes is written there by code from its records, in one of two
forms, and `python scripts/write_docs.py` writes them all (`--check` lists the stale ones; tests/records regenerates
every page and compares):

- a block: the lines between `<!-- begin generated: NAME -->` and `<!-- end generated: NAME -->` (a table, say);
- a figure: one number in a sentence, `<!--fig:NAME-->41 %<!--/fig-->`. The comments do not render, so the prose
  reads as prose, and the sentence around the number stays the writer's.

A generator is a module with `doc_parts() -> list[Block | Figure]`; scripts/write_docs.py lists them."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FIGURE = re.compile(r"<!--fig:([A-Za-z0-9_.-]+)-->(.*?)<!--/fig-->", re.S)
BLOCK_NAME = re.compile(r"<!-- begin generated: ([A-Za-z0-9_.-]+) -->")


@dataclass(frozen=True)
class Block:
    page: str  # relative to the repository's root, e.g. "docs/results.md"
    name: str
    lines: tuple[str, ...]


@dataclass(frozen=True)
class Figure:
    page: str
    name: str
    text: str  # what stands between the markers, e.g. "41 %"


def with_block(text: str, name: str, lines: list[str] | tuple[str, ...]) -> str:
    """`text` with its generated block `name` holding `lines`; ValueError unless it has one pair of markers."""
    begin, end = f"<!-- begin generated: {name} -->", f"<!-- end generated: {name} -->"
    if text.count(begin) != 1 or text.count(end) != 1:
        raise ValueError(f"expected one '{begin}' and one '{end}'")
    head, rest = text.split(begin)
    return head + begin + "\n" + "\n".join(lines) + "\n" + end + rest.split(end)[1]


def with_figure(text: str, name: str, value: str) -> str:
    """`text` with its figure `name` reading `value`; ValueError unless the page marks it exactly once."""
    found = [m for m in FIGURE.finditer(text) if m.group(1) == name]
    if len(found) != 1:
        raise ValueError(f"expected one '<!--fig:{name}-->...<!--/fig-->', found {len(found)}")
    m = found[0]
    return text[:m.start(2)] + value + text[m.end(2):]


def rendered(text: str, page: str, parts: list[Block | Figure]) -> str:
    """The page `text` with every part of `parts` for `page` written in. A marker on the page that no part writes is an
    error too: a number between markers that nothing checks would look generated and not be."""
    mine = [p for p in parts if p.page == page]
    for part in mine:
        text = (with_block(text, part.name, part.lines) if isinstance(part, Block)
                else with_figure(text, part.name, part.text))
    blocks = {p.name for p in mine if isinstance(p, Block)}
    figures = {p.name for p in mine if isinstance(p, Figure)}
    orphans = sorted({f"block {n}" for n in BLOCK_NAME.findall(text) if n not in blocks}
                     | {f"figure {m.group(1)}" for m in FIGURE.finditer(text) if m.group(1) not in figures})
    if orphans:
        raise ValueError(f"{page}: {', '.join(orphans)} marked but written by no generator")
    return text


def pages(parts: list[Block | Figure], root: Path = ROOT) -> dict[str, tuple[str, str]]:
    """{page: (its text now, its text regenerated)} for every page the parts write."""
    out = {}
    for page in sorted({p.page for p in parts}):
        now = (root / page).read_text()
        out[page] = (now, rendered(now, page, parts))
    return out


def stale(parts: list[Block | Figure], root: Path = ROOT) -> list[str]:
    """'page: block NAME' / 'page: figure NAME' for each part whose page does not read as generated."""
    out = []
    for page in sorted({p.page for p in parts}):
        text = (root / page).read_text()
        for part in (p for p in parts if p.page == page):
            kind = "block" if isinstance(part, Block) else "figure"
            one = (with_block(text, part.name, part.lines) if kind == "block"
                   else with_figure(text, part.name, part.text))
            if one != text:
                out.append(f"{page}: {kind} {part.name}")
    return out
