"""The console's one line per round says who trained, how they did, how the global model does (with its
standard error), what moved and when."""

from fedagent_flwr.runs.reporting import round_line
from placed import rollout_config


def test_a_round_line_has_clients_training_held_out_success_with_its_error_bytes_and_time():
    row = {"round": 2, "elapsed_seconds": 157.9, "train/success_rate": 0.453125, "train/mean_reward": 4.314,
           "eval/success_rate": 0.3958, "eval/episodes": 144.0, "train/comm/bytes-sent-round": 4379648.0,
           "train/comm/bytes-received-round": 4379648.0}
    line = round_line(row, [3, 0])
    assert line == ("[fedagent] round 2 | clients 3,0 | train success 0.453 reward 4.31 | "
                    "held-out 0.396 +- 0.041 (144 episodes) | 8.8 MB | 158 s")


def test_a_round_line_says_how_many_replies_failed():
    row = {"round": 3, "elapsed_seconds": 2581.0, "train/success_rate": 0.0625, "train/mean_reward": 0.62,
           "train/replies": 1.0, "train/failed-replies": 3.0}
    assert round_line(row, [0, 2, 3, 1]) == ("[fedagent] round 3 | clients 0,2,3,1 | FAILED 3 of 4 replies, left out of "
                                             "the aggregate | train success 0.062 reward 0.62 | 2581 s")
    assert "FAILED" not in round_line(row | {"train/failed-replies": 0.0}, [0, 2, 3, 1])


def test_a_round_line_says_where_the_rounds_time_went():
    row = {"round": 1, "elapsed_seconds": 1474.0, "train/success_rate": 0.133, "train/mean_reward": 1.31,
           "train/seconds": 457.7, "train/rollout_seconds": 185.3, "eval/success_rate": 0.42, "eval/episodes": 144.0,
           "eval/seconds": 419.7}
    assert round_line(row, [0, 1, 2, 3]) == ("[fedagent] round 1 | clients 0,1,2,3 | train success 0.133 reward 1.31 | "
                                             "held-out 0.420 +- 0.041 (144 episodes) | a client's rollout 3:05 + update "
                                             "4:32, evaluation 7:00 | 1474 s")


def test_round_zero_has_only_the_evaluation():
    line = round_line({"round": 0, "elapsed_seconds": 12.0, "eval/success_rate": 0.5, "eval/episodes": 4.0,
                       "eval/seconds": 11.5}, None)
    assert line == "[fedagent] round 0 | held-out 0.500 +- 0.250 (4 episodes) | evaluation 11.5 s | 12 s"


def test_the_learning_curve_has_error_bars_and_communication_gets_its_own_plot(tmp_path):
    from fedagent_flwr.runs.reporting import RunReporter, binomial_se

    assert binomial_se(0.5, 4) == 0.25 and binomial_se(0.3, 0) == 0.0
    reporter = RunReporter(tmp_path)
    reporter.log({"round": 0, "elapsed_seconds": 1.0, "eval/success_rate": 0.5, "eval/episodes": 16.0})
    assert not (tmp_path / "communication.png").exists()  # nothing moved yet
    reporter.log({"round": 1, "elapsed_seconds": 2.0, "train/success_rate": 0.4, "eval/success_rate": 0.6,
                  "eval/episodes": 16.0, "train/comm/bytes-sent-total": 2e6, "train/comm/bytes-received-total": 2e6})
    assert (tmp_path / "learning_curve.png").stat().st_size > 0 and (tmp_path / "communication.png").stat().st_size > 0


def test_the_evaluation_command_replays_the_servers_evaluation(tmp_path, tiny_lm, maze_tokenizer, capsys):
    """Same checkpoint, same run seed and settings: the same held-out numbers as the server's evaluator."""
    import json

    from envs import make_env
    from envs.multi import per_env_spread
    from fedagent_flwr.agent.play.evaluation import GlobalEvaluator
    from fedagent_flwr.config import RunConfig
    from fedagent_flwr.experiments.evaluate import main

    tiny_lm.save_pretrained(tmp_path / "model")
    maze_tokenizer.save_pretrained(tmp_path / "model")
    cfg = RunConfig.from_run_config({"seed": 7, "eval.tasks": 3, "eval.samples-per-task": 2})
    tasks = per_env_spread(make_env("maze").tasks_of_split("test"), 3)
    evaluator = GlobalEvaluator(tiny_lm, maze_tokenizer, lambda: make_env("maze"), tasks,
                                rollout_config(cfg, evaluation=True), 2, cfg.seed)
    server = evaluator.evaluate(1)
    main(["--model", str(tmp_path / "model"), "--env", "maze", "--tasks", "3", "--samples-per-task", "2", "--seed", "7",
          "--device", "cpu", "--out", str(tmp_path / "eval.json"), "--dump", str(tmp_path / "episodes.txt"),
          "--transcript-episodes", "6"])
    replayed = json.loads((tmp_path / "eval.json").read_text())
    assert replayed["mean_reward"] == server["mean_reward"] and replayed["invalid_action_rate"] == server["invalid_action_rate"]
    # this random model fails every episode whatever it samples: compare what it wrote, which the seed decides
    written = (tmp_path / "episodes.txt").read_text()
    first_words = [" ".join(t.steps[0].completion.split())[:40] for t in evaluator.last_trajectories]
    assert all(w and w in " ".join(written.split()) for w in first_words), first_words


