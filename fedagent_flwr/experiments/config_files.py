"""`python -m fedagent_flwr.experiments.config_files`: rewrite the files that list every run-config key from the
dataclasses in config/run_config.py, so they never drift: pyproject's [tool.flwr.app.config] (the defaults Flower reads,
as dotted keys the way FlowerTune's templates write them) and the key tables of docs/run-config.md, one for the
top-level keys, one per section and one of the renamed keys (config/renames.py). Run it after adding or changing a
key; the tests fail while either file is stale.
"""

from __future__ import annotations

from pathlib import Path

from fedagent_flwr.config import RENAMED, SECTIONS, RunConfig
from fedagent_flwr.simulation import toml_value

BEGIN = "<!-- key tables: written by python -m fedagent_flwr.experiments.config_files from config/run_config.py; edit there -->"
END = "<!-- end of the key tables -->"


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


def docs_tables() -> str:
    """A table of the top-level keys, one per section under a heading with its docstring, and the renamed keys; every
    row as many cells as its header."""
    keys = list(RunConfig.keys())
    out = _table("Top-level keys", TOP_DOC, [(key, f) for key, f, section in keys if section is None])
    for section in SECTIONS:
        heading = HEADINGS.get(section.NAME, section.NAME.capitalize())
        out += _table(f"{heading} keys (`{section.NAME}.*`)", section.__doc__,
                      [(key, f) for key, f, owner in keys if owner is section])
    out += ["### Renamed keys", "", "The flat names of the keys before they moved into sections (December 2026), and "
            "their new names. A run config that uses an old name is refused in one line that names the new key.", "",
            "| old name | new name |", "| --- | --- |"]
    out += [f"| `{old}` | `{new}` |" for old, new in RENAMED.items()]
    return "\n".join(out).rstrip("\n")


def pyproject_table() -> str:
    """[tool.flwr.app.config]'s body: the top-level keys, then each section's keys as dotted keys under a comment."""
    values = RunConfig().to_run_config()
    lines = [f"{key} = {toml_value(values[key])}" for key, _, section in RunConfig.keys() if section is None]
    for section in SECTIONS:
        lines += ["", f"# {HEADINGS.get(section.NAME, section.NAME.capitalize())} keys (docs/run-config.md)"]
        lines += [f"{key} = {toml_value(values[key])}" for key, _, owner in RunConfig.keys() if owner is section]
    return "\n".join(lines) + "\n"


def sync_files(root: Path) -> None:
    """Rewrite pyproject's [tool.flwr.app.config] and the key tables of docs/run-config.md."""
    pyproject = root / "pyproject.toml"
    head, sep, tail = pyproject.read_text().partition("[tool.flwr.app.config]\n")
    if not sep:
        raise ValueError(f"{pyproject} has no [tool.flwr.app.config] table")
    rest = tail.split("\n[", 1)  # the table ends where the next one starts
    pyproject.write_text(head + sep + pyproject_table() + ("\n[" + rest[1] if len(rest) > 1 else ""))

    doc = root / "docs" / "run-config.md"
    text = doc.read_text()
    before, found, after = text.partition(BEGIN + "\n")
    if not found:
        raise ValueError(f"{doc} has no line {BEGIN!r}")
    after = after.partition(END)[2]
    doc.write_text(before + BEGIN + "\n" + docs_tables() + "\n" + END + after)


if __name__ == "__main__":
    sync_files(Path(__file__).resolve().parents[2])
