
import numpy as np
import pytest
import torch

from envs import Task
from fedagent_flwr.agent.training.advantages import group_advantages, trajectories_to_samples
from fedagent_flwr.agent.training.grpo_loss import grpo_loss
from fedagent_flwr.agent.play.rollout import RolloutConfig, StepRecord, Trajectory
from fedagent_flwr.agent.engine.tokens import collate, completion_logprobs
from fedagent_flwr.config import RunConfig
from placed import grpo_trainer


def test_group_advantages_are_normalised_within_each_group():
    adv = group_advantages([10, 0, 0, 0, 5, 5, 1, 3], [0, 0, 0, 0, 1, 1, 2, 2])
    # group 0: mean 2.5, std sqrt(18.75); group 1 is uniform -> no signal; group 2: mean 2, std 1
    np.testing.assert_allclose(adv[:4], np.array([7.5, -2.5, -2.5, -2.5]) / np.sqrt(18.75), rtol=1e-5)
    np.testing.assert_allclose(adv[4:6], [0.0, 0.0])
    np.testing.assert_allclose(adv[6:], [-1.0, 1.0], rtol=1e-5)


def test_batch_and_no_reward_scaling_keep_a_penalty_only_group_small_beside_a_win():
    """Group 0 is split by a win, group 1 only by a 0.1 rollout.invalid-action penalty, group 2 is uniform."""
    rewards, groups = [10.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, -0.1, 0.0, 0.0, 0.0, 0.0], [0] * 4 + [1] * 4 + [2] * 4
    by_group = group_advantages(rewards, groups, scale="group")
    # per-group scaling: the penalty-free failures of group 1 get the same push as group 0's losses get pulled
    np.testing.assert_allclose(by_group[4:7], -by_group[1:4], rtol=1e-4)
    batch = group_advantages(rewards, groups, scale="batch")
    std = np.std(rewards)
    np.testing.assert_allclose(batch[:4], np.array([7.5, -2.5, -2.5, -2.5]) / std, rtol=1e-5)
    np.testing.assert_allclose(batch[4:8], np.array([0.025, 0.025, 0.025, -0.075]) / std, rtol=1e-5)
    assert abs(batch[4]) < abs(batch[0]) / 100
    none = group_advantages(rewards, groups, scale="none")
    np.testing.assert_allclose(none[:8], [7.5, -2.5, -2.5, -2.5, 0.025, 0.025, 0.025, -0.075], rtol=1e-6)
    for adv in (batch, none):
        assert np.all(adv[8:] == 0.0)  # a uniform group still carries nothing (and is dropped under grpo.uniform-groups=drop)
    with pytest.raises(ValueError, match="scale_rewards must be one of"):
        group_advantages(rewards, groups, scale="std")


def test_the_run_config_reward_scaling_reaches_the_epoch_samples(tiny_lm, maze_tokenizer, monkeypatch):
    import fedagent_flwr.agent.training.grpo as grpo
    from envs import make_env

    seen = []
    inner = grpo.step_advantages
    monkeypatch.setattr(grpo, "step_advantages", lambda *a: seen.append(a[-2:]) or inner(*a))
    trainer = grpo_trainer(tiny_lm, maze_tokenizer, RunConfig.from_run_config({"grpo.scale-rewards": "batch", "grpo.reward-std-ddof": 1}).updated({"grpo.tasks-per-epoch": 1, "grpo.num-generations": 2}), RolloutConfig(history_length=0, max_new_tokens=4))
    monkeypatch.setattr(trainer, "update", lambda samples, rng: {})
    trainer.train_epoch(lambda: make_env("maze", max_steps=1), make_env("maze").tasks_of_split("train")[:1],
                        np.random.default_rng(0))
    assert seen == [("batch", 1)]


