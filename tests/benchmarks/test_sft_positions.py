"""benchmarks/sft_positions.py: the positions a fine-tuning micro-batch computes, padded and with its prefix once."""

import json

import pytest

from benchmark_scripts import load_script

sft_positions = load_script("sft_positions")


def test_the_shared_prefix_stops_where_the_prompts_part_and_leaves_each_prompt_a_token_of_its_own():
    rows = [([1, 2, 3, 4], [9]), ([1, 2, 3, 5, 6], [9, 9])]
    assert sft_positions.common_prefix(rows) == 3
    # identical prompts: the prefix stops one token short, whose logits predict the first completion token
    assert sft_positions.common_prefix([([1, 2, 3], [9]), ([1, 2, 3], [8, 8])]) == 2
    assert sft_positions.common_prefix([([7], [9]), ([7], [8])]) == 0
    counted = sft_positions.positions(rows)
    # lengths 5 and 7: padded 2 x 7; real 12; the prefix of 3 once and 2 rows x the longest rest (4)
    assert counted == {"padded": 14, "real": 12, "shared_prefix": 3 + 2 * 4, "prefix": 3}


def test_a_run_folders_buffers_are_found_and_counted(tmp_path):
    from fedagent_flwr.agent.self_evolution import client_buffer_dir
    from fedagent_flwr.agent.training.experience import ExperienceBuffer, StoredTrajectory

    run = tmp_path / "run"
    (run / "state").mkdir(parents=True)
    config = {"strategy": "fedse-lora", "fedse.buffer-dir": str(tmp_path / "buffers"), "num-clients": 2,
              "fedse.sft-micro-batch-size": 2, "fedse.sft-batch-size": 4}
    (run / "config.json").write_text(json.dumps(config))
    (run / "state" / "server.json").write_text(json.dumps({"strategy": {"run_key": "abc"}}))
    buffer = ExperienceBuffer(client_buffer_dir(tmp_path / "buffers", "abc", 1))
    buffer.seed([StoredTrajectory("t", 0, True, [([1, 2, 3, 4], [9]), ([1, 2, 3, 4], [9])])])
    buffer.save()
    report = sft_positions.main(["--run-dir", str(run), "--draws", "3", "--json"])
    assert list(report["clients"]) == [1]  # client 0 left no buffer
    c = report["clients"][1]
    # two equal rows of 5: padded 10; the prefix of 3 once and 2 x 2
    assert c["samples"] == 2 and c["padded"] == 10 and c["shared_prefix"] == 7
    assert report["padded_over_shared_prefix"] == pytest.approx(10 / 7)
    config["strategy"] = "fedagent-avg"
    (run / "config.json").write_text(json.dumps(config))
    with pytest.raises(SystemExit, match="strategy='fedagent-avg'"):
        sft_positions.main(["--run-dir", str(run)])
