"""Table 1 with matched budgets (experiments/matched_table1.py, issue 95): the arms get the federation's budget, the
budgets and endpoints are read from run records, the verdict follows the pre-registered rule, and the power the
pre-registration quotes is what its records give."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from fedagent_flwr.config import RunConfig
from fedagent_flwr.experiments import matched_table1 as mt
from fedagent_flwr.experiments.protocols import resolve_preset

ROOT = Path(__file__).resolve().parents[2]
PRESET = str(ROOT / "configs" / "smollm2-fedagent-directions-cpu.toml")


def test_every_single_learner_gets_a_federation_rounds_episodes_steps_and_resets():
    _, base = resolve_preset(PRESET)
    runs = mt.plan([0, 1], base)
    assert [r.name for r in runs[:4]] == ["matched-fedagent-s0", "matched-local0-s0", "matched-local1-s0", "matched-centralized-s0"]
    fed = RunConfig.from_run_config(runs[0].config)
    for r in runs:
        cfg = RunConfig.from_run_config(r.config)  # every arm is a valid run config
        assert cfg.eval.samples_per_task == mt.SAMPLES_PER_ROOM and cfg.seed == r.seed
        if r.group == "FedAgentAvg":
            assert cfg.baseline.name == "none"
            continue
        share = fed.clients_per_round
        assert cfg.grpo.tasks_per_epoch == share * fed.grpo.tasks_per_epoch  # the round's episodes
        assert cfg.grpo.mini_batch_size == share * fed.grpo.mini_batch_size  # so about one client's AdamW steps
        assert cfg.baseline.optimizer == "reset" and r.cores == share
        changed = ("grpo.tasks-per-epoch", "grpo.mini-batch-size", "seed")
        assert {k: v for k, v in r.config.items() if k not in changed and not k.startswith("baseline.")} == \
               {k: v for k, v in runs[0].config.items() if k not in changed}  # nothing else differs from FedAgentAvg


def test_budgets_are_read_from_the_records():
    """The earlier table's FedAgentAvg of seed 0 played 4 x 32 episodes a round for 3 rounds, its steps along the path
    are a round's mean client's; its compute-matched Local kept one AdamW through the rounds."""
    fed, local = mt.PILOT_PAIRS[0]
    rows = [json.loads(line) for line in (fed / "metrics.jsonl").read_text().splitlines()]
    b = mt.budget(fed)
    assert b["episodes"] == 384 and b["optimizer_resets"] == 3
    assert b["path_steps"] == pytest.approx(sum(r["train/optimizer_steps"] for r in rows if r.get("train/replies")))
    assert mt.budget(local)["episodes"] == 384 and mt.budget(local)["optimizer_resets"] == 1
    assert mt.held_categories(local) == {"north-east"} and mt.held_categories(fed) == set(mt.OPPOSITE)


def _run(folder: Path, wins: dict[str, float], local_client: int | None) -> Path:
    """A run folder with a config.json and one evaluation's episodes: room -> its success (the rooms of the directions
    preset's held-out split, 2 episodes each)."""
    _, base = resolve_preset(PRESET)
    cfg = base | ({"baseline.name": "local", "baseline.local-client": local_client} if local_client is not None else {})
    (folder / "episodes").mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(RunConfig.from_run_config(cfg).to_run_config()))
    from envs import make_env

    tasks = make_env("gridworld").tasks_of_split("test")
    episodes = [{"task": t.id, "category": t.category, "won": i < 2 * wins[t.category], "steps": 1, "reward": 0.0}
                for t in tasks for i in range(2)]
    (folder / "episodes" / "round-0003.json").write_text(json.dumps({"round": 3, "episodes": episodes}))
    (folder / "summary.json").write_text("{}")
    return folder


def test_the_endpoints_pair_the_arms_on_the_rooms_each_names(tmp_path):
    """FedAgentAvg wins every room; Local(0) (north-east) wins its own direction and the opposite one half the time,
    nothing else; Local(1) (south-west) only its own; Centralized half of every room."""
    every = dict.fromkeys(mt.OPPOSITE, 1.0)
    seeds = {}
    for s, shift in ((0, 0.0), (1, 0.5), (2, 0.0)):  # seed 1: Local(1) also wins half of north-east
        arms = tmp_path / f"s{s}"
        seeds[s] = {
            "fedagent": _run(arms / "fed", every, None),
            "local0": _run(arms / "l0", {"north-east": 1.0, "south-west": 0.5, "north-west": 0.0, "south-east": 0.0}, 0),
            "local1": _run(arms / "l1", {"south-west": 1.0, "north-east": shift, "north-west": 0.0, "south-east": 0.0}, 1),
            "centralized": _run(arms / "c", dict.fromkeys(mt.OPPOSITE, 0.5), None),
        }
    e = mt.endpoints(seeds, (0, 1))
    rooms = {"north-east": 15, "north-west": 9, "south-east": 16, "south-west": 8}  # the held-out split's
    unseen0 = 1 - 0.5 * rooms["south-west"] / (rooms["north-west"] + rooms["south-east"] + rooms["south-west"])
    unseen1 = {0.0: 1.0, 0.5: 1 - 0.5 * rooms["north-east"] / (rooms["north-east"] + rooms["north-west"] + rooms["south-east"])}
    expected = [(unseen0 + unseen1[shift]) / 2 for shift in (0.0, 0.5, 0.0)]
    assert e["primary"]["n"] == 3 and e["primary"]["mean"] == pytest.approx(np.mean(expected))
    assert e["opposite"]["mean"] == pytest.approx(np.mean([(0.5 + 1 - shift) / 2 for shift in (0.0, 0.5, 0.0)]))
    assert e["centralized"]["mean"] == pytest.approx(0.5) and e["centralized"]["se"] == 0


@pytest.mark.parametrize("mean,p,ci,expected", [
    (0.07, 0.01, (0.02, 0.12), "supported"),
    (0.05, 0.01, (0.02, 0.08), "inconclusive"),  # beyond noise but under +6 points
    (0.07, 0.08, (-0.01, 0.15), "inconclusive"),
    (0.00, 0.90, (-0.04, 0.029), "refuted"),
    (0.00, 0.90, (-0.04, 0.031), "inconclusive"),
])
def test_the_verdict_follows_the_preregistered_rule(mean, p, ci, expected):
    assert mt.verdict({"mean": mean, "p": p, "ci95": list(ci)}) == expected


def test_power_is_the_rate_a_simulated_paired_t_test_rejects_at():
    from scipy import stats

    rng = np.random.default_rng(0)
    for n, effect, sd in ((5, 0.06, 0.048), (8, 0.06, 0.048), (4, 0.0, 0.05)):
        draws = rng.normal(effect, sd, size=(20000, n))
        rate = float(np.mean(stats.ttest_1samp(draws, 0.0, axis=1).pvalue < 0.05))
        assert mt.power(n, effect, sd) == pytest.approx(rate, abs=0.012)
    assert math.isclose(mt.power(4, 0.0, 0.05), 0.05, abs_tol=1e-9)

