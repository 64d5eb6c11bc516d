"""fastest_variant.py picks the variant gpu_checks.sh's round-kernels stage runs a round with."""

import json

import pytest

from benchmark_scripts import load_script

fastest_variant = load_script("fastest_variant")
fastest, main = fastest_variant.fastest, fastest_variant.main


def variant(kernels: str | None, logprobs: float, update: float) -> dict:
    v = {"grpo.ppo-micro-batch-size-per-gpu": 16} | ({"engine.training-kernels": kernels} if kernels else {})
    return {"variant": v, "logprobs_s": logprobs, "update_s": update}


def test_it_picks_the_smallest_log_prob_plus_update_time():
    # compile has the fastest update but not the fastest sum
    result = {"variants": [variant(None, 12.0, 25.0), variant("compile", 14.0, 20.0), variant("liger", 10.0, 21.0)]}
    assert fastest(result, "engine.training-kernels") == "liger"


def test_a_variant_without_the_key_stands_for_the_default_and_oom_or_a_failure_does_not_count():
    result = {"variants": [variant(None, 5.0, 5.0), {"variant": {"engine.training-kernels": "liger"}, "out_of_memory": True},
                           {"variant": {"engine.training-kernels": "compile"}, "failed": "ImportError: no triton"}]}
    assert fastest(result, "engine.training-kernels") == "eager"


def test_no_finished_variant_is_an_error_with_the_file_named(tmp_path, capsys):
    path = tmp_path / "kernels_profile.json"
    path.write_text(json.dumps({"variants": [{"variant": {}, "out_of_memory": True}]}))
    assert main([str(path), "engine.training-kernels"]) == 1
    assert "kernels_profile.json: no variant finished" in capsys.readouterr().err
    with pytest.raises(ValueError):
        fastest({}, "engine.training-kernels")


def test_sets_gives_the_whole_fastest_variant_as_round_arguments_without_the_benchmarks_own_keys():
    # the passes stage hands the fastest pass setting, whatever keys it varies, to a round as --set arguments
    slow = {"variant": {"grpo.ppo-micro-batch-size-per-gpu": 16, "host-waits": True}, "logprobs_s": 1.0, "update_s": 2.0}
    quick = {"variant": {"grpo.ppo-max-token-len-per-gpu": 24576, "engine.gradient-checkpointing": "auto",
                         "grpo.group-by-length": True, "host-waits": False}, "logprobs_s": 1.0, "update_s": 1.5}
    assert fastest({"variants": [slow, quick]}, "--sets") == (
        "--set grpo.ppo-max-token-len-per-gpu=24576 --set engine.gradient-checkpointing=auto --set grpo.group-by-length=true")
