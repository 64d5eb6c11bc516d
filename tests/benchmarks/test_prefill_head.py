"""benchmarks/prefill_head.py: the prefill's last-position head both ways on a model whose base is frozen under LoRA."""

import pytest

from benchmark_scripts import load_script

prefill_head = load_script("prefill_head")


def test_both_ways_are_timed_alternately_on_a_frozen_head_and_give_the_same_logits(capsys):
    report = prefill_head.main(["--rows", "3", "--tokens", "8", "--repeats", "2"])
    assert report["head_weight_requires_grad"] is False  # the case the index tensor is for
    assert {way: len(times) for way, times in report["seconds"].items()} == {"logits_to_keep=1": 2, "index tensor": 2}
    assert report["max_logit_difference"] < 1e-4  # the same products, summed in another order at most
    assert len(report["ratio_per_repeat"]) == 2 and report["ratio_per_repeat"][0] > 0
    assert report["ratio_strided_over_index"] == pytest.approx(
        report["median_seconds"]["logits_to_keep=1"] / report["median_seconds"]["index tensor"])
    assert "prefill of 3 x 8 tokens" in capsys.readouterr().out


def test_bad_counts_are_refused_by_name():
    with pytest.raises(SystemExit):
        prefill_head.main(["--rows", "0"])