def test_loss_is_zero_gradient_outside_the_mask_and_clips():
    logprobs = torch.tensor([[-1.0, -2.0, -0.5]], requires_grad=True)
    old = torch.tensor([[-1.0, -1.0, -1.0]])
    mask = torch.tensor([[True, True, False]])
    loss, _ = grpo_loss(logprobs, old, torch.tensor([1.0]), mask, clip_eps=0.2)
    loss.backward()
    # token 0: ratio 1, gradient -A/n; token 1: ratio e^-1 (inside the clip range for A>0 it is
    # unclipped below 1); token 2 is masked out.
    assert logprobs.grad[0, 2] == 0.0
    assert logprobs.grad[0, 0] == pytest.approx(-0.5)
    assert logprobs.grad[0, 1] == pytest.approx(-np.exp(-1.0) / 2)
    # A ratio above 1 + eps with a positive advantage is clipped: no gradient.
    lp = torch.tensor([[0.0]], requires_grad=True)
    loss, stats = grpo_loss(lp, torch.tensor([[-1.0]]), torch.tensor([1.0]), torch.tensor([[True]]), clip_eps=0.2)
    loss.backward()
    assert lp.grad.item() == 0.0 and stats["clip_frac"] == 1.0


def test_kl_penalty_is_zero_at_the_reference_and_positive_away_from_it():
    lp = torch.tensor([[-1.0, -2.0]])
    mask = torch.ones_like(lp, dtype=torch.bool)
    _, at_ref = grpo_loss(lp, lp, torch.tensor([0.0]), mask, 0.2, ref_logprobs=lp, kl_beta=0.1)
    _, away = grpo_loss(lp, lp, torch.tensor([0.0]), mask, 0.2, ref_logprobs=lp - 0.5, kl_beta=0.1)
    assert at_ref["kl"] == pytest.approx(0.0)
    assert away["kl"] == pytest.approx(np.exp(-0.5) + 0.5 - 1, rel=1e-5)


def test_environment_tokens_never_receive_gradient(tiny_lm, maze_tokenizer):
    """Only the model's own completion tokens are scored: logits predicting prompt or pad get zero gradient."""
    prompt_a = maze_tokenizer("The goal is at position 8, 6.")["input_ids"]
    prompt_b = maze_tokenizer("There is a wall to your left. Step 2.")["input_ids"]
    completion = maze_tokenizer("<think>next: move up</think><action>move up</action>")["input_ids"]
    batch = collate([(prompt_a, completion), (prompt_b, completion[:5])], maze_tokenizer.pad_token_id)
    captured = {}

    def keep_logits(module, inputs, output):
        output.retain_grad()
        captured["logits"] = output

    handle = tiny_lm.lm_head.register_forward_hook(keep_logits)
    logprobs, mask = completion_logprobs(tiny_lm, batch)
    handle.remove()
    loss, _ = grpo_loss(logprobs, logprobs.detach(), torch.tensor([1.0, -1.0]), mask, 0.2)
    loss.backward()
    grad = captured["logits"].grad.abs().sum(-1)  # [batch, length]
    # Position t predicts token t+1: it may carry gradient only when token t+1 is a completion token.
    scored = torch.zeros_like(grad, dtype=torch.bool)
    scored[:, :-1] = batch["completion_mask"][:, 1:]
    assert (grad[~scored] == 0).all()
    assert (grad[scored] > 0).all()


def test_training_forwards_build_no_kv_cache(tiny_lm, maze_tokenizer):
    """The log-prob and loss passes never decode further, so a KV cache of the whole micro-batch would be memory
    spent for nothing (transformers builds one whenever the config says use_cache)."""
    ids = maze_tokenizer("The goal is at position 8, 6.")["input_ids"]
    batch = collate([(ids, ids[:4])], maze_tokenizer.pad_token_id)
    outputs = []
    handle = tiny_lm.register_forward_hook(lambda module, inputs, output: outputs.append(output))
    assert tiny_lm.config.use_cache  # the model would build a cache on its own
    completion_logprobs(tiny_lm, batch)
    handle.remove()
    assert len(outputs) == 1 and outputs[0].past_key_values is None


def _trajectory(reward, n_steps, tokens_per_step=3):
    steps = [StepRecord([1, 2], list(range(tokens_per_step)), "c", "a", 0.0, True) for _ in range(n_steps)]
    return Trajectory(task=Task("t", "c", "train"), steps=steps, reward=reward)


