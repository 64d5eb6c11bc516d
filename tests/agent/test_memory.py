"""The memory plan: parameter counts of the papers' shapes, its arithmetic by hand, and a run it stops before round 1."""

from pathlib import Path

import pytest
import torch
from flwr.app import MessageType
from transformers import AutoConfig

from fedagent_flwr.agent.engine.memory import GB, ModelShape, client_plan, layer_activations, server_plan, shape_config
from fedagent_flwr.config import RunConfig
from conftest import both_plans, planned
from fedagent_flwr.methods.memory import plan_layer_activations
from fedagent_flwr.methods.placement import place_run
from placed import rollout_config


def test_the_papers_shapes_have_their_published_sizes():
    millions = {n: round(ModelShape.of(shape_config(n)).parameters / 1e6) for n in ("qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-3b", "qwen2.5-7b")}
    assert millions == {"qwen2.5-0.5b": 494, "qwen2.5-1.5b": 1544, "qwen2.5-3b": 3086, "qwen2.5-7b": 7616}


def test_the_plan_adds_up_as_computed_by_hand():
    config = AutoConfig.for_model("qwen2", hidden_size=8, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                                  intermediate_size=16, vocab_size=32, tie_word_embeddings=True)
    shape = ModelShape.of(config)
    # embedding 32 x 8; per layer q 8x8+8, k 8x4+4, v 8x4+4, o 8x8, gate/up 8x16, down 16x8, two norms of 8; final norm 8
    assert shape.parameters == 256 + 2 * (72 + 36 + 36 + 64 + 3 * 128 + 16) + 8 == 1480
    assert shape.lora_parameters(2, ("q_proj", "v_proj")) == 2 * (2 * (8 + 8) + 2 * (8 + 4)) == 112
    full = client_plan(shape, finetuning="full", lora_rank=2, lora_targets=("q_proj", "v_proj"), precision="bf16-mixed",
                       kl_beta=0.01, kl_reference="round-start", micro_batch_size=3, rollout_batch_size=5, context_tokens=10)
    rows = full.as_dict()
    assert rows["weights (fp32)"] == 1480 * 4 and rows["autocast bf16 weight copies"] == 1480 * 2
    assert rows["gradients"] == 1480 * 4 and rows["AdamW moments"] == 1480 * 8 and rows["KL reference"] == 1480 * 4
    assert rows["KV cache of a rollout batch"] == 2 * 2 * 1 * 4 * 10 * 5 * 2  # k and v, layers, kv heads, head dim, tokens, batch, bf16
    # the update's pass: its log-softmax, and in backward the scattered gradient's zeros and result (3 x positions)
    assert rows["generation logits"] == 5 * 32 * 4 and rows["training logits"] == 3 * 3 * 10 * 32 * 4
    # a layer keeps 400 bytes a token under bf16-mixed's fp32 weights (tests/agent/test_checkpointing.py counts them)
    assert rows["activations of a micro-batch"] == 2 * 3 * 10 * 400
    # the rollout's rows and the update's are never held at once: the total is the held rows and the larger phase
    held = rows["weights (fp32)"] + rows["autocast bf16 weight copies"] + rows["AdamW moments"] + rows["KL reference"]
    decode = rows["KV cache of a rollout batch"] + rows["generation logits"]
    update = rows["gradients"] + rows["training logits"] + rows["activations of a micro-batch"]
    assert (full.peak("decode"), full.peak("update")) == (held + decode, held + update) == (rows["decode peak"], rows["update peak"])
    assert full.total == rows["total"] == held + update == 64240 + 3 * 10 * 32 * 4
    checkpointed = client_plan(shape, finetuning="full", lora_rank=2, lora_targets=("q_proj", "v_proj"), precision="bf16-mixed",
                               kl_beta=0.01, kl_reference="round-start", micro_batch_size=3, rollout_batch_size=5,
                               context_tokens=10, gradient_checkpointing=True).as_dict()
    # each layer's input kept, one layer's full set recomputed at a time
    assert checkpointed["activations of a micro-batch"] == 2 * 3 * 10 * 8 * 4 + 3 * 10 * 400  # fp32 inputs
    lora = client_plan(shape, finetuning="lora", lora_rank=2, lora_targets=("q_proj", "v_proj"), precision="fp32",
                       kl_beta=0.01, kl_reference="base", micro_batch_size=3, rollout_batch_size=5, context_tokens=10).as_dict()
    assert lora["gradients"] == 112 * 4 and lora["AdamW moments"] == 112 * 8 and lora["KL reference"] == 0
    assert lora["autocast bf16 weight copies"] == 0 and lora["KV cache of a rollout batch"] == 2 * 2 * 4 * 10 * 5 * 4
    # fp32, frozen norms and MLP: SDPA's (2 x 8 + 2 x 4) x 4 + 2 x 4, the MLP's 3 x 16 x 4 (down is frozen, so the
    # product is not kept), the norms' fp32 inputs and rsqrt 2 x (4 x 8 + 4), the first norm's output that q and v's
    # adapters read 4 x 8, and the two adapters' A outputs 2 x 2 x 4
    assert lora["activations of a micro-batch"] == 2 * 3 * 10 * (104 + 192 + 72 + 32 + 16)
    server = server_plan(shape, finetuning="lora", lora_rank=2, lora_targets=("q_proj", "v_proj"), precision="fp32",
                         eval_batch_size=5, context_tokens=10).as_dict()
    assert server["total"] == 1480 * 4 + 112 * 4 + 2 * 2 * 4 * 10 * 5 * 4 + 5 * 32 * 4



