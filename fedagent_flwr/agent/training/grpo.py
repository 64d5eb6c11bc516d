"""GRPO for multi-turn agents, written out so every step is visible.

One epoch (FedAgent's unit of local work, tau of them per round):
  1. sample `tasks_per_epoch` tasks with replacement from the client's tasks;
  2. play a group of `num_generations` episodes per task with the current policy;
  3. advantage of a trajectory = (its reward - group mean) / (group std + eps);
  4. every agent step of a trajectory becomes a sample (its own prompt, with the
     windowed history, and the model's completion) carrying that advantage;
  5. PPO-clip loss on the completion tokens only (prompt = environment text is
     masked out), plus an optional k3 KL penalty to a reference policy (the
     weights the round started from), minimised with AdamW over minibatches.

Why not TRL's GRPOTrainer: its `rollout_func` returns one prompt and one
completion per rollout (with an `env_mask` over that single sequence), so a
multi-turn episode must be one growing token sequence. The FedAgent reference
instead prompts every step afresh with only the last `history_length` steps,
which makes each step a separate (prompt, completion) sample sharing the
trajectory's advantage. That does not fit the trainer's one-sequence-per-rollout
shape, and the trainer also owns the optimizer and data loop that the federated
round needs to control (fresh local iterate each round, tau epochs, round-start
reference model), so the loss is written here (about 40 lines).
"""

from __future__ import annotations

import contextlib
import copy
import time
from collections.abc import Callable, Sequence

import numpy as np
import torch

from envs import Task, TextEnv
from fedagent_flwr.agent.engine import decode
from fedagent_flwr.agent.engine.kernels import apply_liger, check_training_kernels
from fedagent_flwr.agent.engine.micro_batches import balanced_micro_batches, by_length, chunks, micro_batches, padding_copies
from fedagent_flwr.agent.engine.passes import PassSwitches, TrainingPasses, UpdatePasses
from fedagent_flwr.agent.engine.placement import Placement
from fedagent_flwr.agent.engine.precision import autocast, check_trainable_precision, model_device
from fedagent_flwr.agent.engine.sampling import rollout_dtype
from fedagent_flwr.agent.engine.tokens import collate, completion_logprobs, to_device
from fedagent_flwr.agent.fsdp.ranks import Pass, Ranks, fsdp_modules, gathered, like, whole
from fedagent_flwr.agent.play.evaluation import summarize
from fedagent_flwr.agent.play.progress import ProgressLines
from fedagent_flwr.agent.play.rollout import LMPolicy, PromptEncoder, RolloutConfig, Trajectory, run_episodes
from fedagent_flwr.agent.training import gigpo
from fedagent_flwr.agent.training.advantages import ADV_EPS, StepSample, informative_share, step_advantages, trajectories_to_samples
from fedagent_flwr.agent.training.grpo_loss import grpo_loss, loss_normalisers, rollout_gap
from fedagent_flwr.config import EngineSection, GRPOSection
from fedagent_flwr.config.choices import KL_REFERENCES