def test_samples_carry_their_trajectory_advantage_and_weight():
    trajs = [_trajectory(10.0, 2), _trajectory(0.0, 4), _trajectory(5.0, 1), _trajectory(5.0, 1)]
    samples = trajectories_to_samples(trajs, [0, 0, 1, 1], 1e-6, "trajectory-mean")
    assert len(samples) == 6  # the uniform group 1 is dropped
    assert [s.advantage for s in samples] == pytest.approx([1, 1, -1, -1, -1, -1])
    assert [s.weight for s in samples] == pytest.approx([1 / 6] * 2 + [1 / 12] * 4)
    token_mean = trajectories_to_samples(trajs, [0, 0, 1, 1], 1e-6, "token-mean")
    assert all(s.weight == 1.0 for s in token_mean)
    with pytest.raises(ValueError, match="loss aggregation"):
        trajectories_to_samples(trajs, [0, 0, 1, 1], 1e-6, "sum")


def test_uniform_groups_keep_trains_their_steps_with_advantage_zero():
    """With grpo.beta > 0 a dropped group also loses its KL term; keep hands its steps to the update at advantage 0."""
    trajs = [_trajectory(10.0, 2), _trajectory(0.0, 4), _trajectory(5.0, 1), _trajectory(5.0, 1)]
    kept = trajectories_to_samples(trajs, [0, 0, 1, 1], 1e-6, "trajectory-mean", uniform_groups="keep")
    assert len(kept) == 8 and [s.advantage for s in kept[6:]] == [0.0, 0.0]
    with pytest.raises(ValueError, match="uniform groups"):
        trajectories_to_samples(trajs, [0, 0, 1, 1], 1e-6, uniform_groups="all")


@pytest.mark.parametrize("uniform_groups, kl_beta, trained", [("keep", 0.05, 8), ("drop", 0.05, 0), ("keep", 0.0, 0)])
def test_an_epoch_of_uniform_groups_trains_only_when_kept_under_a_kl(tiny_lm, maze_tokenizer, uniform_groups, kl_beta, trained, monkeypatch):
    """The trainer passes the key through, and only where a KL term exists to train (grpo.beta = 0 keeps nothing)."""
    from envs import make_env

    trainer = grpo_trainer(tiny_lm, maze_tokenizer, RunConfig().updated({"grpo.beta": kl_beta, "grpo.tasks-per-epoch": 1, "grpo.num-generations": 8, "grpo.uniform-groups": uniform_groups}),
                          RolloutConfig(history_length=0, max_new_tokens=8))
    seen = []
    monkeypatch.setattr(trainer, "update", lambda samples, rng: seen.append(len(samples)) or {})
    trainer.train_epoch(lambda: make_env("maze", max_steps=1), make_env("maze").tasks_of_split("train")[:1],
                        np.random.default_rng(0))
    # a random model fails every one-step episode: one group of 8 equal rewards, one step each
    assert seen == [trained]


def test_update_raises_the_likelihood_of_better_than_average_completions(tiny_lm, maze_tokenizer):
    tok = maze_tokenizer
    prompt = tok("Step 1. Observation: start")["input_ids"]
    good = tok("<think>next: move down</think><action>move down</action>")["input_ids"]
    bad = tok("<think>next: move up</think><action>move up</action>")["input_ids"]
    trajs = [
        Trajectory(task=Task("t", "c", "train"), steps=[StepRecord(prompt, c, "", "", 0.0, True)], reward=r)
        for c, r in [(good, 10.0), (bad, 0.0)]
    ]
    trainer = grpo_trainer(tiny_lm, tok, RunConfig().updated({"grpo.learning-rate": 1e-2, "grpo.beta": 0.0}), RolloutConfig(history_length=2))
    samples = trajectories_to_samples(trajs, [0, 0], 1e-6)

    def seq_logprob(completion):
        lp, mask = completion_logprobs(tiny_lm, collate([(prompt, completion)], tok.pad_token_id))
        return float(lp.sum().detach())

    before = seq_logprob(good), seq_logprob(bad)
    stats = trainer.update(samples, np.random.default_rng(0))
    after = seq_logprob(good), seq_logprob(bad)
    assert stats["optimizer_steps"] == 1.0
    assert after[0] > before[0] and after[1] < before[1]