def test_a_rank_plans_its_shard_of_the_states_and_the_whole_weights_it_decodes_with():
    """engine.ranks-per-client = 4 (FSDP2): weights, gradients, AdamW moments and a full model's KL reference a quarter each,
    the whole weights once more while the rank decodes, the root unit and a layer while it updates; its passes and KV
    cache are a process's."""
    config = AutoConfig.for_model("qwen2", hidden_size=8, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                                  intermediate_size=16, vocab_size=32, tie_word_embeddings=True)
    shape = ModelShape.of(config)  # 1480 parameters (the test above)
    common = dict(lora_rank=2, lora_targets=("q_proj", "v_proj"), precision="fp32", kl_beta=0.01,
                  micro_batch_size=3, rollout_batch_size=5, context_tokens=10)
    one = client_plan(shape, finetuning="full", kl_reference="round-start", **common).as_dict()
    plan = client_plan(shape, finetuning="full", kl_reference="round-start", ranks=4, **common)
    rank = plan.as_dict()
    assert plan.who == "each of a client's 4 ranks"
    assert rank["weights (fp32), 1/4 shard"] == 1480 and rank["weights gathered whole to decode"] == 1480 * 4
    assert rank["gradients, 1/4 shard"] == 1480 and rank["AdamW moments, 1/4 shard"] == 1480 * 2
    assert rank["KL reference, 1/4 shard"] == 1480
    for row in ("KV cache of a rollout batch", "training logits", "activations of a micro-batch"):
        assert rank[row] == one[row]
    # the whole weights are gathered while the rank decodes, never beside the update's gradients and activations;
    # a pass holds the root unit (the embedding 32 x 8 and the final norm's 8) and one layer (608) gathered
    assert shape.layer_parameters == 72 + 36 + 36 + 64 + 3 * 128 + 16 == 608
    assert rank["weights gathered for a pass"] == (256 + 8 + 608) * 4
    assert rank["decode peak"] == one["decode peak"] - 1480 * (4 + 8 + 4) * 3 // 4 + 1480 * 4
    assert rank["update peak"] == one["update peak"] - 1480 * (4 + 4 + 8 + 4) * 3 // 4 + (256 + 8 + 608) * 4
    lora = client_plan(shape, finetuning="lora", kl_reference="base", ranks=2, **common).as_dict()
    assert lora["weights (fp32), 1/2 shard"] == 1480 * 2 and lora["adapter (fp32), 1/2 shard"] == 112 * 2
    assert lora["weights gathered whole to decode"] == (1480 + 112) * 4 and lora["gradients, 1/2 shard"] == 112 * 2
    assert "weights gathered whole to decode" not in one  # one process decodes with the weights it holds
    # the static engine copies the weights into its own buffers one unit gathered at a time: the larger of the root
    # (264) and a layer (608), not the whole weights
    static = client_plan(shape, finetuning="full", kl_reference="round-start", ranks=4, static_decoder=True,
                         **common).as_dict()
    assert "weights gathered whole to decode" not in static and static["static decoder's weight copy"] == 1480 * 4
    assert static["a unit gathered to copy for the decoder"] == 608 * 4
    with_adapter = client_plan(shape, finetuning="lora", kl_reference="base", ranks=2, static_decoder=True, **common)
    assert with_adapter.as_dict()["a unit gathered to copy for the decoder"] == 608 * 4 + 112 * 4 // 2
    # the decoder keeps the adapter beside its copy of the weights, unmerged (decode.py), in the copy's dtype
    assert with_adapter.as_dict()["static decoder's weight copy"] == (1480 + 112) * 4


def test_a_generate_call_is_planned_at_the_episodes_its_process_plays():
    """rollout.generation-batch-size bounds a generate call, and so do the episodes: an epoch's (grpo.tasks-per-epoch x grpo.num-generations) in
    one process, a rank's groups (every N-th) on N ranks. The plan's KV cache once took 128 rows for an epoch of 64."""
    config = AutoConfig.for_model("qwen2", hidden_size=8, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                                  intermediate_size=16, vocab_size=32, tie_word_embeddings=True)
    shape = ModelShape.of(config)
    kv_row = 2 * 2 * 1 * 4 * 10 * 4  # k and v, layers, kv heads, head dim, 10 tokens, fp32: one row's

    def kv(**keys):
        return planned(RunConfig.from_run_config({"precision": "fp32", **keys}), shape, 10, 128).as_dict()["KV cache of a rollout batch"]

    assert kv(**{"grpo.tasks-per-epoch": 8, "grpo.num-generations": 8}) == 64 * kv_row
    assert kv(**{"grpo.tasks-per-epoch": 8, "grpo.num-generations": 8, "engine.ranks-per-client": 4}) == 16 * kv_row  # 2 groups a rank
    assert kv(**{"grpo.tasks-per-epoch": 5, "grpo.num-generations": 4, "engine.ranks-per-client": 2}) == 12 * kv_row  # rank 0 plays groups 0, 2 and 4
    assert kv(**{"grpo.tasks-per-epoch": 32, "grpo.num-generations": 8}) == 128 * kv_row  # rollout.generation-batch-size, where it is fewer


