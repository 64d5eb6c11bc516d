"""The SmolLM2 numbers docs/results.md gives for issue 55 are what `paired_rounds` computes from the run records kept
in benchmarks/results/2026-12-0[12]-cpu/runs/ (scripts/keep_run_records.py; one folder per day the runs ran). If a
record or a documented number is edited, or the paired test changes, these fail; they read JSON only, so they cost
nothing in the default suite."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fedagent_flwr.experiments.paired_rounds import compare, compare_runs, evaluation_rounds, over_seeds, success_rounds

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
DAYS = ("2026-12-01-cpu", "2026-12-02-cpu")


def _run(name: str) -> Path:
    """A kept run by its name; a name kept on two days would make the tables ambiguous, so that fails."""
    found = [RESULTS / day / "runs" / name for day in DAYS if (RESULTS / day / "runs" / name).is_dir()]
    assert len(found) == 1, (name, found)
    return found[0]


def _gain(run: str) -> dict:
    """A run's last evaluation minus its first, paired over the held-out rooms."""
    rounds = evaluation_rounds(_run(run))
    return compare(_run(run), rounds[-1], rounds[0])


def _against(run: str, other: str) -> dict:
    """run's last evaluation minus other's last, room by room."""
    return compare_runs(_run(run), _run(other), evaluation_rounds(_run(run))[-1], evaluation_rounds(_run(other))[-1])


# run: (before round 1, after round 3, gain, its standard error), as docs/results.md's tables give them
GAINS = {
    "fedagent-preset-s0": (0.424, 0.535, +0.111, 0.038),  # seed 0 again, on the AMD EPYC (2026-12-02)
    "fedagent-preset-s1": (0.333, 0.500, +0.167, 0.044),
    "fedagent-preset-s2": (0.299, 0.493, +0.194, 0.045),
    "local1-s1": (0.333, 0.410, +0.076, 0.054),
    "central-s1": (0.333, 0.514, +0.181, 0.044),
    "local1-s2": (0.299, 0.576, +0.278, 0.050),
    "central-s2": (0.299, 0.396, +0.097, 0.041),
    "gigpo-s0": (0.424, 0.569, +0.146, 0.040),
    "gigpo-s1": (0.333, 0.431, +0.097, 0.043),
    "gigpo-s2": (0.299, 0.549, +0.250, 0.050),
}

# (run, against): (difference, its standard error, p)
DIFFERENCES = {
    ("fedagent-preset-s1", "local1-s1"): (+0.090, 0.054, 0.10),
    ("fedagent-preset-s1", "central-s1"): (-0.014, 0.034, 0.69),
    ("fedagent-preset-s2", "local1-s2"): (-0.083, 0.035, 0.022),
    ("fedagent-preset-s2", "central-s2"): (+0.097, 0.041, 0.021),
    ("gigpo-s0", "fedagent-preset-s0"): (+0.035, 0.039, 0.37),
    ("gigpo-s1", "fedagent-preset-s1"): (-0.069, 0.031, 0.031),
    ("gigpo-s2", "fedagent-preset-s2"): (+0.056, 0.035, 0.12),
}


@pytest.mark.parametrize("run", sorted(GAINS))
def test_each_documented_gain_is_its_records_paired_test(run):
    before, after, gain, se = GAINS[run]
    out = _gain(run)
    assert out["n"] == 48 and out["episodes"] == 144
    assert (round(out["earlier_success"], 3), round(out["later_success"], 3)) == (before, after)
    assert (round(out["mean"], 3), round(out["se"], 3)) == (gain, se)


@pytest.mark.parametrize("pair", sorted(DIFFERENCES))
def test_each_documented_difference_between_methods_is_their_records_paired_test(pair):
    difference, se, p = DIFFERENCES[pair]
    out = _against(*pair)
    assert out["n"] == 48
    assert (round(out["mean"], 3), round(out["se"], 3)) == (difference, se)
    assert out["p"] == pytest.approx(p, rel=0.05)


