"""Protocol commands: run plans keep budgets equal, cpu presets are feasible, reports aggregate correctly."""

from __future__ import annotations

import json
from collections import Counter
import math
from pathlib import Path

import numpy as np
import pytest

from envs import make_env
from fedagent_flwr.experiments import protocols
from fedagent_flwr.methods.tasks import all_partitions
from fedagent_flwr.config import RunConfig
from fedagent_flwr.atomic import write_json_atomic
from placed import rollout_config


def full(run) -> RunConfig:
    return RunConfig.from_run_config(RunConfig().to_run_config() | run.config)


@pytest.mark.parametrize("preset", ["cpu", "paper"])
def test_table1_methods_share_every_budget_key(preset):
    runs = protocols.table1_runs(preset, [0, 1, 2], protocols.PRESETS[preset], protocols.LOCAL_CLIENTS[preset])
    assert len(runs) == 3 * (3 + len(protocols.LOCAL_CLIENTS[preset]))
    for seed in (0, 1, 2):
        group = [r for r in runs if r.seed == seed and not r.group.endswith("compute-matched")]
        strip = [{k: v for k, v in r.config.items() if k not in ("baseline.name", "baseline.local-client")} for r in group]
        assert all(s == strip[0] for s in strip)  # same rounds, epochs, tasks per epoch, seed ...
        assert sorted(r.config.get("baseline.name", "none") for r in group)[:2] == ["centralized", "local"]
        # The compute-matched Local differs from Local (client k) in its episodes a round alone: a round's clients x.
        matched, = [r for r in runs if r.seed == seed and r.group.endswith("compute-matched")]
        alone, = [r for r in group if r.name == matched.name.replace("-matched", "")]
        diff = {k for k in matched.config.keys() | alone.config.keys() if matched.config.get(k) != alone.config.get(k)}
        assert diff == {"grpo.tasks-per-epoch"} and matched.cores == full(alone).clients_per_round > 1
        assert matched.config["grpo.tasks-per-epoch"] == alone.config["grpo.tasks-per-epoch"] * full(alone).clients_per_round
    if preset == "paper":
        c = runs[0].config
        assert (c["num-clients"], c["clients-per-round"], c["grpo.local-epochs"], c["num-server-rounds"]) == (100, 2, 3, 70)
        assert c["grpo.tasks-per-epoch"] * c["grpo.num-generations"] == 64  # the reference's 8 tasks x rollout.n = 8 per epoch
        assert protocols.LOCAL_CLIENTS["paper"] == (21, 42, 84)


def test_the_paper_table1_dry_run_runs_the_reference_procedure(tmp_path, capsys):
    """Every Table 1 run of the paper preset, FedAgent and baselines alike, trains and evaluates as the FedAgent
    reference does (docs/presets.md): sampled training at 1.0, validation sampled at 0.4,
    the KL anchored to the base model, verl's token-mean loss without group filtering, AdamW weight decay 0.01, the
    per-step, format-only rollout.invalid-action penalty, and minibatches split as the reference splits them (4 micro-batches
    of 16 length-balanced rows, the batch padded with copies)."""
    assert protocols.main(["table1", "--preset", "paper", "--dry-run", "--out", str(tmp_path)]) in (0, None)
    commands = [line for line in capsys.readouterr().out.splitlines() if "fedagent_flwr.simulation" in line]
    assert len(commands) == 18
    reference = ["--rollout.temperature 1.0", "--eval.temperature 0.4", "--grpo.kl-reference base",
                 "--grpo.loss-aggregation micro-batch-token-mean", "--grpo.uniform-groups keep", "--grpo.weight-decay 0.01",
                 "--rollout.invalid-action malformed", "--rollout.invalid-penalty-scope step", "--grpo.beta 0.01", "--grpo.learning-rate 1e-06",
                 "--rollout.history-length 2", "--grpo.num-generations 8", "--grpo.clip-ratio-c 3.0", "--grpo.kl-clamp 10.0", "--grpo.entropy-coeff 0.001",
                 "--grpo.reward-std-ddof 1", "--rollout.answer-parsing reference", "--rollout.prompt-template reference",
                 "--partition.scheme uniform-windows", "--partition.seed -1", "--federation.client-sampling reference", "--rollout.max-steps 0",
                 "--grpo.mini-batch-size 64", "--grpo.ppo-micro-batch-size-per-gpu 16", "--grpo.balance-micro-batches True", "--grpo.batch-padding copy"]
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
    moved = [[[t.id for t in p] for p in all_partitions(RunConfig.from_run_config({"seed": s, "num-clients": k, "partition.tasks-per-client": 4}), k)]
             for s in (0, 1)]
    assert moved[0] != moved[1]  # partition.seed=-1 (the default) keeps the old behaviour: the run seed decides


