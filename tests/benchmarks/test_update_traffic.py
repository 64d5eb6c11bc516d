"""benchmarks/update_traffic.py: the count per operator, and the two precisions' updates counted at the tiny width."""

import pytest
import torch
from benchmark_scripts import load_script

traffic = load_script("update_traffic")


def test_the_count_charges_each_operator_its_tensors_and_each_matmul_its_flops():
    a, b = torch.ones(3, 4), torch.ones(4, 5)
    counter = traffic.TrafficCount()
    with counter:
        c = a @ b  # mm: 12 + 20 inputs, 15 outputs, fp32
        (c + 1).view(15)  # add: 15 in, 15 out; the view moves nothing
    assert counter.ops["mm"] == [1, 4 * (12 + 20 + 15), 2.0 * 3 * 4 * 5]
    assert counter.ops["add"][:2] == [1, 4 * (15 + 15)]
    assert "view" not in counter.ops


def test_a_bf16_working_copy_moves_fewer_bytes_outside_the_matmuls_and_computes_the_same_flops():
    r = traffic.main(["--shape", "tiny", "--variant", "engine.param-dtype=fp32", "--variant", "engine.param-dtype=bf16", "--json"])
    fp32, bf16 = r["variants"]
    for v in (fp32, bf16):
        shallow, deep = v["counted"]
        assert shallow["optimizer_steps"] == deep["optimizer_steps"] == 1
        assert deep["other_bytes"] > shallow["other_bytes"] and deep["matmul_flops"] > shallow["matmul_flops"]
        e = v["extrapolated"]  # tiny has 2 layers, the first depth counted: the extrapolation is that count
        assert e["other_bytes"] == shallow["other_bytes"]
        assert e["other_bytes_per_layer"] == (deep["other_bytes"] - shallow["other_bytes"]) / 2
    # the same multiplies, in bf16 either way
    assert bf16["extrapolated"]["matmul_flops"] == pytest.approx(fp32["extrapolated"]["matmul_flops"])
    # no casts of the weights in every forward, no fp32 activations: fewer bytes per layer, and fewer casts
    assert bf16["extrapolated"]["other_bytes_per_layer"] < 0.9 * fp32["extrapolated"]["other_bytes_per_layer"]
    casts = [v["counted"][1]["ops"]["_to_copy"]["bytes"] for v in (fp32, bf16)]
    assert casts[1] < casts[0]
    ratio = bf16["extrapolated"]["other_bytes"] / fp32["extrapolated"]["other_bytes"]
    assert f"engine.param-dtype=bf16: {ratio:.3f} x the first variant's bytes outside matmuls in the passes" in traffic.format_report(r)
    assert all(v["counted"][0]["optimizer_bytes"] > 0 for v in (fp32, bf16))  # counted apart from the passes
