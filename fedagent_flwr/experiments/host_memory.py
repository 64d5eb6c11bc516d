"""docs/multi-gpu.md's measured host memory of a client on ranks, recomputed from benchmarks/rank_memory.py's raw
outputs and written between the page's markers by `python scripts/write_docs.py` (tests/records regenerates it)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from fedagent_flwr.experiments.doc_blocks import Block

ROOT = Path(__file__).resolve().parents[2]
RECORDS = ROOT / "benchmarks" / "results" / "2026-12-07-cpu" / "ranks-reply"
ROUND, REPLY = "rank_memory.smollm2-full.json", "reply_memory.smollm2.json"
BLOCK = "ranks-host-memory"


def _record(name: str) -> dict:
    return json.loads((RECORDS / name).read_text())


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def lines() -> list[str]:
    round_, reply = _record(ROUND), _record(REPLY)
    where = f"benchmarks/results/{RECORDS.relative_to(ROOT / 'benchmarks' / 'results')}/"
    s = round_["raw_output"]["settings"]["arguments"]
    whole, stream = reply["variants"]["whole"], reply["variants"]["stream"]
    repeats = reply["raw_output"]["settings"]["arguments"]["repeats"]
    return [
        f"Measured on 2 CPU ranks (AMD EPYC, 2 cores; raw outputs, commits and commands in {where}). One round of "
        f"`python benchmarks/rank_memory.py --run-config configs/smollm2-fedagent-cpu.toml --set grpo.finetuning=full "
        f"--set grpo.tasks-per-epoch=2 --set engine.ranks-return-memory=true` ({s['model']}, a {s['finetuning']} "
        f"fine-tune in {s['precision']} with KL to the base):",
        f"- the node, every rank's round peak and the client process's, above what each held before the model: "
        f"{round_['node_round_mib']:.0f} MiB against {round_['node_plan_mib']:.0f} planned ({round_['node_over_plan']:.2f}x);",
        f"- the client process, above the sent weights it holds: {round_['client_round_mib']:.0f} MiB (the reply's file "
        f"mapped and its record) against {round_['client_plan_mib']:.0f} planned ({round_['client_over_plan']:.2f}x).",
        f"Writing the reply alone (`python benchmarks/reply_memory.py`, the same model sharded, {repeats} writes of each "
        f"kind, alternating): rank 0 added {_mean(stream['rank0_added_mib']):.0f} MiB streaming a reply of "
        f"{stream['file_mib']:.0f} MiB, against {_mean(whole['rank0_added_mib']):.0f} MiB building it whole and "
        f"writing it with safetensors, as before; the other rank, which gathers every weight too and keeps none, "
        f"{_mean(stream['others_added_mib']):.0f} and {_mean(whole['others_added_mib']):.0f} MiB.",
    ]


def doc_parts() -> list[Block]:
    return [Block("docs/multi-gpu.md", BLOCK, tuple(lines()))]


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    print("\n".join(lines()))  # written into the page by scripts/write_docs.py
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