def test_decentralized_keeps_total_epochs_fixed_on_the_epochs_panel():
    for preset in ("cpu", "paper"):
        runs = protocols.decentralized_runs(preset, [0], protocols.PRESETS[preset])
        tau_runs = [r for r in runs if r.group == "grpo.local-epochs"]
        total = {r.config["grpo.local-epochs"] * r.config["num-server-rounds"] for r in tau_runs}
        assert total == {protocols.DECENTRALIZED[preset]["total-epochs"]}
    paper = {r.config["grpo.local-epochs"]: r.config["num-server-rounds"]
             for r in protocols.decentralized_runs("paper", [0], protocols.PRESETS["paper"]) if r.group == "grpo.local-epochs"}
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
    assert ("preference", "partition.preference-omega = 0.1") in values and ("hardness", "partition.hardness-xi = 1") in values


def _fake_run(out, name, final, initial, curve_points=None, tau=1):
    d = out / "runs" / name
    d.mkdir(parents=True)
    (d / "summary.json").write_text(json.dumps({"final": final, "initial": initial}))
    rows = [{"round": r, "eval/success_rate": y} for r, y in (curve_points or [])]
    (d / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows))


def test_table1_report_gives_mean_and_standard_error(tmp_path):
    runs = protocols.table1_runs("cpu", [0, 1, 2], protocols.PRESETS["cpu"], (1,))
    finals = {"FedAgent": [0.5, 0.6, 0.7], "Centralized": [0.6, 0.6, 0.9], "Local (client 1)": [0.2, 0.4, 0.3],
              "Local (client 1), compute-matched": [0.3, 0.5, 0.4]}
    for r in runs:
        v = finals[r.group][r.seed]
        _fake_run(tmp_path, r.name, {"success_rate": v, "success_rate/near": 1.0, "success_rate/far": v / 2},
                  {"success_rate": [0.35, 0.4, 0.45][r.seed], "success_rate/near": 0.8, "success_rate/far": 0.1})
        clients = 8 if r.group == "FedAgent" else 1  # two rounds: each client's means and how many replied
        with (tmp_path / "runs" / r.name / "metrics.jsonl").open("a") as f:
            for round_ in (1, 2):
                f.write("\n" + json.dumps({"round": round_, "train/episodes": 16.0, "train/optimizer_steps": 2.5,
                                            "train/replies": clients}))
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
    assert "FedAgent - Local (client 1), compute-matched: +20.0 points" in verdicts  # an interval, not an ordering
    assert "FedAgent above Local (client 1), compute-matched" not in verdicts
    md = (tmp_path / "table1.md").read_text()
    # Each row with what its method spent: 8 clients x 2 rounds x 16 episodes for FedAgent, one learner's for Local.
    assert "| FedAgent | 30.0 ± 2.9 | 100.0 ± 0.0 | 60.0 ± 5.8 | 256 | 40 |" in md
    assert "| Local (client 1) | 15.0 ± 2.9 | 100.0 ± 0.0 | 30.0 ± 5.8 | 32 | 5 |" in md
    # The table says what every learner trained on: client 1's 4 rooms by goal direction, and each client's.
    held = result["local_tasks"]["Local (client 1)"]
    assert sum(held.values()) == 4 and set(held) <= {"north-east", "north-west", "south-east", "south-west"}
    assert "; Local (client 1): " in md and "Training tasks by category: client 0: " in md
    assert len(result["client_tasks"]) == 8
    assert json.loads((tmp_path / "table1.json").read_text())["rows"]["Local (client 1)"]["overall"]["n"] == 3