def test_a_trainer_that_loads_the_optimizer_arrays_continues_exactly_where_the_last_one_stopped(tiny_lm, maze_tokenizer):
    """A baseline's learner carries AdamW's moments between rounds: a new round's trainer that loads them takes
    the very step the old trainer would have taken, and one that does not takes another."""
    import copy

    tok = maze_tokenizer
    prompt = tok("Step 1. Observation: start")["input_ids"]
    trajs = [Trajectory(task=Task("t", "c", "train"), steps=[StepRecord(prompt, tok(text)["input_ids"], "", "", 0.0, True)], reward=r)
             for text, r in [("<action>move down</action>", 10.0), ("<action>move up</action>", 0.0)]]
    samples = trajectories_to_samples(trajs, [0, 0], 1e-6)
    cfg = RunConfig().updated({"grpo.learning-rate": 1e-3, "grpo.beta": 0.0})
    first = grpo_trainer(tiny_lm, tok, cfg, RolloutConfig(history_length=0))
    first.update(samples, np.random.default_rng(0))
    from flwr.app import Array, ArrayRecord

    record = ArrayRecord({k: Array(np.ascontiguousarray(v)) for k, v in first.optimizer_arrays().items()})
    carried = {k: record[k].numpy() for k in record}  # as the baselines keep it in Flower's context.state
    assert carried and all(v.item() == 1.0 for k, v in carried.items() if k.endswith("/step"))

    after_first = copy.deepcopy(tiny_lm)

    def next_step(load: bool) -> dict[str, torch.Tensor]:
        model = copy.deepcopy(after_first)
        trainer = grpo_trainer(model, tok, cfg, RolloutConfig(history_length=0))
        if load:
            trainer.load_optimizer_arrays(carried)
        trainer.update(samples, np.random.default_rng(1))
        return model.state_dict()

    continued, fresh = next_step(load=True), next_step(load=False)
    first.update(samples, np.random.default_rng(1))  # the old trainer, going on
    assert all(torch.allclose(continued[k], v, atol=1e-7) for k, v in tiny_lm.state_dict().items())
    assert any(not torch.allclose(fresh[k], v, atol=1e-7) for k, v in tiny_lm.state_dict().items())


def _update_recording_grads(model, tokenizer, cfg, samples):
    """A fresh trainer's update of `model` on `samples`: its statistics and every optimizer step's gradients."""
    trainer = grpo_trainer(model, tokenizer, cfg, RolloutConfig(history_length=0))
    grads, step = [], trainer.optimizer.step

    def recording_step(*args, **kwargs):
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
        return step(*args, **kwargs)

    trainer.optimizer.step = recording_step
    return trainer.update(samples, np.random.default_rng(0)), grads


def test_length_grouped_micro_batches_give_the_same_loss_and_gradients_with_less_padding(tiny_lm, maze_tokenizer, monkeypatch):
    """Sorting a minibatch by length before cutting micro-batches changes which samples share a forward pass, not
    the loss: it stays one weighted token mean over the minibatch, so every optimizer step sees the same gradient."""
    import copy

    from fedagent_flwr.agent.training import grpo
    from fedagent_flwr.agent.training.advantages import StepSample

    rng = np.random.default_rng(5)
    vocab = tiny_lm.config.vocab_size
    samples = [StepSample(rng.integers(3, vocab, size=int(rng.integers(3, 40))).tolist(),
                          rng.integers(3, vocab, size=int(rng.integers(1, 12))).tolist(),
                          float(rng.normal()), float(rng.uniform(0.2, 1.0))) for _ in range(16)]
    # device="cpu" as the model is: on a GPU machine auto would run the comparison in bf16
    cfg = RunConfig.from_run_config({"grpo.learning-rate": 1e-3, "grpo.beta": 0.05, "grpo.mini-batch-size": 8, "grpo.ppo-micro-batch-size-per-gpu": 2, "device": "cpu"})
    real_collate = grpo.collate

    def run(grouped):
        padding = [0]

        def counting_collate(pairs, pad_id, share_prefix=False):
            batch = real_collate(pairs, pad_id, share_prefix)
            padding[0] += int((batch["attention_mask"] == 0).sum())
            return batch

        monkeypatch.setattr(grpo, "collate", counting_collate)
        stats, grads = _update_recording_grads(copy.deepcopy(tiny_lm), maze_tokenizer,
                                               cfg.updated({"grpo.group-by-length": grouped}), samples)
        return stats, grads, padding[0]

    plain, plain_grads, plain_padding = run(False)
    grouped, grouped_grads, grouped_padding = run(True)
    assert grouped_padding < plain_padding / 2, (grouped_padding, plain_padding)
    assert plain["optimizer_steps"] == grouped["optimizer_steps"] == 2 and len(plain_grads) == len(grouped_grads) == 2
    for key in ("loss", "kl", "clip_frac", "grad_norm"):
        assert grouped[key] == pytest.approx(plain[key], rel=1e-5, abs=1e-8), key
    assert plain["kl"] > 0  # the old-policy and reference passes were grouped too, and the second step used them
    for before, after in zip(plain_grads, grouped_grads):
        for name, grad in before.items():
            torch.testing.assert_close(after[name], grad, rtol=1e-5, atol=1e-7, msg=name)


