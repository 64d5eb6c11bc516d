"""agent/engine/passes.py: the object that holds how GRPO's training passes compute. Its default reproduces the update
as it was written before it (the plumbing inline) bit for bit; each diagnostic switch does what it says; the grpo and
engine sections check their own values and the trainer only what needs the model."""

import contextlib
import copy
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import fedagent_flwr.agent.engine.passes as passes_module
import fedagent_flwr.agent.training.grpo as grpo
from fedagent_flwr.agent.engine.attention import variable_shape_attention
from fedagent_flwr.agent.engine.checkpointing import activation_checkpointing
from fedagent_flwr.agent.engine.kernels import training_kernels
from fedagent_flwr.agent.engine.master_weights import Bf16WorkingCopy, bf16_view
from fedagent_flwr.agent.engine.passes import TrainingPasses
from fedagent_flwr.agent.engine.precision import autocast
from fedagent_flwr.agent.engine.tokens import collate, completion_logprobs, model_attention_mask, to_device
from fedagent_flwr.agent.play.rollout import RolloutConfig
from fedagent_flwr.agent.training.grpo import GRPOTrainer
from fedagent_flwr.agent.training.advantages import StepSample
from fedagent_flwr.agent.engine.micro_batches import by_length, micro_batches
from fedagent_flwr.agent.training.grpo_loss import grpo_loss
from fedagent_flwr.config import EngineSection, GRPOSection, RunConfig
from fedagent_flwr.methods.placement import place_run
from placed import grpo_trainer


def _samples(vocab: int, n: int = 8, seed: int = 7) -> list[StepSample]:
    """Agent steps of distinct lengths (prompts 6 apart, completions of 1 to 5 tokens), so every micro-batch of two is
    padded."""
    rng = np.random.default_rng(seed)
    lengths = rng.permutation(np.arange(4, 4 + 6 * n, 6))
    return [StepSample(rng.integers(3, vocab, size=int(n_p)).tolist(), rng.integers(3, vocab, size=int(rng.integers(1, 6))).tolist(),
                       float(rng.normal()), float(rng.uniform(0.2, 1.0))) for n_p in lengths]


