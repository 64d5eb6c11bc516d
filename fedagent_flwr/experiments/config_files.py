"""`python -m fedagent_flwr.experiments.config_files`: rewrite the files that list every run-config key from the
dataclasses in config/run_config.py, so they never drift: pyproject's [tool.flwr.app.config] (the defaults Flower reads) and
the key tables of docs/run-config.md, one per section. Run it after adding or changing a key; the tests fail while
either file is stale.
"""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

from fedagent_flwr.config import SECTIONS, RunConfig
from fedagent_flwr.simulation import toml_value

BEGIN = "<!-- key tables: written by python -m fedagent_flwr.experiments.config_files from config/run_config.py; edit there -->"
END = "<!-- end of the key tables -->"


HEADINGS = {"grpo": "GRPO", "lora": "LoRA", "fedrl": "QAvg / PAvg", "fedse": "Fed-SE"}  # the rest: capitalized


def cell(text: str) -> str:
    """Markdown table cell text: a `|` inside a cell would end it, so it is escaped."""
    return str(text).replace("|", "\\|")


def section_title(section: type) -> str:
    """The section's name as the docs and run_simulation.py's --help groups show it: SpeedConfig -> speed."""
    return section.__name__.removesuffix("Config").removesuffix("Section").lower()


def docs_tables() -> str:
    """One table per section, under a heading with the section's docstring, every row as many cells as its header."""
    out = []
    for section in SECTIONS:
        out += [f"### {HEADINGS.get(section_title(section), section_title(section).capitalize())} keys", "", " ".join(section.__doc__.split()), "",
                "| key | default | allowed | meaning |", "| --- | --- | --- | --- |"]
        for f in fields(section):
            default = f.default if f.default != "" else '""'
            out.append(f"| `{f.name.replace('_', '-')}` | `{cell(default)}` | {cell(f.metadata['allowed'])} | "
                       f"{cell(f.metadata['doc'])} |")
        out.append("")
    return "\n".join(out).rstrip("\n")


def sync_files(root: Path) -> None:
    """Rewrite pyproject's [tool.flwr.app.config] and the key tables of docs/run-config.md."""
    pyproject = root / "pyproject.toml"
    head, sep, tail = pyproject.read_text().partition("[tool.flwr.app.config]\n")
    if not sep:
        raise ValueError(f"{pyproject} has no [tool.flwr.app.config] table")
    rest = tail.split("\n[", 1)  # the table ends where the next one starts
    body = "".join(f"{k} = {toml_value(v)}\n" for k, v in RunConfig().to_run_config().items())
    pyproject.write_text(head + sep + body + ("\n[" + rest[1] if len(rest) > 1 else ""))

    doc = root / "docs" / "run-config.md"
    text = doc.read_text()
    before, found, after = text.partition(BEGIN + "\n")
    if not found:
        raise ValueError(f"{doc} has no line {BEGIN!r}")
    after = after.partition(END)[2]
    doc.write_text(before + BEGIN + "\n" + docs_tables() + "\n" + END + after)


if __name__ == "__main__":
    sync_files(Path(__file__).resolve().parents[2])