def test_a_shared_prompt_prefix_takes_the_same_update_steps(tiny_lm, maze_tokenizer, monkeypatch):
    """engine.shared-prompt-prefix computes the prompts' common opening once per pass: the old-policy, reference and update
    passes see shorter rows, and every optimizer step's gradient and the update's statistics are those of whole rows."""
    import copy

    from fedagent_flwr.agent.training import grpo
    from fedagent_flwr.agent.training.advantages import StepSample

    rng = np.random.default_rng(11)
    vocab = tiny_lm.config.vocab_size
    head = rng.integers(3, vocab, size=20).tolist()  # what every prompt opens with (instructions, task)
    samples = [StepSample(head + rng.integers(3, vocab, size=int(rng.integers(1, 30))).tolist(),
                          rng.integers(3, vocab, size=int(rng.integers(1, 10))).tolist(), float(rng.normal()),
                          float(rng.uniform(0.2, 1.0))) for _ in range(12)]
    cfg = RunConfig.from_run_config({"grpo.learning-rate": 1e-3, "grpo.beta": 0.05, "grpo.mini-batch-size": 6, "grpo.ppo-micro-batch-size-per-gpu": 3, "device": "cpu"})
    real_collate = grpo.collate

    def run(shared):
        widths = []

        def recording_collate(pairs, pad_id, share_prefix=False):
            batch = real_collate(pairs, pad_id, share_prefix)
            widths.append((batch["input_ids"].shape[1], len(batch.get("prefix_ids", []))))
            return batch

        monkeypatch.setattr(grpo, "collate", recording_collate)
        stats, grads = _update_recording_grads(copy.deepcopy(tiny_lm), maze_tokenizer,
                                               cfg.updated({"engine.shared-prompt-prefix": shared}), samples)
        return stats, grads, widths

    whole, whole_grads, whole_widths = run(False)
    shared, shared_grads, shared_widths = run(True)
    assert all(prefix == 0 for _, prefix in whole_widths)
    # 4 old-policy, 4 reference and 4 update passes, each a row shorter by the 20 tokens it shares
    assert len(shared_widths) == len(whole_widths) == 12
    assert all(prefix == 20 and width + prefix == full for (width, prefix), (full, _) in zip(shared_widths, whole_widths))
    _assert_the_same_steps(whole, whole_grads, shared, shared_grads)


def _assert_the_same_steps(stats, grads, other_stats, other_grads) -> None:
    """Two updates of the same samples took the same 2 optimizer steps to float rounding: statistics and gradients."""
    assert stats["optimizer_steps"] == other_stats["optimizer_steps"] == 2 and stats["kl"] > 0
    for key in ("loss", "kl", "clip_frac", "grad_norm"):
        assert other_stats[key] == pytest.approx(stats[key], rel=1e-4, abs=1e-7), key
    for before, after in zip(grads, other_grads):
        for name, grad in before.items():
            torch.testing.assert_close(after[name], grad, rtol=1e-4, atol=1e-6, msg=name)


