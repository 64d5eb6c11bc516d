"""A real `flwr run` of fedagent-avg training a LoRA adapter with GRPO, sent in bf16 (run_simulation.py -> flwr run -> Ray)."""

import json

import pytest
from peft import PeftModel, get_peft_model_state_dict
from simulate import simulate
from transformers import AutoModelForCausalLM


@pytest.mark.slow
def test_a_lora_fedagent_job_sends_the_adapter_in_bf16_and_reports_held_out_success(tmp_path):
    out = tmp_path / "runs"
    proc, log = simulate(tmp_path, out, "lora", "--num-clients", "2", "--num-server-rounds", "2", "--grpo.finetuning", "lora",
                         "--lora.r", "4", "--grpo.kl-reference", "base", "--federation.transfer-dtype", "bf16", "--eval.tasks", "3")
    run_dir = out / "lora"
    assert (run_dir / "summary.json").exists(), log
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["failed_replies"] == {} and 0.0 <= summary["final_success_rate"] <= 1.0
    config = json.loads((run_dir / "config.json").read_text())
    adapter = config["adapter-parameters"]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    for row in rows[1:]:
        assert row["train/comm/bytes-sent-per-client"] == 2 * adapter == row["train/comm/bytes-received-per-client"]
    final = run_dir / "checkpoints" / "round-0002"
    with open(final / "adapter_config.json") as f:
        assert json.load(f)["r"] == 4
    base = AutoModelForCausalLM.from_pretrained(json.loads((run_dir / "config.json").read_text())["model-source"])
    model = PeftModel.from_pretrained(base, final)
    assert sum(v.numel() for v in get_peft_model_state_dict(model).values()) == adapter
