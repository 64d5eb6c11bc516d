"""`python -m fedagent_flwr.experiments.config_files`: rewrite the files that list every run-config key from the
dataclasses in config/run_config.py, so they never drift: pyproject's [tool.flwr.app.config] (the defaults Flower reads,
as dotted keys the way FlowerTune's templates write them), the key tables of docs/run-config.md (one for the top-level
keys, one per section) and the table of docs/renamed-keys.md (config/renames.py). Run it after adding or changing a
key; the tests fail while either file is stale (the docs' tables: tests/records, which scripts/write_docs.py also
writes).
"""

from __future__ import annotations

from pathlib import Path

from fedagent_flwr.config import RENAMED, SECTIONS, RunConfig
from fedagent_flwr.experiments.doc_blocks import Block, with_block
from fedagent_flwr.simulation import toml_value



HEADINGS = {"grpo": "GRPO", "lora": "LoRA", "fedrl": "QAvg / PAvg", "fedse": "Fed-SE"}  # the rest: capitalized
TOP_DOC = "The everyday keys, at the top level of the run config."


def cell(text: str) -> str:
    """Markdown table cell text: a `|` inside a cell would end it, so it is escaped."""
    return str(text).replace("|", "\\|")


def _table(heading: str, doc: str, rows: list) -> list[str]:
    out = [f"### {heading}", "", " ".join(doc.split()), "", "| key | default | allowed | meaning |", "| --- | --- | --- | --- |"]
    for key, f in rows:
        default = f.default if f.default != "" else '""'
        out.append(f"| `{key}` | `{cell(default)}` | {cell(f.metadata['allowed'])} | {cell(f.metadata['doc'])} |")
    return out + [""]


def key_tables() -> list[str]:
    """A table of the top-level keys, then one per section under a heading with its docstring; every row as many cells
    as its header."""
    keys = list(RunConfig.keys())
    out = _table("Top-level keys", TOP_DOC, [(key, f) for key, f, section in keys if section is None])
    for section in SECTIONS:
        heading = HEADINGS.get(section.NAME, section.NAME.capitalize())
        out += _table(f"{heading} keys (`{section.NAME}.*`)", section.__doc__,
                      [(key, f) for key, f, owner in keys if owner is section])
    return out[:-1]


def renamed_table() -> list[str]:
    return ["| old name | new name |", "| --- | --- |"] + [f"| `{old}` | `{new}` |" for old, new in RENAMED.items()]


def doc_parts() -> list[Block]:
    """The key tables of docs/run-config.md and the renamed keys of docs/renamed-keys.md (scripts/write_docs.py)."""
    return [Block("docs/run-config.md", "keys", tuple(key_tables())),
            Block("docs/renamed-keys.md", "renamed-keys", tuple(renamed_table()))]


def pyproject_table() -> str:
    """[tool.flwr.app.config]'s body: the top-level keys, then each section's keys as dotted keys under a comment."""
    values = RunConfig().to_run_config()
    lines = [f"{key} = {toml_value(values[key])}" for key, _, section in RunConfig.keys() if section is None]
    for section in SECTIONS:
        lines += ["", f"# {HEADINGS.get(section.NAME, section.NAME.capitalize())} keys (docs/run-config.md)"]
        lines += [f"{key} = {toml_value(values[key])}" for key, _, owner in RunConfig.keys() if owner is section]
    return "\n".join(lines) + "\n"


def sync_files(root: Path) -> None:
    """Rewrite pyproject's [tool.flwr.app.config] and the key tables of the docs."""
    pyproject = root / "pyproject.toml"
    head, sep, tail = pyproject.read_text().partition("[tool.flwr.app.config]\n")
    if not sep:
        raise ValueError(f"{pyproject} has no [tool.flwr.app.config] table")
    rest = tail.split("\n[", 1)  # the table ends where the next one starts
    pyproject.write_text(head + sep + pyproject_table() + ("\n[" + rest[1] if len(rest) > 1 else ""))
    for part in doc_parts():
        page = root / part.page
        page.write_text(with_block(page.read_text(), part.name, part.lines))


if __name__ == "__main__":
    sync_files(Path(__file__).resolve().parents[2])
