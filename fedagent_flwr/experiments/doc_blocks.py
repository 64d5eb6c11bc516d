"""Generated blocks in the docs: the lines between `<!-- begin generated: NAME -->` and `<!-- end generated: NAME -->`
are written by a command from run records, and a test regenerates them and compares (experiments/claims.py,
experiments/matched_table1.py)."""

from __future__ import annotations


def with_block(text: str, name: str, lines: list[str]) -> str:
    """`text` with its generated block `name` holding `lines`; ValueError unless it has one pair of markers."""
    begin, end = f"<!-- begin generated: {name} -->", f"<!-- end generated: {name} -->"
    if text.count(begin) != 1 or text.count(end) != 1:
        raise ValueError(f"expected one '{begin}' and one '{end}'")
    head, rest = text.split(begin)
    return head + begin + "\n" + "\n".join(lines) + "\n" + end + rest.split(end)[1]