def _reference_update(trainer: GRPOTrainer, samples: list[StepSample], rng: np.random.Generator) -> dict[str, float]:
    """GRPOTrainer.update as written before TrainingPasses, its plumbing inline (full fine-tuning, a frozen KL copy):
    what the default passes must reproduce bit for bit."""
    cfg, passes, model, device = trainer.config, trainer.passes, trainer.model, trainer.device

    @torch.no_grad()
    def logprobs(scored, samples):
        order = by_length(range(len(samples)), [s.length for s in samples]) if cfg.group_by_length else range(len(samples))
        pending = []
        for micro in micro_batches(list(order), [s.length for s in samples], cfg.log_prob_rows(), cfg.log_prob_max_token_len_per_gpu):
            batch = collate([(samples[i].prompt_ids, samples[i].completion_ids) for i in micro], trainer.tokenizer.pad_token_id)
            with autocast(passes.precision, device), training_kernels(scored, passes.training_kernels):
                lp, _ = completion_logprobs(scored, batch, trainer.rollout.temperature, passes.logprob_chunk_tokens)
            pending.append((micro, lp, batch["completion_mask"][:, 1:]))
        out = [None] * len(samples)
        for micro, lp, host_mask in pending:
            for i, row, m in zip(micro, lp.cpu(), host_mask):
                out[i] = row[m]
        return out

    model.eval()
    working_copy = Bf16WorkingCopy(model) if passes.param_dtype == "bf16" else contextlib.nullcontext()
    with activation_checkpointing(model, passes.gradient_checkpointing, passes.activation_room_bytes, passes.precision,
                                  passes.param_dtype) as ckpt, training_kernels(model, passes.training_kernels), working_copy as working:
        old = None if len(samples) <= cfg.mini_batch_size else logprobs(model, samples)
        ref = None
        if cfg.beta > 0:
            with bf16_view(trainer.reference) if passes.param_dtype == "bf16" else contextlib.nullcontext():
                ref = logprobs(trainer.reference, samples)
        order = rng.permutation(len(samples))
        pending, grad_norms = [], []
        for start in range(0, len(order), cfg.mini_batch_size):
            mb = list(order)[start : start + cfg.mini_batch_size]
            trainer.optimizer.zero_grad(set_to_none=True)
            normalizer = sum(samples[i].weight * len(samples[i].completion_ids) for i in mb)
            if cfg.group_by_length:
                mb = by_length(mb, [s.length for s in samples])
            for micro in micro_batches(mb, [s.length for s in samples], cfg.ppo_micro_batch_size_per_gpu, cfg.ppo_max_token_len_per_gpu):
                chunk = [samples[i] for i in micro]
                batch = collate([(s.prompt_ids, s.completion_ids) for s in chunk], trainer.tokenizer.pad_token_id)
                if ckpt is not None:
                    ckpt.fit(batch["input_ids"].numel())
                with autocast(passes.precision, device):
                    lp, mask = completion_logprobs(model, batch, trainer.rollout.temperature, passes.logprob_chunk_tokens)
                    host_mask = batch["completion_mask"][:, 1:]
                    old_lp = lp.detach() if old is None else grpo._scatter_like(host_mask, [old[i] for i in micro], mask.device)
                    ref_lp = grpo._scatter_like(host_mask, [ref[i] for i in micro], mask.device) if ref is not None else None
                    adv = to_device(torch.tensor([s.advantage for s in chunk], dtype=torch.float32), lp.device)
                    weights = to_device(torch.tensor([s.weight for s in chunk], dtype=torch.float32), lp.device)
                    loss, stats = grpo_loss(lp, old_lp, adv, mask, cfg.epsilon, ref_lp, cfg.beta, weights, normalizer)
                with variable_shape_attention(device):
                    loss.backward()
                pending.append((loss.detach(), stats, int(host_mask.sum())))
            if working is not None:
                working.master_view()
            grad_norms.append(torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad],
                                                             cfg.max_grad_norm))
            trainer.optimizer.step()
            if working is not None:
                working.refresh()
        tokens = sum(n for _, _, n in pending)
        result = {"loss": sum(float(loss) for loss, _, _ in pending) / len(grad_norms),
                  "kl": sum(float(stats["kl"]) * n for _, stats, n in pending) / tokens,
                  "clip_frac": sum(float(stats["clip_frac"]) * n for _, stats, n in pending) / tokens,
                  "grad_norm": float(np.mean([float(norm) for norm in grad_norms])),
                  "optimizer_steps": float(len(grad_norms)), "train_samples": float(len(samples))}
        if ckpt is not None:
            result["checkpointed_layers"] = float(np.mean(ckpt.counts)) / max(1, len(ckpt.layers))
    return result


@pytest.mark.parametrize("settings", [
    {},  # the project's defaults on a CPU: fp32, KL to the round-start copy, two minibatches
    {"precision": "bf16-mixed", "engine.param-dtype": "bf16", "engine.gradient-checkpointing": True,
     "engine.logprob-chunk-tokens": 3},
    {"engine.gradient-checkpointing": "auto", "grpo.group-by-length": True, "grpo.ppo-max-token-len-per-gpu": 40},
], ids=["fp32", "bf16-working-copy-checkpointed-chunked", "auto-grouped-by-tokens"])
def test_the_default_passes_reproduce_the_update_bit_for_bit(tiny_lm, maze_tokenizer, settings):
    cfg = RunConfig.from_run_config({"grpo.learning-rate": 1e-3, "grpo.weight-decay": 0.01, "grpo.beta": 0.05,
                                     "grpo.mini-batch-size": 4, "grpo.ppo-micro-batch-size-per-gpu": 2, "device": "cpu",
                                     **settings})
    placement = place_run(cfg)
    if "engine.gradient-checkpointing" in settings and placement.gradient_checkpointing is True:
        # auto with a room, as place() resolves it on a machine whose plan leaves 1e9 bytes to the activations
        placement = replace(placement, gradient_checkpointing="fitted", activation_room_bytes=1e9)
    samples = _samples(tiny_lm.config.vocab_size)
    trainers = [grpo_trainer(copy.deepcopy(tiny_lm), maze_tokenizer, cfg, RolloutConfig(history_length=0),
                             placement=placement) for _ in range(2)]
    for seed in (0, 1):  # two updates: the second starts from the state the first left (working copy, checkpointing)
        new = trainers[0].update(samples, np.random.default_rng(seed))
        old = _reference_update(trainers[1], samples, np.random.default_rng(seed))
        assert new == old
    assert new["optimizer_steps"] == 2 and new["kl"] > 0
    for (name, a), (_, b) in zip(trainers[0].model.named_parameters(), trainers[1].model.named_parameters()):
        assert a.dtype == b.dtype == torch.float32 and torch.equal(a, b), name
    for key, value in trainers[1].optimizer_arrays().items():
        assert np.array_equal(trainers[0].optimizer_arrays()[key], value), key


