"""Protocol commands: run plans keep budgets equal, cpu presets are feasible, reports aggregate correctly."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from envs import make_env
from fedagent_flwr.experiments import protocols
from fedagent_flwr.methods.tasks import all_partitions
from fedagent_flwr.config import RunConfig
from fedagent_flwr.atomic import write_json_atomic
from fedagent_flwr.methods.library_configs import rollout_config


def full(run) -> RunConfig:
    return RunConfig.from_run_config(RunConfig().to_run_config() | run.config)


@pytest.mark.parametrize("preset", ["cpu", "paper"])
def test_table1_methods_share_every_budget_key(preset):
    runs = protocols.table1_runs(preset, [0, 1, 2], protocols.PRESETS[preset], protocols.LOCAL_CLIENTS[preset])
    assert len(runs) == 3 * (2 + len(protocols.LOCAL_CLIENTS[preset]))
    for seed in (0, 1, 2):
        group = [r for r in runs if r.seed == seed]
        strip = [{k: v for k, v in r.config.items() if k not in ("baseline", "local-client")} for r in group]
        assert all(s == strip[0] for s in strip)  # same rounds, epochs, tasks per epoch, seed ...
        assert sorted(r.config.get("baseline", "none") for r in group)[:2] == ["centralized", "local"]
    if preset == "paper":
        c = runs[0].config
        assert (c["num-clients"], c["clients-per-round"], c["local-epochs"], c["num-server-rounds"]) == (100, 2, 3, 70)
        assert c["tasks-per-epoch"] * c["group-size"] == 64  # the reference's 8 tasks x rollout.n = 8 per epoch
        assert protocols.LOCAL_CLIENTS["paper"] == (21, 42, 84)


def test_the_paper_table1_dry_run_runs_the_reference_procedure(tmp_path, capsys):
    """Every Table 1 run of the paper preset, FedAgent and baselines alike, trains and evaluates as the FedAgent
    reference does (docs/run-config.md, "The paper presets"): sampled training at 1.0, validation sampled at 0.4,
    the KL anchored to the base model, verl's token-mean loss without group filtering, AdamW weight decay 0.01, the
    per-step, format-only invalid-action penalty, and minibatches split as the reference splits them (4 micro-batches
    of 16 length-balanced rows, the batch padded with copies)."""
    assert protocols.main(["table1", "--preset", "paper", "--dry-run", "--out", str(tmp_path)]) in (0, None)
    commands = [line for line in capsys.readouterr().out.splitlines() if "fedagent_flwr.simulation" in line]
    assert len(commands) == 15
    reference = ["--temperature 1.0", "--eval-temperature 0.4", "--kl-reference base",
                 "--loss-aggregation micro-batch-token-mean", "--uniform-groups keep", "--weight-decay 0.01",
                 "--invalid-action malformed", "--invalid-penalty-scope step", "--kl-beta 0.01", "--learning-rate 1e-06",
                 "--history-length 2", "--group-size 8", "--clip-ratio-c 3.0", "--kl-clamp 10.0", "--entropy-coeff 0.001",
                 "--reward-std-ddof 1", "--answer-parsing reference", "--prompt-template reference",
                 "--partition uniform-windows", "--partition-seed -1", "--client-sampling reference", "--max-steps 0",
                 "--minibatch-size 64", "--micro-batch-size 16", "--length-balanced-micro-batches True", "--batch-padding copy"]
    for command in commands:
        missing = [flag for flag in reference if f"{flag} " not in command + " "]
        assert not missing, (missing, command)
        cfg = RunConfig.from_run_config(RunConfig().to_run_config() | protocols.PRESETS["paper"])
        assert rollout_config(cfg, evaluation=True).temperature == 0.4 and rollout_config(cfg).temperature == 1.0


def test_table1_local_client_k_holds_the_same_tasks_in_every_seed():
    """Seeds pair FedAgent with Local (client k) only if client k is one data set; the run seed alone moved it."""
    runs = protocols.table1_runs("cpu", [0, 1, 2], protocols.PRESETS["cpu"], (1,))
    k = protocols.PRESETS["cpu"]["num-clients"]
    held = {r.seed: [[t.id for t in p] for p in all_partitions(full(r), k)] for r in runs if r.label == "Local 1"}
    assert held[0] == held[1] == held[2]
    moved = [[[t.id for t in p] for p in all_partitions(RunConfig(seed=s, num_clients=k, tasks_per_client=4), k)]
             for s in (0, 1)]
    assert moved[0] != moved[1]  # partition-seed=-1 (the default) keeps the old behaviour: the run seed decides


def test_decentralized_keeps_total_epochs_fixed_on_the_epochs_panel():
    for preset in ("cpu", "paper"):
        runs = protocols.decentralized_runs(preset, [0], protocols.PRESETS[preset])
        tau_runs = [r for r in runs if r.group == "local-epochs"]
        total = {r.config["local-epochs"] * r.config["num-server-rounds"] for r in tau_runs}
        assert total == {protocols.DECENTRALIZED[preset]["total-epochs"]}
    paper = {r.config["local-epochs"]: r.config["num-server-rounds"]
             for r in protocols.decentralized_runs("paper", [0], protocols.PRESETS["paper"]) if r.group == "local-epochs"}
    assert paper == {1: 210, 3: 70, 5: 42}


def test_every_cpu_run_is_a_valid_feasible_configuration(tmp_path):
    base = protocols.PRESETS["cpu"]
    pool = make_env(base["env"]).tasks_of_split("train")
    labels = tmp_path / "labels.json"
    write_json_atomic(labels, {"env": base["env"], "labels": {t.id: i % 3 != 0 for i, t in enumerate(pool)}})
    runs = (protocols.table1_runs("cpu", [0], base, protocols.LOCAL_CLIENTS["cpu"])
            + protocols.decentralized_runs("cpu", [0], base)
            + protocols.heterogeneity_runs("cpu", [0], base, str(labels)))
    for run in runs:
        cfg = full(run)
        parts = all_partitions(cfg, cfg.num_clients)
        assert len(parts) == cfg.num_clients and all(parts), run.name
    values = {(r.group, r.label) for r in runs if r.name.startswith("het-")}
    assert ("preference", "preference-omega = 0.1") in values and ("hardness", "hardness-xi = 1") in values


def _fake_run(out, name, final, initial, curve_points=None, tau=1):
    d = out / "runs" / name
    d.mkdir(parents=True)
    (d / "summary.json").write_text(json.dumps({"final": final, "initial": initial}))
    rows = [{"round": r, "eval/success_rate": y} for r, y in (curve_points or [])]
    (d / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows))


def test_table1_report_gives_mean_and_standard_error(tmp_path):
    runs = protocols.table1_runs("cpu", [0, 1, 2], protocols.PRESETS["cpu"], (1,))
    finals = {"FedAgent": [0.5, 0.6, 0.7], "Centralized": [0.6, 0.6, 0.9], "Local (client 1)": [0.2, 0.4, 0.3]}
    for r in runs:
        v = finals[r.group][r.seed]
        _fake_run(tmp_path, r.name, {"success_rate": v, "success_rate/near": 1.0, "success_rate/far": v / 2},
                  {"success_rate": [0.35, 0.4, 0.45][r.seed], "success_rate/near": 0.8, "success_rate/far": 0.1})
    result = protocols.table1_report(tmp_path, runs, "t")
    fed = result["rows"]["FedAgent"]["overall"]
    assert fed["mean"] == pytest.approx(0.6) and fed["std"] == pytest.approx(0.1) and fed["se"] == pytest.approx(0.1 / math.sqrt(3))
    assert result["rows"]["Centralized"]["far"]["mean"] == pytest.approx(0.35)
    base = result["base_model"]["overall"]  # one measurement per seed, however many methods ran in it
    assert base["n"] == 3 and base["mean"] == pytest.approx(0.4) and base["se"] == pytest.approx(0.05 / math.sqrt(3))
    assert result["columns"] == ["far", "near", "overall"]
    # Each ordering with its paired test over seeds; a mean ahead is not enough to claim one.
    local = result["comparisons"]["FedAgent > Local (client 1)"]  # differences 0.3, 0.2, 0.4: t = 5.2, 2 dof
    assert local["mean"] == pytest.approx(0.3) and local["p"] == pytest.approx(0.0353, abs=1e-3)
    assert result["comparisons"]["FedAgent > the base model"]["p"] == pytest.approx(0.0202, abs=1e-3)
    assert result["comparisons"]["Centralized > the base model"]["p"] == pytest.approx(0.0591, abs=1e-3)
    verdicts = "\n".join(result["verdict"])
    assert "FedAgent above Local (client 1): holds" in verdicts and "FedAgent above the base model: holds" in verdicts
    assert "Centralized above the base model: not shown (difference +30.0 ± 7.6 points" in verdicts  # ahead, p > 0.05
    assert "FedAgent - Centralized: -10.0 points, 95% interval [-34.8, +14.8] (3 seeds)" in verdicts
    md = (tmp_path / "table1.md").read_text()
    assert "| FedAgent | 30.0 ± 2.9 | 100.0 ± 0.0 | 60.0 ± 5.8 |" in md
    # The Local row says what its learner trained on: client 1's 4 rooms by goal direction.
    held = result["local_tasks"]["Local (client 1)"]
    assert sum(held.values()) == 4 and set(held) <= {"north-east", "north-west", "south-east", "south-west"}
    assert "Training tasks of each Local learner, by category: Local (client 1): " in md
    assert json.loads((tmp_path / "table1.json").read_text())["rows"]["Local (client 1)"]["overall"]["n"] == 3


def test_a_skewed_table1_names_its_setting_and_each_local_clients_single_category(tmp_path):
    """docs/heterogeneity.md's skewed Table 1: the reference's Dirichlet preference draw at omega 0.9 leaves the cpu
    preset's Local clients 1 and 3 one goal direction each; the table's title and Local lines must say so."""
    sets = ["partition=preference", "preference-omega=0.9", "preference-mix=dirichlet"]
    base = protocols.PRESETS["cpu"] | protocols.parse_set(sets)
    runs = [r for r in protocols.table1_runs("cpu", [0], base, (1, 3)) if r.group.startswith("Local")]
    assert [protocols.local_holding(r) for r in runs] == [{"north-east": 4}, {"south-west": 4}]
    title = protocols.setting("cpu", base, sets)
    assert title.endswith("; --set partition=preference preference-omega=0.9 preference-mix=dirichlet")
    assert protocols.setting("cpu", protocols.PRESETS["cpu"], []) == "cpu preset: env gridworld, model tiny, K=8"


def test_curves_report_plots_success_against_epochs(tmp_path):
    runs = protocols.decentralized_runs("cpu", [0, 1], protocols.PRESETS["cpu"])
    for r in runs:
        rounds, every = r.config["num-server-rounds"], r.config["eval-every"]
        points = [(k, 0.1 * r.seed + 0.01 * k) for k in range(0, rounds + 1, every)]
        if points[-1][0] != rounds:
            points.append((rounds, 0.1 * r.seed + 0.01 * rounds))
        _fake_run(tmp_path, r.name, {}, {}, points)
    result = protocols.curves_report(tmp_path, runs, "decentralized", "t")
    panel = result["panels"]["local-epochs"]["local-epochs = 3 (2 rounds)"]
    assert panel["epochs"] == [0, 3, 6]  # rounds x tau
    np.testing.assert_allclose(panel["mean_success"], [0.05, 0.06, 0.07])
    assert panel["final"]["values"] == pytest.approx([0.02, 0.12])
    assert (tmp_path / "decentralized.png").stat().st_size > 0 and set(result["panels"]) == {"tasks-per-client", "clients-per-round", "local-epochs"}


def test_heterogeneity_report_gives_each_effects_direction_with_its_paired_test(tmp_path):
    runs = protocols.heterogeneity_runs("cpu", [0, 1, 2], protocols.PRESETS["cpu"], "labels.json")
    low_minus_high = {"preference": [0.1, 0.2, 0.1], "coverage": [0.0, 0.0, 0.0], "hardness": [-0.2, -0.1, -0.2]}
    for r in runs:
        low = r.label.endswith(("0.1", "256"))
        final = 0.4 + (low_minus_high[r.group][r.seed] if low else 0.0)
        _fake_run(tmp_path, r.name, {}, {}, [(0, 0.3), (r.config["num-server-rounds"], final)])
    result = protocols.curves_report(tmp_path, runs, "heterogeneity", "t")
    text = (tmp_path / "heterogeneity.md").read_text()
    assert result["panels"]["preference"]["comparison"]["mean"] == pytest.approx(0.4 / 3)
    assert "preference: preference-omega = 0.1 above preference-omega = 0.9: not shown (difference +13.3" in text
    assert "coverage: coverage-xi = 256 above coverage-xi = 1: not shown (difference +0.0" in text
    assert result["panels"]["hardness"]["comparison"]["mean"] == pytest.approx(-0.5 / 3)  # the other way


def test_heterogeneity_runs_only_the_panels_asked_for(tmp_path, capsys):
    """One panel is 10 runs over 5 seeds instead of 30; without hardness no success labels are made."""
    runs = protocols.heterogeneity_runs("cpu", [0, 1], protocols.PRESETS["cpu"], None, ("preference",))
    assert [r.name for r in runs] == ["het-preference-0.1-s0", "het-preference-0.9-s0", "het-preference-0.1-s1",
                                      "het-preference-0.9-s1"]
    protocols.main(["heterogeneity", "--dry-run", "--panels", "preference", "--seeds", "0", "--out", str(tmp_path),
                    "--set", "preference-mix=dirichlet"])
    printed = capsys.readouterr().out
    assert "het-preference-0.9-s0" in printed and "het-coverage" not in printed and "het-hardness" not in printed
    assert "--preference-mix dirichlet" in printed
    assert not (tmp_path / "success_labels.json").exists()


def test_set_overrides_are_checked():
    assert protocols.parse_set(["learning-rate=1e-5", "num-server-rounds=2"]) == {"learning-rate": 1e-5, "num-server-rounds": 2}
    with pytest.raises(SystemExit, match="run-config key"):
        protocols.parse_set(["rounds=3"])
    with pytest.raises(SystemExit, match="takes a int"):
        protocols.parse_set(["num-server-rounds=many"])


def test_each_protocol_folder_gets_its_own_flower_home_and_ports(tmp_path):
    a = protocols.isolated_env(tmp_path / "a")
    assert a["FLWR_HOME"] == str(tmp_path / "a" / ".flwr")
    assert a == protocols.isolated_env(tmp_path / "a")  # a rerun reuses its SuperLink
    assert int(a["FLWR_LOCAL_CONTROL_API_PORT"]) == int(a["FLWR_LOCAL_SUPERLINK_HTTP_API_PORT"]) + 2
    assert a["FLWR_LOCAL_SUPERLINK_HTTP_API_PORT"] != "39091"  # not the default shared by plain `flwr run`


def test_an_ordering_needs_two_seeds_and_a_spread_to_be_claimed():
    from fedagent_flwr.experiments.seed_statistics import ordering, paired_difference

    one = paired_difference({0: 0.9}, {0: 0.1})
    assert one["n"] == 1 and math.isnan(one["p"]) and "not shown" in ordering("A", "B", one)
    tie = paired_difference({0: 0.5, 1: 0.6}, {0: 0.5, 1: 0.6})
    assert tie["mean"] == 0 and tie["p"] == 1.0 and "not shown" in ordering("A", "B", tie)
    behind = paired_difference({0: 0.1, 1: 0.2, 2: 0.1}, {0: 0.5, 1: 0.7, 2: 0.6})
    assert behind["p"] < 0.05 and "not shown" in ordering("A", "B", behind)  # significant, but the other way
    only_shared = paired_difference({0: 0.5, 1: 0.6, 5: 0.9}, {0: 0.4, 1: 0.4})
    assert only_shared["seeds"] == [0, 1]  # a seed one method lacks is left out, not paired with anything


@pytest.mark.parametrize("name, shown", [
    ("fedse-paper.toml", ('max-steps="babyai=20,webshop=10"', 'fedse-sft-epochs=2', 'fedse-lr-schedule="cosine"',
                          'history-length=40', 'eval-tasks="webshop=200,babyai=90,wordle=25"', 'lora-target-modules="all-linear"')),
    ("fedse-paper-v1.toml", ('fedse-loss-tokens="action"', 'fedse-learning-rate=0.0002')),
])
def test_the_fedse_paper_dry_run_prints_each_methods_checked_keys(capsys, name, shown):
    """Each Fed-SE preset's dry run shows every method's keys with the preset's values: the second version's (the
    whole episode as history, 2 epochs under a cosine rate, the turn limits and test-set sizes) and the first's (the
    action given the reasoning, Eq. 7)."""
    from fedagent_flwr.experiments import fedse_protocol

    preset = Path(protocols.APP_DIR) / "configs" / name
    assert fedse_protocol.main(["--run-config", str(preset), "--out", "unused", "--dry-run", "--ranks", ""]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("[fedse-protocol]")]
    assert len(lines) == len(fedse_protocol.METHODS)
    assert all('env="babyai,webshop,textcraft,maze,wordle"' in line and all(key in line for key in shown) for line in lines)