def test_runs_of_one_seed_start_from_the_same_evaluation():
    """The premise of pairing methods room by room and of `initial-evaluation`: with the same model and seed, the
    evaluation before round 1 is the same episodes, here played by two runs on different thread counts (the
    FedAgentAvg run alone on 2 threads, Local's first run with OMP_NUM_THREADS=1 beside two other simulations)."""
    def episodes(run):
        return json.loads((_run(run) / "episodes" / "round-0000.json").read_text())["episodes"]

    assert episodes("local1-s2-stopped") == episodes("fedagent-preset-s2")
    # GiGPO's seed-1 run evaluated itself (the GRPO run's record predates the sources digest it would be checked by)
    assert episodes("gigpo-s1") == episodes("fedagent-preset-s1")
    # the baselines that took their round 0 from another run say so, and carry the source's episodes
    taken = json.loads((_run("local1-s2") / "episodes" / "round-0000.json").read_text())
    assert "taken-from" in taken and taken["episodes"] == episodes("fedagent-preset-s2")
    # GiGPO's seed-0 run took its round 0 from the GRPO run of seed 0 on the same machine and day
    taken = json.loads((_run("gigpo-s0") / "episodes" / "round-0000.json").read_text())
    assert "grpo-s0" in taken["taken-from"] and taken["episodes"] == episodes("fedagent-preset-s0")


def test_the_over_seeds_lines_are_the_per_seed_success_rates():
    """docs/results.md's tests over seeds 0-2. Seed 0's FedAgentAvg, Local and Centralized runs of the table stayed on
    the Xeon, so their rates are the table's; `fedagent-preset-s0` is seed 0 run again on the AMD EPYC."""
    s = {run: success_rounds(_run(run)) for run in ("fedagent-preset-s1", "fedagent-preset-s2", "local1-s1", "local1-s2",
                                                     "central-s1", "central-s2")}
    preset = over_seeds([(0.576, 0.389), (s["fedagent-preset-s1"][3], s["fedagent-preset-s1"][0]),
                         (s["fedagent-preset-s2"][3], s["fedagent-preset-s2"][0])])
    assert (round(preset["mean"], 3), round(preset["se"], 3), round(preset["p"], 3)) == (0.183, 0.008, 0.002)
    # the same over the three AMD EPYC runs, seed 0's second sample in place of the Xeon's
    epyc = over_seeds([(r[3], r[0]) for r in (success_rounds(_run(f"fedagent-preset-s{k}")) for k in (0, 1, 2))])
    assert (round(epyc["mean"], 3), round(epyc["se"], 3), round(epyc["p"], 3)) == (0.157, 0.024, 0.023)
    local = over_seeds([(0.576, 0.361), (s["fedagent-preset-s1"][3], s["local1-s1"][3]),
                        (s["fedagent-preset-s2"][3], s["local1-s2"][3])])
    assert (round(local["mean"], 3), round(local["se"], 3), round(local["p"], 2)) == (0.074, 0.087, 0.48)
    central = over_seeds([(0.576, 0.493), (s["fedagent-preset-s1"][3], s["central-s1"][3]),
                          (s["fedagent-preset-s2"][3], s["central-s2"][3])])
    assert (round(central["mean"], 3), round(central["se"], 3), round(central["p"], 2)) == (0.055, 0.035, 0.25)


def test_gigpo_against_grpo_over_seeds():
    def finals(stem, seeds):
        return [success_rounds(_run(f"{stem}-s{s}"))[3] for s in seeds]

    two = over_seeds(list(zip(finals("gigpo", (1, 2)), finals("fedagent-preset", (1, 2)))))
    assert (round(two["mean"], 3), round(two["se"], 3), round(two["p"], 2)) == (-0.007, 0.062, 0.93)
    three = over_seeds(list(zip(finals("gigpo", (0, 1, 2)), finals("fedagent-preset", (0, 1, 2)))))
    assert (round(three["mean"], 3), round(three["se"], 3), round(three["p"], 2)) == (0.007, 0.039, 0.87)