def test_the_passes_take_the_configs_settings_and_default_to_what_runs_use(tiny_lm, maze_tokenizer):
    cfg = RunConfig.from_run_config({"device": "cpu", "engine.training-kernels": "compile", "engine.attn-implementation": "eager"})
    placement = replace(place_run(cfg), gradient_checkpointing="fitted", activation_room_bytes=5e8)
    passes = grpo_trainer(tiny_lm, maze_tokenizer, cfg, RolloutConfig(history_length=0), placement=placement).passes
    assert passes == TrainingPasses(torch.device("cpu"), "fp32", "fp32", "compile", "fitted", 5e8, attention="eager")
    assert (passes.fused_adamw, passes.host_waits, passes.padding_mask) == (True, False, False)


def test_fused_adamw_takes_the_fused_kernel_on_a_gpu_and_false_takes_pytorchs_default(tiny_lm, maze_tokenizer, monkeypatch):
    built = []
    with monkeypatch.context() as patch:
        patch.setattr(torch.optim, "AdamW", lambda params, **kwargs: built.append(kwargs))
        on_gpu, on_cpu = [SimpleNamespace(device=torch.device("cuda"))], [SimpleNamespace(device=torch.device("cpu"))]
        for fused in (True, False):
            for params in (on_gpu, on_cpu):
                TrainingPasses(torch.device("cpu"), "fp32", fused_adamw=fused).optimizer(params, 1e-3, 0.01)
    # fused only on a GPU and only when asked; the CPU's reference loop either way (the CPU jobs' numbers)
    assert [kwargs["fused"] for kwargs in built] == [True, None, None, None]
    assert all(kwargs["lr"] == 1e-3 and kwargs["weight_decay"] == 0.01 for kwargs in built)
    cfg = RunConfig.from_run_config({"device": "cpu", "grpo.learning-rate": 1e-3, "grpo.weight-decay": 0.01})
    plain = grpo_trainer(tiny_lm, maze_tokenizer, cfg, RolloutConfig(history_length=0), fused_adamw=False).optimizer
    assert type(plain) is torch.optim.AdamW and not plain.defaults["fused"]
    assert (plain.defaults["lr"], plain.defaults["weight_decay"]) == (1e-3, 0.01)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_a_gpu_fused_adamw_false_builds_pytorchs_default(tiny_lm, maze_tokenizer):
    cfg = RunConfig(device="cuda", precision="fp32")
    model = copy.deepcopy(tiny_lm).cuda()
    assert grpo_trainer(model, maze_tokenizer, cfg, RolloutConfig(history_length=0)).optimizer.defaults["fused"]
    plain = grpo_trainer(model, maze_tokenizer, cfg, RolloutConfig(history_length=0), fused_adamw=False).optimizer
    assert not plain.defaults["fused"]


