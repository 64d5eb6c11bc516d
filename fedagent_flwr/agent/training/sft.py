"""Supervised fine-tuning on agent steps, with TRL's `SFTTrainer`.

Two parts of the project train with supervision, and both go through TRL: the tiny models' behaviour-cloning
warm start on the scripted expert (a random tiny model never emits a valid action, so RL alone learns nothing)
and Fed-SE's local fine-tuning on a client's own successful trajectories. Their samples are agent steps already
tokenized exactly as the rollout engine tokenizes them, (prompt ids, completion ids), so they reach
`SFTTrainer` as `input_ids` with `labels` that mask the prompt, and TRL's loss is the loss the project wants:
the negative log-likelihood of the completion tokens, averaged over the batch's completion tokens. (`experiments/warm_start.py` trains real chat models on text rows with their chat template, through
the same `trainer_arguments`.)
"""

from __future__ import annotations

import random
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from fedagent_flwr.agent.engine.attention import training_attention, variable_shape_attention
from fedagent_flwr.agent.engine.precision import model_device
from fedagent_flwr.config.choices import LR_SCHEDULES, TRAINING_ATTENTIONS


if TYPE_CHECKING:
    from transformers import TrainerCallback
    from trl import SFTConfig as TRLSFTConfig
    from trl import SFTTrainer


@dataclass
class SupervisedConfig:
    """The knobs of one supervised pass (TRL's defaults where not set here: AdamW, betas 0.9/0.999, eps 1e-8)."""

    steps: int = 300
    epochs: int = 0  # > 0: this many passes over the samples instead of `steps` steps
    batch_size: int = 32
    # samples per forward/backward pass: a batch is accumulated over batch_size / micro_batch_size passes (TRL's
    # gradient accumulation; transformers normalises the loss over the whole batch's tokens, so the loss is the
    # batch's); 0 = batch_size
    micro_batch_size: int = 0
    learning_rate: float = 1e-3
    lr_schedule: str = "constant"  # LR_SCHEDULES
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    seed: int = 0
    # Batches of similar length (transformers' LengthGroupedSampler): with prompts of very different lengths
    # (WebShop pages next to Maze lines) random batches are mostly padding.
    group_by_length: bool = False
    precision: str = "fp32"  # or "bf16-mixed": fp32 weights, forward under bf16 autocast (agent/engine/precision.py)
    attention: str = "sdpa"  # the passes' attention kernel, sdpa | eager (agent/engine/attention.py, training_attention)

    def __post_init__(self) -> None:
        if self.steps < 1 or self.batch_size < 1 or self.epochs < 0:
            raise ValueError(f"steps and batch_size must be >= 1 and epochs >= 0, got {self.steps}, {self.batch_size} and {self.epochs}")
        if self.lr_schedule not in LR_SCHEDULES:
            raise ValueError(f"lr_schedule={self.lr_schedule!r} is not allowed: expected {' | '.join(LR_SCHEDULES)}")
        if self.micro_batch_size < 0 or (self.micro_batch_size and self.batch_size % self.micro_batch_size):
            raise ValueError(f"micro_batch_size must be 0 or divide batch_size ({self.batch_size}), got {self.micro_batch_size}")
        if self.precision not in ("fp32", "bf16-mixed"):
            raise ValueError(f"precision={self.precision!r} is not allowed: expected fp32 | bf16-mixed (resolved)")
        if self.attention not in TRAINING_ATTENTIONS:
            raise ValueError(f"attention={self.attention!r} is not allowed: expected {' | '.join(TRAINING_ATTENTIONS)}")


def trainer_arguments(output_dir: str, *, steps: int, batch_size: int, learning_rate: float, seed: int,
                      device: torch.device, bf16: bool, weight_decay: float = 0.0, max_grad_norm: float = 1.0,
                      group_by_length: bool = False, gradient_checkpointing: bool = False,
                      micro_batch_size: int = 0, epochs: int = 0, lr_schedule: str = "constant") -> TRLSFTConfig:
    """TRL's configuration for the project's supervised passes: `steps` optimizer steps, or with `epochs` > 0 that
    many passes over the data (Trainer counts the steps); a constant learning rate without warmup (what the recipes
    were tuned with) unless `lr_schedule` = cosine; a loss logged every step, nothing saved or reported, no sequence truncation (prompts
    are as long as the environment makes them), no progress bar: tqdm's carriage-return bar garbles a Flower log
    stream, and with it Trainer also prints every step's loss dict. A pass that wants progress lines passes a
    callback to supervised_finetune (tiny_model.TrainingProgress)."""
    # Imported here, not at the top: importing TRL costs every process that reads a run config a second.
    from trl import SFTConfig as TRLSFTConfig

    return TRLSFTConfig(
        output_dir=output_dir, max_steps=-1 if epochs > 0 else steps, num_train_epochs=max(epochs, 1),
        per_device_train_batch_size=micro_batch_size or batch_size,
        gradient_accumulation_steps=batch_size // (micro_batch_size or batch_size), learning_rate=learning_rate,
        lr_scheduler_type=lr_schedule, warmup_steps=0, weight_decay=weight_decay, max_grad_norm=max_grad_norm,
        logging_steps=1, save_strategy="no", report_to="none", seed=seed, completion_only_loss=True,
        max_length=None, bf16=bf16, use_cpu=device.type == "cpu", dataloader_num_workers=0, disable_tqdm=True,
        # TRL turns checkpointing on by default; small models on CPU run ~3x faster without it.
        activation_checkpointing=gradient_checkpointing,
        train_sampling_strategy="group_by_length" if group_by_length else "random")


