"""Every `auto` decided in one place (agent/engine/placement.py), and every entry point asking it."""

from __future__ import annotations

import pytest
from transformers import AutoConfig, AutoModelForCausalLM

import fedagent_flwr.agent.engine.placement as placement_module
from fedagent_flwr.agent.engine.memory import ACTIVATIONS_ROW, GB, MemoryPlan
from fedagent_flwr.agent.engine.placement import Machine, place
from fedagent_flwr.config import RunConfig
from fedagent_flwr.methods.placement import place_run

CPU, GPU = Machine(cuda=False), Machine(cuda=True)


def test_auto_resolves_by_the_machine_and_explicit_values_stay():
    cpu, gpu = place(machine=CPU), place(machine=GPU)
    assert (cpu.device, cpu.precision, cpu.param_dtype, cpu.decode_engine) == ("cpu", "fp32", "fp32", "hf")
    assert (gpu.device, gpu.precision, gpu.param_dtype, gpu.decode_engine) == ("cuda", "bf16-mixed", "fp32", "static")
    assert place(machine=GPU, full_grpo=True).param_dtype == "bf16"  # a working copy where every weight trains
    assert place(machine=GPU, full_grpo=True, precision="fp32").param_dtype == "fp32"  # no bf16 compute, no copy
    # what the key says is kept, whatever the machine has
    kept = place(device="cuda:1", precision="fp32", param_dtype="fp32", decode_engine="hf", machine=CPU)
    assert (kept.device, kept.precision, kept.decode_engine) == ("cuda:1", "fp32", "hf")
    assert place(device="cpu", machine=GPU).precision == "fp32"  # a CPU device on a GPU machine computes in fp32
    assert place(kl_reference="auto", single_learner=True).kl_reference == "base"
    assert place(kl_reference="auto").kl_reference == "round-start"
    with pytest.raises(ValueError, match="device='gpu' is not allowed"):
        place(device="gpu")


def test_auto_rows_are_the_most_the_plan_fits_up_to_an_epoch():
    def plan_for(placement, rows: int) -> MemoryPlan:
        return MemoryPlan("each client", [("fixed", 10 * GB), ("per row", rows * GB)])

    assert place(max_rows=64, plan_for=plan_for, budget_bytes=20 * GB).rollout_rows == 10
    assert place(max_rows=8, plan_for=plan_for, budget_bytes=20 * GB).rollout_rows == 8  # an epoch's episodes at most
    assert place(max_rows=64, plan_for=plan_for, budget_bytes=None).rollout_rows == 64  # no budget known
    assert place(rollout_batch_size=5, max_rows=64, plan_for=plan_for, budget_bytes=20 * GB).rollout_rows == 5


def _llama(rope_scaling=None):
    config = AutoConfig.for_model("llama", vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                  num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128,
                                  rope_scaling=rope_scaling)
    return AutoModelForCausalLM.from_config(config).eval()


def test_auto_checkpointing_takes_the_room_the_rest_of_the_plan_leaves():
    asked = set()

    def plan_for(placement, rows: int) -> MemoryPlan:
        asked.add(placement.gradient_checkpointing)
        return MemoryPlan("each client", [("fixed", 10 * GB), ("per row", rows * GB), (ACTIVATIONS_ROW, 3 * GB)])

    auto = place(gradient_checkpointing="auto", max_rows=4, plan_for=plan_for, budget_bytes=20 * GB)
    assert asked == {True}  # the plan is asked for auto's worst case, every layer checkpointed (never the word auto)
    # 4 rows fit (17 GiB); the activations may take what the other rows leave: 20 - (10 + 4)
    assert (auto.rollout_rows, auto.gradient_checkpointing, auto.activation_room_bytes) == (4, "fitted", 6 * GB)
    unknown = place(gradient_checkpointing="auto", max_rows=4)  # no memory known: every layer, as true
    assert (unknown.gradient_checkpointing, unknown.activation_room_bytes) == (True, None)
    assert place(gradient_checkpointing=False, plan_for=plan_for, budget_bytes=20 * GB).activation_room_bytes is None


def test_a_model_the_static_engine_refuses_is_named_or_refused_with_the_model_in_hand():
    """Llama 3's rope scaling is not one the static engine reproduces: auto on a GPU takes hf and says why (the server
    prints it at start-up); rollout.name='static' stops the run before any work."""
    llama3 = _llama({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 64})
    auto = place(machine=GPU, model=llama3)
    assert auto.decode_engine == "hf" and "rope scaling 'llama3'" in auto.engine_note
    assert "rope scaling 'llama3'" in auto.summary()
    with pytest.raises(ValueError, match="rope scaling 'llama3'"):
        place_run(RunConfig.from_run_config({"rollout.name": "static"}), "client", GPU, model=llama3)
    plain = place(machine=GPU, model=_llama())
    assert plain.decode_engine == "static" and plain.engine_note == ""