def test_host_waits_wait_for_the_device_before_and_after_every_forward(tiny_lm, maze_tokenizer, monkeypatch):
    """On a CPU there is nothing to wait for, so the hook the switch calls is counted: one wait before and one after
    each forward of the old-policy, KL-reference and update passes; none with the switch off."""
    waits, forwards = [], []
    monkeypatch.setattr(passes_module, "wait_for_device", lambda device: waits.append(device))
    real = grpo.completion_logprobs
    monkeypatch.setattr(grpo, "completion_logprobs", lambda *a, **k: forwards.append(len(waits)) or real(*a, **k))
    cfg = RunConfig.from_run_config({"grpo.learning-rate": 1e-3, "grpo.beta": 0.05, "grpo.mini-batch-size": 4, "grpo.ppo-micro-batch-size-per-gpu": 2, "device": "cpu"})
    samples = _samples(tiny_lm.config.vocab_size)
    for on in (True, False):
        waits.clear()
        forwards.clear()
        trainer = grpo_trainer(copy.deepcopy(tiny_lm), maze_tokenizer, cfg, RolloutConfig(history_length=0), host_waits=on)
        trainer.update(samples, np.random.default_rng(0))
        assert len(forwards) == 12  # old policy, reference, update: 4 micro-batches each
        # each forward finds the host past its own wait before and the previous forward's wait after
        assert (forwards, len(waits)) == (([2 * i + 1 for i in range(12)], 24) if on else ([0] * 12, 0))
    assert all(device == torch.device("cpu") for device in waits)


@pytest.mark.parametrize("chunk_tokens", [0, 3])
def test_padding_mask_hands_a_qwen_model_the_4d_mask(tiny_lm, maze_tokenizer, chunk_tokens):
    """Right-padded batches reach a Qwen model under SDPA with the mask mapping (no padding mask: the causal kernel);
    padding_mask=True hands it the 4-D causal-and-padding mask, as before the mapping. The loss is the same function."""
    mask = collate([([5, 6, 7], [8]), ([5], [9])], pad_id=0)["attention_mask"]
    cpu = torch.device("cpu")
    assert model_attention_mask(tiny_lm, mask, cpu) == {"full_attention": None}
    assert model_attention_mask(tiny_lm, mask, cpu, padding_mask=True).shape == (2, 1, 4, 4)
    cfg = RunConfig.from_run_config({"grpo.learning-rate": 1e-3, "grpo.beta": 0.05, "grpo.mini-batch-size": 4, "grpo.ppo-micro-batch-size-per-gpu": 2, "device": "cpu", "engine.logprob-chunk-tokens": chunk_tokens})
    samples = _samples(tiny_lm.config.vocab_size)
    stats, seen = {}, {}
    for on in (False, True):
        model = copy.deepcopy(tiny_lm)
        body, masks = model.model, []
        # the body: what the full path's model and the chunked path's decoder both hand the mask to
        body.forward = lambda *a, inner=body.forward, **k: masks.append(k.get("attention_mask")) or inner(*a, **k)
        trainer = grpo_trainer(model, maze_tokenizer, cfg, RolloutConfig(history_length=0), padding_mask=on)
        stats[on], seen[on] = trainer.update(samples, np.random.default_rng(0)), masks
    assert len(seen[False]) == len(seen[True]) == 12  # every forward of the three passes, each micro-batch padded
    assert all(m == {"full_attention": None} for m in seen[False])
    assert all(isinstance(m, torch.Tensor) and m.dim() == 4 and not m.all() for m in seen[True])
    for key in ("loss", "kl", "grad_norm"):
        assert stats[True][key] == pytest.approx(stats[False][key], rel=1e-4, abs=1e-8), key


def test_the_log_prob_passes_inside_an_update_do_not_enter_the_kernels_again(tiny_lm, maze_tokenizer, monkeypatch):
    """Leaving a nested training_kernels("compile") switches the layers back to eager: the old-policy pass inside the
    update must run on the kernels the update holds, and leave them on for the update's own micro-batches."""
    depth: dict[int, int] = {}

    @contextlib.contextmanager
    def counted(model, kind):
        depth[id(model)] = depth.get(id(model), 0) + 1
        try:
            yield
        finally:
            depth[id(model)] -= 1

    monkeypatch.setattr(passes_module, "training_kernels", counted)
    seen = []
    real = grpo.completion_logprobs
    monkeypatch.setattr(grpo, "completion_logprobs", lambda model, *a, **k: seen.append(depth.get(id(model))) or real(model, *a, **k))
    cfg = RunConfig.from_run_config({"grpo.learning-rate": 1e-3, "grpo.beta": 0.05, "grpo.mini-batch-size": 4, "grpo.ppo-micro-batch-size-per-gpu": 2, "device": "cpu"})
    trainer = grpo_trainer(tiny_lm, maze_tokenizer, cfg, RolloutConfig(history_length=0))
    trainer.update(_samples(tiny_lm.config.vocab_size), np.random.default_rng(0))
    assert seen == [1] * 12 and set(depth.values()) == {0}  # the policy's and the reference's passes, once each
    assert trainer._logprobs(tiny_lm, _samples(tiny_lm.config.vocab_size)) and seen[-1] == 1  # outside an update too


