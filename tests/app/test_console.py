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
