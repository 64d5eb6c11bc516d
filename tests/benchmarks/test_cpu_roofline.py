"""benchmarks/cpu_roofline.py: the positions each phase's passes run the weights at, counted as the sampler and the
trainer compute them, and the whole script on a tiny preset; benchmarks/performance_figures.py, which writes the
performance pages' tables and figures from the records (tests/records compares the pages): how it picks a processor's
rooflines, and what the records say where the pages draw a conclusion from them."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmark_scripts import load_script

roofline = load_script("cpu_roofline")
figures = load_script("performance_figures")
ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"


def test_the_sampler_is_split_into_its_prefill_and_token_steps_and_their_positions_counted(tiny_lm, maze_tokenizer):
    from fedagent_flwr.agent.engine.sampling import sample_batch

    shared = list(range(3, 13))  # 10 tokens: at least MIN_SHARED_PREFIX, so the sampler computes it once
    prompts = [shared + [20, 21, 22], shared + [23], shared + [24, 25], shared + [20, 21, 22]]  # the last a repeat
    meter = roofline.PhaseMeter()
    torch.manual_seed(0)
    with roofline.instrumented(meter):
        rows = sample_batch(tiny_lm, prompts, maze_tokenizer.pad_token_id, [maze_tokenizer.eos_token_id], 6, 1.0, engine="hf")
    # the prefix once, then 3 distinct prompts' rests left-padded to 3 tokens
    assert meter.body_model["rollout prefill"] == 10 + 3 + 1 + 2
    assert meter.body_computed["rollout prefill"] == 10 + 3 * 3
    assert meter.head["rollout prefill"] == 1 + 3  # the prefix's last position, each distinct prompt's last
    # a row is advanced once per token it drew, but its last
    assert meter.counts["rollout row steps"] == meter.body_model["rollout decode"] == sum(len(r) - 1 for r in rows)
    assert meter.seconds["rollout prefill"] > 0 and meter.seconds["rollout decode"] > 0
    assert meter.counts["rollout prompts"] == 4 and meter.counts["rollout distinct prompts"] == 3


def test_the_update_backward_counts_one_forward_for_lora_two_for_a_full_model_and_recomputation_as_computed_only():
    meter = roofline.PhaseMeter()
    meter.body_computed["update forward"], meter.body_model["update forward"], meter.head["update forward"] = 100, 80, 20
    for phase, seconds in {"update total": 10.0, "update backward": 4.0, "optimizer step": 1.0,
                           "reference log-probs": 2.0}.items():
        meter.add(phase, seconds)
    peaks = {"fp32": {"peak_flops": 1e9}, "bf16": {"peak_flops": 2e9}}
    shape = roofline.FlopShape(body=1000, head=40)
    lora = roofline.phase_table(meter, shape, "fp32", True, peaks, 0.0)["phases"]
    full = roofline.phase_table(meter, shape, "bf16-mixed", False, peaks, 0.5)["phases"]
    forward = 2 * (1000 * 100 + 40 * 20) / 1e9
    assert lora["update forward"]["gflop_computed"] == pytest.approx(forward)
    assert lora["update forward"]["seconds"] == pytest.approx(10 - 2 - 4 - 1)  # the rest of the update's time
    assert lora["update backward"]["gflop_computed"] == pytest.approx(forward)
    assert full["update backward"]["gflop_computed"] == pytest.approx(2.5 * forward)  # two passes, half recomputed
    assert full["update backward"]["gflop_model"] == pytest.approx(2 * 2 * (1000 * 80 + 40 * 20) / 1e9)
    # set against the peak of the dtype the matmuls run in
    assert full["update forward"]["share_of_peak"] == pytest.approx(forward * 1e9 / 3.0 / 2e9)
    assert lora["update forward"]["share_of_peak"] == pytest.approx(forward * 1e9 / 3.0 / 1e9)


def test_trls_fine_tuning_is_split_into_its_forward_backward_and_optimizer_step_and_its_positions_counted(
        tiny_lm, maze_tokenizer):
    """Fed-SE's update: TRL's loss counted at the padded batch's positions (its head at the completions'), its backward
    and optimizer step timed apart, one each per micro-batch and per step."""
    import copy
    import random

    import fedagent_flwr.agent.self_evolution as self_evolution
    from fedagent_flwr.agent.training.sft import SupervisedConfig

    unwrapped = self_evolution.supervised_finetune  # the name the round calls, which the wrapper replaces

    rng = random.Random(0)
    samples = [([rng.randrange(3, 30) for _ in range(rng.randrange(4, 9))],
                [rng.randrange(3, 30) for _ in range(rng.randrange(2, 5))]) for _ in range(8)]
    meter = roofline.PhaseMeter()
    with roofline.instrumented(meter):
        from peft import LoraConfig, get_peft_model

        adapted = get_peft_model(copy.deepcopy(tiny_lm), LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))  # as Fed-SE
        self_evolution.supervised_finetune(adapted, samples, maze_tokenizer,
                                           SupervisedConfig(steps=2, batch_size=4, micro_batch_size=2, seed=3))
    passes = meter.counts["update forward passes"]
    assert passes == 4  # 2 steps of 2 micro-batches
    tokens = sum(len(p) + len(c) for p, c in samples)  # 8 samples drawn once over the 2 steps of 4
    assert meter.body_model["update forward"] == tokens
    assert meter.body_computed["update forward"] >= tokens
    # the head where TRL's fused head ran: the completions' positions (sft.head_at_loss_positions)
    assert meter.head["update forward"] == meter.counts["sft loss tokens"] == sum(len(c) for _, c in samples)
    for phase in ("update total", "update forward (timed)", "update backward", "optimizer step"):
        assert meter.seconds[phase] > 0, phase
    assert meter.seconds["update total"] > meter.seconds["update forward (timed)"] + meter.seconds["update backward"]
    assert self_evolution.supervised_finetune is unwrapped  # put back on leaving
    from trl.trainer import utils as trl_utils

    assert "apply" not in vars(trl_utils._ChunkedLogProbFunction)  # the autograd Function's own `apply` uncovered


@pytest.mark.parametrize("preset, rounds, expected", [("fedagent-cpu.toml", "2", "strategy is 'fedagent-avg'"),
                                                      ("fedse-cpu.toml", "0", "must be at least 1")])
def test_fedse_rounds_is_refused_before_any_work_where_it_means_nothing(preset, rounds, expected, capsys):
    with pytest.raises(SystemExit):
        roofline.main(["--run-config", str(ROOT / "configs" / preset), "--fedse-rounds", rounds])
    assert expected in capsys.readouterr().err


def test_a_fedse_round_has_no_log_prob_passes_and_its_trainers_own_work_is_a_phase():
    meter = roofline.PhaseMeter()
    meter.body_computed["update forward"], meter.body_model["update forward"], meter.head["update forward"] = 100, 80, 100
    for phase, seconds in {"update total": 10.0, "update forward (timed)": 3.0, "update backward": 4.0,
                           "optimizer step": 1.0, "rollout total": 5.0, "rollout prefill": 2.0, "rollout decode": 2.5}.items():
        meter.add(phase, seconds)
    peaks = {"fp32": {"peak_flops": 1e9}, "bf16": {"peak_flops": 2e9}}
    table = roofline.phase_table(meter, roofline.FlopShape(body=1000, head=40), "fp32", True, peaks, 0.0,
                                 roofline.SFT_PHASES)
    rows = table["phases"]
    assert list(rows) == list(roofline.SFT_PHASES) and "reference log-probs" not in rows
    assert rows["update forward"]["seconds"] == 3.0 and rows["update other"]["seconds"] == pytest.approx(10 - 3 - 4 - 1)
    assert rows["rollout other"]["seconds"] == pytest.approx(0.5) and table["total_seconds"] == pytest.approx(15.0)
    assert rows["update backward"]["gflop_computed"] == rows["update forward"]["gflop_computed"] == pytest.approx(
        2 * (1000 * 100 + 40 * 100) / 1e9)


@pytest.mark.slow  # a client's round and an evaluation of a tiny preset in a subprocess (about 45 s each)
@pytest.mark.parametrize("preset", ["fedagent-cpu.toml", "fedse-cpu.toml"])
def test_the_script_reports_every_phase_on_a_tiny_round(preset):
    fedse_rounds = ["--fedse-rounds", "2"] if preset.startswith("fedse") else []  # Fed-SE: its second round measured
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "cpu_roofline.py"), "--run-config",
                           str(ROOT / "configs" / preset), "--eval-tasks", "2", *fedse_rounds, "--json"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    fedse = report["strategy"] == "fedse-lora"
    assert list(report["phases"]) == list(roofline.SFT_PHASES if fedse else roofline.PHASES)
    for phase in ("rollout prefill", "rollout decode", "update forward", "update backward", "evaluation prefill",
                  "evaluation decode"):
        row = report["phases"][phase]
        assert row["seconds"] > 0 and row["gflop_computed"] >= row["gflop_model"] > 0, phase
        assert 0 < row["share_of_peak"] < 2, phase  # a rate near the measured peak, not a unit slip
    assert sum(r["share_of_round"] for r in report["phases"].values()) == pytest.approx(1.0)
    assert report["peaks"]["fp32"]["peak_flops"] > 0 and report["peaks"]["bf16"]["decode_sweep_flops"] > 0
    if fedse:  # the second round alone: the preset's 10 steps of one pass each, and the Trainer's own work
        assert report["fedse_rounds"] == 2 and report["round"]["episodes"] == 4 * 2  # 4 rooms, 2 samples each
        assert report["round"]["optimizer_steps"] == report["counts"]["update forward passes"] == 10
        assert report["round"]["train_samples"] > 0 and report["phases"]["update other"]["seconds"] > 0


def test_peaks_only_measures_both_dtypes_of_the_models_shapes_without_a_round():
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "cpu_roofline.py"), "--run-config",
                           str(ROOT / "configs" / "fedagent-cpu.toml"), "--peaks-only", "--decode-rows", "4", "--json"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert "phases" not in report and set(report["peaks"]) == {"fp32", "bf16"}
    fp32, bf16 = report["peaks"]["fp32"], report["peaks"]["bf16"]
    assert bf16["decode_rows"] == 4 and len(fp32["shapes"]) >= 4  # the tiny model's distinct linear shapes
    assert report["bf16_over_fp32"] == bf16["peak_flops"] / fp32["peak_flops"] > 0
    assert report["bf16_over_fp32_decode_sweep"] == bf16["decode_sweep_flops"] / fp32["decode_sweep_flops"]


def test_a_runs_minutes_are_its_waves_of_client_rounds_and_two_evaluations_shared_by_the_cores():
    report = {"dtype": "fp32", "peaks": {"fp32": {"peak_flops": 1e9}}, "evaluation": {"episodes": 10},
              "phases": {"rollout prefill": {"seconds": 60.0, "gflop_computed": 30.0},
                         "update forward": {"seconds": 60.0, "gflop_computed": 30.0},
                         "evaluation decode": {"seconds": 30.0, "gflop_computed": 10.0}}}
    run = roofline.run_minutes(report, clients=3, cores=2, rounds=2, eval_episodes=20)
    assert run["measured_rates"] == pytest.approx((2 * 2 * 120 + 2 * 20 * 3.0 / 2) / 60)  # 2 waves of 3 clients
    assert run["at_the_peak"] == pytest.approx((2 * 3 * 60 + 2 * 20 * 1.0) / (2 * 1.0) / 60)


def test_the_presets_comment_gives_where_its_runs_time_went_as_the_records_do():
    """configs/smollm2-fedagent-cpu.toml's speed comment: the shares of the Xeon-with-AMX runs' time, from run_shares."""
    comment = " ".join(line.lstrip("# ") for line in (ROOT / "configs" / "smollm2-fedagent-cpu.toml").read_text()
                       .splitlines() if line.startswith("#"))
    shares = [figures.run_shares(r) for r in figures.SEED_RUNS["preset"]
              if figures.machine(r) == figures.MACHINES["amx"]]
    span = lambda part: "-".join(dict.fromkeys(f"{100 * s[part]:.0f}" for s in sorted(shares, key=lambda s: s[part])))  # noqa: E731
    assert (f"about {span('update')} % the clients' updates, {span('rollout')} % their rollouts, "
            f"{span('evaluation')} % the two evaluations") in comment


def test_best_rate_minutes_puts_each_pass_at_the_best_rate_of_its_kind_and_keeps_a_faster_one():
    phase = lambda seconds, gflop: {"seconds": seconds, "gflop_computed": gflop, "gflop_per_s": gflop / seconds if gflop  # noqa: E731
                                    else 0.0}
    report = {"dtype": "bf16", "evaluation": {"episodes": 144},
              "peaks": {"bf16": {"peak_flops": 200e9, "decode_sweep_flops": 50e9}},
              "phases": {"rollout prefill": phase(10.0, 1000.0), "update backward": phase(20.0, 1000.0),
                         "rollout decode": phase(10.0, 100.0), "rollout other": phase(1.0, 0.0),
                         "evaluation prefill": phase(5.0, 500.0), "evaluation decode": phase(1.0, 100.0)}}
    # sequences at 100 GFLOP/s (the prefills'): the backward 10 s; the rollout decode at the sweep: 2 s; the
    # evaluation's decode (100 GFLOP/s) faster than the sweep already keeps its 1 s; a phase of no FLOPs keeps its own
    client, evaluation = 10 + 10 + 2 + 1, 5 + 1
    best = roofline.best_rate_minutes(report)
    assert best["best_sequence_gflop_per_s"] == 100 and best["sweep_gflop_per_s"] == 50
    assert best["minutes"] == pytest.approx((3 * 2 * client + 2 * 144 * evaluation / 144 / 2) / 60)



def test_a_processors_table_takes_its_latest_roofline_of_each_preset_and_precision_and_marks_the_rest():
    latest = figures.latest_rooflines()
    assert set(latest) == set(figures.PROCESSORS)
    amx = latest["Intel Xeon with AMX"]
    assert amx[("FedAgentAvg", "bf16-base")] == "2026-12-04-cpu/cpu_roofline.after.json"  # after the prefill's fix
    assert latest["AMD EPYC with AVX-512 bf16, no AMX"][("Fed-SE", "fp32")].startswith("2026-12-06-cpu/")  # the head's
    table = figures.processor_table("Intel Xeon with AMX")
    rows = [line for line in table if line.startswith("| Fed")]
    assert len(rows) == len(figures.ROUNDS) and all(line.count("|") == table[2].count("|") for line in rows)
    assert sum("not measured" in line for line in rows) == len(figures.ROUNDS) - len(amx)
    for line in rows:  # a round's shares: its rollout, update and evaluation, the whole round within rounding
        cells = [c.strip() for c in line.split("|")[1:-1]]
        if cells[2] != "not measured":
            assert 98 <= sum(int(c.rstrip(" %")) for c in cells[4:7]) <= 101, line


def test_the_records_bear_out_what_the_performance_notes_conclude_from_them():
    """The notes' words that are not numbers ("not shown", "the same episodes", "above 20 minutes") follow from the
    records: each check here is one such word, on the records the generator reads."""
    from fedagent_flwr.experiments.paired_rounds import compare, evaluation_rounds

    record = figures.record
    bf16, after = record("2026-12-04-cpu/cpu_roofline.json"), record("2026-12-04-cpu/cpu_roofline.after.json")
    assert after["round"] == bf16["round"] and after["evaluation"] == bf16["evaluation"]  # the same episodes
    assert record("2026-12-04-cpu/prefill_head.json")["max_logit_difference"] == 0  # "the logits identical"
    xeon = [record(f"2026-12-03-cpu/cpu_roofline{s}.json")["phases"]["evaluation decode"]["gflop_per_s"]
            for s in ("", ".fp32")]
    assert f"{xeon[1] / xeon[0]:.1f}" == "1.0"  # the decode gained "none in the evaluation"
    cast = record("2026-12-05-cpu/update_passes.input-cast.json")["variants"]
    assert cast["peft-input-cast=false"]["loss"][0] == cast["peft-input-cast=true"]["loss"][0]  # "the same bits"
    static = record("2026-12-05-cpu/cpu_round.eval-engines.json")["variants"]
    ratio = static["decode-engine=static,old-logprobs=recompute"]["eval_ratio"]
    assert ratio[0] - 2 * ratio[1] < 1  # "not shown"
    v = record("2026-12-05-cpu/update_passes.attention-amd.json")["variants"]
    ratios = [v[k]["update_ratio"] for k in list(v)[1:]]
    assert abs(ratios[0][0] - 1) < 2 * ratios[0][1] and all(r[0] + 2 * r[1] < 1 for r in ratios[1:])
    assert max(abs(e["loss"][0] - v[""]["loss"][0]) for e in v.values()) < 1e-7  # "equal to 1e-7"
    # 20 minutes out of reach by faster kernels: the FLOPs at the peak take longer, where the notes say so
    assert roofline.run_minutes(record("2026-12-05-cpu/cpu_roofline.amd.json"))["at_the_peak"] > 20
    fedse = [roofline.run_minutes(record(f"2026-12-05-cpu/cpu_roofline.fedse{s}-amd.json"))["at_the_peak"]
             for s in ("", "-bf16-mixed")]
    assert round(fedse[0]) > 20 > round(fedse[1])
    amd = record("2026-12-05-cpu/cpu_roofline.amd.json")["phases"]
    assert all(0.15 < amd[p]["share_of_peak"] < 0.25 for p in figures.DECODES)  # "about a fifth of the peak"
    # the rounds of 2026-12-06 did the work of 2026-12-05's, so their seconds compare
    for old, new in (("fedse-amd", "fedse-head-amd"), ("fedse-bf16-mixed-amd", "fedse-head-bf16-mixed-amd")):
        old, new = record(f"2026-12-05-cpu/cpu_roofline.{old}.json"), record(f"2026-12-06-cpu/cpu_roofline.{new}.json")
        assert old["counts"] == new["counts"] and old["round"] == new["round"]
    head = record("2026-12-06-cpu/sft_memory.head-amd.json")
    rows = {(r["head"], r["precision"]): r for r in head["measured"]}
    assert all(rows[("every", p)]["losses"] == rows[("loss", p)]["losses"] for p in ("fp32", "bf16-mixed"))
    assert record("2026-12-06-cpu/sft_memory.head-amd.first.json")["raw_output"]["git"]["commit"].startswith("8568fd8")
    sft = record("2026-12-06-cpu/sft_memory.bf16-base-amd.json")
    assert min(next(r["first_over_this"] for r in sft["precision_ratios"] if r["precision"] == "bf16-base")) < 1.01
    engines = record("2026-12-06-cpu/cpu_round.fedse-eval-engines-threads-amd.json")["variants"]
    base, static = (engines[k]["eval_ratio"]
                    for k in ("precision=bf16-base", "precision=bf16-base,decode-engine=static"))
    assert abs(static[0] - base[0]) < base[1] + static[1] + 0.02  # "gains nothing shown over hf"
    sampler = record("2026-12-06-cpu/cpu_round.fedse-eval-sampler-amd.json")["variants"]
    same = sampler[""]["eval_success"][1] == sampler["token-sampler=inverse-cdf"]["eval_success"][1] == 0
    assert same  # each sampler played the same episodes in every repeat
    t = record("2026-12-06-cpu/sampler_tails.fedse-amd.json")["temperatures"]["1.0"]
    for way in ("multinomial", "inverse-cdf"):  # "measurably alike": each within 2 standard errors of the expected
        assert abs(t[way]["tail_draws"] - t[way]["expected"]) < 2 * t[way]["expected_se"]
    new = record("2026-12-06-cpu/cpu_roofline.fedse-head-bf16-mixed-amd.json")["phases"]
    others = [r["share_of_peak"] for p, r in new.items() if r["share_of_peak"] and p not in figures.DECODES]
    assert all(new[p]["share_of_peak"] < min(others) for p in figures.DECODES)  # "the slowest phases against the peak"
    shares = figures.run_shares("2026-12-05-cpu/runs/fedse-preset-s0-amx")
    assert shares["waves"] == 2 and "rollout" not in shares  # "this run's records do not split the two"
    for rows in (15, 34):  # the decode profiles: the rows, precision and thread the notes name
        for precision in ("bf16-mixed", "bf16-base"):
            report = record(f"2026-12-06-cpu/decode_profile.fedse-{precision}-{rows}-amd.json")
            assert (report["batch"], report["precision"], report["threads"]) == (rows, precision, 1)
    for pair in zip(*figures.FEDSE_EAGER_RUNS.values()):  # round 1: the same exploration, so the same buffer
        first = [figures.metrics(r)[1] for r in pair]
        assert all(x["round"] == 1 for x in first)
        assert first[0]["train/success_rate"] == first[1]["train/success_rate"]
        assert first[0]["train/fedse/train-samples"] == first[1]["train/fedse/train-samples"]
    # the seed tables' verdicts
    for name, shown in (("SEED_RUNS", False), ("FEDSE_PRECISION_RUNS", False), ("FEDSE_BASE_RUNS", False),
                        ("FEDSE_EAGER_RUNS", False), ("FEDSE_SAMPLER_RUNS", True)):
        runs, seeds = figures.SEED_TABLES[name]
        d = figures.seed_table(runs, seeds)[1]["difference"]
        assert (d["p"] < 0.05) == shown, name
    precision = figures.seed_table(figures.FEDSE_PRECISION_RUNS)[1]["ratio"][figures.MACHINES["amd"]]
    assert precision["mean"] - 2 * precision["se"] > 1  # bf16-mixed "faster"
    each = figures.seed_table(figures.FEDSE_BASE_RUNS)[1]["each"]
    assert {x["mean"] > 0 for x in each} == {True, False}  # "not one way in every seed"
    assert all(x["mean"] > 0 for x in figures.seed_table(figures.FEDSE_SAMPLER_RUNS)[1]["each"])
    for run in figures.FEDSE_SAMPLER_MORE["multinomial"] + figures.FEDSE_SAMPLER_MORE["inverse-cdf"]:
        marks = evaluation_rounds(RESULTS / run)
        gain = compare(RESULTS / run, marks[-1], marks[0])
        assert gain["mean"] / gain["se"] > 3  # "every run gained beyond 3 standard errors"
    # what the kernels allow: between the two ends, and 20 minutes out of reach with every lever at its bound
    _, minutes = figures.kernels_allow()
    for run, best in minutes.values():
        assert run["at_the_peak"] < best["minutes"] < run["measured_rates"]
    assert minutes["FedAgentAvg"][0]["at_the_peak"] > 20
    added = [figures.run_shares(r)["minutes"] / minutes["Fed-SE"][0]["measured_rates"]
             for r in figures.FEDSE_BASE_RUNS["bf16-base"]]
    assert minutes["Fed-SE"][1]["minutes"] * min(added) > 20
    bounds = figures.lever_bounds()
    assert min(bounds["bounded"]) > 20
    assert len({f"{r['padded_over_shared_prefix']:.2f}" for r in bounds["reports"]}) == 1  # the seeds agree as quoted


def test_the_presets_keep_the_settings_the_notes_say_they_keep():
    """The adoptions the notes state are the presets' (configs/), and `auto` takes bf16-base on the processor of the
    Fed-SE records by its probe there."""
    from fedagent_flwr.agent.engine.cpu_rates import MatmulRates
    from fedagent_flwr.agent.engine.placement import resolve_precision

    fedse = (ROOT / "configs" / "smollm2-fedse-cpu.toml").read_text()
    assert 'engine.attn-implementation = "eager"' in fedse and "token-sampler" not in fedse
    assert 'precision = "auto"' in fedse
    probe = json.loads((RESULTS / "2026-12-07-cpu" / "cpu_precision.smollm2-amd.json").read_text())
    assert all(resolve_precision("auto", False, True, MatmulRates(**r))[0] == "bf16-base" for r in probe["fresh"])
