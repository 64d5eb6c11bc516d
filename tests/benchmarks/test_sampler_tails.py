"""benchmarks/sampler_tails.py: the inverse CDF's implied distribution and both samplers' tail draws."""

import pytest
import torch

from benchmark_scripts import load_script

tails = load_script("sampler_tails").tails


def test_a_tail_that_holds_a_known_mass_is_drawn_at_that_rate_by_each_sampler():
    # one token of 0.9, 9 of 0.01 and 990 of 1e-5 (below the tail threshold): a tail mass of 0.0099
    probs = torch.tensor([0.9] + [0.01] * 9 + [1e-5] * 990, dtype=torch.float64)
    logits = probs.log().float().repeat(20, 1)
    r = tails(logits, 1.0, tail=1e-3, draws=500, seed=0)
    assert r["tail_mass_mean"] == pytest.approx(990e-5, rel=1e-3)
    assert r["inverse_cdf_total_variation_mean"] < 1e-5 and r["inverse_cdf_mass_never_drawn_mean"] == 0
    for sampler in ("multinomial", "inverse-cdf"):
        drawn = r[sampler]
        assert drawn["draws"] == 10_000 and drawn["expected"] == pytest.approx(99.0, rel=1e-3)
        assert abs(drawn["tail_draws"] - drawn["expected"]) < 4 * drawn["expected_se"]


def test_a_running_sum_that_swallows_its_tail_is_reported():
    # after a token of mass ~1, tokens of 1e-9 add nothing to an fp32 running sum: the inverse CDF cannot draw them
    logits = torch.tensor([[0.0] + [-20.7] * 1000])  # e^-20.7 ~ 1e-9
    r = tails(logits, 1.0, tail=1e-3, draws=10, seed=0)
    assert r["tail_mass_mean"] > 0
    # (most of it: torch's cumsum may add some of the small terms together before they meet the large one)
    assert 0.9 * r["tail_mass_mean"] < r["inverse_cdf_mass_never_drawn_mean"] <= r["tail_mass_mean"]
