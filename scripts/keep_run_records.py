"""Copy a run folder's records (not its weights) into the repository, so that its numbers can be tested again later:
`python scripts/keep_run_records.py RUN_DIR DEST --relative-to RUNS_ROOT`.

Run folders live on the machine that ran them, and machines are not kept: the seed-0 and seed-1 runs of issue 55 were
gone a session later, so their paired tests could not be repeated. What `python -m
fedagent_flwr.experiments.paired_rounds` reads is small (every evaluation's episodes, the metric rows, the config):
this copies config.json, metrics.jsonl, clients.jsonl (where written), summary.json, provenance.json (the
command, commit and processor, with the run's wall time added) and episodes/round-*.json / .txt, and writes every path under
RUNS_ROOT as `<runs>/...` and the model cache's as `<model-cache>/...`, so no machine's scratch path lands in the repository. It refuses a destination that
exists (nothing is overwritten) and a record that would still name an absolute path.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
from pathlib import Path

from fedagent_flwr.agent.models.model_cache import default_cache_root

FILES = ("config.json", "metrics.jsonl", "clients.jsonl", "summary.json")  # clients.jsonl where the run wrote one
PROVENANCE = "provenance.json"  # runs/provenance.py; runs before 2026-12-08 have none (their commands.txt says it)
ABSOLUTE = re.compile(r'"(/[^"]*)"')  # a JSON string value that is an absolute path
LEFT_PATH = re.compile(r"(?<![\w<>])/[^\s'\"]+")  # an absolute path inside a command line


def keep(run_dir: Path, dest: Path, root: Path) -> list[Path]:
    if not (run_dir / "metrics.jsonl").is_file():
        raise ValueError(f"{run_dir}: not a run folder (no metrics.jsonl)")
    if dest.exists():
        raise ValueError(f"{dest} exists; records are never overwritten: choose another name")
    sources = [run_dir / f for f in FILES + (PROVENANCE,) if (run_dir / f).is_file()]
    sources += sorted((run_dir / "episodes").glob("round-*.json")) + sorted((run_dir / "episodes").glob("round-*.txt"))
    texts = {}
    for src in sources:
        text = src.read_text().replace(str(root.resolve()), "<runs>").replace(str(root), "<runs>")
        text = text.replace(str(default_cache_root()), "<model-cache>")  # config.json's model-source: the warm model's folder
        left = ABSOLUTE.findall(text) if src.suffix != ".txt" else []
        if left:
            raise ValueError(f"{src}: still names the absolute path {left[0]!r}; give a --relative-to that holds it")
        if src.name == PROVENANCE:  # with the wall time, so the record says how long the run took on its machine
            record = json.loads(text)
            for start in [record, *record.get("resumed", [])]:  # the app's folder, the interpreter: <path>/<name>
                if start.get("command"):
                    start["command"] = LEFT_PATH.sub(lambda m: f"<path>/{Path(m.group(0)).name}", start["command"])
            summary = run_dir / "summary.json"
            record["wall_s"] = json.loads(summary.read_text()).get("seconds") if summary.is_file() else None
            text = json.dumps(record, indent=2) + "\n"
        texts[src.relative_to(run_dir)] = text
    tmp = dest.with_name(dest.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    for rel, text in texts.items():
        (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp / rel).write_text(text)
    tmp.rename(dest)  # all files or none
    return [dest / rel for rel in texts]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("dest", type=Path, help="a new folder in the repository, e.g. benchmarks/results/<date>-<processor>/runs/<name>")
    parser.add_argument("--relative-to", type=Path, required=True,
                        help="the folder the runs were written under; its paths become <runs>/...")
    args = parser.parse_args(argv)
    try:
        kept = keep(args.run_dir, args.dest, args.relative_to)
    except ValueError as err:
        print(f"keep_run_records.py: {err}", file=sys.stderr)
        return 2
    print(f"{len(kept)} files in {args.dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