def quiet(trainer: SFTTrainer) -> SFTTrainer:
    """Without a progress bar, Trainer prints every logged dict; a client's log needs none of them."""
    from transformers import PrinterCallback

    trainer.remove_callback(PrinterCallback)
    return trainer


def step_losses(trainer: SFTTrainer) -> list[float]:
    return [float(e["loss"]) for e in trainer.state.log_history if "loss" in e]


def supervised_finetune(
    model: torch.nn.Module,
    samples: Sequence[tuple[Sequence[int], Sequence[int]]],
    tokenizer,
    config: SupervisedConfig,
    callbacks: Sequence[TrainerCallback] = (),
) -> list[float]:
    """Train `model` (a plain model, or a PEFT model whose adapter trains) on (prompt ids, completion ids) pairs;
    returns the loss of every step. The model is left in eval mode, on the device it came on (Trainer trains on
    its own device: the first visible GPU, which is the client's own under Ray's or a SuperNode's
    CUDA_VISIBLE_DEVICES). `callbacks` are added to the Trainer's (the tiny-model build's progress lines)."""
    from datasets import Dataset
    from trl import SFTTrainer

    if not samples:
        raise ValueError("supervised_finetune needs at least one sample")
    # Labels of -100 mask the prompt out of the loss (the Hugging Face convention; TRL then builds no labels itself).
    rows = [{"input_ids": [*p, *c], "labels": [-100] * len(p) + list(c)} for p, c in samples]
    device = model_device(model)
    # variable_shape_attention: every batch is padded to its own longest sample, a new shape for cuDNN (attention.py)
    with tempfile.TemporaryDirectory(prefix="fedagent-sft-") as scratch, kept_global_generators(), \
            variable_shape_attention(device), training_attention(model, config.attention), \
            head_at_loss_positions() if frozen_head(model) else nullcontext():
        args = trainer_arguments(scratch, steps=config.steps, batch_size=config.batch_size,
                                 learning_rate=config.learning_rate, seed=config.seed, device=device,
                                 bf16=config.precision != "fp32", weight_decay=config.weight_decay,
                                 max_grad_norm=config.max_grad_norm, group_by_length=config.group_by_length,
                                 micro_batch_size=config.micro_batch_size, epochs=config.epochs,
                                 lr_schedule=config.lr_schedule)
        trainer = quiet(SFTTrainer(model=model, args=args, train_dataset=Dataset.from_list(rows),
                                   processing_class=tokenizer, callbacks=list(callbacks) or None))
        trainer.train()
    model.to(device).eval()
    return step_losses(trainer)


def frozen_head(model: torch.nn.Module) -> bool:
    """Whether the output head takes no gradient (a LoRA adapter over the base, as Fed-SE trains). Only then does a
    pass score the loss positions alone (head_at_loss_positions): a trained head's gradient would sum over other rows
    in another order, and every tiny model built before would change in rounding, for nothing, their vocabulary of a
    few hundred tokens costing the head little."""
    head = model.get_output_embeddings()
    return head is not None and not head.weight.requires_grad


@contextmanager
def head_at_loss_positions() -> Iterator[None]:
    """TRL's fused loss head (`trl.trainer.utils.add_fused_lm_head`) projects through the vocabulary only the positions
    whose label counts, but only on devices it runs Triton on: elsewhere it scores every position and zeroes the rest,
    so that compiled tile shapes (Neuron's) do not change with each batch's count of labels. Eager CPU compiles
    nothing, and there an agent step's completion is a few tokens after a prompt of hundreds: on the Fed-SE preset's
    round the loss read 2,394 of 29,497 positions (docs/performance.md). Here the CPU takes the labelled positions too.
    The loss is the same sum over the same positions, the same to the bit (each row is projected alone); the backward's
    products have fewer rows and may sum in another order, so the trained weights agree to rounding
    (tests/agent/test_sft.py). TRL decides this in a private helper it reads at each call; if a TRL release renames
    it, this does nothing and the test that counts the head's rows fails."""
    from trl.trainer import utils as trl_utils

    compact_on = getattr(trl_utils, "_use_triton", None)
    if compact_on is None:
        yield
        return
    trl_utils._use_triton = lambda device: device.type == "cpu" or compact_on(device)
    try:
        yield
    finally:
        trl_utils._use_triton = compact_on


@contextmanager
def kept_global_generators() -> Iterator[None]:
    """Trainer seeds Python's, NumPy's and torch's global generators with its own seed; put the caller's back, so
    that a client's later draws do not depend on whether a supervised pass ran before them."""
    py, np_state = random.getstate(), np.random.get_state()
    with torch.random.fork_rng(devices=range(torch.cuda.device_count()) if torch.cuda.is_available() else []):
        yield
    random.setstate(py)
    np.random.set_state(np_state)