def test_the_log_prob_passes_run_at_their_own_micro_batch_and_change_nothing_else(tiny_lm, maze_tokenizer, monkeypatch):
    """grpo.log-prob-micro-batch-size-per-gpu sizes the no-grad passes (old policy, KL reference) apart from the update's micro-batch:
    the passes see batches of that many rows, and the update's statistics and gradients are those of the default."""
    import copy

    from fedagent_flwr.agent.training import grpo
    from fedagent_flwr.agent.training.advantages import StepSample

    rng = np.random.default_rng(7)
    vocab = tiny_lm.config.vocab_size
    samples = [StepSample(rng.integers(3, vocab, size=int(rng.integers(3, 30))).tolist(),
                          rng.integers(3, vocab, size=int(rng.integers(1, 10))).tolist(), float(rng.normal())) for _ in range(12)]
    base = RunConfig.from_run_config({"grpo.learning-rate": 1e-3, "grpo.beta": 0.05, "grpo.mini-batch-size": 6, "grpo.ppo-micro-batch-size-per-gpu": 2})
    assert base.grpo.log_prob_rows() == 2  # 0 (the default) = the update's micro-batch
    real = grpo.completion_logprobs

    def run(logprob_rows):
        rows = {"grad": [], "no_grad": []}

        def recording(model, batch, *args, **kwargs):
            rows["grad" if torch.is_grad_enabled() else "no_grad"].append(len(batch["input_ids"]))
            return real(model, batch, *args, **kwargs)

        monkeypatch.setattr(grpo, "completion_logprobs", recording)
        model = copy.deepcopy(tiny_lm)
        cfg = base.updated({"grpo.log-prob-micro-batch-size-per-gpu": logprob_rows})
        trainer = grpo_trainer(model, maze_tokenizer, cfg, RolloutConfig(history_length=0))
        stats = trainer.update(samples, np.random.default_rng(0))
        return stats, dict(model.named_parameters()), rows

    small, small_weights, small_rows = run(0)
    big, big_weights, big_rows = run(5)
    assert small_rows["no_grad"] == [2] * 12  # two passes (old policy and reference) of 12 samples in 2s
    assert big_rows["no_grad"] == [5, 5, 2] * 2  # the same passes in 5s
    assert small_rows["grad"] == big_rows["grad"] == [2] * 6  # the update's micro-batches are untouched
    assert big["kl"] > 0 and big["optimizer_steps"] == 2
    for key in ("loss", "kl", "clip_frac", "grad_norm"):
        assert big[key] == pytest.approx(small[key], rel=1e-5, abs=1e-8), key
    # AdamW divides by the gradient's size: where it is near zero, rounding moves a weight by a fraction of a step
    # (lr 1e-3); 1 % of a step is the tolerance (as in test_chunked_logprobs.py), a wrong log-prob moves whole steps
    for name, weight in small_weights.items():
        torch.testing.assert_close(big_weights[name], weight, rtol=0, atol=1e-5, msg=name)


def test_the_static_decoders_memory_is_released_before_the_update(tiny_lm, maze_tokenizer, monkeypatch):
    """The static engine's weight copy, KV cache and graphs must not sit in memory through the update (on the 1.5B shape
    at 128 rows that is about 6 GiB the memory plan does not count twice)."""
    from envs import make_env
    from fedagent_flwr.agent.engine import decode

    trainer = grpo_trainer(tiny_lm, maze_tokenizer, RunConfig().updated({"grpo.tasks-per-epoch": 1, "grpo.num-generations": 2}),
                          RolloutConfig(history_length=0, max_new_tokens=4, decode_engine="static"))
    held = []
    monkeypatch.setattr(trainer, "update", lambda samples, rng: held.append(tiny_lm in decode._DECODERS) or {})
    built = []
    inner = decode.decoder_for
    monkeypatch.setattr(decode, "decoder_for", lambda *a, **k: built.append(1) or inner(*a, **k))
    import fedagent_flwr.agent.engine.sampling as sampling
    monkeypatch.setattr(sampling, "decoder_for", decode.decoder_for)
    trainer.train_epoch(lambda: make_env("maze", max_steps=1), make_env("maze").tasks_of_split("train")[:1],
                        np.random.default_rng(0))
    assert built and held == [False]


def test_the_epoch_reports_the_share_of_groups_whose_rewards_differ(tiny_lm, maze_tokenizer, monkeypatch):
    from envs import make_env
    from fedagent_flwr.agent.training.advantages import informative_share

    task = Task("t", "c", "train")
    trajs = [Trajectory(task=task, reward=r) for r in (1.0, 0.0, 0.5, 0.5, 0.0, 0.0)]
    assert informative_share(trajs, [0, 0, 1, 1, 2, 2]) == pytest.approx(1 / 3)
    trainer = grpo_trainer(tiny_lm, maze_tokenizer, RunConfig().updated({"grpo.tasks-per-epoch": 1, "grpo.num-generations": 4}),
                          RolloutConfig(history_length=0, max_new_tokens=4))
    monkeypatch.setattr(trainer, "update", lambda samples, rng: {})
    metrics = trainer.train_epoch(lambda: make_env("maze", max_steps=1), make_env("maze").tasks_of_split("train")[:1],
                                  np.random.default_rng(0))
    assert metrics["informative_groups"] == 0.0  # a random model fails every one-step episode: one uniform group
    assert metrics["outcome_groups"] == 0.0