class GRPOTrainer:
    """Local GRPO on one client: owns the optimizer and the reference policy for one round."""

    def __init__(self, model, tokenizer, config: GRPOSection, rollout: RolloutConfig, *, engine: EngineSection,
                 placement: Placement, base_model: torch.nn.Module | None = None,
                 switches: PassSwitches = PassSwitches()) -> None:
        """`config`: the run config's grpo section, as TRL's GRPOTrainer takes its GRPOConfig; `engine` and `placement`
        (this process's, methods/placement.py): how the passes compute (TrainingPasses), the KL anchor and precision
        they resolved. `base_model`: the frozen KL anchor of full fine-tuning, where the caller holds it: the run's
        initial weights for grpo.kl-reference base; under N ranks also the round-start copy (a sharded model cannot be
        deep-copied). `switches`: a benchmark's diagnostic switches (agent/engine/passes.py)."""
        if placement.kl_reference not in KL_REFERENCES:
            raise ValueError(f"placement.kl_reference={placement.kl_reference!r}: expected a resolved one, "
                             f"{' | '.join(KL_REFERENCES)}")
        self.model = model
        self.tokenizer = tokenizer
        self.config = config
        self.kl_reference = placement.kl_reference
        self.rollout = rollout
        self.encoder = PromptEncoder(tokenizer)
        self.policy = LMPolicy(model, tokenizer, rollout)
        self.device = model_device(model)
        # The config checked its own values; what remains needs the model.
        check_trainable_precision(model, placement.precision)
        if placement.param_dtype == "bf16" and not all(p.requires_grad for p in model.parameters()):
            raise ValueError("param_dtype='bf16' needs full fine-tuning (every weight trained; a LoRA base has "
                             "precision bf16-base)")
        check_training_kernels(engine.training_kernels, self.device)  # liger: on a CUDA device, with its package
        if engine.training_kernels == "liger":
            apply_liger(model)
        self.passes = TrainingPasses.of(engine, placement, self.device, switches)
        self.ranks = Ranks.current()  # N ranks share the passes (agent/fsdp/ranks.py); one without a process group
        # A fresh optimizer each round: the local iterate starts from the broadcast model. Only trainable
        # tensors are optimized (all of them, or a LoRA adapter's).
        self.trainable = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = self.passes.optimizer(self.trainable, config.learning_rate, config.weight_decay)
        self.reference = None  # a frozen full model to score against: the round-start copy, or the base
        self.reference_adapter = None  # the round-start adapter's tensors (LoRA): swapped in to score
        if config.beta > 0:
            from peft import (  # here: see agent/training/lora.py on PEFT imports
                PeftModel,
                get_peft_model_state_dict,
            )

            if isinstance(model, PeftModel):
                if self.kl_reference == "round-start":
                    self.reference_adapter = {k: v.detach().clone() for k, v in get_peft_model_state_dict(model).items()}
            elif self.kl_reference == "base" or base_model is not None:
                if base_model is None:
                    raise ValueError("kl_reference='base' with full fine-tuning needs the base model's weights (base_model)")
                self.reference = base_model.eval()
                for p in self.reference.parameters():
                    p.requires_grad_(False)
            else:
                self.reference = copy.deepcopy(model).eval()
                if placement.param_dtype == "bf16":  # it computes on bf16 weights anyway: hold it so, half the memory
                    self.reference.to(torch.bfloat16)
                for p in self.reference.parameters():
                    p.requires_grad_(False)

    def _reference_logprobs(self, samples: Sequence[StepSample]) -> list[torch.Tensor] | None:
        """Completion log-probs under the KL anchor, or None when the KL term is off."""
        if self.config.beta <= 0:
            return None
        if self.reference is not None:  # a frozen copy (under engine.param-dtype bf16 it computes as the policy does)
            return self._logprobs(self.reference, samples, reference=True)
        if self.reference_adapter is None:  # base: the LoRA model with its adapter switched off
            with self.model.disable_adapter():
                return self._logprobs(self.model, samples)
        from peft import get_peft_model_state_dict, set_peft_model_state_dict

        current = {k: v.detach().clone() for k, v in get_peft_model_state_dict(self.model).items()}
        set_peft_model_state_dict(self.model, self.reference_adapter)
        try:
            return self._logprobs(self.model, samples)
        finally:
            set_peft_model_state_dict(self.model, current)

    def train_epoch(self, env_factory: Callable[[], TextEnv], tasks: Sequence[Task], rng: np.random.Generator,
                    progress: bool | str | ProgressLines = False) -> dict[str, float]:
        cfg = self.config
        started = time.time()
        chosen = [tasks[i] for i in rng.choice(len(tasks), size=cfg.tasks_per_epoch, replace=True)]
        group_ids = [i for i in range(len(chosen)) for _ in range(cfg.num_generations)]
        trajectories = self._play(env_factory, chosen, rng, progress)
        rollout_seconds = time.time() - started
        advantages = step_advantages(trajectories, group_ids, ADV_EPS, self.rollout.penalty_scope, cfg.scale_rewards,
                                     cfg.reward_std_ddof)
        if cfg.adv_estimator == "gigpo":  # plus credit for steps that did better than others from the same state
            step_part = gigpo.step_level_advantages(trajectories, group_ids, cfg.gamma, cfg.gigpo_mode,
                                                    per_step_rewards=self.rollout.reward == "env")
            advantages = gigpo.combine(advantages, step_part, cfg.step_advantage_w)
        samples = trajectories_to_samples(trajectories, group_ids, ADV_EPS, cfg.loss_aggregation,
                                          cfg.uniform_groups if cfg.beta > 0 else "drop",  # no KL: nothing to keep
                                          advantages=advantages)
        if cfg.batch_padding == "copy":  # every minibatch whole, as the reference pads its batch
            samples += [samples[i] for i in padding_copies(len(samples), cfg.mini_batch_size, rng)]
        update_stats = self.update(samples, rng)
        metrics = summarize(trajectories)
        metrics.update(update_stats)
        if cfg.adv_estimator == "gigpo":  # the steps whose state another episode of their group also met
            metrics["repeated_states"] = gigpo.repeated_share(trajectories, group_ids)
        # the share of groups GRPO can learn from: those whose episodes' rewards are not all equal
        metrics["informative_groups"] = informative_share(trajectories, group_ids)
        metrics["outcome_groups"] = informative_share(trajectories, group_ids, penalised=False)
        metrics["tokens"] = float(sum(len(s.prompt_ids) + len(s.completion_ids) for t in trajectories for s in t.steps))
        metrics["generated_tokens"] = float(sum(len(s.completion_ids) for t in trajectories for s in t.steps))
        metrics["rollout_seconds"] = rollout_seconds
        metrics["seconds"] = time.time() - started
        return metrics

    def _play(self, env_factory: Callable[[], TextEnv], chosen: Sequence[Task], rng: np.random.Generator,
              progress: bool | str | ProgressLines) -> list[Trajectory]:
        """num-generations episodes of each chosen task, in that order. On N ranks each plays whole groups (a stride of them)
        with every weight gathered, and all ranks receive every episode."""
        cfg, ranks = self.config, self.ranks
        mine = ranks.share(range(len(chosen)))
        if ranks.world > 1:  # every rank drew the same seed: each samples from a stream of its own
            torch.manual_seed(int(rng.integers(2**62)) + ranks.rank)
        episodes = [chosen[g] for g in mine for _ in range(cfg.num_generations)]
        with autocast(self.passes.precision, self.device), self._decoding_weights():
            played = run_episodes(self.policy, env_factory, episodes, self.encoder, self.rollout, progress=progress)
        # The static decode engine keeps a weight copy, a KV cache and CUDA graphs per model; the update needs that
        # memory more (1.5B shape, 128 rows: about 6 GiB), and the next rollout builds them again.
        decode.release(self.policy.model)
        if ranks.world == 1:
            return played
        groups = ranks.gather({g: played[i * cfg.num_generations:(i + 1) * cfg.num_generations] for i, g in enumerate(mine)})
        return [t for g in range(len(chosen)) for t in groups[g]]

    def _decoding_weights(self) -> contextlib.AbstractContextManager:
        """What a rank's rollout decodes from without the other ranks (entered under the rollout's autocast). The static
        engine copies the weights into its own buffers in its dtype (bf16 under bf16 autocast), one FSDP unit gathered at
        a time; the hf engine runs the model itself, every weight gathered whole in its own dtype. A model not sharded:
        as it is. One rank of a launched client is sharded all the same (its weights are DTensors over a world of one),
        so the static engine's copy gathers them as on N ranks."""
        if not fsdp_modules(self.model):
            return contextlib.nullcontext()
        if self.rollout.decode_engine == "static":
            return decode.pinned(self.model, rollout_dtype(self.device), kernels=self.rollout.decode_kernels,
                                 gathered=gathered)
        return self.ranks.unsharded(self.model)

    def optimizer_arrays(self) -> dict[str, np.ndarray]:
        """AdamW's step counts and moments by parameter position ("<i>/exp_avg", ...): what a learner that trains
        on without averaging (the Centralized and Local baselines) carries from one round into the next."""
        keep = self.ranks.rank == 0  # a sharded moment gathered by every rank alike, kept by rank 0 (whose is sent)
        gathered = ((f"{i}/{name}", whole(value).detach())
                    for i, state in self.optimizer.state_dict()["state"].items() for name, value in state.items())
        return {key: value.cpu().numpy().copy() for key, value in gathered if keep}

    def load_optimizer_arrays(self, arrays: dict[str, np.ndarray]) -> None:
        """Continue from `optimizer_arrays()` of an earlier round's trainer on the same parameters."""
        state: dict[int, dict[str, torch.Tensor]] = {}
        params = [p for group in self.optimizer.param_groups for p in group["params"]]  # the state dict's numbering
        for key, value in arrays.items():
            i, name = key.split("/", 1)
            tensor = torch.from_numpy(np.array(value))
            # AdamW keeps its step count as a 0-d tensor; a trip through Flower's ArrayRecord makes it 1-d
            state.setdefault(int(i), {})[name] = tensor.reshape(()) if name == "step" else like(tensor, params[int(i)])
        self.optimizer.load_state_dict({"state": state, "param_groups": self.optimizer.state_dict()["param_groups"]})

    def _cut(self, rows: Sequence[int], samples: Sequence[StepSample], size: int, tokens: int,
             update: bool = False) -> list[list[int]]:
        """`rows` cut into micro-batches as one process cuts them (longest first where length-grouped; for the update,
        of even summed lengths where length-balanced); on N ranks every rank cuts alike and Ranks.passes shares it."""
        lengths = [s.length for s in samples]
        if update and self.config.balance_micro_batches:
            return balanced_micro_batches(rows, lengths, size)
        if self.config.group_by_length:
            rows = by_length(rows, lengths)
        return micro_batches(rows, lengths, size, tokens)

    @torch.no_grad()
    def _logprobs(self, model, samples: Sequence[StepSample], reference: bool = False) -> list[torch.Tensor]:
        """Per-sample completion log-probs (1-D, completion tokens only). reference: `model` is the frozen KL
        reference (TrainingPasses.scoring)."""
        cfg, passes = self.config, self.passes
        plan = self._cut(range(len(samples)), samples, cfg.log_prob_rows(), cfg.log_prob_max_token_len_per_gpu)
        pending = []  # each micro-batch's sample indices, log-probs (on the device) and completion mask (on the host)
        with passes.scoring(model, reference):
            for p in self.ranks.passes(plan):
                batch = collate([(samples[i].prompt_ids, samples[i].completion_ids) for i in p.rows],
                                self.tokenizer.pad_token_id, passes.shared_prompt_prefix)
                with passes.forward():
                    logprobs, _ = completion_logprobs(model, batch, self.rollout.temperature, passes.logprob_chunk_tokens,
                                                      padding_mask=passes.padding_mask)
                if not p.spare:
                    pending.append((p.rows, logprobs, batch["completion_mask"][:, 1:]))
        # Copied to the host once every micro-batch is queued, rows cut there by the host's own mask: a copy waits for
        # the device, and a wait inside the loop would keep the host from queuing the next micro-batch while the
        # device computes this one (a boolean index of each row on the device would wait twice a row).
        out: dict[int, torch.Tensor] = {}
        for rows, logprobs, host_mask in pending:
            for i, lp, m in zip(rows, logprobs.cpu(), host_mask):
                out[i] = lp[m]
        everyone = self.ranks.gather(out)
        return [everyone[i] for i in range(len(samples))]

    def _old_from_rollout(self, samples: Sequence[StepSample]) -> bool:
        """Whether the PPO ratio's old log-probs are the rollout's: asked for, and carried by every sample (a
        demonstration or a greedy step carries none)."""
        return self.config.old_logprobs == "rollout" and all(s.old_logprobs is not None for s in samples)

    def _old_logprobs(self, samples: Sequence[StepSample]) -> list[torch.Tensor]:
        """The round-start policy's completion log-probs: the rollout's where _old_from_rollout, else a no-grad pass."""
        if self._old_from_rollout(samples):
            return [torch.tensor(s.old_logprobs, dtype=torch.float32) for s in samples]
        return self._logprobs(self.model, samples)

    def update(self, samples: list[StepSample], rng: np.random.Generator) -> dict[str, float]:
        """Clipped policy-gradient steps over the samples in shuffled minibatches: for each, the gradients zeroed, each
        micro-batch's forward, loss and backward, one clipped AdamW step.

        How the passes compute (precision, working copy, kernels, checkpointing) is self.passes' business
        (agent/engine/passes.py), how a minibatch is cut and shared by ranks self._cut's and Ranks.passes'; what is
        written here is the algorithm."""
        if not samples:  # every group was uniform: nothing to learn from this batch
            return dict(NO_UPDATE)
        self.model.eval()  # dropout off: old and new log-probs must come from the same function
        cfg = self.config
        with self.passes.update(self.model) as passes:
            # With a single minibatch the policy has not moved before the update: the old log-probs are the current ones
            old = self._old_logprobs(samples) if len(samples) > cfg.mini_batch_size else None
            ref = self._reference_logprobs(samples)
            record = UpdateRecord(measures_gap=old is not None and self._old_from_rollout(samples))
            for minibatch in chunks(list(rng.permutation(len(samples))), cfg.mini_batch_size):
                self.optimizer.zero_grad(set_to_none=True)
                plan = self._cut(minibatch, samples, cfg.ppo_micro_batch_size_per_gpu, cfg.ppo_max_token_len_per_gpu, update=True)
                normalisers = loss_normalisers(minibatch, plan, samples, cfg.loss_aggregation)
                for p in self.ranks.passes(plan):
                    loss, stats = self._loss(p, samples, old, ref, normalisers[p.part], passes, record.wants_gap)
                    passes.backward(loss * p.scale)
                    record.micro_batch(p, loss, stats)
                with passes.optimizer_step():
                    record.step(torch.nn.utils.clip_grad_norm_(self.trainable, cfg.max_grad_norm))
                    self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)  # not held through the next rollout (a model's size, or 1/N)
            return record.result(len(samples), self.ranks, passes.checkpointed_layers)

    def _loss(self, p: Pass, samples: Sequence[StepSample], old: list[torch.Tensor] | None,
              ref: list[torch.Tensor] | None, normaliser: float, passes: UpdatePasses,
              measure_gap: bool) -> tuple[torch.Tensor, dict[str, torch.Tensor | int]]:
        """A micro-batch's forward and its share of the minibatch's loss (its weighted token sum over `normaliser`), with
        its statistics, its completion tokens and, where `measure_gap`, its rollout gap. `old` None: the current
        policy's log-probs, detached (no step taken yet)."""
        cfg, settings = self.config, self.passes
        chunk = [samples[i] for i in p.rows]
        batch = collate([(s.prompt_ids, s.completion_ids) for s in chunk], self.tokenizer.pad_token_id,
                        settings.shared_prompt_prefix)
        with passes.forward(batch):
            scored = completion_logprobs(self.model, batch, self.rollout.temperature, settings.logprob_chunk_tokens,
                                         padding_mask=passes.padding_mask, with_entropy=cfg.entropy_coeff > 0)
            logprobs, mask = scored[:2]
            entropy = scored[2] if cfg.entropy_coeff > 0 else None
            host_mask = batch["completion_mask"][:, 1:]
            old_lp = logprobs.detach() if old is None else _scatter_like(host_mask, [old[i] for i in p.rows], mask.device)
            ref_lp = _scatter_like(host_mask, [ref[i] for i in p.rows], mask.device) if ref is not None else None
            adv = to_device(torch.tensor([s.advantage for s in chunk], dtype=torch.float32), logprobs.device)
            weights = to_device(torch.tensor([s.weight for s in chunk], dtype=torch.float32), logprobs.device)
            loss, stats = grpo_loss(logprobs, old_lp, adv, mask, cfg.epsilon, ref_lp, cfg.beta, weights,
                                    normaliser, cfg.clip_ratio_c, cfg.kl_clamp, entropy, cfg.entropy_coeff)
        stats["tokens"] = int(host_mask.sum())
        if measure_gap:
            stats["rollout_gap"] = rollout_gap(logprobs, old_lp, mask)
        return loss, stats


