"""The GPU figures the docs quote, recomputed from the raw outputs committed under benchmarks/results/<date>-<card>/
(benchmarks/gpu_checks.sh's <stage>.json and <stage>.log, one folder per call), and written into the pages by
`python scripts/write_docs.py` (tests/records regenerates them):

- docs/gpu-measurements.md opens with a table per card that has raw outputs: each stage's JSON, what it measured, its
  key number, whether it passed, and the file;
- the page's H100 E section and docs/gpu.md quote figures of the H100 80GB HBM3 session of 2026-12-05."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from fedagent_flwr.experiments.doc_blocks import Block, Figure

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
H100_E = RESULTS / "2026-12-05-h100-80gb-hbm3"
MEASUREMENTS, GUIDE = "docs/gpu-measurements.md", "docs/gpu.md"
TABLE = "gpu-raw-outputs"
# what each script a stage runs measures (pytest stages name their test files instead)
MEASURES = {
    "step_kernels.py": "compiled against eager token steps",
    "decode_profile.py": "each decode engine's token step",
    "prefill_profile.py": "group-prefix prefill against whole prompts",
    "gpu_round.py": "a client epoch",
    "update_profile.py": "update and log-prob settings side by side",
}
PYTEST_COUNTS = re.compile(r"^((?:\d+ (?:passed|failed|skipped|errors?|xfailed|xpassed)(?:, )?)+).* in [\d.]+s", re.M)


def _json(path: Path) -> dict:
    return json.loads(path.read_text())


def gpu_outputs(results: Path = RESULTS) -> dict[Path, list[Path]]:
    """{session folder: its stages' JSON files, in the order they started} for every folder whose raw outputs ran on
    a GPU (the raw_output section's card counts one or more)."""
    found: dict[Path, list[tuple[str, Path]]] = {}
    for path in sorted(results.glob("*/**/*.json")):
        try:
            raw = _json(path).get("raw_output")
        except (json.JSONDecodeError, AttributeError):
            continue
        if raw and (raw.get("card") or {}).get("count"):
            session = results / path.relative_to(results).parts[0]
            found.setdefault(session, []).append((raw["started_utc"], path))
    return {s: [p for _, p in sorted(files)] for s, files in sorted(found.items())}


def _log(path: Path) -> str:
    """The stage's log beside its JSON (decode-compile.profile.json shares decode-compile.log)."""
    return (path.parent / f"{path.name.split('.')[0]}.log").read_text()


def _script(command: list[str]) -> str:
    if "pytest" in command:
        return "pytest"
    return next(Path(w).name for w in command if w.endswith(".py"))


def what(command: list[str]) -> str:
    script = _script(command)
    if script == "pytest":
        tests = [w for w in command if w.startswith("tests/")]
        names = [f"`{Path(w.split('::')[0]).name}`" + (" (one test)" if "::" in w else "") for w in tests]
        k = f" (`-k {command[command.index('-k') + 1]}`)" if "-k" in command else ""
        return "tests: " + ", ".join(names) + k
    shape = f", {command[command.index('--shape') + 1]} shape" if "--shape" in command else ""
    return f"{MEASURES.get(script, script)}{shape} (`{script}`)"


def _failure(log: str) -> str:
    """What stopped a stage, from the last error line of its log."""
    lines = [line for line in log.splitlines() if re.search(r"Error: |: error: ", line)]
    if not lines:
        return "no error line in the log"
    missing = re.search(r"No module named '[\w.]+'", lines[-1])
    return missing.group(0) if missing else re.split(r"Error: |: error: ", lines[-1], maxsplit=1)[1]


def key_number(path: Path) -> str:
    record = _json(path)
    raw = record["raw_output"]
    script = _script(raw["command"])
    if script == "pytest":
        counts = PYTEST_COUNTS.findall(_log(path))
        return counts[-1].rstrip(", ") if counts else "no summary in the log"
    if raw["rc"] != 0:
        return f"none: {_failure(_log(path))}"
    if script == "step_kernels.py":
        compiled, eager = (record["ms_mean_se"][k][0] for k in ("compile", "eager"))
        return f"{compiled:.3f} against {eager:.3f} ms a token step, {record['speedup_mean_se'][0]:.3f}x"
    if script == "decode_profile.py":
        ms = {e["engine"]: e["ms_per_token_step"] for e in record["engines"]}
        return (f"static engine {ms['static']:.2f} ms a token step (transformers loop {ms['hf']:.2f}, bandwidth bound "
                f"{record['bound']['bound_ms']:.2f})")
    if script == "prefill_profile.py":
        shared, whole = record["variants"]["shared prefixes"], record["variants"]["whole"]
        return f"{shared['ms']:.1f} against {whole['ms']:.1f} ms, {record['speedup']:.2f}x"
    return "see the file"


def table(session: Path, files: list[Path]) -> list[str]:
    raw = _json(files[0])["raw_output"]
    card, where = raw["card"], session.relative_to(ROOT).as_posix()
    calls = sorted({p.parent.name for p in files if p.parent != session})
    lines = [f"**{card['name']}, {session.name[:10]}** ({len(calls)} calls; raw outputs in `{where}/`, the calls "
             f"as made in its commands.txt):", "",
             "| call | stage | what it measured | key number | result | raw output |",
             "| --- | --- | --- | --- | --- | --- |"]
    for path in files:
        r = _json(path)["raw_output"]
        name = path.relative_to(session).as_posix()
        result = "passed" if r["rc"] == 0 else f"failed (rc {r['rc']})"
        call = path.parent.name if path.parent != session else ""
        key = key_number(path).replace("|", "/")
        link = f"[{name}](../{where}/{name})"
        lines.append(f"| {call} | {r['stage']} | {what(r['command'])} | {key} | {result} | {link} |")
    return lines


def raw_output_tables() -> Block:
    lines: list[str] = []
    for session, files in gpu_outputs().items():
        lines += ([""] if lines else []) + table(session, files)
    return Block(MEASUREMENTS, TABLE, tuple(lines))


def _record(name: str) -> dict:
    return _json(H100_E / name)


def h100_e() -> list[Figure]:
    """The figures of gpu-measurements.md's section H100 E and the ones docs/gpu.md quotes from it."""
    names = ("decode-compile", "decode-compile.profile", "prefill")
    steps, profile, prefill = (_record(f"call-2/{n}.json") for n in names)
    raw = steps["raw_output"]
    compiled, eager = (steps["ms_mean_se"][k][0] for k in ("compile", "eager"))
    ms = {e["engine"]: e["ms_per_token_step"] for e in profile["engines"]}
    shared, whole = prefill["variants"]["shared prefixes"], prefill["variants"]["whole"]
    gap = float(re.search(r"AssertionError: ([\d.]+)", (H100_E / "call-1" / "tests.log").read_text()).group(1))
    page = lambda name, text: Figure(MEASUREMENTS, f"h100-e.{name}", text)  # noqa: E731
    return [
        page("driver", raw["card"]["driver"]),
        page("cuda", raw["software"]["cuda"]),
        page("torch", raw["software"]["torch"]),
        page("transformers", raw["software"]["transformers"]),
        page("compiled-step-gap", f"{gap:.3f}"),
        page("steps.rows", str(steps["rows"])),
        page("steps.prompt-tokens", str(steps["prompt_tokens"])),
        page("steps.runs", str(steps["runs"])),
        page("steps.compiled-ms", f"{compiled:.3f}"),
        page("steps.eager-ms", f"{eager:.3f}"),
        page("steps.speedup", f"{steps['speedup_mean_se'][0]:.3f}"),
        page("steps.p", f"{steps['paired_t_p']:.1e}"),
        page("steps.first-run-compiled-s", f"{steps['first_run_s']['compile']:.2f}"),
        page("steps.first-run-eager-s", f"{steps['first_run_s']['eager']:.2f}"),
        *(page(f"engines.{e}-ms", f"{ms[e]:.2f}") for e in ("hf", "static", "static-compile", "static-eager")),
        page("engines.bound-ms", f"{profile['bound']['bound_ms']:.2f}"),
        page("prefill.tasks", str(prefill["tasks"])),
        page("prefill.group", str(prefill["group"])),
        page("prefill.prompt-tokens", f"{prefill['prompt_tokens']:,}"),
        page("prefill.shared-ms", f"{shared['ms']:.1f}"),
        page("prefill.shared-positions", f"{shared['positions']:,}"),
        page("prefill.whole-ms", f"{whole['ms']:.1f}"),
        page("prefill.whole-positions", f"{whole['positions']:,}"),
        page("prefill.speedup", f"{prefill['speedup']:.2f}"),
        page("prefill.logprob-gap", f"{prefill['logprob_gap']:.3f}"),
        # docs/gpu.md: the card's memory, and the speed-key table's token steps
        Figure(GUIDE, "h100-e.card-gib", f"{raw['card']['memory_mib'] / 1024:.1f}"),
        Figure(GUIDE, "h100-e.compiled-ms", f"{compiled:.3f}"),
        Figure(GUIDE, "h100-e.eager-ms", f"{eager:.3f}"),
    ]


def doc_parts() -> list[Block | Figure]:
    return [raw_output_tables(), *h100_e()]


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    for part in doc_parts():  # written into the pages by scripts/write_docs.py
        print(f"{part.page} {part.name}:", "\n".join(part.lines) if isinstance(part, Block) else part.text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