def test_the_log_prob_passes_enter_the_plan_where_they_need_more_than_the_update():
    """The no-grad passes at grpo.log-prob-micro-batch-size-per-gpu L hold, at their peak, one layer's moment or the head's (their
    logits over L x S rows, or a chunk), and never run beside the update's passes: the plan adds what they hold beyond
    the update's logits and activations, by hand on a small shape."""
    config = AutoConfig.for_model("qwen2", hidden_size=8, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                                  intermediate_size=16, vocab_size=32, tie_word_embeddings=True)
    shape = ModelShape.of(config)
    layer = 10 * 400  # one layer's set for one row of 10 tokens under bf16-mixed's fp32 weights (test above)
    # a no-grad pass under bf16-mixed, per token: in a layer, 4 fp32 hidden states (4 x 8 x 4) beside the larger of
    # the MLP (3 x 16 wide in bf16 = 96) and the attention's bound (2 x (2 + 1) heads x 4 wide x (2 + 4) = 144): 272;
    # at the head, fp32 logits and log-softmax (2 x 32 x 4 = 256) and 2 hidden states (64): 320, the larger
    scoring = 320 * 10  # a row of 10 tokens

    def plan(rows, **kw):
        return client_plan(shape, finetuning="full", lora_rank=2, lora_targets=("q_proj",), precision="bf16-mixed",
                           kl_beta=0.01, kl_reference="round-start", micro_batch_size=3, rollout_batch_size=5,
                           context_tokens=10, logprob_micro_batch_size=rows, **kw).as_dict()

    assert plan(0) == plan(3)  # 0 = the update's micro-batch
    update = 3 * 3 * 10 * 32 * 4 + 2 * 3 * layer  # the update's log-softmax and the backward's two; 2 layers x 3 rows
    assert plan(5)["training logits"] + plan(5)["activations of a micro-batch"] == update
    assert plan(5)["no-grad passes beyond the update's"] == 0  # 16,000 bytes beside the update's 35,520
    assert plan(20)["no-grad passes beyond the update's"] == 20 * scoring - update
    assert plan(20)["update peak"] - plan(5)["update peak"] == 20 * scoring - update
    # chunked: the update's logits a chunk of 16 positions and the head's gradients of the chunks added up; a pass of
    # 20 rows holds its layer's 272 x 200 bytes, more than the head's 2 x 16 chunk positions x 128 + 200 x 64
    chunked = plan(20, logprob_chunk_tokens=16)
    assert chunked["training logits"] == 3 * 16 * 32 * 4 + 2 * 32 * 8 * 4
    assert chunked["no-grad passes beyond the update's"] == 272 * 200 - chunked["training logits"] - 2 * 3 * layer
    # checkpointed update: 2 layer inputs of 3 rows + one layer's set, so the passes of 10 rows now hold more
    checkpointed = plan(10, gradient_checkpointing=True)
    assert checkpointed["activations of a micro-batch"] == 2 * 30 * 8 * 4 + 3 * layer
    assert checkpointed["no-grad passes beyond the update's"] == 10 * scoring - 3 * 3 * 10 * 32 * 4 - 2 * 30 * 32 - 3 * layer
    cfg = RunConfig.from_run_config({"grpo.ppo-micro-batch-size-per-gpu": 3, "grpo.log-prob-micro-batch-size-per-gpu": 20, "precision": "bf16-mixed"})
    assert planned(cfg, shape, 10, 5).as_dict()["no-grad passes beyond the update's"] == 20 * scoring - update  # the key reaches it
    # Fed-SE's fine-tuning: a pass holds fedse.sft-micro-batch-size rows when set, else the whole batch
    fedse = RunConfig.from_run_config({"strategy": "fedse-lora", "fedse.sft-batch-size": 16, "precision": "bf16-mixed"})
    whole, passes_of_4 = (planned(fedse.updated({"fedse.sft-micro-batch-size": m}), shape, 10, 5).as_dict() for m in (0, 4))
    assert whole["training logits"] == 4 * passes_of_4["training logits"] == 3 * 16 * 10 * 32 * 4


def test_the_plan_counts_a_chunk_of_logits_and_a_bf16_base_as_computed_by_hand():
    config = AutoConfig.for_model("qwen2", hidden_size=8, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                                  intermediate_size=16, vocab_size=32, tie_word_embeddings=True)
    shape = ModelShape.of(config)  # 1480 parameters; the adapter on q and v: 112 (the test above)
    common = dict(lora_rank=2, lora_targets=("q_proj", "v_proj"), kl_beta=0.01, kl_reference="round-start",
                  micro_batch_size=3, rollout_batch_size=5, context_tokens=10)
    chunked = client_plan(shape, finetuning="full", precision="fp32", logprob_chunk_tokens=7, **common).as_dict()
    # one chunk of 7 completion tokens, not 3 x 10 positions, and the trained head's gradients summed over chunks
    assert chunked["training logits"] == 3 * 7 * 32 * 4 + 2 * 32 * 8 * 4
    wide = client_plan(shape, finetuning="full", precision="fp32", logprob_chunk_tokens=1000, **common).as_dict()
    assert wide["training logits"] == 3 * 3 * 10 * 32 * 4 + 2 * 32 * 8 * 4  # a chunk wider than the micro-batch holds it all
    base = client_plan(shape, finetuning="lora", precision="bf16-base", **common).as_dict()
    assert "weights (fp32)" not in base and base["weights (bf16 base)"] == 1480 * 2
    assert base["adapter (fp32)"] == 112 * 4 and base["gradients"] == 112 * 4 and base["AdamW moments"] == 112 * 8
    assert base["KL reference"] == 112 * 4  # the round-start adapter
    assert base["autocast bf16 weight copies"] == 112 * 2  # the adapter only: the frozen base is bf16 already
    assert base["KV cache of a rollout batch"] == 2 * 2 * 4 * 10 * 5 * 2
    # bf16 compute: SDPA's 48 + 8, the MLP's 3 x 16 x 2, the norms' 2 x (4 x 8 + 4), the bf16 norm output q's and v's
    # adapters both read 2 x 8, and their A outputs 2 x 2 x 2
    assert base["activations of a micro-batch"] == 2 * 3 * 10 * (56 + 96 + 72 + 16 + 8)
    server = server_plan(shape, finetuning="lora", lora_rank=2, lora_targets=("q_proj", "v_proj"), precision="bf16-base",
                         eval_batch_size=5, context_tokens=10).as_dict()
    assert server["weights (bf16 base)"] == 1480 * 2 and server["autocast bf16 weight copies"] == 112 * 2
    with pytest.raises(ValueError, match="needs grpo.finetuning='lora'"):
        client_plan(shape, finetuning="full", precision="bf16-base", **common)


