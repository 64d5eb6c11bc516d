#!/usr/bin/env python
"""The memory a client's rank 0 adds to write its round's reply: built whole, then written, against streamed.

A client on N ranks sends the server rank 0's full weights. Built whole (every weight gathered into one record, then
written by safetensors, which makes the file's bytes in memory first), the reply held the model twice on rank 0 beside
what the round held; streamed (agent/fsdp/tensor_files.py: each weight gathered in turn and written as it comes), one
weight at a time. This loads a model sharded over N CPU ranks (gloo) and writes its reply both ways, alternating, each
rank's peak resident memory reset before each write (/proc/self/clear_refs) and read after it (VmHWM), less what it
held before: the two variants side by side in one run. Every rank gathers every weight either way; rank 0 keeps them.

    python benchmarks/reply_memory.py                                       # the SmolLM2 preset's model, 2 ranks
    python benchmarks/reply_memory.py --model tiny --repeats 2

With `--json` (one JSON line) under `python benchmarks/raw_output.py run OUT.json -- ...` the result is kept with the
machine, versions and commit it ran on (benchmarks/results/README.md).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

import numpy as np
import torch

from fedagent_flwr.agent.fsdp.launch import RankPool
from fedagent_flwr.agent.fsdp.ranks import Ranks
from fedagent_flwr.agent.fsdp.tensor_files import write_streamed
from fedagent_flwr.agent.models.pretrained import resolve_model
from fedagent_flwr.agent.models.sharded_load import load_sharded
from fedagent_flwr.agent.training.weights import model_to_arrays, model_weights
from strategies.transfer import array_view
from rank_rounds import status_mib  # benchmarks/ is the script's own folder

MIB = 1024**2
_MODEL: list[torch.nn.Module] = []  # in a rank's process: the model, loaded once


def write_whole(model: torch.nn.Module, path: str) -> None:
    """The reply as it was built before streaming: every weight gathered into a record, then safetensors' save_file."""
    from safetensors.numpy import save_file

    record = model_to_arrays(model)
    if Ranks.current().rank == 0:
        save_file({k: np.ascontiguousarray(array_view(record[k])) for k in record.keys()}, path)


def write_stream(model: torch.nn.Module, path: str) -> None:
    """The reply as it is built now: each weight gathered in turn, rank 0 writing it as it comes."""
    streamed = model_weights(model)
    if Ranks.current().rank == 0:
        write_streamed(path, streamed)
    else:
        streamed.drain()


def one_reply(rank: int, world: int, tensors: dict, source: str, variant: str, folder: str):
    """A target of the rank pool: the model of `source` loaded sharded (the first time), its reply written as `variant`
    says; every rank's peak above what it held before the write, in MiB, and the file's size."""
    if not _MODEL:
        torch.set_num_threads(1)
        _MODEL.append(load_sharded(resolve_model(source, "gridworld"), torch.device("cpu")))
    path = os.path.join(folder, f"reply-{variant}.safetensors")
    before = status_mib("self", "VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM starts again from what is resident now
    (write_whole if variant == "whole" else write_stream)(_MODEL[0], path)
    added = status_mib("self", "VmHWM") - before
    size = os.path.getsize(path) / MIB if rank == 0 else 0.0
    if rank == 0:
        os.remove(path)
    return {}, {"added_mib": Ranks(rank, world).gather({str(rank): added}), "file_mib": size}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="warm:smollm2-135m-instruct", help="a run-config model (default: the SmolLM2 preset's)")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3, help="writes per variant (alternating)")
    parser.add_argument("--json", action="store_true", help="one JSON line on stdout")
    args = parser.parse_args()
    variants = ("whole", "stream")
    runs: dict[str, list[dict]] = {v: [] for v in variants}
    with tempfile.TemporaryDirectory(prefix="fedagent-reply-") as folder, \
            RankPool(args.ranks, "gloo", mmap_threshold=1 << 16) as pool:  # freed blocks returned, as a rank's round can ask
        for repeat in range(args.repeats):
            for variant in variants if repeat % 2 == 0 else variants[::-1]:
                _, info = pool.run(one_reply, {}, args.model, variant, folder)
                runs[variant].append(info)
                print(f"repeat {repeat}, {variant}: rank 0 +{info['added_mib']['0']:.0f} MiB, rank 1 "
                      f"+{info['added_mib'].get('1', 0.0):.0f} MiB (reply file {info['file_mib']:.0f} MiB)", flush=True)
    summary = {v: {"rank0_added_mib": [r["added_mib"]["0"] for r in runs[v]],
                   "others_added_mib": [max([a for k, a in r["added_mib"].items() if k != "0"], default=0.0) for r in runs[v]],
                   "file_mib": runs[v][0]["file_mib"]} for v in variants}
    for v in variants:
        s = summary[v]
        print(f"{v}: rank 0 added {np.mean(s['rank0_added_mib']):.0f} MiB (the reply {s['file_mib']:.0f} MiB), the "
              f"other ranks {np.mean(s['others_added_mib']):.0f}", flush=True)
    if args.json:
        print(json.dumps({"settings": {"model": args.model, "ranks": args.ranks, "repeats": args.repeats}, "variants": summary}))


if __name__ == "__main__":
    main()