def test_groups_that_only_the_penalty_splits_count_as_informative_but_not_as_differing_in_outcome():
    from fedagent_flwr.agent.training.advantages import informative_share

    task = Task("t", "c", "train")
    # group 0: a win and a loss; group 1: two losses, one of them with an invalid step (penalty 0.1)
    trajs = [Trajectory(task=task, reward=10.0, episode_reward=10.0), Trajectory(task=task, reward=0.0, episode_reward=0.0),
             Trajectory(task=task, reward=0.0, episode_reward=0.0), Trajectory(task=task, reward=-0.1, episode_reward=0.0)]
    assert informative_share(trajs, [0, 0, 1, 1]) == 1.0
    assert informative_share(trajs, [0, 0, 1, 1], penalised=False) == 0.5


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_a_gpu_the_update_takes_fused_adamw_steps_equal_to_the_reference_loop(tiny_lm, maze_tokenizer):
    """On a GPU the trainer's AdamW is PyTorch's fused kernel (agent/engine/passes.py adamw): in fp32 its steps match the
    reference loop's to rounding, and AdamW's carried moments load into it (its step count lives on the GPU)."""
    import copy

    from fedagent_flwr.agent.training.advantages import StepSample

    rng = np.random.default_rng(7)
    vocab = tiny_lm.config.vocab_size
    samples = [StepSample(rng.integers(3, vocab, size=int(rng.integers(3, 30))).tolist(),
                          rng.integers(3, vocab, size=int(rng.integers(1, 10))).tolist(), float(rng.normal()))
               for _ in range(12)]
    cfg = RunConfig.from_run_config({"grpo.learning-rate": 1e-3, "grpo.weight-decay": 0.01, "grpo.beta": 0.05, "grpo.mini-batch-size": 4, "grpo.ppo-micro-batch-size-per-gpu": 2, "device": "cuda", "precision": "fp32"})

    def trained(fused: bool, carried=None):
        model = copy.deepcopy(tiny_lm).cuda()
        trainer = grpo_trainer(model, maze_tokenizer, cfg, RolloutConfig(history_length=0))
        assert bool(trainer.optimizer.defaults["fused"])
        if not fused:  # the reference loop, on the same parameters
            trainer.optimizer = torch.optim.AdamW(trainer.optimizer.param_groups[0]["params"], lr=1e-3, weight_decay=0.01)
        if carried is not None:
            trainer.load_optimizer_arrays(carried)
        trainer.update(samples, np.random.default_rng(0))
        return model, trainer

    fused_model, fused_trainer = trained(True)
    loop_model, _ = trained(False)
    base = dict(tiny_lm.named_parameters())
    for (name, a), (_, b) in zip(fused_model.named_parameters(), loop_model.named_parameters()):
        assert not torch.equal(a.cpu(), base[name]), name  # every weight moved
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    carried = fused_trainer.optimizer_arrays()
    assert all(v.item() == 3.0 for k, v in carried.items() if k.endswith("/step"))
    _, again = trained(True, carried)
    assert all(v.item() == 6.0 for k, v in again.optimizer_arrays().items() if k.endswith("/step"))


