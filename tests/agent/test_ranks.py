"""GRPO's passes on N ranks (agent/fsdp/ranks.py, FSDP2 with gloo on CPU) train as one rank does."""

import pytest
import torch
import torch.multiprocessing as mp

import rank_workers

pytestmark = pytest.mark.ranks  # rank processes on gloo: .ci/run runs them apart from the default suite


def _on_ranks(lora: bool, settings: dict, out: str, world: int) -> None:
    rendezvous = out + ".rendezvous"
    context = mp.get_context("spawn")
    procs = [context.Process(target=rank_workers.update, args=(lora, settings, out, r, world, rendezvous))
             for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=300)
    assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]


NO_KL = {"grpo.mini-batch-size": 8, "grpo.ppo-micro-batch-size-per-gpu": 2, "grpo.beta": 0.0}  # 13 samples: 2 minibatches, ranks with 3 and 2 passes
KL_TO_BASE = {"grpo.mini-batch-size": 8, "grpo.ppo-micro-batch-size-per-gpu": 3, "grpo.beta": 0.05, "grpo.kl-reference": "base",
              "grpo.group-by-length": True}
# verl's per-micro-batch mean with uneven counts: minibatches of 8 and 5 cut into 3 and 2 micro-batches, so rank 0 runs
# 2 and 1, rank 1 runs 1 and 1: each micro-batch's token mean must weigh 1/3 and 1/2 of its minibatch's loss
PER_MICRO_BATCH = {"grpo.mini-batch-size": 8, "grpo.ppo-micro-batch-size-per-gpu": 3, "grpo.beta": 0.0, "grpo.loss-aggregation": "micro-batch-token-mean"}
# micro-batches cut by padded tokens, each of another size, under the plain token mean
BY_TOKENS = {"grpo.mini-batch-size": 8, "grpo.ppo-micro-batch-size-per-gpu": 8, "grpo.ppo-max-token-len-per-gpu": 60, "grpo.beta": 0.05, "grpo.kl-reference": "base",
             "grpo.loss-aggregation": "token-mean"}
# chunked log-probs call the body and the head themselves, not the model's forward (the SmolLM2 presets' 256-token
# chunks); a tied head and embedding, as SmolLM2's, trained through both
CHUNKED = {"grpo.mini-batch-size": 8, "grpo.ppo-micro-batch-size-per-gpu": 3, "grpo.beta": 0.05, "grpo.kl-reference": "base", "engine.logprob-chunk-tokens": 4,
           "tied": True}
# every layer's activations recomputed in backward (the 7B plan's assumption), each layer an FSDP unit of its own
CHECKPOINTED = {"grpo.mini-batch-size": 8, "grpo.ppo-micro-batch-size-per-gpu": 3, "grpo.beta": 0.05, "grpo.kl-reference": "base",
                "engine.gradient-checkpointing": True}


# every loss aggregation once; the aggregation is the trainer's, so one model kind each suffices for the newer two.
# The default suite runs each setting once with one model kind (about 14 s a case); -m slow adds the other kind.
@pytest.mark.parametrize("lora, settings", [
    pytest.param(False, NO_KL, marks=pytest.mark.slow), (True, NO_KL), (False, KL_TO_BASE),
    pytest.param(True, KL_TO_BASE, marks=pytest.mark.slow), (False, PER_MICRO_BATCH), (True, BY_TOKENS),
    (False, CHUNKED), (True, CHUNKED), (False, CHECKPOINTED),
], ids=["no-kl-full", "no-kl-lora", "kl-to-base-full", "kl-to-base-lora", "micro-batch-token-mean-full",
        "token-mean-by-tokens-lora", "chunked-tied-full", "chunked-tied-lora", "checkpointed-full"])
def test_two_ranks_train_the_weights_one_rank_trains(lora, settings, tmp_path):
    rank_workers.update(lora, settings, str(tmp_path / "one.pt"))
    _on_ranks(lora, settings, str(tmp_path / "two.pt"), 2)
    one, two = torch.load(tmp_path / "one.pt"), torch.load(tmp_path / "two.pt")
    start = rank_workers.tiny_model(lora, tied=settings.get("tied", False))[0].state_dict()
    moved = max(float((one["weights"][k] - start[k]).abs().max()) for k in one["weights"])
    assert moved > 1e-4  # the update did something
    for k in one["weights"]:
        torch.testing.assert_close(two["weights"][k], one["weights"][k], rtol=0, atol=1e-5, msg=k)
    assert two["stats"]["loss"] == pytest.approx(one["stats"]["loss"], abs=1e-5)
    assert two["stats"]["optimizer_steps"] == one["stats"]["optimizer_steps"] == 2
    if settings.get("engine.gradient-checkpointing"):  # recomputed on the ranks too, not silently left off
        assert two["stats"]["checkpointed_layers"] == one["stats"]["checkpointed_layers"] == 1.0
