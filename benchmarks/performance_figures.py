"""docs/performance.md and its lab notes (docs/notes/performance-cpu.md): every table and every measured figure they
quote, recomputed from the raw outputs and run records in benchmarks/results/ and written into the pages by
`python scripts/write_docs.py` (tests/records regenerates them and compares).

The pages' roofline tables are `cpu_roofline.py --table` of the raw outputs they name; the seed tables compare a preset
with a lever run by run (the run lists below name their records); the figures in the prose are each one computation
of the records, named by section."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import numpy as np

import cpu_roofline as roofline
from fedagent_flwr.experiments.doc_blocks import Block, Figure

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
GUIDE = "docs/performance.md"
NOTES = "docs/notes/performance-cpu.md"

# the roofline raw outputs the notes quote as tables, in the notes' order
ROOFLINES = ("2026-12-03-cpu/cpu_roofline.json", "2026-12-03-cpu/cpu_roofline.fp32.json",
             "2026-12-04-cpu/cpu_roofline.json", "2026-12-04-cpu/cpu_roofline.fp32.json",
             "2026-12-04-cpu/cpu_roofline.after.json", "2026-12-05-cpu/cpu_roofline.amd.json",
             "2026-12-05-cpu/cpu_roofline.fedse-amd.json", "2026-12-05-cpu/cpu_roofline.fedse-bf16-mixed-amd.json",
             "2026-12-06-cpu/cpu_roofline.fedse-head-amd.json",
             "2026-12-06-cpu/cpu_roofline.fedse-head-bf16-mixed-amd.json",
             "2026-12-06-cpu/cpu_roofline.fedse-bf16-base-amd.json")

SEED_RUNS = {  # issue 69: the preset against it with compiled layers, seed by seed (commands.txt of 2026-12-05)
    "preset": ["2026-12-04-cpu/runs/fedagent-preset-s0-amx", "2026-12-05-cpu/runs/fedagent-preset-s1-amx",
               "2026-12-05-cpu/runs/fedagent-preset-s2-amd"],
    "compiled": ["2026-12-05-cpu/runs/fedagent-compile-s0-amx", "2026-12-05-cpu/runs/fedagent-compile-s1-amx",
                 "2026-12-05-cpu/runs/fedagent-compile-s2-amd"],
}
FEDSE_PRECISION_RUNS = {  # issue 69: the Fed-SE preset in fp32 against it under bf16-mixed, AMD EPYC, seeds 0-2
    "fp32": ["2026-12-06-cpu/runs/fedse-preset-s0-amd", "2026-12-05-cpu/runs/fedse-preset-s1-amd",
             "2026-12-05-cpu/runs/fedse-preset-s2-amd"],
    "bf16-mixed": ["2026-12-06-cpu/runs/fedse-bf16-mixed-s0-amd", "2026-12-06-cpu/runs/fedse-bf16-mixed-s1-amd",
                   "2026-12-06-cpu/runs/fedse-bf16-mixed-s2-amd"],
}
FEDSE_BASE_RUNS = {  # issue 69: the Fed-SE preset under bf16-mixed against it under bf16-base, AMD EPYC, seeds 0-2
    "bf16-mixed": [f"2026-12-06-cpu/runs/fedse-bf16-mixed-s{s}-amd" for s in range(3)],
    "bf16-base": [f"2026-12-06-cpu/runs/fedse-bf16-base-s{s}-amd" for s in range(3)],
}
FEDSE_EAGER_RUNS = {  # issue 69: the Fed-SE preset (bf16-base, SDPA) against it with training-attention=eager, AMD EPYC
    "sdpa": [f"2026-12-06-cpu/runs/fedse-bf16-base-s{s}-amd" for s in range(3)],
    "eager": [f"2026-12-06-cpu/runs/fedse-eager-s{s}-amd" for s in range(3)],
}
FEDSE_SAMPLER_RUNS = {  # issue 69: the Fed-SE preset (torch.multinomial) against it with token-sampler=inverse-cdf, AMD
    "multinomial": [f"2026-12-06-cpu/runs/fedse-eager-s{s}-amd" for s in range(3)],
    "inverse-cdf": [f"2026-12-06-cpu/runs/fedse-icdf-s{s}-amd" for s in range(3)],
}
FEDSE_SAMPLER_MORE = {  # issue 69: does seeds 0-2's higher last evaluation hold? Seeds 3-4 with each sampler, AMD EPYC
    "multinomial": [f"2026-12-06-cpu/runs/fedse-eager-s{s}-amd" for s in (3, 4)],
    "inverse-cdf": [f"2026-12-06-cpu/runs/fedse-icdf-s{s}-amd" for s in (3, 4)],
}
SEED_TABLES = {"SEED_RUNS": (SEED_RUNS, None), "FEDSE_PRECISION_RUNS": (FEDSE_PRECISION_RUNS, None),
               "FEDSE_BASE_RUNS": (FEDSE_BASE_RUNS, None), "FEDSE_EAGER_RUNS": (FEDSE_EAGER_RUNS, None),
               "FEDSE_SAMPLER_RUNS": (FEDSE_SAMPLER_RUNS, None), "FEDSE_SAMPLER_MORE": (FEDSE_SAMPLER_MORE, [3, 4])}
MACHINES = {"amx": "Intel Xeon with AMX", "amd": "AMD EPYC"}  # a run name's last part: the machine it ran on

DECODE_GROUPS = {"matrix products": "aten::mm", "attention kernel": "aten::_scaled_dot_product_flash_attention_for_cpu",
                 "the sampler's exponential draws": "aten::exponential_", "copies (casts, KV growth)": "aten::copy_"}
PRESET_DECODE_GROUPS = {"matrix products": "aten::mm",
                        "attention kernel": "aten::_scaled_dot_product_flash_attention_for_cpu",
                        "the sampler's exponential draws": "aten::exponential_", "KV growth": "aten::cat"}
WHOLE_SEQUENCES = ("rollout prefill", "reference log-probs", "update forward", "update backward", "evaluation prefill")
DECODES = ("rollout decode", "evaluation decode")


# ------------------------------------------------------------------ records


@cache
def record(path: str) -> dict:
    """A raw output of benchmarks/results/, by its path there."""
    return json.loads((RESULTS / path).read_text())


def metrics(run: str | Path) -> list[dict]:
    """A kept run's metrics.jsonl rows."""
    return [json.loads(line) for line in (RESULTS / run / "metrics.jsonl").read_text().splitlines()]


def machine(run: str) -> str:
    return MACHINES[str(run).rsplit("-", 1)[1]]


def run_shares(run: str | Path) -> dict[str, float]:
    """A run's minutes and where they went: its evaluations, and its clients' rounds as the 2 cores ran them (a client
    per core, so a round's replies / 2 clients one after another on each; the metrics give the clients' mean), split
    into rollouts and updates where the records have the rollouts' time; the rest being start-up, aggregation and a
    core waiting for the other. (The replies, not summary.json: a Fed-SE summary of before 2026-12-05 named
    clients-per-round's 2, a key Fed-SE does not use.)"""
    run = RESULTS / run
    total = json.loads((run / "summary.json").read_text())["seconds"]
    rows = metrics(run)
    trained = [r for r in rows if "train/seconds" in r]
    waves = trained[0]["train/replies"] / 2
    shares = {"evaluation": sum(r.get("eval/seconds", 0.0) for r in rows),
              "clients": waves * sum(r["train/seconds"] for r in trained)}
    if all("train/rollout_seconds" in r for r in trained):
        shares["rollout"] = waves * sum(r["train/rollout_seconds"] for r in trained)
        shares["update"] = shares["clients"] - shares["rollout"]
    shares["rest"] = total - shares["evaluation"] - shares["clients"]
    return {"minutes": total / 60, "waves": waves} | {k: v / total for k, v in shares.items()}


