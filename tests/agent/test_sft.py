"""Supervised fine-tuning goes through TRL's SFTTrainer with the loss the project means: the mean negative
log-likelihood of the completion tokens only, prompts masked out."""

import copy
import random

import numpy as np
import pytest
import torch
import trl
from trl import SFTTrainer

from fedagent_flwr.agent.training.sft import SupervisedConfig, supervised_finetune
from fedagent_flwr.agent.engine.tokens import collate, completion_logprobs


def _pairs(tokenizer, n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    return [(rng.integers(3, len(tokenizer), size=int(rng.integers(6, 14))).tolist(),
             rng.integers(3, len(tokenizer), size=int(rng.integers(2, 6))).tolist()) for _ in range(n)]


def _completion_nll(model, samples, pad_id) -> float:
    with torch.no_grad():
        logprobs, mask = completion_logprobs(model, collate(samples, pad_id))
    return float(-(logprobs.sum() / mask.sum()))


def _all_token_nll(model, samples, pad_id) -> float:
    batch = collate(samples, pad_id)
    batch["completion_mask"] = batch["attention_mask"].bool()
    with torch.no_grad():
        logprobs, mask = completion_logprobs(model, batch)
    return float(-(logprobs.sum() / mask.sum()))


def test_the_first_step_loss_is_the_completion_token_nll_of_the_untrained_model(tiny_lm, maze_tokenizer):
    """One batch holding every sample: TRL's first logged loss is the loss before any update. It must equal the
    completion-only NLL (and not the NLL over prompt tokens too, which differs on these random sequences)."""
    samples = _pairs(maze_tokenizer, 6)
    expected = _completion_nll(tiny_lm, samples, maze_tokenizer.pad_token_id)
    assert abs(expected - _all_token_nll(tiny_lm, samples, maze_tokenizer.pad_token_id)) > 1e-3
    losses = supervised_finetune(copy.deepcopy(tiny_lm), samples, maze_tokenizer,
                                 SupervisedConfig(steps=2, batch_size=len(samples), learning_rate=1e-3))
    assert len(losses) == 2
    assert losses[0] == pytest.approx(expected, rel=1e-3)


def test_training_fits_the_completions_and_leaves_the_model_in_eval_mode(tiny_lm, maze_tokenizer):
    samples = _pairs(maze_tokenizer, 8, seed=1)
    model = copy.deepcopy(tiny_lm)
    before = _completion_nll(model, samples, maze_tokenizer.pad_token_id)
    losses = supervised_finetune(model, samples, maze_tokenizer,
                                 SupervisedConfig(steps=30, batch_size=4, learning_rate=3e-3, group_by_length=True))
    assert len(losses) == 30 and not model.training
    assert _completion_nll(model, samples, maze_tokenizer.pad_token_id) < 0.7 * before


def test_the_same_seed_gives_the_same_weights_and_the_callers_generators_are_untouched(tiny_lm, maze_tokenizer):
    """Trainer seeds the global generators; a client's later draws must not depend on whether SFT ran."""
    samples = _pairs(maze_tokenizer, 8, seed=2)
    cfg = SupervisedConfig(steps=3, batch_size=4, learning_rate=1e-3, seed=7)
    random.seed(1), np.random.seed(1), torch.manual_seed(1)
    a, b = copy.deepcopy(tiny_lm), copy.deepcopy(tiny_lm)
    supervised_finetune(a, samples, maze_tokenizer, cfg)
    draws = (random.random(), float(np.random.rand()), float(torch.rand(())))
    random.seed(1), np.random.seed(1), torch.manual_seed(1)
    assert draws == (random.random(), float(np.random.rand()), float(torch.rand(())))
    supervised_finetune(b, samples, maze_tokenizer, cfg)
    for (name, x), y in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(x, y), name


def test_it_is_trl_that_trains(tiny_lm, maze_tokenizer, monkeypatch):
    """No hand-written loop hides behind the helper: it builds TRL's SFTTrainer, and truncates nothing."""
    built = []

    class Recording(SFTTrainer):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            built.append(self)

    monkeypatch.setattr(trl, "SFTTrainer", Recording)
    supervised_finetune(copy.deepcopy(tiny_lm), _pairs(maze_tokenizer, 4), maze_tokenizer,
                        SupervisedConfig(steps=1, batch_size=2))
    assert len(built) == 1 and built[0].args.max_length is None


def test_length_grouped_batches_cover_every_sample_with_little_padding(tiny_lm, maze_tokenizer, monkeypatch):
    """group_by_length (the multi-env and WebShop presets) gives batches of similar length: an epoch of the
    trainer's own data loader pads less than half what random batches would, and still holds every sample."""
    built = []
    monkeypatch.setattr(trl, "SFTTrainer", lambda *a, **k: built.append(SFTTrainer(*a, **k)) or built[-1])
    rng = np.random.default_rng(0)
    # Maze-like, BabyAI-like and WebShop-like prompts; transformers groups within megabatches of up to 50
    # batches (fewer for small datasets), so a preset-sized dataset
    lengths = rng.choice([20, 40, 300], size=1024)
    samples = [([5] * int(n), [6]) for n in lengths]
    supervised_finetune(copy.deepcopy(tiny_lm), samples, maze_tokenizer,
                        SupervisedConfig(steps=1, batch_size=16, group_by_length=True))
    epoch = list(built[0].get_train_dataloader())
    seen = sorted(int(n) for b in epoch for n in b["attention_mask"].sum(dim=1))
    assert seen == sorted(int(n) + 1 for n in lengths)  # every sample once
    padded = sum(b["input_ids"].numel() for b in epoch)
    random_padded = sum(16 * (lengths[rng.choice(1024, 16, replace=False)].max() + 1) for _ in range(64))
    assert padded < 0.5 * random_padded


def test_micro_batches_accumulate_to_the_batchs_loss_and_weights(tiny_lm, maze_tokenizer):
    """A batch of 8 in passes of 2 (gradient accumulation) trains as the batch of 8 does: the same losses, the same
    weights, with 2 samples in a forward pass. Completions of different lengths, so a per-pass mean would differ."""
    samples = _pairs(maze_tokenizer, 16, seed=3)
    widths = []
    trained = {}
    for micro in (0, 2):
        widths.clear()
        model = copy.deepcopy(tiny_lm)
        model.register_forward_pre_hook(lambda m, args, kwargs: widths.append(len(kwargs["input_ids"])), with_kwargs=True)
        losses = supervised_finetune(model, samples, maze_tokenizer,
                                     SupervisedConfig(steps=3, batch_size=8, micro_batch_size=micro, learning_rate=1e-2))
        trained[micro] = (losses, model.state_dict())
        assert max(widths) == (micro or 8)
    assert trained[2][0] == pytest.approx(trained[0][0], rel=1e-5)
    # atol 1e-5: a parameter whose gradient is zero in exact arithmetic (the key bias: softmax ignores a shift shared by
    # all keys) gets rounding noise, which AdamW scales to steps of its own; on an Intel Xeon the two summation orders
    # ended 2.3e-6 apart there. A per-pass mean, the bug this guards, moves the losses above and every weight far more.
    for (name, x), y in zip(trained[0][1].items(), trained[2][1].values()):
        torch.testing.assert_close(y, x, rtol=1e-4, atol=1e-5, msg=name)


@pytest.mark.parametrize("bad", [{"steps": 0}, {"batch_size": 0}, {"precision": "auto"}, {"precision": "fp16"},
                                 {"micro_batch_size": 3}, {"micro_batch_size": -1}, {"attention": "flash"}])
def test_bad_settings_are_refused(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        SupervisedConfig(**bad)


class _Rates:
    """The learning rate Trainer logs at every step."""

    def __new__(cls):
        from transformers import TrainerCallback

        class Rates(TrainerCallback):
            def __init__(self):
                self.rates = []

            def on_log(self, args, state, control, logs=None, **kwargs):
                if logs and "learning_rate" in logs:
                    self.rates.append(logs["learning_rate"])
        return Rates()


@pytest.mark.parametrize("micro", [0, 2])
def test_epochs_count_the_steps_from_the_samples_and_cosine_decays_the_rate_without_warm_up(tiny_lm, maze_tokenizer, micro):
    """Fed-SE's second version trains 2 epochs over the client's data a round with a cosine schedule and no warm-up:
    10 samples in batches of 4 make 3 steps an epoch, 6 in all, whatever `steps` says (accumulated micro-batches
    included); the constant schedule holds the rate, the cosine one starts at it and falls towards 0."""
    samples = _pairs(maze_tokenizer, 10, seed=3)
    runs = {}
    for schedule in ("constant", "cosine"):
        rates = _Rates()
        cfg = SupervisedConfig(steps=50, epochs=2, batch_size=4, micro_batch_size=micro, learning_rate=1e-3,
                               lr_schedule=schedule)
        runs[schedule] = (supervised_finetune(copy.deepcopy(tiny_lm), samples, maze_tokenizer, cfg, [rates]), rates.rates)
    (constant_losses, constant), (cosine_losses, cosine) = runs["constant"], runs["cosine"]
    assert len(constant_losses) == len(cosine_losses) == 6
    assert constant == pytest.approx([1e-3] * 6)
    assert cosine[0] == pytest.approx(1e-3, rel=0.1) and all(a > b for a, b in zip(cosine, cosine[1:]))
    assert cosine[-1] < 0.1e-3, cosine
    with pytest.raises(ValueError, match="lr_schedule"):
        SupervisedConfig(lr_schedule="linear")


def _head_rows(monkeypatch) -> list[int]:
    """The rows TRL's fused head projects through the vocabulary, one entry a forward pass."""
    from trl.trainer import utils as trl_utils

    rows, apply = [], trl_utils._ChunkedLogProbFunction.apply
    monkeypatch.setattr(trl_utils._ChunkedLogProbFunction, "apply", lambda hidden, *a: rows.append(len(hidden)) or apply(hidden, *a))
    return rows


def _adapted(model):
    from peft import LoraConfig, get_peft_model

    return get_peft_model(copy.deepcopy(model), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                                           init_lora_weights=False))


def test_the_head_runs_only_at_the_completions_positions_on_cpu_under_an_adapter(tiny_lm, maze_tokenizer, monkeypatch):
    """An agent step's completion is a few tokens after a long prompt: under a LoRA adapter (Fed-SE) the vocabulary
    projection runs at the completion's positions only, one row a completion token (TRL's default on CPU is every
    position of the batch). A trained head (the tiny models' build) keeps TRL's path, so those builds stay as they were
    to the bit."""
    rows = _head_rows(monkeypatch)
    samples = _pairs(maze_tokenizer, 4, seed=4)
    torch.manual_seed(1)
    supervised_finetune(_adapted(tiny_lm), samples, maze_tokenizer, SupervisedConfig(steps=1, batch_size=4))
    assert rows == [sum(len(c) for _, c in samples)]
    assert rows[0] < 0.5 * len(samples) * max(len(p) + len(c) for p, c in samples)
    rows.clear()
    supervised_finetune(copy.deepcopy(tiny_lm), samples, maze_tokenizer, SupervisedConfig(steps=1, batch_size=4))
    assert rows == [len(samples) * (max(len(p) + len(c) for p, c in samples) - 1)]  # every position but the last


@pytest.mark.parametrize("precision", ["fp32", "bf16-mixed"])
def test_the_adapter_trains_as_with_the_head_at_every_position(tiny_lm, maze_tokenizer, monkeypatch, precision):
    """Fed-SE's case, a LoRA adapter over a frozen head: scoring only the completions' positions changes which rows
    the head computes, not the loss nor its gradient. The forward's rows are computed alone, so the losses are the
    same to the bit as under TRL's every-position path; the backward's products have fewer rows, which may sum in
    another order, so the adapter agrees to rounding (micro-batches of different widths, accumulated)."""
    import contextlib

    from fedagent_flwr.agent.training import sft

    samples = _pairs(maze_tokenizer, 12, seed=5)
    runs, rows = {}, _head_rows(monkeypatch)
    for compact in (True, False):
        if not compact:
            monkeypatch.setattr(sft, "head_at_loss_positions", contextlib.nullcontext)
        torch.manual_seed(1)
        model = _adapted(tiny_lm)
        rows.clear()
        losses = supervised_finetune(model, samples, maze_tokenizer, SupervisedConfig(
            steps=3, batch_size=4, micro_batch_size=2, learning_rate=1e-2, precision=precision))
        runs[compact] = losses, {k: v.clone() for k, v in model.state_dict().items() if "lora_" in k}, sum(rows)
    assert runs[True][2] < runs[False][2]  # the two paths did differ in the rows the head computed
    assert runs[True][0] == runs[False][0]
    assert runs[True][1].keys() == runs[False][1].keys() and runs[True][1]
    for name, weight in runs[True][1].items():
        # an adapter trained on the wrong positions (labels shifted by one, or the prompt's) moves by ~1e-2 here
        torch.testing.assert_close(weight, runs[False][1][name], rtol=0, atol=1e-6, msg=name)


def _eager_calls(monkeypatch) -> list[int]:
    """Calls of transformers' eager attention in the tiny Qwen2 model, one entry each."""
    from transformers.models.qwen2 import modeling_qwen2

    calls, eager = [], modeling_qwen2.eager_attention_forward
    monkeypatch.setattr(modeling_qwen2, "eager_attention_forward", lambda *a, **k: calls.append(1) or eager(*a, **k))
    return calls


@pytest.mark.parametrize("precision", ["fp32", "bf16-mixed"])
def test_the_fine_tuning_runs_the_attention_kernel_it_is_given_and_trains_alike(tiny_lm, maze_tokenizer, monkeypatch,
                                                                             precision):
    """engine.attn-implementation=eager: every forward of the fine-tuning runs transformers' eager attention, and the model
    computes with its own kernel again after it. The same function as SDPA's up to rounding: in fp32 the losses agree
    to 1e-5 (eager handed no mask moved the first loss by 4e-3 here; checked) and the adapters closely; under bf16,
    where eager rounds the scores to bf16 before the softmax and SDPA keeps them in fp32, to 2e-2."""
    samples = _pairs(maze_tokenizer, 8, seed=6)
    calls, runs = _eager_calls(monkeypatch), {}
    for attention in ("sdpa", "eager"):
        torch.manual_seed(1)
        model = _adapted(tiny_lm)
        calls.clear()
        losses = supervised_finetune(model, samples, maze_tokenizer, SupervisedConfig(
            steps=3, batch_size=4, micro_batch_size=2, learning_rate=1e-2, precision=precision, attention=attention))
        assert len(calls) == (0 if attention == "sdpa" else 3 * 2 * len(tiny_lm.model.layers))  # steps x passes x layers
        assert model.config._attn_implementation == "sdpa"
        runs[attention] = losses, {k: v.clone() for k, v in model.state_dict().items() if "lora_" in k}
    tolerance = 1e-5 if precision == "fp32" else 2e-2
    assert runs["eager"][0] == pytest.approx(runs["sdpa"][0], rel=tolerance)
    if precision == "fp32":
        for name, weight in runs["eager"][1].items():
            torch.testing.assert_close(weight, runs["sdpa"][1][name], rtol=0, atol=1e-5, msg=name)