def test_rollout_log_probs_as_the_old_policy_are_refused_where_the_sampler_holds_other_weights():
    """grpo.old-logprobs = rollout takes the sampler's log-probs as the trained policy's. The static engine samples from a
    bf16 copy with the LoRA delta merged in (small deltas round away), so on a GPU, where auto takes it, or wherever
    it is asked for, the run stops at start-up naming the key; with hf it runs."""
    rollout = RunConfig.from_run_config({"grpo.old-logprobs": "rollout"})
    for cfg, machine in ((rollout, GPU), (RunConfig.from_run_config({"grpo.old-logprobs": "rollout", "rollout.name": "static"}), CPU)):
        with pytest.raises(ValueError, match=r"grpo.old-logprobs='rollout' is not allowed: expected recompute where"):
            place_run(cfg, "client", machine)
    assert place_run(rollout, "client", CPU).decode_engine == "hf"
    assert place_run(RunConfig.from_run_config({"grpo.old-logprobs": "rollout", "rollout.name": "hf"}), "client", GPU).decode_engine == "hf"
    assert place_run(RunConfig.from_run_config({"grpo.old-logprobs": "recompute"}), "client", GPU).decode_engine == "static"
    assert place_run(rollout, "server", GPU).decode_engine == "static"  # the server only evaluates: it trains nothing


@pytest.mark.parametrize("machine", [CPU, GPU], ids=["cpu", "gpu"])
def test_evaluation_the_warm_start_and_a_run_resolve_the_same_engine_and_precision(machine, monkeypatch, tmp_path,
                                                                                  tiny_lm, maze_tokenizer):
    """On one machine, the run's clients and server, `python -m fedagent_flwr.evaluation` and the warm start of a
    `warm:` model take the same precision and decode engine: each asks place(), none decides for itself. The GPU
    machine is pretended (placement.this_machine); models stay on the CPU, where the static engine also runs."""
    import fedagent_flwr.agent.models.pretrained as pretrained
    import fedagent_flwr.experiments.evaluate as evaluate

    monkeypatch.setattr(placement_module, "this_machine", lambda: machine)
    seen: dict[str, object] = {}

    def spy(where):
        def wrapped(**kwargs):
            seen[where] = resolved = place(**kwargs)
            return resolved
        return wrapped

    monkeypatch.setattr(evaluate, "place", spy("evaluation"))
    monkeypatch.setattr(pretrained, "place", spy("warm start"))
    warm_placements = []
    monkeypatch.setattr(pretrained, "ensure_warm_model",
                        lambda base, source, env, placement: warm_placements.append(placement) or source)
    tiny_lm.save_pretrained(tmp_path / "model")
    maze_tokenizer.save_pretrained(tmp_path / "model")
    assert evaluate.main(["--model", str(tmp_path / "model"), "--env", "maze", "--tasks", "1",
                          "--samples-per-task", "1", "--device", "auto"]) == 0
    pretrained.resolve_model(f"warm:{tmp_path / 'model'}", "maze")
    cfg = RunConfig(env="maze")
    run = {role: place_run(cfg, role, model=tiny_lm) for role in ("client", "server")}
    evaluation, warm = seen["evaluation"], warm_placements[0]
    expected = ("bf16-mixed", "static") if machine.cuda else ("fp32", "hf")
    for resolved in (run["client"], run["server"], evaluation, warm):
        assert (resolved.precision, resolved.decode_engine) == expected, resolved


def test_a_config_is_valid_wherever_it_is_checked_and_what_auto_becomes_is_checked_where_it_runs():
    """engine.param-dtype = bf16 needs bf16-mixed, which precision = auto becomes on a GPU only: the config is valid on this
    CPU (it once was refused here and accepted on the GPU node), and refused in one line where it would run on a CPU."""
    cfg = RunConfig.from_run_config({"engine.param-dtype": "bf16", "grpo.finetuning": "full"})
    assert place_run(cfg, machine=GPU).param_dtype == "bf16"
    with pytest.raises(ValueError, match=r"^invalid run config: engine.param-dtype='bf16' is not allowed: .*precision resolves "
                                         r"to 'fp32' on a CPU\)$"):
        place_run(cfg, machine=CPU)
    ranks = RunConfig.from_run_config({"engine.param-dtype": "auto", "grpo.finetuning": "full", "engine.ranks-per-client": 2})  # auto takes the working copy on a GPU, not yet under FSDP2
    with pytest.raises(ValueError, match="engine.param-dtype='auto' is not allowed: expected fp32 with engine.ranks-per-client > 1"):
        place_run(ranks, machine=GPU)
    assert place_run(ranks, machine=CPU).param_dtype == "fp32"