def test_a_7b_lora_client_plans_under_24_gib_at_micro_batch_1_only_with_a_bf16_base():
    """Qwen2.5-7B, LoRA r 8 on q/k/v/o, grpo.kl-reference base, micro-batch 1, rollout batch 8, 1,024 tokens: 36.0 GiB
    with the fp32 base of bf16-mixed, 20.4 GiB with a bf16 base, both while updating."""
    from fedagent_flwr.config import LoRASection

    shape = ModelShape.of(shape_config("qwen2.5-7b"))
    common = dict(finetuning="lora", lora_rank=8, lora_targets=LoRASection(r=8).targets, kl_beta=0.01,
                  kl_reference="base", micro_batch_size=1, rollout_batch_size=8, context_tokens=1024)
    fp32_base = client_plan(shape, precision="bf16-mixed", **common)
    bf16_base = client_plan(shape, precision="bf16-base", **common)
    assert fp32_base.total > 24 * GB > bf16_base.total
    assert round(fp32_base.total / GB, 1) == 36.0 and round(bf16_base.total / GB, 1) == 20.4
    # the base's halving (P x 2 = 14.2 GiB), the output head's transient bf16 copy (1.0 GiB), and the bf16 casts of the
    # fp32 norm output that k's and v's adapters keep under bf16-mixed, where under bf16-base they share q's input
    # (0.4 GiB) are the difference
    assert fp32_base.total - bf16_base.total == (shape.parameters * 2 + shape.vocab * shape.hidden * 2
                                                 + 2 * 2 * shape.hidden * 1024 * shape.layers)

# Measured in a fresh process: in a long-lived one glibc raises its mmap threshold as large blocks are freed, so
# freed tensors stay in the heap and resident memory no longer drops when autocast's cache is cleared.
# MALLOC_MMAP_THRESHOLD_ fixes the threshold, so every large tensor is its own mapping, returned when freed.
_MEASURE_AUTOCAST = """
import json, os, torch
from transformers import AutoConfig, AutoModelForCausalLM
from fedagent_flwr.agent.training.lora import attached_lora
from fedagent_flwr.config import LoRASection

def resident():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

def held(model):
    ids = torch.ones((1, 4), dtype=torch.long)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        model(input_ids=ids)
        inside = resident()
    return inside - resident()

torch.manual_seed(0)
config = AutoConfig.for_model("qwen2", **json.loads(os.environ["SHAPE"]))
model = AutoModelForCausalLM.from_config(config).eval()
full = held(model)
with attached_lora(model, LoRASection(r=8)) as peft_model:
    lora = held(peft_model)
print(json.dumps({"full": full, "lora": lora}))
"""