def test_a_skewed_table1_names_its_setting_and_each_local_clients_single_category(tmp_path):
    """docs/heterogeneity.md's skewed Table 1: the reference's Dirichlet preference draw at omega 0.9 leaves the cpu
    preset's Local clients 1 and 3 one goal direction each; the table's title and Local lines must say so."""
    sets = ["partition.scheme=preference", "partition.preference-omega=0.9", "partition.preference-mix=dirichlet"]
    base = protocols.PRESETS["cpu"] | protocols.parse_set(sets)
    runs = [r for r in protocols.table1_runs("cpu", [0], base, (1, 3), matched=False) if r.group.startswith("Local")]
    assert [protocols.run_holdings(r) for r in runs] == [{"client 1": {"north-east": 4}}, {"client 3": {"south-west": 4}}]
    title = protocols.setting("cpu", base, sets)
    assert title.endswith("; --set partition.scheme=preference partition.preference-omega=0.9 partition.preference-mix=dirichlet")
    assert protocols.setting("cpu", protocols.PRESETS["cpu"], []) == "cpu preset: env gridworld, model tiny, K=8"


def test_curves_report_plots_success_against_epochs(tmp_path):
    runs = protocols.decentralized_runs("cpu", [0, 1], protocols.PRESETS["cpu"])
    for r in runs:
        rounds, every = r.config["num-server-rounds"], r.config["eval.test-freq"]
        points = [(k, 0.1 * r.seed + 0.01 * k) for k in range(0, rounds + 1, every)]
        if points[-1][0] != rounds:
            points.append((rounds, 0.1 * r.seed + 0.01 * rounds))
        _fake_run(tmp_path, r.name, {}, {}, points)
    result = protocols.curves_report(tmp_path, runs, "decentralized", "t")
    panel = result["panels"]["grpo.local-epochs"]["grpo.local-epochs = 3 (2 rounds)"]
    assert panel["epochs"] == [0, 3, 6]  # rounds x tau
    np.testing.assert_allclose(panel["mean_success"], [0.05, 0.06, 0.07])
    assert panel["final"]["values"] == pytest.approx([0.02, 0.12])
    assert (tmp_path / "decentralized.png").stat().st_size > 0 and set(result["panels"]) == {"partition.tasks-per-client", "clients-per-round", "grpo.local-epochs"}


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
    assert "preference: partition.preference-omega = 0.1 above partition.preference-omega = 0.9: not shown (difference +13.3" in text
    assert "coverage: partition.coverage-xi = 256 above partition.coverage-xi = 1: not shown (difference +0.0" in text
    assert result["panels"]["hardness"]["comparison"]["mean"] == pytest.approx(-0.5 / 3)  # the other way


def test_heterogeneity_runs_only_the_panels_asked_for(tmp_path, capsys):
    """One panel is 10 runs over 5 seeds instead of 30; without hardness no success labels are made."""
    runs = protocols.heterogeneity_runs("cpu", [0, 1], protocols.PRESETS["cpu"], None, ("preference",))
    assert [r.name for r in runs] == ["het-preference-0.1-s0", "het-preference-0.9-s0", "het-preference-0.1-s1",
                                      "het-preference-0.9-s1"]
    protocols.main(["heterogeneity", "--dry-run", "--panels", "preference", "--seeds", "0", "--out", str(tmp_path),
                    "--set", "partition.preference-mix=dirichlet"])
    printed = capsys.readouterr().out
    assert "het-preference-0.9-s0" in printed and "het-coverage" not in printed and "het-hardness" not in printed
    assert "--partition.preference-mix dirichlet" in printed
    assert not (tmp_path / "success_labels.json").exists()


