"""The console's one line per round says who trained, how they did, how the global model does (with its
standard error), what moved and when."""

from fedagent_flwr.runs.reporting import round_line


def test_a_round_line_has_clients_training_held_out_success_with_its_error_bytes_and_time():
    row = {"round": 2, "elapsed_seconds": 157.9, "train/success_rate": 0.453125, "train/mean_reward": 4.314,
           "eval/success_rate": 0.3958, "eval/episodes": 144.0, "train/comm/bytes-sent-round": 4379648.0,
           "train/comm/bytes-received-round": 4379648.0}
    line = round_line(row, [3, 0])
    assert line == ("[fedagent] round 2 | clients 3,0 | train success 0.453 reward 4.31 | "
                    "held-out 0.396 +- 0.041 (144 episodes) | 8.8 MB | 158 s")


def test_round_zero_has_only_the_evaluation():
    line = round_line({"round": 0, "elapsed_seconds": 12.0, "eval/success_rate": 0.5, "eval/episodes": 4.0}, None)
    assert line == "[fedagent] round 0 | held-out 0.500 +- 0.250 (4 episodes) | 12 s"


def test_the_learning_curve_has_error_bars_and_communication_gets_its_own_plot(tmp_path):
    from fedagent_flwr.runs.reporting import RunReporter, binomial_se

    assert binomial_se(0.5, 4) == 0.25 and binomial_se(0.3, 0) == 0.0
    reporter = RunReporter(tmp_path)
    reporter.log({"round": 0, "elapsed_seconds": 1.0, "eval/success_rate": 0.5, "eval/episodes": 16.0})
    assert not (tmp_path / "communication.png").exists()  # nothing moved yet
    reporter.log({"round": 1, "elapsed_seconds": 2.0, "train/success_rate": 0.4, "eval/success_rate": 0.6,
                  "eval/episodes": 16.0, "train/comm/bytes-sent-total": 2e6, "train/comm/bytes-received-total": 2e6})
    assert (tmp_path / "learning_curve.png").stat().st_size > 0 and (tmp_path / "communication.png").stat().st_size > 0