@pytest.mark.parametrize("section, field, value, says", [
    (GRPOSection, "ppo_micro_batch_size_per_gpu", 0, "grpo.ppo-micro-batch-size-per-gpu=0 is not allowed: expected an integer >= 1"),
    (GRPOSection, "log_prob_micro_batch_size_per_gpu", -1, "grpo.log-prob-micro-batch-size-per-gpu=-1 is not allowed: expected an integer >= 0"),
    (GRPOSection, "ppo_max_token_len_per_gpu", -1, "grpo.ppo-max-token-len-per-gpu=-1 is not allowed: expected an integer >= 0 (0 = grpo.ppo-micro-batch-size-per-gpu)"),
    (GRPOSection, "log_prob_max_token_len_per_gpu", -5, "grpo.log-prob-max-token-len-per-gpu=-5 is not allowed: expected an integer >= 0"),
    (GRPOSection, "kl_reference", "start", "grpo.kl-reference='start' is not allowed: expected auto | round-start | base"),
    (GRPOSection, "loss_aggregation", "sum", "grpo.loss-aggregation='sum' is not allowed: expected trajectory-mean | token-mean"),
    (EngineSection, "logprob_chunk_tokens", -1, "engine.logprob-chunk-tokens=-1 is not allowed: expected an integer >= 0 (0 = full logits)"),
    (EngineSection, "param_dtype", "bf8", "engine.param-dtype='bf8' is not allowed: expected"),
    (EngineSection, "training_kernels", "fast", "engine.training-kernels='fast' is not allowed: expected eager | compile | liger"),
])
def test_the_trainers_sections_refuse_a_bad_value_as_they_are_made(section, field, value, says):
    """The trainer takes the grpo and engine sections as they are: each checks itself, as TRL's GRPOConfig does."""
    with pytest.raises(ValueError) as err:
        section(**{field: value})
    assert str(err.value).startswith("invalid run config: " + says), str(err.value)
    assert "\n" not in str(err.value)


def test_a_bf16_working_copy_needs_bf16_mixed():
    with pytest.raises(ValueError, match=r"engine.param-dtype='bf16' is not allowed: expected fp32 unless a GRPO strategy "
                                         r"trains every weight \(grpo.finetuning='full'\) under precision 'bf16-mixed'"):
        RunConfig.from_run_config({"device": "cpu", "precision": "fp32", "engine.param-dtype": "bf16"})


def test_the_trainer_checks_only_what_needs_the_model(tiny_lm, maze_tokenizer):
    cfg = RunConfig.from_run_config({"device": "cpu", "precision": "bf16-mixed", "engine.param-dtype": "bf16"})
    frozen = copy.deepcopy(tiny_lm)
    frozen.model.embed_tokens.weight.requires_grad_(False)
    with pytest.raises(ValueError, match=r"param_dtype='bf16' needs full fine-tuning \(every weight trained"):
        grpo_trainer(frozen, maze_tokenizer, cfg, RolloutConfig(history_length=0))
    with pytest.raises(ValueError, match="engine.training-kernels='liger' runs Triton kernels on a CUDA device"):
        # an engine section alone takes liger (the run config refuses it with device cpu): the trainer's own check
        GRPOTrainer(tiny_lm, maze_tokenizer, cfg.grpo, RolloutConfig(history_length=0),
                    engine=replace(cfg.engine, training_kernels="liger"), placement=place_run(cfg))