def test_set_overrides_are_checked():
    assert protocols.parse_set(["grpo.learning-rate=1e-5", "num-server-rounds=2"]) == {"grpo.learning-rate": 1e-5, "num-server-rounds": 2}
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
    assert ordering("A", "B", one).endswith("points in 1 seed; no test over seeds)") and "nan" not in ordering("A", "B", one)
    # the same difference in both seeds (success rates are multiples of 1/144): no spread, so no "holds" from p = 0
    same = paired_difference({0: 77 / 144, 1: 66 / 144}, {0: 67 / 144, 1: 56 / 144})
    assert ordering("A", "B", same) == ("A above B: not shown (difference +6.9 points in each of 2 seeds: no spread "
                                        "over seeds to test it against)")
    tie = paired_difference({0: 0.5, 1: 0.6}, {0: 0.5, 1: 0.6})
    assert tie["mean"] == 0 and tie["p"] == 1.0 and "not shown" in ordering("A", "B", tie)
    behind = paired_difference({0: 0.1, 1: 0.2, 2: 0.1}, {0: 0.5, 1: 0.7, 2: 0.6})
    assert behind["p"] < 0.05 and "not shown" in ordering("A", "B", behind)  # significant, but the other way
    only_shared = paired_difference({0: 0.5, 1: 0.6, 5: 0.9}, {0: 0.4, 1: 0.4})
    assert only_shared["seeds"] == [0, 1]  # a seed one method lacks is left out, not paired with anything