def test_gigpo_with_step_weight_zero_trains_exactly_as_grpo_and_otherwise_adds_credit(tiny_lm, maze_tokenizer,
                                                                                       monkeypatch):
    """grpo.adv-estimator=gigpo with grpo.step-advantage-w=0 is GRPO to the bit (the same samples, the same update);
    with weight 1 the steps of a group that started from the same state get their step-level part, and the epoch
    reports how many steps met a state another episode of their group met. The episodes are made by hand (a random
    model would fail them all alike): in each group of 4, two win, by paths of different lengths through states the
    others also pass."""
    import copy

    import fedagent_flwr.agent.training.grpo as grpo
    from envs import Task, make_env
    from fedagent_flwr.agent.play.rollout import StepRecord, Trajectory

    prompt, completion = maze_tokenizer.encode("go north"), maze_tokenizer.encode("<action>north</action>")

    def played(policy, env_factory, episodes, encoder, rollout, progress=False):
        paths = (["A", "B", "G"], ["A", "C", "B", "G"], ["A", "C"], ["A", "B", "C"])
        out = []
        for i, task in enumerate(episodes):
            path = paths[i % 4]
            won = path[-1] == "G"
            steps = [StepRecord(prompt, completion, "", "north", 0.0, True, observation=o) for o in path]
            out.append(Trajectory(task, steps, won=won, reward=10.0 * won, episode_reward=10.0 * won))
        return out

    monkeypatch.setattr(grpo, "run_episodes", played)
    tasks = [Task("t0", "room", "train"), Task("t1", "room", "train")]
    trained, seen = {}, {}
    for estimator, weight in (("grpo", 1.0), ("gigpo", 0.0), ("gigpo", 1.0)):
        model = copy.deepcopy(tiny_lm)
        cfg = RunConfig.from_run_config({"env": "maze", "device": "cpu", "grpo.adv-estimator": estimator, "grpo.step-advantage-w": weight, "grpo.tasks-per-epoch": 2, "grpo.num-generations": 4, "grpo.mini-batch-size": 1000})
        trainer = grpo_trainer(model, maze_tokenizer, cfg, RolloutConfig(history_length=0, max_new_tokens=12))
        samples = []
        inner = trainer.update
        trainer.update = lambda s, rng: samples.extend(s) or inner(s, rng)
        seen[(estimator, weight)] = trainer.train_epoch(lambda: make_env("maze"), tasks, np.random.default_rng(0))
        trained[(estimator, weight)] = ([x.advantage for x in samples], model.state_dict())
    grpo_adv, grpo_state = trained[("grpo", 1.0)]
    zero_adv, zero_state = trained[("gigpo", 0.0)]
    assert grpo_adv and zero_adv == grpo_adv and all(torch.equal(grpo_state[k], zero_state[k]) for k in grpo_state)
    assert "repeated_states" not in seen[("grpo", 1.0)]
    # every state is met by two episodes of its group at least: A by all four, B and C by three, G by the winners
    assert seen[("gigpo", 1.0)]["repeated_states"] == 1.0
    gigpo_adv = trained[("gigpo", 1.0)][0]
    assert len(gigpo_adv) == len(grpo_adv) and gigpo_adv != grpo_adv


def test_eager_training_attention_runs_the_update_passes_alone_and_takes_the_same_steps(tiny_lm, maze_tokenizer,
                                                                                     monkeypatch):
    """engine.attn-implementation=eager: the update's forward passes run transformers' eager attention, the no-grad log-prob
    passes (old policy, KL reference) SDPA as every other pass; the optimizer steps' gradients and the update's
    statistics are SDPA's to rounding (fp32), and the model computes with SDPA again after."""
    import copy

    from transformers.models.qwen2 import modeling_qwen2

    from fedagent_flwr.agent.training.advantages import StepSample

    rng = np.random.default_rng(12)
    vocab = tiny_lm.config.vocab_size
    samples = [StepSample(rng.integers(3, vocab, size=int(rng.integers(5, 30))).tolist(),
                          rng.integers(3, vocab, size=int(rng.integers(1, 10))).tolist(), float(rng.normal()),
                          float(rng.uniform(0.2, 1.0))) for _ in range(12)]
    cfg = RunConfig.from_run_config({"grpo.learning-rate": 1e-3, "grpo.beta": 0.05, "grpo.mini-batch-size": 6, "grpo.ppo-micro-batch-size-per-gpu": 3, "device": "cpu"})
    calls, eager = [], modeling_qwen2.eager_attention_forward
    monkeypatch.setattr(modeling_qwen2, "eager_attention_forward",
                        lambda module, *a, **k: calls.append(torch.is_grad_enabled()) or eager(module, *a, **k))
    runs = {}
    for attention in ("sdpa", "eager"):
        calls.clear()
        model = copy.deepcopy(tiny_lm)
        runs[attention] = _update_recording_grads(model, maze_tokenizer, cfg.updated({"engine.attn-implementation": attention}), samples)
        layers = len(model.model.layers)
        # sdpa: none; eager: the 4 update passes (2 minibatches of 2 micro-batches), with gradients, layer by layer
        assert calls == ([] if attention == "sdpa" else [True] * 4 * layers)
        assert model.config._attn_implementation == "sdpa"
    _assert_the_same_steps(*runs["sdpa"], *runs["eager"])