NO_UPDATE = {"loss": 0.0, "kl": 0.0, "clip_frac": 0.0, "grad_norm": 0.0, "optimizer_steps": 0.0, "train_samples": 0.0}


class UpdateRecord:
    """An update's statistics: each micro-batch's share of its minibatch's loss, its KL and clip fraction weighed by its
    completion tokens, each step's gradient norm, and, where measured, the rollout gap over the first step's
    micro-batches (before any step, the trained pass and the rollout score the same policy). Kept on the device until
    every step is queued: reading one waits for the device, and a wait inside the loop would keep the host from queuing
    the next micro-batch while the device computes this one."""

    def __init__(self, measures_gap: bool = False) -> None:
        self.measures_gap = measures_gap
        self.pending: list[tuple[torch.Tensor, dict[str, torch.Tensor | int]]] = []
        self.grad_norms: list[torch.Tensor] = []
        self.gaps: list[torch.Tensor] = []
        self.first_step_clipped: list[torch.Tensor] = []  # clipped tokens of the first step's micro-batches

    @property
    def wants_gap(self) -> bool:
        return self.measures_gap and not self.grad_norms

    def micro_batch(self, p: Pass, loss: torch.Tensor, stats: dict[str, torch.Tensor | int]) -> None:
        if p.spare:  # a spare pass keeps step with the other ranks and adds nothing
            return
        if "rollout_gap" in stats:
            self.gaps.append(stats.pop("rollout_gap"))
            self.first_step_clipped.append(stats["clip_frac"] * stats["tokens"])
        self.pending.append((loss.detach(), stats))

    def step(self, grad_norm: torch.Tensor) -> None:
        self.grad_norms.append(grad_norm)

    def result(self, samples: int, ranks: Ranks, checkpointed_layers: float | None = None) -> dict[str, float]:
        """Read from the device now that every step is queued; on N ranks each holds its micro-batches' shares, which
        add up over the ranks to the minibatches' losses and token sums."""
        steps = len(self.grad_norms)
        sums = {"loss": 0.0, "kl": 0.0, "clip_frac": 0.0, "tokens": 0.0}
        for loss, stats in self.pending:
            sums["loss"] += float(loss)  # micro-batch shares add up to the minibatch loss
            sums["kl"] += float(stats["kl"]) * stats["tokens"]
            sums["clip_frac"] += float(stats["clip_frac"]) * stats["tokens"]
            sums["tokens"] += stats["tokens"]
        sums = {k: ranks.total(v) for k, v in sums.items()}
        tokens = max(1, int(sums["tokens"]))
        result = {"loss": sums["loss"] / max(1, steps), "kl": sums["kl"] / tokens, "clip_frac": sums["clip_frac"] / tokens,
                  "grad_norm": float(np.mean([float(getattr(n, "full_tensor", lambda: n)()) for n in self.grad_norms])),
                  "optimizer_steps": float(steps), "train_samples": float(samples)}
        if self.gaps:  # how far the decode passes' rounding puts the rollout's log-probs from a training pass's
            gaps = torch.stack(self.gaps).double()
            signed, absolute, _, over, n = gaps.sum(0).tolist()
            largest = float(gaps[:, 2].max())
            signed, absolute, over, n = (ranks.total(v) for v in (signed, absolute, over, n))
            n = max(1.0, n)
            result |= {"rollout_logprob_gap": absolute / n, "rollout_logprob_gap_signed": signed / n,
                       "rollout_logprob_gap_max": ranks.largest(largest), "rollout_logprob_gap_over_001": over / n,
                       "first_step_clip_frac": ranks.total(float(sum(self.first_step_clipped))) / n}
        if checkpointed_layers is not None:  # the share of layer passes that recomputed (1.0 = every layer)
            result["checkpointed_layers"] = checkpointed_layers
        return result


def _scatter_like(host_mask: torch.Tensor, values: list[torch.Tensor], device: torch.device) -> torch.Tensor:
    """Place per-sample 1-D completion values (on the host) back at the mask's positions, on `device`. Built on the
    host and copied once without waiting: per row, a copy and a boolean index on the device would each wait for it."""
    out = torch.zeros(host_mask.shape, dtype=torch.float32)
    for row, v in enumerate(values):
        out[row, host_mask[row]] = v
    return to_device(out, device)