@pytest.mark.parametrize("name, shown", [
    ("fedse-paper.toml", ('rollout.max-steps="babyai=20,webshop=10"', 'fedse.num-train-epochs=2', 'fedse.lr-scheduler-type="cosine"',
                          'rollout.prompt-template="agentgym"', 'rollout.answer-parsing="agentgym"',
                          'rollout.history-length=40', 'eval.tasks="webshop=200,babyai=90,wordle=25"', 'lora.target-modules="all-linear"')),
    ("fedse-paper-v1.toml", ('fedse.loss-tokens="action"', 'fedse.learning-rate=0.0002')),
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


DIRECTIONS = protocols.APP_DIR / "configs" / "smollm2-fedagent-directions-cpu.toml"
SPLIT_KEYS = {"partition.scheme", "partition.preference-mix", "partition.preference-omega", "partition.seed"}


def _client_directions(config: dict) -> list[dict[str, int]]:
    cfg = RunConfig.from_run_config(RunConfig().to_run_config() | config)
    return [next(iter(h.values())) for h in (protocols.holdings(cfg, [p]) for p in all_partitions(cfg, cfg.num_clients))]


def test_the_directions_preset_is_the_smollm2_preset_with_one_goal_direction_a_client():
    """configs/smollm2-fedagent-directions-cpu.toml: the uniform SmolLM2 preset's every value but the split, and a split
    in which each client holds one goal direction and together all four, as its comment says; partition.seed 4 the
    smallest seed that does it; the held-out counts the comment quotes."""
    from fedagent_flwr.simulation import read_run_config_file

    name, directions = protocols.resolve_preset(str(DIRECTIONS))
    uniform = read_run_config_file(str(protocols.APP_DIR / "configs" / "smollm2-fedagent-cpu.toml"))
    assert name == "smollm2-fedagent-directions-cpu" and set(directions) - set(uniform) == SPLIT_KEYS
    assert {k: v for k, v in directions.items() if k not in SPLIT_KEYS} == uniform
    held = _client_directions(directions)
    assert all(len(h) == 1 for h in held) and len({next(iter(h)) for h in held}) == 4
    comment = " ".join(line.lstrip("# ") for line in DIRECTIONS.read_text().splitlines() if line.startswith("#"))
    for k, h in enumerate(held):
        (direction, n), = h.items()
        assert f"client {k} {direction} {n}" in comment
    smaller = [_client_directions(directions | {"partition.seed": s}) for s in range(directions["partition.seed"])]
    assert not any(all(len(h) == 1 for h in d) and len({next(iter(h)) for h in d}) == 4 for d in smaller)
    rooms = Counter(t.category for t in make_env("gridworld").tasks_of_split("test"))
    assert "(" + ", ".join(f"{c} {n}" for c, n in sorted(rooms.items())) + ")" in comment
    with pytest.raises(SystemExit, match="--preset 'nowhere': expected one of cpu, paper or the path"):
        protocols.resolve_preset("nowhere")


def _episodes(out, name, wins: dict[str, list[int]]):
    d = out / "runs" / name / "episodes"
    d.mkdir(parents=True, exist_ok=True)
    kind = {"a": "near", "b": "near", "c": "far", "d": "far"}
    write_json_atomic(d / "round-0003.json", {"episodes": [{"task": t, "won": w, "category": kind[t]}
                                                           for t, ws in wins.items() for w in ws]})


def test_table1_tests_each_seed_paired_over_the_held_out_rooms(tmp_path):
    """Within a seed, FedAgent and each baseline evaluated the same rooms: the table's per-seed line is their
    difference paired room by room (paired_rounds), besides the test over seeds."""
    runs = protocols.table1_runs("cpu", [0], protocols.PRESETS["cpu"], (1,))
    wins = {"FedAgent": {"a": [1, 1], "b": [1, 0], "c": [1, 1], "d": [0, 0]},
            "Local (client 1)": {"a": [0, 1], "b": [0, 0], "c": [0, 1], "d": [0, 0]}}
    for r in runs:
        room = wins.get(r.group, wins["Local (client 1)"])
        rate = sum(map(sum, room.values())) / 8
        _fake_run(tmp_path, r.name, {"success_rate": rate}, {"success_rate": 0.2})
        _episodes(tmp_path, r.name, room)
    result = protocols.table1_report(tmp_path, runs, "t")
    t = result["within_seed"]["FedAgent - Local (client 1)"]["0"]  # per room 0.5, 0.5, 0.5, 0: mean 0.375
    assert t["n"] == 4 and t["mean"] == pytest.approx(0.375) and t["se"] == pytest.approx(0.125)
    assert ("FedAgent - Local (client 1), seed 0, paired over 4 held-out rooms: +37.5 ± 12.5 points"
            in "\n".join(result["verdict"]))
    # and over the rooms of each category: near rooms a, b (+0.5, +0.5), far rooms c, d (+0.5, 0)
    near, far = t["by_category"]["near"], t["by_category"]["far"]
    assert (near["n"], near["mean"], near["se"]) == (2, pytest.approx(0.5), pytest.approx(0.0))
    assert (far["n"], far["mean"], far["se"]) == (2, pytest.approx(0.25), pytest.approx(0.25))
    assert "by category: far +25.0 ± 25.0 (p = 0.500, 2 rooms), near +50.0 ± 0.0" in "\n".join(result["verdict"])
    assert set(result["within_seed"]) == {"FedAgent - Local (client 1)", "FedAgent - Centralized",
                                          "FedAgent - Local (client 1), compute-matched"}


def test_one_core_learners_run_side_by_side_each_on_its_own_superlink_and_thread(tmp_path):
    """--parallel 2 on CPUs: Local and Centralized (one learner on one core) go two at a time, one thread each and each
    with its own Flower home and ports; FedAgent and the compute-matched Local (the federation's cores) go alone."""
    runs = protocols.table1_runs("cpu", [0], protocols.PRESETS["cpu"], (1, 3))
    waves = [[r.group for r in w] for w in protocols.waves(runs, 2, num_gpus=0.0)]
    assert waves == [["FedAgent"], ["Local (client 1)", "Local (client 3)"], ["Centralized"],
                     ["Local (client 1), compute-matched"]]
    assert all(len(w) == 1 for w in protocols.waves(runs, 1, 0.0)) and all(len(w) == 1 for w in protocols.waves(runs, 2, 0.5))
    a, b = protocols.isolated_env(tmp_path, 0), protocols.isolated_env(tmp_path, 1, threads=1)
    keys = ("FLWR_HOME", "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT", "FLWR_LOCAL_CONTROL_API_PORT")
    assert all(a[k] != b[k] for k in keys) and b["OMP_NUM_THREADS"] == "1"
    assert protocols.isolated_env(tmp_path, 0) == a  # a rerun of the protocol finds the same ports
    assert protocols.main(["table1", "--preset", "cpu", "--seeds", "0", "--parallel", "2", "--dry-run",
                           "--out", str(tmp_path)]) is None
    with pytest.raises(SystemExit, match="--parallel 0: must be an integer >= 1"):
        protocols.main(["table1", "--preset", "cpu", "--parallel", "0", "--dry-run", "--out", str(tmp_path)])


def test_a_baseline_takes_its_first_evaluation_from_the_seeds_fedagent_run_and_a_stopped_run_is_kept(tmp_path):
    """Resuming a protocol reruns only what is missing: a run folder left without summary.json is moved aside (kept),
    and a baseline takes the evaluation before round 1 from its seed's FedAgent run once that run has played it."""
    runs = protocols.table1_runs("cpu", [0, 1], protocols.PRESETS["cpu"], (1,))
    local0 = next(r for r in runs if r.group == "Local (client 1)" and r.seed == 0)
    assert protocols.first_evaluation_source(local0, runs, tmp_path) is None  # FedAgent has not evaluated yet
    first = tmp_path / "runs" / "table1-fedagent-s0" / "episodes" / "round-0000.json"
    first.parent.mkdir(parents=True)
    first.write_text("{}")
    assert protocols.first_evaluation_source(local0, runs, tmp_path) == first.parents[1]
    assert protocols.first_evaluation_source(runs[0], runs, tmp_path) is None  # FedAgent evaluates itself
    other_seed = next(r for r in runs if r.group == "Local (client 1)" and r.seed == 1)
    assert protocols.first_evaluation_source(other_seed, runs, tmp_path) is None
    stopped = tmp_path / "runs" / "table1-local1-s0"
    (stopped / "episodes").mkdir(parents=True)
    assert protocols.set_aside(stopped) == tmp_path / "runs" / "table1-local1-s0.stopped-1" and not stopped.exists()
    stopped.mkdir()
    assert protocols.set_aside(stopped).name == "table1-local1-s0.stopped-2"
    assert (tmp_path / "runs" / "table1-local1-s0.stopped-1" / "episodes").is_dir()
    assert protocols.set_aside(stopped) is None


def test_a_run_stopped_after_a_saved_round_is_resumed_not_started_again(tmp_path, capsys):
    runs = [r for r in protocols.table1_runs("cpu", [0], protocols.PRESETS["cpu"], (1,)) if r.name == "table1-fedagent-s0"]
    saved = tmp_path / "runs" / "table1-fedagent-s0"
    (saved / "state").mkdir(parents=True)
    assert not protocols.resumable(saved)  # a state folder still being written has no manifest yet
    (saved / "state" / "manifest.json").write_text("{}")
    assert protocols.resumable(saved)
    protocols.execute(runs, tmp_path, 1, 0.0, dry_run=True)
    out = capsys.readouterr().out
    assert "resumed after its last saved round" in out and out.rstrip().endswith("--resume true")
    (saved / "summary.json").write_text("{}")  # finished: reused, neither resumed nor rerun
    assert not protocols.resumable(saved)


def test_a_baselines_command_names_its_first_evaluation_by_the_keys_name(tmp_path, capsys):
    """The flag a baseline takes its seed's first evaluation with is the key's name today (an old flat name is refused
    by run_simulation.py with exit 2, which stopped the first matched Local run)."""
    from fedagent_flwr.simulation import renamed_flag

    runs = protocols.table1_runs("cpu", [0], protocols.PRESETS["cpu"], (1,))
    first = tmp_path / "runs" / "table1-fedagent-s0"
    (first / "episodes").mkdir(parents=True)
    (first / "episodes" / "round-0000.json").write_text("{}")
    (first / "summary.json").write_text("{}")
    protocols.execute(runs, tmp_path, 1, 0.0, dry_run=True)
    lines = [line.split() for line in capsys.readouterr().out.splitlines() if line.startswith("  ")]
    assert any("--eval.initial-evaluation" in args for args in lines)
    assert all(renamed_flag(args) is None for args in lines)