@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="reads resident memory from /proc")
def test_the_autocast_row_matches_what_autocast_holds_for_full_and_lora_training():
    """The plan counts P x 2 bf16 copies with full fine-tuning but only the adapter's (and one frozen matrix at a
    time) with LoRA, because autocast caches the casts of weights that require grad only. Measured here on CPU with
    a 40M-parameter Qwen2; on an H200 a 7B LoRA round peaked 16.7 GiB below the old plan, which counted P x 2."""
    import json
    import os
    import subprocess
    import sys

    from fedagent_flwr.config import LoRASection

    fields = {"hidden_size": 512, "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2,
              "intermediate_size": 2048, "vocab_size": 16384, "tie_word_embeddings": False}
    shape = ModelShape.of(AutoConfig.for_model("qwen2", **fields))
    common = {"lora_rank": 8, "lora_targets": LoRASection(r=8).targets, "precision": "bf16-mixed", "kl_beta": 0.0,
              "kl_reference": "base", "micro_batch_size": 1, "rollout_batch_size": 1, "context_tokens": 4}
    planned_full = client_plan(shape, finetuning="full", **common).as_dict()["autocast bf16 weight copies"]
    planned_lora = client_plan(shape, finetuning="lora", **common).as_dict()["autocast bf16 weight copies"]
    env = os.environ | {"SHAPE": json.dumps(fields), "MALLOC_MMAP_THRESHOLD_": "131072"}
    proc = subprocess.run([sys.executable, "-c", _MEASURE_AUTOCAST], env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    held = json.loads(proc.stdout.strip().splitlines()[-1])
    # full: every linear weight cached (the input embedding is looked up, not cast); LoRA: the adapter only
    embedding = shape.vocab * shape.hidden * 2
    assert abs(held["full"] - (planned_full - embedding)) < 0.1 * planned_full, (held, planned_full)
    assert held["lora"] < 0.1 * held["full"], held
    # the LoRA plan: what is held, plus at most one frozen matrix's transient copy (the output head, the largest)
    assert held["lora"] <= planned_lora <= max(held["lora"], 0) + embedding + 2 * 2**20, (held, planned_lora)


def test_the_static_engine_casts_no_weight_so_its_plan_leaves_autocasts_copies_to_the_update():
    """Under bf16 autocast the hf engine's forwards cast the fp32 weights (autocast's copies, held while it decodes);
    the static engine reads its own bf16 copy and never touches a parameter. So with it the plan counts the copies in
    the update phase only, and the server, evaluating so, holds none."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from test_decode import _model, _prompts  # pytest puts this folder on the path (its prepend import mode)

    from fedagent_flwr.agent.engine.sampling import sample_batch

    class ParameterReads(TorchDispatchMode):
        def __init__(self, model):
            super().__init__()
            self.storages, self.ops = {p.untyped_storage().data_ptr() for p in model.parameters()}, []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if args and isinstance(args[0], torch.Tensor) and args[0].untyped_storage().data_ptr() in self.storages:
                self.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    model = _model("llama")
    reads = {}
    for engine in ("hf", "static"):
        with torch.autocast("cpu", dtype=torch.bfloat16), ParameterReads(model) as seen:
            sample_batch(model, _prompts(), 0, [], 6, 0.0, engine=engine)
        reads[engine] = seen.ops
    assert "aten._to_copy.default" in reads["hf"] and reads["static"] == []

    shape = ModelShape.of(model.config)
    common = {"finetuning": "full", "lora_rank": 0, "lora_targets": None, "precision": "bf16-mixed", "kl_beta": 0.0,
              "kl_reference": "base", "micro_batch_size": 1, "rollout_batch_size": 8, "context_tokens": 64}
    hf, static = (client_plan(shape, static_decoder=s, **common) for s in (False, True))
    copies = shape.parameters * 2
    assert hf.as_dict()["autocast bf16 weight copies"] == static.as_dict()["autocast bf16 weight copies"] == copies
    held = {name: plan.peak("decode") - sum(b for row, b in plan.rows if row in plan.decode) for name, plan in
            (("hf", hf), ("static", static))}  # what the rollout holds beside its own rows
    assert held["static"] == held["hf"] - copies and static.peak("update") == hf.peak("update")
    evaluating = {s: server_plan(shape, finetuning="full", lora_rank=0, lora_targets=None, precision="bf16-mixed",
                                 eval_batch_size=8, context_tokens=64, static_decoder=s).as_dict()
                  for s in (False, True)}
    assert evaluating[False]["autocast bf16 weight copies"] == copies and evaluating[True]["autocast bf16 weight copies"] == 0


def test_the_command_prints_the_plans_of_the_papers_models(capsys):
    from fedagent_flwr.experiments.memory_plan import main

    main(["--shape", "qwen2.5-7b"])
    full = capsys.readouterr().out
    main(["--shape", "qwen2.5-7b", "--set", "grpo.finetuning=lora", "--set", "grpo.kl-reference=base", "--set", "grpo.ppo-micro-batch-size-per-gpu=1",
          "--set", "rollout.generation-batch-size=8", "--context-tokens", "1024"])
    lora = capsys.readouterr().out
    assert "7,615,616,512 parameters" in full and "AdamW moments" in full and "fits a 80 GiB GPU per client: no" in full
    assert "fits a 80 GiB GPU per client: yes" in lora  # LoRA, no reference copy, small batches
    # what a layer keeps a token, for this run's precision, engine.param-dtype and adapter (memory.layer_activations)
    from fedagent_flwr.config import LoRASection

    shape = ModelShape.of(shape_config("qwen2.5-7b"))
    for out, per in ((full, layer_activations(shape, "bf16-mixed")),
                     (lora, layer_activations(shape, "bf16-mixed", "fp32", LoRASection().targets, 8))):
        assert f"a decoder layer keeps {per.full:,} bytes a token for backward ({per.kept:,} as a checkpointed" in out
    assert "engine.param-dtype=fp32" in full


def test_the_command_says_what_auto_checkpointing_does_with_the_paper_preset(capsys):
    """--run-config reads a preset; with engine.gradient-checkpointing=auto the command prints the layers a micro-batch
    checkpoints by width in the memory given: none of the short ones, more of the long ones, more in less memory."""
    import re

    from fedagent_flwr.experiments.memory_plan import main

    def layers(gb: int) -> list[int]:
        preset = Path(__file__).resolve().parents[2] / "configs" / "fedagent-paper.toml"
        main(["--shape", "qwen2.5-1.5b", "--run-config", str(preset), "--set", "engine.gradient-checkpointing=auto",
              "--set", f"engine.client-memory-gb={gb}", "--set", "device=cuda"])
        line = capsys.readouterr().out.strip().splitlines()[-1]
        assert line.startswith(f"engine.gradient-checkpointing=auto in {gb} GiB") and "a micro-batch of 16 rows" in line
        return [int(k) for k in re.findall(r"(\d+) of 28 layers at \d+ tokens", line)]

    roomy, tight = layers(80), layers(56)
    assert len(roomy) == len(tight) == 4 and roomy[0] == tight[0] == 0  # 256, 512, 1024 and the 2048-token context
    assert roomy == sorted(roomy) and tight == sorted(tight) and tight[-1] > roomy[-1] and tight[-1] <= 28


def test_a_run_whose_plan_does_not_fit_stops_before_round_1(tmp_path, run_identity):
    from fedagent_flwr.agent.models.loading import load_agent
    from fedagent_flwr.federation import run_federation
    from loopback_grid import LoopbackGrid

    run_config = RunConfig().to_run_config() | {"num-clients": 2, "output-dir": str(tmp_path), "run-name": "oom",
                                                "engine.client-memory-gb": 0.001}
    grid = LoopbackGrid(run_config, 2)
    try:
        with pytest.raises(ValueError, match=r"each client needs about .* GiB but engine.client-memory-gb=0.001.*\n(.*\n)*knobs: engine.ranks-per-client .*grpo.finetuning='lora'"):
            run_federation(grid, RunConfig.from_run_config(run_config))
    finally:
        load_agent.cache_clear()
    assert all(sent.metadata.message_type == MessageType.QUERY for sent, _ in grid.exchanges)  # no round started
    assert GB == 1024**3


def test_rollout_batch_size_auto_takes_the_most_rows_the_plan_fits():
    """rollout.generation-batch-size=0: the largest rollout batch whose client plan fits engine.client-memory-gb, capped at an epoch's
    episodes, and an epoch's episodes where no memory is given."""
    from fedagent_flwr.agent.engine.memory import GB, ModelShape, shape_config
    from fedagent_flwr.config import RunConfig

    shape = ModelShape.of(shape_config("qwen2.5-1.5b"))
    cfg = RunConfig.from_run_config({"rollout.generation-batch-size": 0, "grpo.tasks-per-epoch": 64, "grpo.num-generations": 8, "precision": "bf16-mixed", "engine.client-memory-gb": 48.0, "grpo.ppo-micro-batch-size-per-gpu": 8, "engine.gradient-checkpointing": True, "engine.logprob-chunk-tokens": 1024})
    rows_in = lambda c, budget: place_run(c, shape=shape, context_tokens=2048, budget_bytes=budget).rollout_rows  # noqa: E731
    rows = rows_in(cfg, 48 * GB)
    assert 16 < rows < 512  # the KV cache of 2,048 tokens is about 59 MB a row at 1.5B in bf16
    assert planned(cfg, shape, 2048, rows).total <= 48 * GB < planned(cfg, shape, 2048, rows + 1).total
    assert both_plans(cfg, shape, 2048)[0].total == planned(cfg, shape, 2048, rows).total  # the plan uses them
    assert rows_in(cfg, 1e15) == 512  # never more than an epoch's episodes
    assert rows_in(cfg, None) == 512 and rollout_config(cfg).batch_size == 512
    assert rows_in(RunConfig.from_run_config({"rollout.generation-batch-size": 32}), 48 * GB) == 32  # a number is kept as given


def test_a_client_and_the_server_resolve_auto_rows_against_their_own_memory(tiny_lm, maze_tokenizer):
    import torch

    from fedagent_flwr.agent.models.loading import Agent
    from fedagent_flwr.agent.engine.memory import GB, ModelShape
    from fedagent_flwr.agent.models.pretrained import ModelSpec
    from fedagent_flwr.config import RunConfig
    from fedagent_flwr.methods.placement import context_tokens, process_placement
    from envs import make_env

    agent = Agent(tiny_lm, maze_tokenizer, ModelSpec("test", built_here=True), torch.device("cpu"), "fp")
    tasks = make_env("maze").tasks_of_split("train")[:4]
    # an update small beside a rollout's rows: one row a pass, 8-token log-prob chunks
    settings = {"env": "maze", "rollout.generation-batch-size": 0, "grpo.tasks-per-epoch": 3, "grpo.num-generations": 16,
                "grpo.ppo-micro-batch-size-per-gpu": 1, "engine.logprob-chunk-tokens": 8,
                "grpo.log-prob-micro-batch-size-per-gpu": 1}
    cfg = RunConfig.from_run_config(settings)
    assert process_placement(cfg, agent, tasks).rollout_rows == 48  # a CPU with no memory given: an epoch's episodes
    shape, context = ModelShape.of(tiny_lm.config), context_tokens(cfg, maze_tokenizer, make_env("maze"), tasks)
    plan = lambda rows: planned(cfg, shape, context, rows)
    # the rows are held while decoding: a budget between 29 rows' decoding peak and 30 rows' (the update fits beside)
    assert plan(30).peak("update") < plan(29).peak("decode")
    small = cfg.updated({"engine.client-memory-gb": (plan(29).peak("decode") + plan(30).peak("decode")) / 2 / GB})
    assert process_placement(small, agent, tasks).rollout_rows == 29
    assert process_placement(small, agent, tasks, "server").rollout_rows == 48


def test_the_plan_counts_the_static_decoders_weight_copy():
    from fedagent_flwr.agent.engine.memory import ModelShape, shape_config
    from fedagent_flwr.config import RunConfig

    shape = ModelShape.of(shape_config("qwen2.5-0.5b"))
    hf = both_plans(RunConfig(device="cpu"), shape, 1024)
    static = both_plans(RunConfig.from_run_config({"device": "cpu", "rollout.name": "static"}), shape, 1024)
    auto_cpu = both_plans(RunConfig.from_run_config({"device": "cpu", "rollout.name": "auto"}), shape, 1024)
    for plain, with_copy in zip(hf, static):
        # fp32 on a CPU: the copy is in the model's dtype, held while decoding (a client releases it before updating)
        assert with_copy.peak("decode") - plain.peak("decode") == 4 * shape.parameters
        assert with_copy.as_dict()["static decoder's weight copy"] == 4 * shape.parameters
    assert static[0].peak("update") == hf[0].peak("update")
    assert [p.total for p in auto_cpu] == [p.total for p in hf]  # auto decodes with hf on a CPU


def test_the_command_says_what_auto_checkpointing_does_with_passes_cut_by_tokens(capsys):
    """With grpo.ppo-max-token-len-per-gpu a pass holds the budget's tokens at every width (up to a minibatch of rows), so auto
    checkpoints as much at short widths as at long ones, and more for a bigger budget."""
    import re

    from fedagent_flwr.experiments.memory_plan import main

    def layers(tokens: int) -> tuple[list[int], list[int]]:
        preset = Path(__file__).resolve().parents[2] / "configs" / "fedagent-paper.toml"
        main(["--shape", "qwen2.5-1.5b", "--run-config", str(preset), "--set", "engine.gradient-checkpointing=auto",
              "--set", "engine.client-memory-gb=80", "--set", "device=cuda", "--set", f"grpo.ppo-max-token-len-per-gpu={tokens}",
              "--set", "grpo.balance-micro-batches=false"])
        line = capsys.readouterr().out.strip().splitlines()[-1]
        assert f"a pass of at most {tokens:,} padded tokens" in line
        found = re.findall(r"(\d+) of 28 layers at (\d+) tokens \((\d+) rows\)", line)
        assert [int(w) for _, w, _ in found] == [256, 512, 1024, 2048]
        return [int(k) for k, _, _ in found], [int(n) for _, _, n in found]

    (small, small_rows), (big, big_rows) = layers(12288), layers(49152)
    assert small_rows == [48, 24, 12, 6] and big_rows == [64, 64, 48, 24]  # the paper preset's minibatch is 64
    assert small == [0, 0, 0, 0]  # 12,288 tokens keep every activation in the 37.3 GiB left
    assert all(b >= s for b, s in zip(big, small)) and big[-1] > 0


def test_the_command_gives_the_largest_token_budget_that_checkpoints_nothing():
    """The printed budgets are the most tokens a pass can hold in the room the plan leaves: whole, and with every layer
    checkpointed; one token more would checkpoint a layer (or not fit)."""
    import re

    from fedagent_flwr.agent.engine.memory import layer_activations, layers_to_checkpoint, update_activation_bytes
    from fedagent_flwr.experiments.memory_plan import token_budgets
    from fedagent_flwr.simulation import read_run_config_file

    preset = Path(__file__).resolve().parents[2] / "configs" / "fedagent-paper.toml"
    cfg = RunConfig.from_run_config(read_run_config_file(str(preset)) | {"device": "cuda", "engine.client-memory-gb": 80,
                                                                         "engine.gradient-checkpointing": "auto"})
    shape = ModelShape.of(shape_config("qwen2.5-1.5b"))
    line = token_budgets(cfg, shape, 2048, 80.0)
    whole, every = (int(x.replace(",", "")) for x in re.findall(r"up to ([\d,]+)", line))
    placement = place_run(cfg, shape=shape, context_tokens=2048, budget_bytes=80 * GB)
    room = placement.activation_room_bytes
    assert f"({room / GB:.1f} GiB left" in line and 2048 < whole < every
    per = plan_layer_activations(cfg, shape, placement)  # the preset's engine.param-dtype auto: the bf16 working copy on a GPU
    assert per == layer_activations(shape, "bf16-mixed", "bf16")
    assert layers_to_checkpoint(shape, whole, room, per) == 0 and layers_to_checkpoint(shape, whole + 1, room, per) >= 1
    assert update_activation_bytes(shape, every, 28, per) <= room < update_activation_bytes(shape, every + 1, 28, per)


def test_the_plan_counts_the_static_engines_cache_as_the_engine_allocates_it(tiny_lm):
    """rollout.generation-batch-size=0 sizes the batch by the plan, so the plan must hold what the static engine really allocates:
    cache columns in steps of 1,024, and with CUDA graphs rows rounded up to the largest power-of-two bucket (bucketed
    here on a CPU, as a GPU does); the engine's constants and the planner's agree."""
    import torch

    import fedagent_flwr.agent.engine.decode as decode
    from fedagent_flwr.agent.engine import memory

    assert (memory.CAPACITY_STEP, memory.WINDOW_STEP) == (decode.CAPACITY_STEP, decode.WINDOW_STEP)
    decoder = decode.StaticDecoder(tiny_lm, torch.float32, cuda_graphs=False, bucketed=True)
    prompts = [[5 + i % 7] * (20 + i) for i in range(5)]  # 5 rows, the longest 24 tokens
    decoder.start(prompts, 0, max_new_tokens=9)
    needed = 24 + 8  # the last sampled token is never fed back
    assert decoder.capacity == memory.decode_rows(5, needed, static_decoder=True, cuda_graphs=True) == (8, 1024)
    shape = ModelShape.of(tiny_lm.config)
    name, planned = memory.kv_cache("kv", shape, needed, 5, 4, static_decoder=True, cuda_graphs=True)
    assert planned == decoder.k.numel() * 4 + decoder.v.numel() * 4  # fp32 cache
    assert memory.decode_rows(5, needed, static_decoder=False, cuda_graphs=True) == (5, needed)  # hf: as they are


def test_auto_rows_stop_below_the_engines_next_bucket():
    """With rows rounded to powers of two the plan grows in steps: 65 rows cost a 128-row cache, so a budget between
    the 64- and 128-row plans gets 64 rows, not a count that a straight line through 0 and 1 rows would give."""
    from fedagent_flwr.agent.engine import memory

    shape = ModelShape.of(shape_config("qwen2.5-0.5b"))

    def plan(rows: int):
        return memory.MemoryPlan("c", (("fixed", GB), memory.kv_cache("kv", shape, 2048, rows, 2, True, True)))

    budget = (plan(64).total + plan(65).total) / 2
    assert plan(64).total < budget < plan(65).total == plan(128).total
    assert memory.rows_that_fit(plan, budget, 512) == 64
    assert memory.rows_that_fit(plan, plan(512).total, 512) == 512 and memory.rows_that_fit(plan, 0, 512) == 1


def test_the_command_plans_for_the_machine_it_names_whatever_this_one_has(capsys):
    """--device cuda on a machine without a GPU plans what a GPU run holds: auto resolves as there (bf16-mixed, the
    static engine with its weight copy and graphs), and the output says so; --device cpu plans a CPU run."""
    from fedagent_flwr.experiments.memory_plan import main

    def plan(device: str) -> dict[str, str]:
        main(["--shape", "qwen2.5-0.5b", "--device", device, "--context-tokens", "512"])
        out = capsys.readouterr().out
        rows = {line[:40].strip(): line[40:].strip() for line in out.splitlines() if line.startswith("  ")}
        return {"out": out} | rows

    gpu, cpu = plan("cuda"), plan("cpu")
    assert "planned for a machine with a CUDA GPU (--device cuda)" in gpu["out"] and "decode engine static" in gpu["out"]
    assert "precision bf16-mixed" in gpu["out"] and gpu["static decoder's weight copy"] != "0.00 GiB"
    assert gpu["decode graphs (outputs and pool)"] != "0.00 GiB"
    assert "planned for a machine without a GPU (--device cpu)" in cpu["out"] and "decode engine hf" in cpu["out"]
    assert cpu["static decoder's weight copy"] == "0.00 GiB" and "precision fp32" in cpu["out"]


def test_the_fedagent_paper_presets_memory_keys_bring_the_15b_client_under_one_80_gib_card(capsys):
    """configs/fedagent-paper.toml sets its memory keys so that a client fits one 80 GB card: with them the 1.5B
    client's plan at a 2,048-token context fits 80 GiB, without them it does not (docs/presets.md quotes both plans,
    written by fedagent_flwr/experiments/memory_figures.py)."""
    from fedagent_flwr.experiments.memory_plan import main

    preset = Path(__file__).resolve().parents[2] / "configs" / "fedagent-paper.toml"

    def fits(*extra: str) -> bool:
        main(["--shape", "qwen2.5-1.5b", "--context-tokens", "2048", "--run-config", str(preset), *extra])
        return "fits a 80 GiB GPU per client: yes" in capsys.readouterr().out

    assert fits()
    assert not fits("--set", "engine.gradient-checkpointing=false", "--set", "engine.logprob-chunk-tokens=0",
                    "--set", "grpo.group-by-length=false")


def test_the_host_plan_counts_the_message_one_file_the_reply_and_one_gathered_weight():
    from fedagent_flwr.methods.memory import host_plan

    config = AutoConfig.for_model("qwen2", hidden_size=8, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                                  intermediate_size=16, vocab_size=32, tie_word_embeddings=True)
    shape = ModelShape.of(config)  # 1480 parameters (test above); the embedding, 32 x 8, its largest weight
    full = RunConfig.from_run_config({"engine.ranks-per-client": 2, "grpo.finetuning": "full"})
    rows = host_plan(full, shape).as_dict()
    assert rows == {"sent weights, Flower's message": 1480 * 4, "round file: the sent weights, then the reply": 1480 * 4,
                    "rank 0: a weight gathered, and its buffer": 2 * 32 * 8 * 4, "the reply, Flower's record": 1480 * 4,
                    "total": 3 * 1480 * 4 + 2 * 32 * 8 * 4}
    # bf16 on the wire: the message and the encoded reply at half, each decoded or built in fp32 beside them
    rows = host_plan(full.updated({"federation.transfer-dtype": "bf16"}), shape).as_dict()
    assert rows["sent weights, Flower's message (bf16)"] == 1480 * 2 and rows["sent weights decoded to fp32"] == 1480 * 4
    assert rows["the reply encoded in bf16"] == 1480 * 2
    # a LoRA adapter travels alone: r x (in + out) of q and v, and the widest matrix r x 8 is what is gathered at once
    lora = full.updated({"grpo.finetuning": "lora", "lora.r": 2, "lora.target-modules": "q_proj,v_proj"})
    rows = host_plan(lora, shape).as_dict()
    assert rows["round file: the sent weights, then the reply"] == 112 * 4 and rows["rank 0: a weight gathered, and its buffer"] == 2 * 2 * 8 * 4
    # a baseline's kept AdamW state rides in the files and is held twice in the process
    kept = full.updated({"baseline.name": "centralized", "baseline.optimizer": "keep"})
    rows = host_plan(kept, shape).as_dict()
    assert rows["round file: the sent weights, then the reply"] == 3 * 1480 * 4 and rows["AdamW state kept, and its working copy"] == 4 * 1480 * 4
