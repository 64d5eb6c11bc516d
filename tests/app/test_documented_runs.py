"""The run records behind docs/results.md's real-model tables: every run folder a table names is kept, and the runs
the tables pair room by room played what the pairing assumes (the same held-out episodes before round 1; a seed
repeated on one processor kind, the same episodes and rewards). The tables and the numbers around them are written
from the records by fedagent_flwr/experiments/results_figures.py (tests/records regenerates them); the SmolLM2
presets' comments may quote only numbers it writes. They read JSON only, so they cost nothing in the default suite."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from fedagent_flwr.experiments import results_figures
from fedagent_flwr.experiments.doc_blocks import Block

ROOT = Path(__file__).resolve().parents[2]
TABLES = results_figures.tables()


@pytest.mark.parametrize("name", sorted(TABLES))
def test_every_run_folder_a_table_names_is_kept(name):
    page, rows, _ = TABLES[name]
    assert rows, name
    for folder in (f for row in rows for f in results_figures.folders(row)):
        assert (folder / "summary.json").is_file() and (folder / "episodes").is_dir(), folder


def quoted(text: str) -> set[str]:
    """Signed results with three decimals (+0.111), standard errors after ±, two-decimal numbers (SE ratios, p) and
    minutes (41.9)."""
    return set(re.findall(r"[+-]\d\.\d{3}\b", text)) | set(re.findall(r"± (\d\.\d{3})", text)) | \
        set(re.findall(r"(?<![\d.])\d\.\d{2}(?![\d.])", text)) | set(re.findall(r"(?<![\d.])\d{2,3}\.\d(?![\d.])", text))


def test_the_presets_comments_quote_only_numbers_the_records_give():
    """The SmolLM2 presets' comments (configs/ holds no generated parts) quote results only as results_figures.py
    computes them from the records."""
    generated = quoted("\n".join("\n".join(p.lines) if isinstance(p, Block) else p.text
                                 for p in results_figures.doc_parts()))
    for name in ("smollm2-fedagent-cpu.toml", "smollm2-fedse-cpu.toml"):
        comment = "\n".join(line for line in (ROOT / "configs" / name).read_text().splitlines() if line.startswith("#"))
        numbers = quoted(comment)
        assert numbers, name  # the comment does quote results
        assert numbers <= generated, (name, sorted(numbers - generated))


def test_runs_of_one_seed_start_from_the_same_evaluation():
    """The premise of pairing methods room by room and of `eval.initial-evaluation`: with the same model and seed, the
    evaluation before round 1 is the same episodes, here played by two runs on different thread counts (the
    FedAgentAvg run alone on 2 threads, Local's first run with OMP_NUM_THREADS=1 beside two other simulations)."""
    runs = ROOT / "benchmarks" / "results"

    def episodes(run):
        return json.loads((runs / run / "episodes" / "round-0000.json").read_text())["episodes"]

    assert episodes("2026-12-01-cpu/runs/local1-s2-stopped") == episodes("2026-12-01-cpu/runs/fedagent-preset-s2")
    assert episodes("2026-12-01-cpu/runs/gigpo-s1") == episodes("2026-12-01-cpu/runs/fedagent-preset-s1")
    taken = json.loads((runs / "2026-12-01-cpu/runs/local1-s2/episodes/round-0000.json").read_text())
    assert "taken-from" in taken and taken["episodes"] == episodes("2026-12-01-cpu/runs/fedagent-preset-s2")
    taken = json.loads((runs / "2026-12-02-cpu/runs/gigpo-s0/episodes/round-0000.json").read_text())
    assert "grpo-s0" in taken["taken-from"] and taken["episodes"] == episodes("2026-12-02-cpu/runs/fedagent-preset-s0")


def test_the_fedse_preset_under_bf16_base_starts_from_the_fedagent_presets_evaluation():
    """results.md: with both presets holding the base in bf16, each seed of each on the AMD EPYC played the same
    held-out episodes before round 1 (what its table of Fed-SE against FedAgentAvg, room by room, stands on); under
    bf16-mixed Fed-SE did not."""
    runs = ROOT / "benchmarks" / "results"

    def episodes(run):
        return json.loads((runs / run / "episodes" / "round-0000.json").read_text())["episodes"]

    assert episodes("2026-12-06-cpu/runs/fedse-bf16-base-s2-amd") == episodes("2026-12-05-cpu/runs/fedagent-preset-s2-amd")
    fedagent = ["2026-12-02-cpu/runs/fedagent-preset-s0", "2026-12-01-cpu/runs/fedagent-preset-s1",
                "2026-12-01-cpu/runs/fedagent-preset-s2"]
    for seed, run in enumerate(fedagent):
        assert episodes(f"2026-12-06-cpu/runs/fedse-bf16-base-s{seed}-amd") == episodes(run)
        assert episodes(f"2026-12-06-cpu/runs/fedse-eager-s{seed}-amd") == episodes(run)  # the preset since eager
        assert episodes(f"2026-12-06-cpu/runs/fedse-bf16-mixed-s{seed}-amd") != episodes(run)


def same_evaluations_and_rewards(first: Path, again: Path) -> list[tuple[dict, dict]]:
    """Asserts two runs played the same held-out episodes in both evaluations and had the same training rewards and
    successes round by round; returns their trained rounds' metrics, paired, for the caller's own checks."""
    for name in ("round-0000.json", "round-0003.json"):
        assert (json.loads((first / "episodes" / name).read_text())["episodes"]
                == json.loads((again / "episodes" / name).read_text())["episodes"]), name

    def trained(run):
        return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if "train/seconds" in line]

    pairs = list(zip(trained(first), trained(again), strict=True))
    for a, b in pairs:
        assert (a["train/mean_reward"], a["train/success_rate"]) == (b["train/mean_reward"], b["train/success_rate"])
    return pairs


def test_a_seed_repeats_on_one_processor_kind():
    """results.md: seed 2 on an AMD EPYC, 2026-12-01 and 2026-12-05 (many commits apart, the warm start rebuilt),
    played the same held-out episodes in every evaluation and the same training rewards; the update norms agree to
    1e-15 (float sums in another order), and the clocks differ."""
    runs = ROOT / "benchmarks" / "results"
    first, again = runs / "2026-12-01-cpu/runs/fedagent-preset-s2", runs / "2026-12-05-cpu/runs/fedagent-preset-s2-amd"
    for a, b in same_evaluations_and_rewards(first, again):
        assert abs(a["train/update_norm"] - b["train/update_norm"]) < 1e-15
    minutes = [json.loads((r / "summary.json").read_text())["seconds"] / 60 for r in (first, again)]
    assert minutes[0] != minutes[1]  # the clocks differ


def test_the_fedse_presets_seed_0_repeats_across_processors_and_the_loss_heads_change():
    """results.md: the Fed-SE preset in fp32, seed 0, on the Xeon with AMX before the loss head took the completions'
    positions only (2026-12-05) and on the AMD EPYC after it (2026-12-06): the same held-out episodes in both
    evaluations and the same training rewards; the fine-tuning losses agree within 1e-6, rounding apart."""
    runs = ROOT / "benchmarks" / "results"
    first, again = runs / "2026-12-05-cpu/runs/fedse-preset-s0-amx", runs / "2026-12-06-cpu/runs/fedse-preset-s0-amd"
    for a, b in same_evaluations_and_rewards(first, again):
        for key in ("train/loss", "train/fedse/loss-first"):
            assert a[key] != b[key] and abs(a[key] - b[key]) < 1e-6  # rounding moved, nothing more
