"""The memory plan's figures the docs quote: each is what `python -m fedagent_flwr.experiments.memory_plan` prints for
the command the page shows beside it (a computed plan, not a measurement), and the command is written in with it, so
that the two cannot drift apart (a command in prose is a figure with its backticks: a comment inside a code span would
show). `python scripts/write_docs.py` writes them into docs/gpu.md, docs/presets.md and docs/multi-gpu.md;
tests/records regenerates them."""

from __future__ import annotations

import argparse
import contextlib
import io
import math
import re
import shlex
from pathlib import Path

from fedagent_flwr.experiments.doc_blocks import Block, Figure
from fedagent_flwr.experiments.memory_plan import main as memory_plan

ROOT = Path(__file__).resolve().parents[2]
GPU, PRESETS, RANKS = "docs/gpu.md", "docs/presets.md", "docs/multi-gpu.md"
PROGRAM = "python -m fedagent_flwr.experiments.memory_plan"

# docs/gpu.md's command for the guide's settings, as its code block shows it
GPU_COMMAND = (
    f"{PROGRAM} --shape qwen2.5-1.5b --context-tokens 512 \\",
    "  --set env=webshop --set grpo.tasks-per-epoch=16 --set grpo.num-generations=8"
    " --set rollout.generation-batch-size=128 --set grpo.mini-batch-size=64 \\",
    "  --set grpo.ppo-micro-batch-size-per-gpu=16 --set grpo.log-prob-micro-batch-size-per-gpu=64"
    " --set grpo.group-by-length=true \\",
    "  --set engine.param-dtype=bf16 --set engine.gradient-checkpointing=false \\",
    "  --set engine.logprob-chunk-tokens=1024 --set engine.client-memory-gb=64",
)
# docs/presets.md's pair for the paper preset, line breaks where the paragraph has them
PRESET_COMMAND = (f"{PROGRAM} --shape qwen2.5-1.5b --context-tokens\n2048 "
                  "--run-config configs/fedagent-paper.toml")
PRESET_WITHOUT = ("--set engine.gradient-checkpointing=false --set\nengine.logprob-chunk-tokens=0 "
                  "--set grpo.group-by-length=false")
# docs/multi-gpu.md's command for a 7B full fine-tune on 4 ranks; the page then swaps rollout.name=hf for static
RANK_COMMAND = (f"{PROGRAM}\n--shape qwen2.5-7b --ranks 4 --set engine.gradient-checkpointing=true "
                "--set engine.param-dtype=fp32 --set engine.logprob-chunk-tokens=1024\n"
                "--set grpo.ppo-micro-batch-size-per-gpu=1 --set rollout.generation-batch-size=16 "
                "--set rollout.name=hf")
ROW = re.compile(r"^  (.+?)\s+(-?[\d.]+) GiB$")


def arguments(command: str) -> list[str]:
    """The command's arguments after the program, as a shell splits them (a backslash-newline joins lines), a run
    config's path taken from the repository's root wherever this runs."""
    words = shlex.split(command.replace("\\\n", " "))
    if " ".join(words[:3]) != PROGRAM:
        raise ValueError(f"not a memory plan command: {command!r}")
    return [str(ROOT / w) if i > 0 and words[i - 1] == "--run-config" else w for i, w in enumerate(words)][3:]


def tables(argv: list[str]) -> list[tuple[str, dict[str, str]]]:
    """The tables the memory plan prints for `argv`, in order: (who, {row as printed: GiB as printed})."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        if memory_plan(argv) != 0:
            raise RuntimeError(f"memory_plan {argv} failed")
    found: list[tuple[str, dict[str, str]]] = []
    for line in out.getvalue().splitlines():
        if line.endswith(":") and not line.startswith(" "):
            found.append((line[:-1], {}))
        elif found and (m := ROW.match(line)):
            found[-1][1][m.group(1)] = m.group(2)
    return found


def table(argv: list[str], who: str) -> dict[str, str]:
    """The rows of the table whose heading starts with `who` ("each client", "the server", "each of a client's")."""
    return next(rows for heading, rows in tables(argv) if heading.startswith(who))


def with_rows(argv: list[str], rows: int) -> list[str]:
    """`argv` with its update passes of `rows` rows."""
    key = "grpo.ppo-micro-batch-size-per-gpu="
    return [f"{key}{rows}" if a.startswith(key) else a for a in argv]


def with_context(argv: list[str], tokens: int) -> list[str]:
    i = argv.index("--context-tokens")
    return argv[:i + 1] + [str(tokens)] + argv[i + 2:]


def gpu_parts() -> list[Block | Figure]:
    argv = arguments("\n".join(GPU_COMMAND))
    server, client = table(argv, "the server")["total"], table(argv, "each client")["total"]
    rows32 = {n: table(with_context(with_rows(argv, 32), n), "each client")["total"] for n in (340, 476, 512)}
    return [
        Block(GPU, "memory-plan-command", ("```bash", *GPU_COMMAND, "```")),
        Figure(GPU, "plan.server", server),
        Figure(GPU, "plan.server-rounded-up", str(math.ceil(float(server)))),
        Figure(GPU, "plan.client", client),
        *(Figure(GPU, f"plan.client-32-rows-{n}", total) for n, total in rows32.items()),
        # the same two, quoted again where the guide's command sets 16-row passes
        Figure(GPU, "settings.plan-32-rows-512", rows32[512]),
        Figure(GPU, "settings.plan-16-rows-512", client),
    ]


def preset_parts() -> list[Figure]:
    with_four = arguments(PRESET_COMMAND)
    without = with_four + shlex.split(PRESET_WITHOUT)
    return [
        Figure(PRESETS, "paper-preset.plan-command", f"`{PRESET_COMMAND}`"),
        Figure(PRESETS, "paper-preset.plan-without-command", f"`{PRESET_WITHOUT}`"),
        Figure(PRESETS, "paper-preset.client-plan", table(with_four, "each client")["total"]),
        Figure(PRESETS, "paper-preset.client-plan-without", table(without, "each client")["total"]),
    ]


def rank_parts() -> list[Figure]:
    hf = arguments(RANK_COMMAND)
    static = [a.replace("rollout.name=hf", "rollout.name=static") for a in hf]
    if static == hf:
        raise ValueError("docs/multi-gpu.md's rank command no longer sets rollout.name=hf")
    rank, static_rank = table(hf, "each of a client's"), table(static, "each of a client's")
    return [
        Figure(RANKS, "rank-plan.command", f"`{RANK_COMMAND}`"),
        Figure(RANKS, "rank-plan.decode-peak", rank["peak while decoding"]),
        Figure(RANKS, "rank-plan.update-peak", rank["peak while updating"]),
        Figure(RANKS, "rank-plan.static-decode-peak", static_rank["peak while decoding"]),
        Figure(RANKS, "rank-plan.static-unit-gathered",
               static_rank["a unit gathered to copy for the decoder [decode]"]),
        Figure(RANKS, "rank-plan.static-copy", static_rank["static decoder's weight copy [decode]"]),
    ]


def doc_parts() -> list[Block | Figure]:
    return gpu_parts() + preset_parts() + rank_parts()


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    for part in doc_parts():  # written into the pages by scripts/write_docs.py
        text = "\n".join(part.lines) if isinstance(part, Block) else part.text
        print(f"{part.page} {part.name}: {text}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