def seed_table(seed_runs: dict[str, list[str]], seeds: list[int] | None = None) -> tuple[list[str], dict]:
    """A table of a preset (the first entry of `seed_runs`) against it with a lever (the second), seed by seed, from the
    kept records: each run's minutes and where they went, its held-out success (first -> last evaluation, the gain in
    standard errors paired over rooms), and the lever's last evaluation minus the preset's, room by room; over seeds,
    the minutes' ratio per machine and the difference in the last evaluation (paired t-test over seeds). `seeds`: the
    seeds the runs are, in order (0, 1, ... unless given)."""
    from fedagent_flwr.experiments.paired_rounds import compare, compare_runs, evaluation_rounds
    from fedagent_flwr.experiments.seed_statistics import paired_difference, stats

    (base, base_runs), (lever, _) = seed_runs.items()
    runs = {k: [RESULTS / r for r in v] for k, v in seed_runs.items()}
    seeds = seeds or list(range(len(base_runs)))
    lines = ["| seed | machine | run | minutes | evaluations | rollouts | updates | rest | held-out success | "
             f"{lever} - {base}, last evaluation |", "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    last, minutes, each = {k: [] for k in runs}, {k: [] for k in runs}, []
    for seed, p, c in zip(seeds, runs[base], runs[lever]):
        against = compare_runs(c, p, evaluation_rounds(c)[-1], evaluation_rounds(p)[-1])
        each.append(against)
        for k, run in ((base, p), (lever, c)):
            shares, marks = run_shares(run), evaluation_rounds(run)
            gain = compare(run, marks[-1], marks[0])
            last[k].append(gain["later_success"])
            minutes[k].append(shares["minutes"])
            cells = [str(seed), machine(run.name), k, f"{shares['minutes']:.1f}",
                     *(f"{100 * shares[part]:.0f} %" for part in ("evaluation", "rollout", "update", "rest")),
                     f"{gain['earlier_success']:.3f} -> {gain['later_success']:.3f} "
                     f"({gain['mean'] / gain['se']:.1f} SE)",
                     f"{against['mean']:+.3f} +- {against['se']:.3f} (p {against['p']:.2g})" if k == lever else ""]
            lines.append("| " + " | ".join(cells) + " |")
    # the minutes' ratio per machine: the same lever paid on one processor and not on the other
    ratios = {}
    for run, a, b in zip(base_runs, minutes[base], minutes[lever]):
        ratios.setdefault(machine(run), []).append(a / b)
    figures = {"ratio": {m: stats(r) if len(r) > 1 else {"mean": r[0], "se": None, "n": 1} for m, r in ratios.items()},
               "difference": paired_difference(dict(enumerate(last[lever])), dict(enumerate(last[base]))),
               "seeds": len(last[base]), "each": each, "minutes": minutes}
    return lines, figures


def decode_step_table(folder: Path = RESULTS / "2026-12-06-cpu") -> list[str]:
    """The decode-step table: each engine's ms a token step and its operators' shares of the profiled self time, from
    decode_profile's raw outputs at 15 and 34 rows under bf16-mixed."""
    lines = ["| rows | engine | ms a token step | " + " | ".join(DECODE_GROUPS) + " |",
             "|---:|---|---:|" + "---:|" * len(DECODE_GROUPS)]
    for rows in (15, 34):
        report = json.loads((folder / f"decode_profile.fedse-bf16-mixed-{rows}-amd.json").read_text())
        for e in report["engines"]:
            total = sum(v["self_cpu_us"] for v in e["ops"].values())
            shares = [f"{100 * e['ops'][op]['self_cpu_us'] / total:.0f} %" for op in DECODE_GROUPS.values()]
            lines.append(f"| {rows} | {e['engine']} | {e['ms_per_token_step']:.1f} | " + " | ".join(shares) + " |")
    return lines


def preset_decode_steps() -> tuple[list[str], dict[int, dict[str, float]], list[float]]:
    """The preset's decode under bf16-base: the table (hf's step and its operators' shares, the static engine's step),
    each row count's shares and the static engine's speed-ups."""
    lines = ["| rows | hf: ms a token step | matrix products | attention kernel | the sampler's exponential draws | "
             "KV growth (`cat`) | static: ms a token step |", "|---:|---:|---:|---:|---:|---:|---:|"]
    shares, speedups = {}, []
    for rows in (15, 34):
        hf, static = record(f"2026-12-06-cpu/decode_profile.fedse-bf16-base-{rows}-amd.json")["engines"]
        total = sum(v["self_cpu_us"] for v in hf["ops"].values())
        shares[rows] = {g: hf["ops"][op]["self_cpu_us"] / total for g, op in PRESET_DECODE_GROUPS.items()}
        speedups.append(hf["ms_per_token_step"] / static["ms_per_token_step"])
        lines.append(f"| {rows} | {hf['ms_per_token_step']:.1f} | "
                     + " | ".join(f"{100 * v:.0f} %" for v in shares[rows].values())
                     + f" | {static['ms_per_token_step']:.1f} |")
    return lines, shares, speedups


def round_one_table() -> tuple[list[str], list[float]]:
    """Round 1 of the eager runs against the SDPA runs: the same exploration from the same adapter (the same episodes),
    then the fine-tuning on the same buffer but for the kernel; each client's mean seconds of both, and the
    fine-tuning's speed-up at the machine's speed of the SDPA run (the rollouts' ratio scales it)."""
    lines = ["| seed | rollout, sdpa run (s) | rollout, eager run (s) | fine-tuning, sdpa (s) | "
             "fine-tuning, eager (s) | eager faster, at the same machine speed |", "|---:|---:|---:|---:|---:|---:|"]
    speedups = []
    for seed, (a, b) in enumerate(zip(*FEDSE_EAGER_RUNS.values())):
        first = [metrics(r)[1] for r in (a, b)]
        rollout = [x["train/rollout_seconds"] for x in first]
        update = [x["train/seconds"] - x["train/rollout_seconds"] for x in first]
        speedups.append(update[0] / update[1] * rollout[1] / rollout[0])
        lines.append(f"| {seed} | {rollout[0]:.1f} | {rollout[1]:.1f} | {update[0]:.1f} | {update[1]:.1f} | "
                     f"{speedups[-1]:.2f}x |")
    return lines, speedups


def eager_attention() -> tuple[list[str], np.ndarray, dict]:
    """The eager-attention table: sft_memory's fine-tuning and update_passes' GRPO update with SDPA and eager."""
    sft = record("2026-12-06-cpu/sft_memory.attention-amd.json")
    sdpa, eager = sft["measured"]
    (ratios,) = sft["attention_ratios"]
    speedup = np.array(ratios["first_over_this"])
    update = record("2026-12-06-cpu/update_passes.attention-eager-amd.json")
    base, fast = update["variants"][""], update["variants"]["training-attention=eager"]
    losses = lambda xs: ", ".join(f"{x:.4f}" for x in xs)  # noqa: E731
    lines = ["| pass | call | sdpa (s) | eager (s) | eager faster | losses | peak memory | plan |",
             "|---|---|---:|---:|---:|---|---|---|",
             f"| Fed-SE's fine-tuning, 2 steps of 16 in passes of 4, bf16-base | `sft_memory.py` | "
             f"{np.mean(sdpa['seconds']):.1f} | {np.mean(eager['seconds']):.1f} | {speedup.mean():.2f}x +- "
             f"{speedup.std(ddof=1) / np.sqrt(len(speedup)):.2f} | {losses(sdpa['losses'])} against "
             f"{losses(eager['losses'])} | {sdpa['peak_rss_gib']:.2f} against {eager['peak_rss_gib']:.2f} GiB | "
             f"{sdpa['plan_gib']:.2f} against {eager['plan_gib']:.2f} GiB |",
             "| FedAgentAvg's GRPO update, 32 agent steps, bf16-base | `update_passes.py` | "
             f"{base['update_s'][0]:.1f} | "
             f"{fast['update_s'][0]:.1f} | {fast['update_ratio'][0]:.2f}x +- {fast['update_ratio'][1]:.2f} | "
             f"{base['loss'][0]:.6f} against {fast['loss'][0]:.6f} | | |"]
    return lines, speedup, fast


def kernels_allow() -> tuple[list[str], dict]:
    """Each preset's run minutes at its rates, at the best rates measured and at the peak, from its AMD roofline."""
    lines = ["| preset | roofline | at its rates (min) | at the best rates measured (min) | at the peak (min) | "
             "best rate of a pass over sequences | weight sweep |", "|---|---|---:|---:|---:|---:|---:|"]
    minutes = {}
    for preset, name in (("FedAgentAvg", "2026-12-05-cpu/cpu_roofline.amd.json"),
                         ("Fed-SE", "2026-12-06-cpu/cpu_roofline.fedse-bf16-base-amd.json")):
        report = record(name)
        run, best = roofline.run_minutes(report), roofline.best_rate_minutes(report)
        minutes[preset] = (run, best)
        lines.append(f"| {preset} | {name} | {run['measured_rates']:.1f} | {best['minutes']:.1f} | "
                     f"{run['at_the_peak']:.1f} | {best['best_sequence_gflop_per_s']:.1f} GFLOP/s | "
                     f"{best['sweep_gflop_per_s']:.1f} GFLOP/s |")
    return lines, minutes


def eval_ratio(name: str, variant: str) -> float:
    """A variant's held-out evaluation speed-up (mean repeat by repeat) in a cpu_round raw output of 2026-12-06."""
    return record(f"2026-12-06-cpu/{name}")["variants"][variant]["eval_ratio"][0]


def lever_bounds() -> dict:
    """The Fed-SE preset's runs of seeds 0-4 with every lever measured or bounded at its bound: the fine-tuning's
    positions with a shared prefix (sft_positions), the evaluation on two processes and with the inverse-CDF sampler."""
    reports = [record(f"2026-12-06-cpu/sft_positions.fedse-s{s}-amd.json") for s in (3, 4)]
    prefix = max(r["padded_over_shared_prefix"] for r in reports)  # the larger bound: the most the lever could save
    two = 2 / eval_ratio("cpu_round.fedse-eval-threads-amd.json", "threads=2")
    sampler = eval_ratio("cpu_round.fedse-eval-sampler-amd.json", "token-sampler=inverse-cdf")
    bounded = []
    for run in FEDSE_SAMPLER_RUNS["multinomial"] + FEDSE_SAMPLER_MORE["multinomial"]:
        shares = run_shares(run)
        bounded.append(shares["minutes"] * (1 - shares["update"] * (1 - 1 / prefix)
                                            - shares["evaluation"] * (1 - 1 / (two * sampler))))
    return {"reports": reports, "prefix": prefix, "two": two, "sampler": sampler, "bounded": bounded}


def last_evaluations(lever: list[str], base: list[str]) -> list[dict]:
    """Each seed's last evaluation of `lever` minus `base`'s, room by room."""
    from fedagent_flwr.experiments.paired_rounds import compare_runs, evaluation_rounds

    last = lambda run: evaluation_rounds(RESULTS / run)[-1]  # noqa: E731
    return [compare_runs(RESULTS / a, RESULTS / b, last(a), last(b)) for a, b in zip(lever, base)]


def verdict(p: float) -> str:
    """What a paired test over seeds shows at p < 0.05."""
    return "not shown" if p > 0.05 else "shown"


# ------------------------------------------------------------------ formats


def pct(x: float) -> str:
    return f"{100 * x:.0f}"


def tabled(share: float) -> float:
    """A share as a roofline table prints it: a percentage to one decimal."""
    return float(f"{100 * share:.1f}")


def span(values, fmt=pct) -> str:
    """'low-high' of `values` as formatted, one figure where both read alike."""
    low, high = fmt(min(values)), fmt(max(values))
    return low if low == high else f"{low}-{high}"


def pm(mean: float, se: float, digits: int = 3, sign: bool = True) -> str:
    return f"{mean:+.{digits}f} +- {se:.{digits}f}" if sign else f"{mean:.{digits}f} +- {se:.{digits}f}"


def times(x: float, digits: int = 2) -> str:
    return f"{x:.{digits}f}x"


def phase(report: dict, name: str, key: str) -> float:
    return report["phases"][name][key]


def arithmetic(report: dict) -> tuple[str, str]:
    """A roofline's run minutes at its rates and at the peak, as its table's last line rounds them."""
    run = roofline.run_minutes(report)
    return f"{run['measured_rates']:.0f}", f"{run['at_the_peak']:.0f}"


def block_name(path: str) -> str:
    return "roofline." + path.removesuffix(".json").replace("/", ".")


# ------------------------------------------------------------------ the notes' figures, section by section


def xeon_figures() -> dict[str, str]:
    """The Intel Xeon without AMX (2026-12-03): bf16-base against fp32."""
    bf16, fp32 = record("2026-12-03-cpu/cpu_roofline.json"), record("2026-12-03-cpu/cpu_roofline.fp32.json")
    rate = lambda report, p: report["phases"][p]["gflop_per_s"]  # noqa: E731
    ratio = {p: rate(fp32, p) / rate(bf16, p) for p in roofline.PHASES if rate(bf16, p)}
    share = lambda *phases: 100 * sum(fp32["phases"][p]["share_of_round"] for p in phases)  # noqa: E731
    runs = roofline.run_minutes(fp32), roofline.run_minutes(bf16)
    out = {f"xeon.fp32-over-bf16.{p.replace(' ', '-')}": times(ratio[p], 1)
           for p in (*WHOLE_SEQUENCES, "rollout decode")}
    return out | {
        "xeon.fp32.whole-sequences-peak": span([phase(fp32, p, "share_of_peak") for p in WHOLE_SEQUENCES]),
        "xeon.fp32.decode-peak": pct(phase(fp32, "rollout decode", "share_of_peak")),
        "xeon.fp32.prefills-share": f"{share('rollout prefill', 'evaluation prefill'):.0f}",
        "xeon.fp32.decodes-share": f"{share(*DECODES):.0f}",
        "xeon.bf16.minutes": f"{bf16['wall_seconds'] / 60:.1f}",
        "xeon.fp32.minutes": f"{fp32['wall_seconds'] / 60:.1f}",
        "xeon.bf16.trained-steps": f"{bf16['round']['train_samples']:.0f}",
        "xeon.fp32.trained-steps": f"{fp32['round']['train_samples']:.0f}",
        "xeon.fp32.run-at-peak": f"{runs[0]['at_the_peak']:.0f}",
        "xeon.fp32.run-at-rates": f"{runs[0]['measured_rates']:.0f}",
        "xeon.bf16.run-at-rates": f"{runs[1]['measured_rates']:.0f}",
    }


def amx_figures() -> dict[str, str]:
    """The Intel Xeon with AMX (2026-12-04): the dtypes, the prefill's head both ways, the fix, and the run after it."""
    from fedagent_flwr.experiments.paired_rounds import compare, evaluation_rounds

    bf16, fp32, after = (record(f"2026-12-04-cpu/{n}.json") for n in ("cpu_roofline", "cpu_roofline.fp32",
                                                                      "cpu_roofline.after"))
    head, head32 = record("2026-12-04-cpu/prefill_head.json"), record("2026-12-04-cpu/prefill_head.fp32.json")
    peaks = bf16["peaks"]
    median = lambda report, way: f"{report['median_seconds'][way]:.2f}"  # noqa: E731

    def by_repeat(report: dict) -> str:  # each repeat ran both ways back to back: their ratio, mean and standard error
        ratios = [a / b for a, b in zip(report["seconds"]["logits_to_keep=1"], report["seconds"]["index tensor"])]
        mean = sum(ratios) / len(ratios)
        se = (sum((r - mean) ** 2 for r in ratios) / (len(ratios) - 1) / len(ratios)) ** 0.5
        return f"{mean:.2f}x +- {se:.2f}"

    speedup = lambda name: times(phase(bf16, name, "seconds") / phase(after, name, "seconds"), 1)  # noqa: E731
    run = RESULTS / "2026-12-04-cpu" / "runs" / "fedagent-preset-s0-amx"
    rows = metrics(run)
    evaluation = {r["round"]: r["eval/seconds"] for r in rows if "eval/seconds" in r}
    elapsed = {r["round"]: r["elapsed_seconds"] for r in rows}
    gain = compare(run, evaluation_rounds(run)[-1], evaluation_rounds(run)[0])
    trained = [r for r in rows if "train/rollout_seconds" in r]
    update = sum(r["train/seconds"] - r["train/rollout_seconds"] for r in trained)
    chunks = record("2026-12-04-cpu/update_passes.chunks.json")
    whole, chunked = chunks["variants"]["logprob-chunk-tokens=0"], chunks["variants"]["logprob-chunk-tokens=1024"]
    return {
        "amx.bf16-over-fp32-peak": times(peaks["bf16"]["peak_flops"] / peaks["fp32"]["peak_flops"], 1),
        "amx.bf16.round-seconds": f"{bf16['total_seconds']:.0f}",
        "amx.fp32.round-seconds": f"{fp32['total_seconds']:.0f}",
        "amx.fp32-over-bf16-round": times(fp32["total_seconds"] / bf16["total_seconds"]),
        "amx.bf16.whole-sequences-peak": span([phase(bf16, p, "share_of_peak") for p in WHOLE_SEQUENCES]),
        "amx.bf16.decodes-peak": span([phase(bf16, p, "share_of_peak") for p in DECODES]),
        "amx.bf16.rollout-prefill-rate": f"{phase(bf16, 'rollout prefill', 'gflop_per_s'):.0f}",
        "amx.bf16.reference-rate": f"{phase(bf16, 'reference log-probs', 'gflop_per_s'):.0f}",
        "amx.head.bf16.strided": median(head, "logits_to_keep=1"), "amx.head.bf16.index": median(head, "index tensor"),
        "amx.head.bf16.repeats": f"{head['repeats']}",
        "amx.head.bf16.ratio": times(head["ratio_strided_over_index"]),
        "amx.head.bf16.by-repeat": by_repeat(head),
        "amx.head.fp32.strided": median(head32, "logits_to_keep=1"),
        "amx.head.fp32.index": median(head32, "index tensor"),
        "amx.head.fp32.ratio": times(head32["ratio_strided_over_index"]),
        "amx.head.fp32.by-repeat": by_repeat(head32),
        "amx.head.fp32.logit-difference": f"{head32['max_logit_difference']:.1g}",
        "amx.head.fp32.copy-cost": pct(head32["ratio_strided_over_index"] - 1),
        "amx.after.trained-steps": f"{after['round']['train_samples']:.0f}",
        "amx.after.rollout-prefill-speedup": speedup("rollout prefill"),
        "amx.after.evaluation-prefill-speedup": speedup("evaluation prefill"),
        "amx.after.before-seconds": f"{bf16['total_seconds']:.0f}",
        "amx.after.round-seconds": f"{after['total_seconds']:.0f}",
        "amx.after.run-before": f"{roofline.run_minutes(bf16)['measured_rates']:.0f}",
        "amx.after.run-after": f"{roofline.run_minutes(after)['measured_rates']:.0f}",
        "amx.run.minutes": f"{json.loads((run / 'summary.json').read_text())['seconds'] / 60:.1f}",
        "amx.run.arithmetic": f"{roofline.run_minutes(after)['measured_rates']:.0f}",
        "amx.run.first-evaluation": f"{evaluation[0]:.0f}", "amx.run.last-evaluation": f"{evaluation[3]:.0f}",
        "amx.run.round-minutes": f"{(elapsed[3] - evaluation[3] - elapsed[0]) / 3 / 60:.1f}",
        "amx.run.first-success": f"{gain['earlier_success']:.3f}",
        "amx.run.last-success": f"{gain['later_success']:.3f}",
        "amx.run.gain": pm(gain["mean"], gain["se"]), "amx.run.gain-se": f"{gain['mean'] / gain['se']:.1f}",
        "amx.run.gain-p": f"{gain['p']:.2g}",
        "amx.run.update-over-rollout": times(update / sum(r["train/rollout_seconds"] for r in trained), 1),
        "amx.after.backward-share": pct(phase(after, "update backward", "share_of_round")),
        "amx.after.backward-peak": pct(phase(after, "update backward", "share_of_peak")),
        "amx.after.decodes-share": pct(sum(phase(after, p, "share_of_round") for p in DECODES)),
        "amx.after.decodes-peak": span([phase(after, p, "share_of_peak") for p in DECODES]),
        "amx.chunks.samples": f"{chunks['samples']}",
        "amx.chunks.chunked-seconds": f"{chunked['update_s'][0]:.1f}",
        "amx.chunks.whole-seconds": f"{whole['update_s'][0]:.1f}",
        "amx.chunks.ratio": f"{chunked['update_ratio'][0]:.2f}x +- {chunked['update_ratio'][1]:.2f}",
        "amx.chunks.repeats": f"{chunks['repeats']}", "amx.chunks.threads": f"{chunks['threads']}",
        "amx.chunks.chunked-loss": f"{chunked['loss'][0]:.4f}", "amx.chunks.whole-loss": f"{whole['loss'][0]:.4f}",
    }


def run_figures(run: Path) -> tuple[float, float, float]:
    """A FedAgentAvg run's minutes, a round's minutes (the last evaluation's round less its evaluation, from the end of
    the first evaluation, over 3 rounds) and its update's seconds (the clients' rounds less their rollouts)."""
    rows = metrics(run)
    evaluation = {r["round"]: r["eval/seconds"] for r in rows if "eval/seconds" in r}
    elapsed = {r["round"]: r["elapsed_seconds"] for r in rows}
    update = sum(r["train/seconds"] - r["train/rollout_seconds"] for r in rows if "train/rollout_seconds" in r)
    return (json.loads((run / "summary.json").read_text())["seconds"] / 60,
            (elapsed[3] - evaluation[3] - elapsed[0]) / 3 / 60, update)


def levers_figures() -> dict[str, str]:
    """The update's levers on the AMX Xeon (2026-12-05) and the run with compiled layers against the preset's."""
    from fedagent_flwr.experiments.paired_rounds import compare, compare_runs, evaluation_rounds

    report = record("2026-12-05-cpu/update_passes.input-cast.json")
    cast, kept, compiled = (report["variants"][v] for v in ("peft-input-cast=true", "peft-input-cast=false",
                                                             "training-kernels=compile"))
    runs = [RESULTS / r for r in ("2026-12-05-cpu/runs/fedagent-compile-s0-amx",
                                  "2026-12-04-cpu/runs/fedagent-preset-s0-amx")]
    (minutes, round_, update), (minutes_p, round_p, update_p) = (run_figures(r) for r in runs)
    against = compare_runs(runs[0], runs[1], evaluation_rounds(runs[0])[-1], evaluation_rounds(runs[1])[-1])
    first = compare(runs[0], evaluation_rounds(runs[0])[-1], evaluation_rounds(runs[0])[0])["earlier_success"]
    return {
        "levers.kept-seconds": f"{kept['update_s'][0]:.1f}", "levers.cast-seconds": f"{cast['update_s'][0]:.1f}",
        "levers.kept-ratio": f"{kept['update_ratio'][0]:.2f}x +- {kept['update_ratio'][1]:.2f}",
        "levers.kept-loss": f"{kept['loss'][0]:.4f}",
        "levers.compiled-seconds": f"{compiled['update_s'][0]:.1f} s +- {compiled['update_s'][1]:.1f}",
        "levers.cast-seconds-again": f"{cast['update_s'][0]:.1f}",
        "levers.compiled-ratio": f"{compiled['update_ratio'][0]:.2f}x +- {compiled['update_ratio'][1]:.2f}",
        "levers.compiled-loss": f"{compiled['loss'][0]:.4f}", "levers.cast-loss": f"{cast['loss'][0]:.4f}",
        "levers.compiled-gap": f"{compiled['rollout_logprob_gap'][0]:.4f}",
        "levers.cast-gap": f"{cast['rollout_logprob_gap'][0]:.4f}",
        "levers.run.minutes": f"{minutes:.1f}", "levers.run.preset-minutes": f"{minutes_p:.1f}",
        "levers.run.round": f"{round_:.1f}", "levers.run.preset-round": f"{round_p:.1f}",
        "levers.run.update": f"{update:.0f}", "levers.run.preset-update": f"{update_p:.0f}",
        "levers.run.first-success": f"{first:.3f}",
        "levers.run.last-success": f"{against['later_success']:.3f}",
        "levers.run.preset-last-success": f"{against['earlier_success']:.3f}",
        "levers.run.difference": pm(against["mean"], against["se"]), "levers.run.difference-p": f"{against['p']:.2g}",
    }


def compiled_seeds_figures() -> dict[str, str]:
    """The compiled layers against the preset, seed by seed (SEED_RUNS)."""
    _, figures = seed_table(SEED_RUNS)
    d = figures["difference"]
    amx, amd = figures["ratio"][MACHINES["amx"]], figures["ratio"][MACHINES["amd"]]
    first = {k: [metrics(r)[1] for r in runs] for k, runs in SEED_RUNS.items()}
    out = {}
    for key, name, digits in (("train/kl", "kl", 1), ("train/clip_frac", "clipped", 1),
                              ("train/update_norm", "update-norm", 2)):
        for seed, (p, c) in enumerate(zip(first["preset"], first["compiled"])):
            out[f"compiled.round-1.{name}.s{seed}"] = times(c[key] / p[key], digits)
    evaluations = [metrics(SEED_RUNS[k][1])[0]["eval/seconds"] for k in ("preset", "compiled")]

    def update(run: str) -> str:  # a client's update in round 1 as the console prints it: m:ss
        first_round = next(r for r in metrics(run) if "train/seconds" in r)
        minutes, seconds = divmod(round(first_round["train/seconds"] - first_round["train/rollout_seconds"]), 60)
        return f"{minutes}:{seconds:02d}"

    return out | {
        "compiled.amx-ratio": f"{amx['mean']:.2f}x +- {amx['se']:.2f}", "compiled.amd-ratio": times(amd["mean"]),
        "compiled.difference": pm(d["mean"], d["se"]), "compiled.difference-p": f"{d['p']:.2g}",
        "compiled.s1.preset-evaluation": f"{evaluations[0]:.0f}",
        "compiled.s1.compiled-evaluation": f"{evaluations[1]:.0f}",
        "compiled.s2.compiled-update": update(SEED_RUNS["compiled"][2]),
        "compiled.s2.preset-update": update(SEED_RUNS["preset"][2]),
    }


def profile_figures() -> dict[str, str]:
    """Where the update's time goes on the AMD EPYC (2026-12-05): the dtypes' peaks, a profiled micro-batch, SDPA's
    other paths."""
    peaks = record("2026-12-05-cpu/cpu_roofline.peaks-amd.json")
    p = record("2026-12-05-cpu/update_passes.profile-amd.json")["profile"]
    top, total = {e["op"]: e["self_cpu_ms"] for e in p["top"]}, p["self_cpu_ms"]
    mm = top["aten::mm"] / total
    forward, backward = (top[f"aten::_scaled_dot_product_flash_attention_for_cpu{s}"] / total
                         for s in ("", "_backward"))
    nodes = {e["node"]: e["cpu_ms"] for e in p["backward_nodes"]}
    shares = sorted(round(100 * run_shares(r)["update"]) for r in SEED_RUNS["preset"])
    v = record("2026-12-05-cpu/update_passes.attention-amd.json")["variants"]
    ratios = [v[k]["update_ratio"] for k in list(v)[1:]]
    amx = record("2026-12-04-cpu/cpu_roofline.json")["peaks"]
    rest = pct(1 - mm - forward - backward)
    return {
        "profile.preset-update-share": f"{shares[0]}-{shares[-1]}",
        "profile.bf16-peak": f"{peaks['peaks']['bf16']['peak_flops'] / 1e9:.1f}",
        "profile.fp32-peak": f"{peaks['peaks']['fp32']['peak_flops'] / 1e9:.1f}",
        "profile.bf16-over-fp32": times(peaks["bf16_over_fp32"]),
        "profile.amx-bf16-over-fp32": times(amx["bf16"]["peak_flops"] / amx["fp32"]["peak_flops"], 1),
        "profile.rows": f"{p['rows']}", "profile.tokens": f"{p['tokens']}",
        "profile.forward-ms": f"{p['forward_ms']:.0f}", "profile.backward-ms": f"{p['backward_ms']:.0f}",
        "profile.backward-share": pct(p["backward_ms"] / p["wall_ms"]),
        "profile.mm": pct(mm), "profile.attention": pct(forward + backward), "profile.attention-forward": pct(forward),
        "profile.attention-backward": pct(backward), "profile.rest": rest, "profile.rest-again": rest,
        "profile.attention-backward-ms": f"{nodes['ScaledDotProductFlashAttentionForCpuBackward0']:.0f}",
        "profile.mm-backward-ms": f"{nodes['MmBackward0']:.0f}",
        "profile.sdpa.seconds": f"{v['']['update_s'][0]:.1f}",
        **{f"profile.sdpa.{k.split('=')[1]}": f"{r[0]:.2f}x +- {r[1]:.2f}" for k, r in zip(list(v)[1:], ratios)},
    }


def amd_figures() -> dict[str, str]:
    """The FedAgentAvg preset's round on the AMD EPYC (2026-12-05), against the AMX Xeon's after the prefill fix."""
    report, after = record("2026-12-05-cpu/cpu_roofline.amd.json"), record("2026-12-04-cpu/cpu_roofline.after.json")
    at_rates, at_peak = arithmetic(report)
    minutes = sorted(run_shares(r)["minutes"] for r in SEED_RUNS["preset"][:2])
    # as the table prints them (one decimal), then rounded: the figures the section read off the table
    peak = lambda p: f"{tabled(phase(report, p, 'share_of_peak')):.0f}"  # noqa: E731
    decodes = sum(tabled(phase(report, p, "share_of_round")) for p in DECODES)
    return {
        "amd.minutes": f"{report['total_seconds'] / 60:.1f}",
        "amd.reference-peak": peak("reference log-probs"), "amd.evaluation-prefill-peak": peak("evaluation prefill"),
        "amd.rollout-prefill-peak": peak("rollout prefill"), "amd.update-forward-peak": peak("update forward"),
        "amd.update-backward-peak": peak("update backward"),
        "amd.decodes-share": f"{decodes:.0f}",
        "amd.run-at-peak": at_peak, "amd.run-at-rates": at_rates,
        "amd.preset-s2-minutes": f"{run_shares(SEED_RUNS['preset'][2])['minutes']:.1f}",
        "amd.reference-share": f"{tabled(phase(report, 'reference log-probs', 'share_of_round')):.0f}",
        "amd.amx-run-at-peak": arithmetic(after)[1],
        "amd.amx-passes-peak": span([phase(after, p, "share_of_peak") for p in WHOLE_SEQUENCES]),
        "amd.amx-preset-minutes": f"{minutes[0]:.1f}-{minutes[1]:.1f}",
    }


def fedse_timed_figures() -> dict[str, str]:
    """The Fed-SE preset's run on the AMX Xeon (2026-12-05)."""
    run = "2026-12-05-cpu/runs/fedse-preset-s0-amx"
    rows = metrics(run)
    evaluations = [r["eval/seconds"] for r in rows if "eval/seconds" in r]
    clients = [r["train/seconds"] for r in rows if "train/seconds" in r]
    shares = run_shares(run)
    amx = record("2026-12-04-cpu/cpu_roofline.json"), record("2026-12-04-cpu/cpu_roofline.fp32.json")
    return {
        "fedse-timed.minutes": f"{shares['minutes']:.1f}", "fedse-timed.first-evaluation": f"{evaluations[0]:.0f}",
        "fedse-timed.last-evaluation": f"{evaluations[1]:.0f}", "fedse-timed.evaluations": pct(shares["evaluation"]),
        "fedse-timed.clients": pct(shares["clients"]), "fedse-timed.client-round": span(clients, lambda x: f"{x:.0f}"),
        "fedse-timed.amx-fp32-over-bf16": times(amx[1]["total_seconds"] / amx[0]["total_seconds"]),
    }


def fedse_roofline_figures() -> dict[str, str]:
    """The Fed-SE preset's round on the AMD EPYC (2026-12-05), in fp32 and under bf16-mixed."""
    fp32, bf16 = (record(f"2026-12-05-cpu/cpu_roofline.fedse{n}-amd.json") for n in ("", "-bf16-mixed"))
    peak = lambda report, p: pct(phase(report, p, "share_of_peak"))  # noqa: E731
    share = lambda report, *phases: pct(sum(phase(report, p, "share_of_round") for p in phases))  # noqa: E731
    ratio = lambda p: times(phase(bf16, p, "gflop_per_s") / phase(fp32, p, "gflop_per_s"))  # noqa: E731
    wins = [round(r["round"]["success_rate"] * r["round"]["episodes"]) for r in (bf16, fp32)]
    runs = [run_shares(f"2026-12-05-cpu/runs/fedse-preset-s{s}-amd")["minutes"] for s in (1, 2)]
    body, head = fp32["body_parameters"], fp32["head_parameters"]
    positions = phase(fp32, "update forward", "gflop_computed") * 1e9 / (2 * (body + head))
    loss = fp32["counts"]["sft loss tokens"]
    return {
        "fedse-roofline.fp32.minutes": f"{fp32['total_seconds'] / 60:.1f}",
        "fedse-roofline.bf16.minutes": f"{bf16['total_seconds'] / 60:.1f}",
        "fedse-roofline.fp32.episodes": f"{fp32['round']['episodes']:.0f}",
        "fedse-roofline.fp32.buffer": f"{fp32['round']['train_samples']:.0f}",
        "fedse-roofline.fp32.passes-peak": span([phase(fp32, p, "share_of_peak") for p in (
            "rollout prefill", "update forward", "update backward", "evaluation prefill")]),
        "fedse-roofline.fp32.rollout-prefill-peak": peak(fp32, "rollout prefill"),
        "fedse-roofline.fp32.evaluation-prefill-peak": peak(fp32, "evaluation prefill"),
        "fedse-roofline.fp32.update-forward-peak": peak(fp32, "update forward"),
        "fedse-roofline.fp32.update-backward-peak": peak(fp32, "update backward"),
        "fedse-roofline.fp32.rollout-decode-peak": peak(fp32, "rollout decode"),
        "fedse-roofline.fp32.evaluation-decode-peak": peak(fp32, "evaluation decode"),
        "fedse-roofline.fp32.tuning-share": share(fp32, "update forward", "update backward"),
        "fedse-roofline.fp32.exploring-share": share(fp32, "rollout prefill", "rollout decode", "rollout other"),
        "fedse-roofline.fp32.run-at-peak": arithmetic(fp32)[1], "fedse-roofline.fp32.run-at-rates": arithmetic(fp32)[0],
        "fedse-roofline.s1-minutes": f"{runs[0]:.1f}", "fedse-roofline.s2-minutes": f"{runs[1]:.1f}",
        "fedse-roofline.bf16.run-at-peak": arithmetic(bf16)[1], "fedse-roofline.bf16.run-at-rates": arithmetic(bf16)[0],
        "fedse-roofline.bf16.update-backward-peak": peak(bf16, "update backward"),
        "fedse-roofline.bf16-over-fp32.update-backward": ratio("update backward"),
        "fedse-roofline.bf16-over-fp32.rollout-prefill": ratio("rollout prefill"),
        "fedse-roofline.bf16-over-fp32.update-forward": ratio("update forward"),
        "fedse-roofline.bf16-over-fp32.rollout-decode": ratio("rollout decode"),
        "fedse-roofline.bf16-over-fp32.evaluation-decode": ratio("evaluation decode"),
        "fedse-roofline.bf16.decodes-peak": span([phase(bf16, p, "share_of_peak") for p in DECODES]),
        "fedse-roofline.bf16.wins": f"{wins[0]}", "fedse-roofline.fp32.wins": f"{wins[1]}",
        "fedse-roofline.bf16.buffer": f"{bf16['round']['train_samples']:.0f}",
        "fedse-roofline.fp32.buffer-again": f"{fp32['round']['train_samples']:.0f}",
        "fedse-roofline.loss-positions": f"{loss:,.0f}", "fedse-roofline.positions": f"{positions:,.0f}",
        "fedse-roofline.head-share": pct(head / (body + head)),
        "fedse-roofline.head-cut": pct(head * (positions - loss) / ((body + head) * positions)),
    }


def head_figures() -> dict[str, str]:
    """Fed-SE's fine-tuning with the head at the completions' positions (2026-12-06): side by side, then its round."""
    report = record("2026-12-06-cpu/sft_memory.head-amd.json")
    rows = {(r["head"], r["precision"]): r for r in report["measured"]}
    steps = len(rows[("loss", "fp32")]["losses"])
    mean = lambda r: sum(r["seconds"]) / len(r["seconds"]) / steps  # noqa: E731
    out = {}
    for precision in ("fp32", "bf16-mixed"):
        turns = next(r["every_over_loss"] for r in report["head_ratios"] if r["precision"] == precision)
        out |= {f"head.{precision}.loss-step": f"{mean(rows[('loss', precision)]):.1f}",
                f"head.{precision}.every-step": f"{mean(rows[('every', precision)]):.1f}",
                f"head.{precision}.turns": " and ".join(times(x) for x in turns)}
    first = record("2026-12-06-cpu/sft_memory.head-amd.first.json")
    for r in first["head_ratios"]:
        out[f"head.first.{r['precision']}.turns"] = " and ".join(times(x) for x in r["every_over_loss"])
    out |= {"head.fp32.every-rss": f"{rows[('every', 'fp32')]['peak_rss_gib']:.2f}",
            "head.fp32.loss-rss": f"{rows[('loss', 'fp32')]['peak_rss_gib']:.2f}",
            "head.fp32.plan": f"{rows[('loss', 'fp32')]['plan_gib']:.2f}"}

    before = {"fp32": record("2026-12-05-cpu/cpu_roofline.fedse-amd.json"),
              "bf16": record("2026-12-05-cpu/cpu_roofline.fedse-bf16-mixed-amd.json")}
    after = {"fp32": record("2026-12-06-cpu/cpu_roofline.fedse-head-amd.json"),
             "bf16": record("2026-12-06-cpu/cpu_roofline.fedse-head-bf16-mixed-amd.json")}
    new = after["fp32"]
    out |= {"head.round.episodes": f"{new['round']['episodes']:.0f}",
            "head.round.buffer": f"{new['round']['train_samples']:.0f}",
            "head.round.loss-tokens": f"{new['counts']['sft loss tokens']:,.0f}",
            "head.round.passes": f"{new['counts']['update forward passes']:.0f}"}
    tuning = lambda report: sum(phase(report, p, "seconds")  # noqa: E731
                                for p in ("update forward", "update backward"))
    for dtype in ("fp32", "bf16"):
        old, new = before[dtype], after[dtype]
        out |= {f"head.{dtype}.tuning-seconds": f"{tuning(new):.0f}",
                f"head.{dtype}.tuning-seconds-before": f"{tuning(old):.0f}",
                f"head.{dtype}.tuning-speedup": times(tuning(old) / tuning(new)),
                f"head.{dtype}.forward-peak": pct(phase(new, "update forward", "share_of_peak")),
                f"head.{dtype}.backward-peak": pct(phase(new, "update backward", "share_of_peak")),
                f"head.{dtype}.run-at-peak": arithmetic(new)[1], f"head.{dtype}.run-at-peak-before": arithmetic(old)[1],
                f"head.{dtype}.run-at-rates": arithmetic(new)[0],
                f"head.{dtype}.run-at-rates-before": arithmetic(old)[0]}
    new = after["fp32"]
    out["head.fp32.tuning-share"] = pct(sum(phase(new, p, "share_of_round")
                                            for p in ("update forward", "update backward")))
    new, old = after["bf16"], before["bf16"]
    out |= {"head.bf16.backward-peak-before": pct(phase(old, "update backward", "share_of_peak")),
            "head.bf16.rollout-decode-peak": pct(phase(new, "rollout decode", "share_of_peak")),
            "head.bf16.evaluation-decode-peak": pct(phase(new, "evaluation decode", "share_of_peak")),
            "head.bf16.decodes-share": pct(sum(phase(new, p, "share_of_round") for p in DECODES)),
            "head.bf16.run-at-rates-again": arithmetic(new)[0]}
    runs = sorted(run_shares(r)["minutes"] for r in FEDSE_PRECISION_RUNS["fp32"][1:])  # before the head's change
    seed0 = {k: run_shares(runs_[0])["minutes"] for k, runs_ in FEDSE_PRECISION_RUNS.items()}  # after it
    return out | {
        "head.fp32-runs-before": f"{runs[0]:.1f}-{runs[1]:.1f}",
        "head.fp32.arithmetic-before": arithmetic(before["fp32"])[0],
        "head.s0.fp32-minutes": f"{seed0['fp32']:.1f}", "head.s0.fp32-arithmetic": arithmetic(after["fp32"])[0],
        "head.s0.bf16-minutes": f"{seed0['bf16-mixed']:.1f}", "head.s0.bf16-arithmetic": arithmetic(after["bf16"])[0],
    }


def precision_figures() -> dict[str, str]:
    """The Fed-SE preset in fp32 against bf16-mixed, seed by seed (FEDSE_PRECISION_RUNS)."""
    _, figures = seed_table(FEDSE_PRECISION_RUNS)
    ratio, d = figures["ratio"][MACHINES["amd"]], figures["difference"]
    out = {"precision.ratio": f"{ratio['mean']:.2f}x +- {ratio['se']:.2f}",
           "precision.difference": pm(d["mean"], d["se"]),
           "precision.difference-p": f"{d['p']:.2g}"}
    for k, name in (("bf16-mixed", "bf16"), ("fp32", "fp32")):
        for seed, m in enumerate(figures["minutes"][k]):
            out[f"precision.s{seed}.{name}-minutes"] = f"{m:.1f}"
    return out | {"precision.s0.fastest": f"{figures['minutes']['bf16-mixed'][0]:.1f}"}


def base_figures() -> dict[str, str]:
    """Fed-SE under bf16-base (2026-12-06): side by side, its roofline against bf16-mixed's, and its runs."""
    sft = record("2026-12-06-cpu/sft_memory.bf16-base-amd.json")
    rows = {r["precision"]: r for r in sft["measured"]}
    step = lambda r: sum(r["seconds"]) / len(r["seconds"]) / len(r["losses"])  # noqa: E731
    (turns,) = [r["first_over_this"] for r in sft["precision_ratios"] if r["precision"] == "bf16-base"]
    evaluation = record("2026-12-06-cpu/cpu_round.fedse-eval-bf16-base-amd.json")
    mixed, base = evaluation["variants"]["precision=bf16-mixed"], evaluation["variants"]["precision=bf16-base"]
    new, old = record("2026-12-06-cpu/cpu_roofline.fedse-bf16-base-amd.json"), record(
        "2026-12-06-cpu/cpu_roofline.fedse-head-bf16-mixed-amd.json")
    rate = lambda report, p: phase(report, p, "gflop_per_s")  # noqa: E731
    others = [rate(new, p) / rate(old, p) for p in ("rollout prefill", "evaluation prefill", "update forward",
                                                     "update backward")]
    sweep = new["peaks"]["bf16"]["decode_sweep_flops"]
    out = {
        "base.sft.base-step": f"{step(rows['bf16-base']):.1f}",
        "base.sft.mixed-step": f"{step(rows['bf16-mixed']):.1f}",
        "base.sft.turns": " and ".join(times(x) for x in turns),
        "base.sft.base-rss": f"{rows['bf16-base']['peak_rss_gib']:.2f}",
        "base.sft.mixed-rss": f"{rows['bf16-mixed']['peak_rss_gib']:.2f}",
        "base.sft.base-plan": f"{rows['bf16-base']['plan_gib']:.2f}",
        "base.sft.mixed-plan": f"{rows['bf16-mixed']['plan_gib']:.2f}",
        "base.eval.base-seconds": f"{base['eval_s'][0]:.1f}", "base.eval.mixed-seconds": f"{mixed['eval_s'][0]:.1f}",
        "base.eval.ratio": f"{base['eval_ratio'][0]:.2f}x +- {base['eval_ratio'][1]:.2f}",
        "base.eval.per-token": f"{base['eval_ms_per_token_ratio'][0]:.2f}x +- {base['eval_ms_per_token_ratio'][1]:.2f}",
        "base.rollout-decode-rate": f"{rate(new, 'rollout decode'):.1f}",
        "base.mixed-rollout-decode-rate": f"{rate(old, 'rollout decode'):.1f}",
        "base.rollout-decode-ratio": times(rate(new, "rollout decode") / rate(old, "rollout decode")),
        "base.evaluation-decode-rate": f"{rate(new, 'evaluation decode'):.1f}",
        "base.mixed-evaluation-decode-rate": f"{rate(old, 'evaluation decode'):.1f}",
        "base.evaluation-decode-ratio": times(rate(new, "evaluation decode") / rate(old, "evaluation decode")),
        "base.others-ratio": span(others, lambda x: f"{x:.2f}"),
        "base.run-at-rates": arithmetic(new)[0], "base.mixed-run-at-rates": arithmetic(old)[0],
        "base.run-at-peak": arithmetic(new)[1],
        "base.rollout-decode-peak": pct(phase(new, "rollout decode", "share_of_peak")),
        "base.evaluation-decode-peak": pct(phase(new, "evaluation decode", "share_of_peak")),
        "base.sweep": f"{sweep / 1e9:.1f}",
        "base.rollout-decode-sweep": pct(rate(new, "rollout decode") * 1e9 / sweep),
        "base.evaluation-decode-sweep": pct(rate(new, "evaluation decode") * 1e9 / sweep),
    }
    _, figures = seed_table(FEDSE_BASE_RUNS)
    mixed_runs, base_runs = FEDSE_BASE_RUNS.values()
    minutes = {run: run_shares(run)["minutes"] for run in (mixed_runs[0], base_runs[0])}
    first = {run: metrics(run)[0] for run in (mixed_runs[0], base_runs[0])}
    ratios = figures["ratio"][MACHINES["amd"]]["values"]
    d = figures["difference"]
    out |= {"base.s0.base-minutes": f"{minutes[base_runs[0]]:.1f}",
            "base.s0.mixed-minutes": f"{minutes[mixed_runs[0]]:.1f}",
            "base.s0.ratio": times(ratios[0]),
            "base.s0.base-evaluation": f"{first[base_runs[0]]['eval/seconds']:.0f}",
            "base.s0.mixed-evaluation": f"{first[mixed_runs[0]]['eval/seconds']:.0f}",
            "base.s1.ratio": times(ratios[1]), "base.s2.ratio": times(ratios[2]),
            "base.fastest": f"{min(run_shares(r)['minutes'] for r in mixed_runs + base_runs):.1f}",
            "base.difference": pm(d["mean"], d["se"]), "base.difference-p": f"{d['p']:.2g}",
            "base.s0.base-first-success": f"{first[base_runs[0]]['eval/success_rate']:.3f}",
            "base.s0.mixed-first-success": f"{first[mixed_runs[0]]['eval/success_rate']:.3f}"}
    for seed, e in enumerate(figures["each"]):
        out[f"base.s{seed}.difference"] = pm(e["mean"], e["se"])
    return out


def static_figures() -> dict[str, str]:
    """The static engine in the FedAgentAvg preset's evaluation on the AMX Xeon (2026-12-05)."""
    report = record("2026-12-05-cpu/cpu_round.eval-engines.json")
    hf, static = report["variants"][""], report["variants"]["decode-engine=static,old-logprobs=recompute"]
    return {"static.static-seconds": f"{static['eval_s'][0]:.1f}", "static.hf-seconds": f"{hf['eval_s'][0]:.1f}",
            "static.ratio": f"{static['eval_ratio'][0]:.2f}x +- {static['eval_ratio'][1]:.2f}",
            "static.repeats": f"{report['repeats']}"}


def decode_figures() -> dict[str, str]:
    """Where a decode step's time goes, the engines and precisions in the evaluation, the preset's own decode and the
    evaluation on both cores (2026-12-06)."""
    base = record("2026-12-06-cpu/cpu_roofline.fedse-bf16-base-amd.json")
    per_row = phase(base, "rollout decode", "gflop_computed") / base["counts"]["rollout row steps"]
    sweep = base["peaks"]["bf16"]["decode_sweep_flops"] / 1e9
    v = record("2026-12-06-cpu/cpu_round.fedse-eval-engines-threads-amd.json")["variants"]
    ratio = lambda name: f"{v[name]['eval_ratio'][0]:.2f}x +- {v[name]['eval_ratio'][1]:.2f}"  # noqa: E731
    static = {rows: [e for e in record(f"2026-12-06-cpu/decode_profile.fedse-bf16-mixed-{rows}-amd.json")["engines"]
                     if e["engine"] == "static"][0] for rows in (15, 34)}
    share = lambda e, op: pct(  # noqa: E731
        e["ops"][op]["self_cpu_us"] / sum(x["self_cpu_us"] for x in e["ops"].values()))
    _, shares, speedups = preset_decode_steps()
    left = {rows: s["attention kernel"] + s["the sampler's exponential draws"] for rows, s in shares.items()}
    rollout, evaluation = (phase(base, p, "share_of_round") for p in DECODES)
    threads = record("2026-12-06-cpu/cpu_round.fedse-eval-threads-amd.json")["variants"]["threads=2"]["eval_ratio"]
    base_runs = FEDSE_BASE_RUNS["bf16-base"]
    evaluations = sum(run_shares(r)["evaluation"] for r in base_runs) / len(base_runs)
    return {
        "decode.sweep": f"{sweep:.1f}", "decode.sweep-step-ms": f"{1000 * 15 * per_row / sweep:.0f}",
        **{f"decode.static.attention-{r}": share(static[r], DECODE_GROUPS["attention kernel"]) for r in (15, 34)},
        **{f"decode.static.draws-{r}": share(static[r], DECODE_GROUPS["the sampler's exponential draws"])
           for r in (15, 34)},
        "decode.eval.mixed-seconds": f"{v['precision=bf16-mixed']['eval_s'][0]:.1f}",
        "decode.eval.mixed-static": ratio("precision=bf16-mixed,decode-engine=static"),
        "decode.eval.base-hf": ratio("precision=bf16-base"),
        "decode.eval.base-static": ratio("precision=bf16-base,decode-engine=static"),
        "decode.preset.left-15": pct(left[15]), "decode.preset.left-34": pct(left[34]),
        "decode.preset.static-15": times(speedups[0]), "decode.preset.static-34": times(speedups[1]),
        "decode.preset.rollout-share": f"{100 * rollout:.1f}",
        "decode.preset.evaluation-share": f"{100 * evaluation:.1f}",
        "decode.preset.left-of-round": pct(rollout * left[15] + evaluation * left[34]),
        "decode.threads.ratio": f"{threads[0]:.2f}x +- {threads[1]:.2f}",
        "decode.threads.per-core": pct(threads[0] / 2),
        "decode.threads.bound": times(2 / threads[0]), "decode.threads.evaluations": pct(evaluations),
        "decode.threads.of-run": pct(evaluations * (1 - threads[0] / 2)),
    }


def eager_figures() -> dict[str, str]:
    """Eager attention in the passes that take a gradient (2026-12-06): what it is worth, and its runs."""
    _, speedup, fast = eager_attention()
    updates = [run_shares(r)["update"] for r in FEDSE_BASE_RUNS["bf16-base"]]
    saved = 1 - 1 / speedup.mean()
    phases = record("2026-12-05-cpu/cpu_roofline.amd.json")["phases"]
    passes = phases["update forward"]["share_of_round"] + phases["update backward"]["share_of_round"]
    sdpa, eager = FEDSE_EAGER_RUNS.values()
    first = [[metrics(run)[0]["eval/seconds"] for run in pair] for pair in zip(sdpa, eager)]
    _, speedups = round_one_table()
    s = np.array(speedups)
    _, figures = seed_table(FEDSE_EAGER_RUNS)
    d = figures["difference"]
    out = {
        "eager.updates": span(updates), "eager.sft-speedup": times(speedup.mean()),
        "eager.of-run": f"{pct(min(updates) * saved)}-{pct(max(updates) * saved)}",
        "eager.update-passes": pct(passes), "eager.update-speedup": times(fast["update_ratio"][0]),
        "eager.update-of-round": pct(passes * (1 - 1 / fast["update_ratio"][0])),
        "eager.runs.minutes": span(figures["minutes"]["eager"], lambda x: f"{x:.1f}"),
        "eager.runs.round-1-speedup": f"{s.mean():.2f}x +- {s.std(ddof=1) / np.sqrt(len(s)):.2f}",
        "eager.runs.side-by-side": times(speedup.mean()),
        "eager.runs.difference": pm(d["mean"], d["se"]), "eager.runs.difference-p": f"{d['p']:.2g}",
        "eager.runs.update-speedup": times(fast["update_ratio"][0]),
    }
    for seed, (a, b) in enumerate(first):
        out[f"eager.runs.s{seed}.first-evaluation"] = times(b / a)
    for seed, e in enumerate(figures["each"]):
        out[f"eager.runs.s{seed}.difference"] = pm(e["mean"], e["se"])
    return out


def sampler_figures() -> dict[str, str]:
    """The inverse-CDF sampler (2026-12-06): side by side, seeds 0-2, the tails, seeds 3-4 and the five seeds."""
    from fedagent_flwr.experiments.paired_rounds import compare, evaluation_rounds
    from fedagent_flwr.experiments.seed_statistics import paired_difference

    _, shares, _ = preset_decode_steps()
    r = record("2026-12-06-cpu/cpu_round.fedse-eval-sampler-amd.json")
    multinomial, inverse = r["variants"][""], r["variants"]["token-sampler=inverse-cdf"]
    out = {
        "sampler.draws-15": pct(shares[15]["the sampler's exponential draws"]),
        "sampler.draws-34": pct(shares[34]["the sampler's exponential draws"]),
        "sampler.eval.inverse-seconds": f"{inverse['eval_s'][0]:.1f}",
        "sampler.eval.multinomial-seconds": f"{multinomial['eval_s'][0]:.1f}",
        "sampler.eval.ratio": f"{inverse['eval_ratio'][0]:.2f}x +- {inverse['eval_ratio'][1]:.2f}",
        "sampler.eval.per-token": f"{inverse['eval_ms_per_token_ratio'][0]:.2f}x +- "
                                  f"{inverse['eval_ms_per_token_ratio'][1]:.2f}",
        "sampler.eval.inverse-success": f"{inverse['eval_success'][0]:.3f}",
        "sampler.eval.multinomial-success": f"{multinomial['eval_success'][0]:.3f}",
    }
    _, figures = seed_table(FEDSE_SAMPLER_RUNS)
    runs = FEDSE_SAMPLER_RUNS["multinomial"], FEDSE_SAMPLER_RUNS["inverse-cdf"]
    for seed, pair in enumerate(zip(*runs)):
        a, b = (metrics(run)[0] for run in pair)
        out[f"sampler.runs.s{seed}.per-step"] = times((a["eval/seconds"] / a["eval/mean_steps"])
                                                      / (b["eval/seconds"] / b["eval/mean_steps"]))
    for seed, e in enumerate(figures["each"]):
        out[f"sampler.runs.s{seed}.difference"] = pm(e["mean"], e["se"])
    d = figures["difference"]
    minutes = figures["minutes"]
    out |= {"sampler.runs.difference": pm(d["mean"], d["se"]), "sampler.runs.difference-p": f"{d['p']:.2g}",
            "sampler.runs.inverse-minutes": span(minutes["inverse-cdf"], lambda x: f"{x:.1f}"),
            "sampler.runs.multinomial-minutes": span(minutes["multinomial"], lambda x: f"{x:.1f}")}
    tail = record("2026-12-06-cpu/sampler_tails.fedse-amd.json")
    t = tail["temperatures"]["1.0"]
    out |= {"sampler.tails.rows": f"{t['rows']}", "sampler.tails.draws-per-row": f"{tail['draws_per_row']}",
            "sampler.tails.tail": f"{tail['tail']:g}", "sampler.tails.mass": f"{100 * t['tail_mass_mean']:.2f}",
            "sampler.tails.multinomial": f"{t['multinomial']['tail_draws']}",
            "sampler.tails.inverse": f"{t['inverse-cdf']['tail_draws']}",
            "sampler.tails.draws": f"{t['multinomial']['draws']:,}",
            "sampler.tails.expected": f"{t['multinomial']['expected']:.1f} +- {t['multinomial']['expected_se']:.1f}",
            "sampler.tails.total-variation": f"{t['inverse_cdf_total_variation_mean']:.0e}"}
    _, more = seed_table(FEDSE_SAMPLER_MORE, [3, 4])
    for seed, e in zip((3, 4), more["each"]):
        out[f"sampler.more.s{seed}.difference"] = pm(e["mean"], e["se"])
    out["sampler.more.minutes"] = span(more["minutes"]["multinomial"] + more["minutes"]["inverse-cdf"],
                                       lambda x: f"{x:.1f}")
    runs = {k: FEDSE_SAMPLER_RUNS[k] + FEDSE_SAMPLER_MORE[k] for k in FEDSE_SAMPLER_RUNS}
    marks = lambda r: evaluation_rounds(RESULTS / r)  # noqa: E731
    last = {k: {s: compare(RESULTS / r, marks(r)[-1], marks(r)[0])["later_success"] for s, r in enumerate(v)}
            for k, v in runs.items()}
    d = paired_difference(last["inverse-cdf"], last["multinomial"])
    return out | {"sampler.five.difference": pm(d["mean"], d["se"]), "sampler.five.difference-p": f"{d['p']:.2g}",
                  "sampler.five.verdict": verdict(d["p"]),
                  "sampler.more.saves": times(eval_ratio("cpu_round.fedse-eval-sampler-amd.json",
                                                         "token-sampler=inverse-cdf"))}


def kernels_figures() -> dict[str, str]:
    """What this processor's kernels allow a run (2026-12-06), and the levers left at their bounds."""
    _, minutes = kernels_allow()
    run, best = minutes["FedAgentAvg"]
    fedse_run, fedse_best = minutes["Fed-SE"]
    added = [run_shares(r)["minutes"] / fedse_run["measured_rates"] for r in FEDSE_BASE_RUNS["bf16-base"]]
    b = lever_bounds()
    prefixes = [c["prefix"] for r in b["reports"] for c in r["clients"].values()]
    return {
        "kernels.fedagent.best": f"{best['minutes']:.1f}", "kernels.fedagent.peak": f"{run['at_the_peak']:.1f}",
        "kernels.fedse.best": f"{fedse_best['minutes']:.1f}", "kernels.fedse.added": span(added, lambda x: f"{x:.2f}"),
        "kernels.prefix": span(prefixes, lambda x: f"{x:.1f}"),
        "kernels.shared-prefix": times(b["reports"][0]["padded_over_shared_prefix"]),
        "kernels.no-padding": times(b["reports"][0]["padded_over_real"]),
        "kernels.threads": times(b["two"]), "kernels.sampler": times(b["sampler"]),
        "kernels.bound.prefix": times(b["prefix"]), "kernels.bound.threads": times(b["two"]),
        "kernels.bound.sampler": times(b["sampler"]), "kernels.bound.minutes": span(b["bounded"], lambda x: f"{x:.1f}"),
    }


# ------------------------------------------------------------------ the guide's tables, one per processor

def processor(report: dict) -> str:
    """The processor a raw output ran on, as its `cpu` record names it: the model, and AMX where its flags have it."""
    cpu = report["cpu"]
    if cpu["model"].startswith("AMD EPYC"):
        return "AMD EPYC with AVX-512 bf16, no AMX" if "avx512_bf16" in cpu["flags"] else cpu["model"]
    return "Intel Xeon " + ("with" if "amx_tile" in cpu["flags"] else "without") + " AMX"


def preset(report: dict) -> str:
    return "Fed-SE" if report.get("strategy") == "fedse-lora" else "FedAgentAvg"


@cache
def latest_rooflines() -> dict[str, dict[tuple[str, str], str]]:
    """{processor: {(preset, precision): the path of its latest round's roofline}} over every roofline raw output
    of benchmarks/results/ that measured a round (a later call of the same preset and precision supersedes an
    earlier one: the prefill's fix, the head at the completions' positions)."""
    found: dict[str, dict[tuple[str, str], tuple[str, str]]] = {}
    for path in sorted(RESULTS.glob("*/cpu_roofline*.json")):
        name = path.relative_to(RESULTS).as_posix()
        report = record(name)
        if "phases" not in report:
            continue
        key, when = (preset(report), report["precision"]), report["raw_output"]["finished_utc"]
        mine = found.setdefault(processor(report), {})
        if key not in mine or mine[key][0] < when:
            mine[key] = (when, name)
    return {cpu: {key: name for key, (_, name) in rows.items()} for cpu, rows in found.items()}


PROCESSORS = ("AMD EPYC with AVX-512 bf16, no AMX", "Intel Xeon with AMX", "Intel Xeon without AMX")
ROUNDS = (("FedAgentAvg", "bf16-base"), ("FedAgentAvg", "fp32"), ("Fed-SE", "bf16-base"), ("Fed-SE", "bf16-mixed"),
          ("Fed-SE", "fp32"))


def processor_table(name: str) -> list[str]:
    """A processor's rounds at a glance, from its latest roofline of each preset and precision: a client's round and
    an evaluation of 16 rooms as measured on one thread, a run of the preset's shape by the roofline's arithmetic,
    the round's shares (rollout, update, evaluation), and how near the peak of its dtype the passes ran."""
    lines = [f"**{name}**", "",
             "| preset | precision | round measured (min) | run, arithmetic (min) | rollout | update | evaluation | "
             "passes over sequences, of the dtype's peak | decodes, of the peak | raw output (benchmarks/results/) |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    rooflines = latest_rooflines()[name]
    for preset_, precision in ROUNDS:
        path = rooflines.get((preset_, precision))
        if path is None:
            lines.append(f"| {preset_} | {precision} | not measured |" + " |" * 7)
            continue
        report = record(path)
        run = roofline.run_minutes(report)
        share = lambda *prefixes: sum(r["share_of_round"] for p, r in report["phases"].items()  # noqa: E731
                                      if p.startswith(prefixes))
        passes = [r["share_of_peak"] for p, r in report["phases"].items() if r["share_of_peak"] and "decode" not in p]
        decodes = [phase(report, p, "share_of_peak") for p in DECODES]
        lines.append(f"| {preset_} | {precision} | {report['total_seconds'] / 60:.1f} | {run['measured_rates']:.0f} | "
                     f"{pct(share('rollout'))} % | {pct(share('update', 'optimizer', 'reference', 'old-policy'))} % | "
                     f"{pct(share('evaluation'))} % | {span(passes)} % | {span(decodes)} % | `{path}` |")
    return lines


# ------------------------------------------------------------------ the parts


def figures() -> dict[str, str]:
    """Every figure of the notes, by name."""
    out = {}
    for section in (xeon_figures, amx_figures, levers_figures, compiled_seeds_figures, profile_figures, amd_figures,
                    fedse_timed_figures, fedse_roofline_figures, head_figures, precision_figures, base_figures,
                    static_figures, decode_figures, eager_figures, sampler_figures, kernels_figures):
        part = section()
        assert not part.keys() & out.keys(), part.keys() & out.keys()
        out |= part
    return out


def doc_parts() -> list[Block | Figure]:
    parts = [Block(GUIDE, f"processor.{key}", tuple(processor_table(name)))
             for key, name in zip(("amd", "amx", "no-amx"), PROCESSORS)]
    parts += [Block(NOTES, block_name(path), tuple(roofline.markdown(record(path)).splitlines())) for path in ROOFLINES]
    parts += [Block(NOTES, f"seed-table.{name}", tuple(seed_table(runs, seeds)[0]))
              for name, (runs, seeds) in SEED_TABLES.items()]
    parts += [Block(NOTES, "round-1.FEDSE_EAGER_RUNS", tuple(round_one_table()[0])),
              Block(NOTES, "decode-steps.bf16-mixed", tuple(decode_step_table())),
              Block(NOTES, "decode-steps.bf16-base", tuple(preset_decode_steps()[0])),
              Block(NOTES, "eager-attention", tuple(eager_attention()[0])),
              Block(NOTES, "kernels-allow", tuple(kernels_allow()[0]))]
    return parts + [Figure(NOTES, name, text) for name, text in figures().items()]