def test_paired_evaluation_plays_both_models_on_the_same_tasks_and_stream(tmp_path, capsys):
    """A model paired with itself differs by exactly nothing: both plays start from the run's evaluation seed. (The
    trained tiny Gridworld model wins some episodes and not others, so a second stream would differ.)"""
    import json

    from fedagent_flwr.experiments.evaluate import main

    main(["--model", "tiny", "--env", "gridworld", "--tasks", "12", "--samples-per-task", "4", "--seed", "3",
          "--device", "cpu", "--paired-with", "tiny", "--out", str(tmp_path / "eval.json")])
    result = json.loads((tmp_path / "eval.json").read_text())
    assert 0.0 < result["success_rate"] < 1.0 and result["paired_with/success_rate"] == result["success_rate"]
    # every task's difference is zero, not only their mean
    assert result["paired"]["n"] == 12 and result["paired"]["mean"] == 0.0 and result["paired"]["se"] == 0.0
    assert "tiny minus tiny: +0.000" in capsys.readouterr().out


def test_success_by_task_is_each_tasks_rate_over_its_episodes():
    from types import SimpleNamespace

    from fedagent_flwr.experiments.evaluate import success_by_task

    episodes = [SimpleNamespace(task=SimpleNamespace(id=i), won=w) for i, w in [("a", True), ("b", False), ("a", False), ("a", True)]]
    assert success_by_task(episodes) == {"a": 2 / 3, "b": 0.0}


def test_flowers_raw_metric_dicts_and_final_dump_are_left_out_of_the_log(caplog):
    import logging

    from fedagent_flwr.runs.reporting import trimmed_flower_log

    flwr = logging.getLogger("flwr")
    with caplog.at_level(logging.INFO, logger="flwr"), trimmed_flower_log():
        for msg in ("Initial global evaluation results: %s", "", "[ROUND 1/2]", "\t└──> Aggregated MetricRecord: %s", "Global evaluation", "\t└──> MetricRecord: %s",
                    "Strategy execution finished in %.2fs", "Final results:", "\t%s"):
            flwr.info(msg, *(["{'loss': '2.0000e+00'}"] if "%s" in msg else [1.0] if "%.2f" in msg else []))
    kept = [r.getMessage() for r in caplog.records if r.name == "flwr"]
    assert kept == ["[ROUND 1/2]"], kept
    with caplog.at_level(logging.INFO, logger="flwr"):  # (on its own: flwr may not have set its level yet)
        flwr.info("after the run")  # the filter is gone once the run's strategy returns
    assert caplog.records[-1].getMessage() == "after the run"


def test_a_long_loop_says_how_far_it_is_and_the_time_left_and_a_short_one_says_nothing():
    from fedagent_flwr.agent.play.progress import ProgressLines

    said, now = [], [0.0]
    lines = ProgressLines("client 2 rollout, round 1", say=said.append, now=lambda: now[0])
    for done, at in [(1, 20.0), (2, 61.0), (3, 90.0), (4, 125.0), (8, 200.0)]:
        now[0] = at
        lines.update(done, 8)
    # nothing in the first minute, then at most a line a minute, none once done; time left from the mean so far
    assert said == ["[fedagent] client 2 rollout, round 1: 2/8 episodes (25%), 1:01 elapsed, about 3:03 left",
                    "[fedagent] client 2 rollout, round 1: 4/8 episodes (50%), 2:05 elapsed, about 2:05 left"]
    # episodes played side by side: the steps left at most, at the mean step's cost so far
    said.clear()
    lines = ProgressLines("held-out evaluation", say=said.append, now=lambda: now[0])
    now[0] += 80.0
    lines.update(0, 144, 4, 20)
    assert said == ["[fedagent] held-out evaluation: step 4 of at most 20, 0/144 episodes done, 1:20 elapsed, "
                    "at most 5:20 left"]


def test_a_round_line_says_how_far_the_rollouts_log_probs_lay_from_the_trained_pass():
    """grpo.old-logprobs = rollout: the signed mean gap, its largest token, the share beyond 0.01 nats, and the clip
    fraction of the first step (where the ratio should be 1) on the round's line."""
    row = {"round": 1, "elapsed_seconds": 600.0, "train/success_rate": 0.125, "train/mean_reward": 1.2,
           "train/rollout_logprob_gap_signed": -0.00041, "train/rollout_logprob_gap_max": 0.0213,
           "train/rollout_logprob_gap_over_001": 0.0042, "train/first_step_clip_frac": 0.0}
    assert round_line(row, [0, 1]) == ("[fedagent] round 1 | clients 0,1 | train success 0.125 reward 1.20 | rollout "
                                       "log-probs -0.0004 nats a token (largest 0.021, 0.4 % beyond 0.01), first-step "
                                       "clip 0.0 % | 600 s")
