import pytest
import torch
from scipy import stats

from fedagent_flwr.agent.play.rollout import stop_token_ids
from fedagent_flwr.agent.engine.sampling import inverse_cdf_draw, pick_tokens, sample_batch
from fedagent_flwr.agent.engine.tokens import shared_prefix
from fedagent_flwr.config.choices import TOKEN_SAMPLERS


def _generate_one(model, prompt, stop_ids, pad_id, max_new):
    out = model.generate(input_ids=torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                         max_new_tokens=max_new, do_sample=False, eos_token_id=stop_ids, pad_token_id=pad_id)
    ids = []
    for tok in out[0, len(prompt):].tolist():
        ids.append(tok)
        if tok in stop_ids:
            break
    return ids


def test_greedy_batch_with_row_dropping_equals_generate_prompt_by_prompt(tiny_lm, maze_tokenizer):
    stop = stop_token_ids(maze_tokenizer)
    pad = maze_tokenizer.pad_token_id
    texts = ["Reach the goal", "move up move down move left", "The goal is at position 8, 6. Your current position"]
    prompts = [maze_tokenizer(t)["input_ids"] for t in texts]  # ragged: exercises left padding and positions
    # Make the second row stop early so the batch shrinks mid-generation.
    with torch.no_grad():
        first = tiny_lm(torch.tensor([prompts[1]])).logits[0, -1].argmax().item()
    stop_ids = stop + [first]
    got = sample_batch(tiny_lm, prompts, pad, stop_ids, max_new_tokens=12, temperature=0.0)
    assert got[1] == [first]
    for prompt, ids in zip(prompts, got):
        assert ids == _generate_one(tiny_lm, prompt, stop_ids, pad, 12)
    assert max(len(ids) for ids in got) == 12


@pytest.mark.parametrize("sampler", TOKEN_SAMPLERS)
def test_top_p_samples_only_from_the_nucleus(sampler):
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]])).repeat(4000, 1)
    torch.manual_seed(0)
    picks = pick_tokens(logits, temperature=1.0, top_p=0.7, sampler=sampler)
    counts = torch.bincount(picks, minlength=4).float() / len(picks)
    assert counts[2] == 0 and counts[3] == 0  # 0.5 + 0.3 already reaches 0.7
    assert abs(counts[0].item() - 0.5 / 0.8) < 0.03
    assert pick_tokens(logits[:2], temperature=0.0, top_p=1.0, sampler=sampler).tolist() == [0, 0]


@pytest.mark.parametrize("sampler", TOKEN_SAMPLERS)
def test_each_token_sampler_draws_from_the_tempered_softmax(sampler):
    """A vocabulary of 64 with probabilities from 0.2 down to 1e-4 at temperature 0.7: the counts of 40,000 draws fit
    the softmax (a chi-square test; a sampler off by one token, or one that ignored the temperature, fails by far)."""
    generator = torch.Generator().manual_seed(5)
    logits = torch.randn(64, generator=generator) * 2
    torch.manual_seed(1)
    picks = pick_tokens(logits.repeat(40_000, 1), temperature=0.7, top_p=1.0, sampler=sampler)
    expected = torch.softmax(logits.double() / 0.7, dim=-1) * len(picks)
    observed = torch.bincount(picks, minlength=64).double()
    assert observed.sum() == len(picks)
    assert stats.chisquare(observed.numpy(), expected.numpy()).pvalue > 1e-3


def test_inverse_cdf_draws_one_uniform_number_a_row_and_places_it_among_the_running_sums():
    probs = torch.tensor([[0.1, 0.2, 0.3, 0.4], [0.0, 0.5, 0.0, 0.5], [2.0, 0.0, 0.0, 1.0]])  # sums need not be 1
    torch.manual_seed(7)
    picks = inverse_cdf_draw(probs)
    after = torch.rand(1)
    torch.manual_seed(7)
    u, next_number = torch.rand(3, 1), torch.rand(1)
    assert torch.equal(after, next_number)  # three rows took three numbers from the generator, no more
    want = [int((probs[i].cumsum(0) <= u[i] * probs[i].sum()).sum()) for i in range(3)]
    assert picks.tolist() == want
    assert picks[1].item() in (1, 3) and picks[2].item() in (0, 3)  # never a token of no mass


def test_inverse_cdf_keeps_a_uniform_number_that_rounds_up_to_the_sum_inside_the_last_token_of_mass(monkeypatch):
    """rand x sum can round to the sum itself; placed there, it would name the index after the vocabulary, or a
    trailing token of no mass. Held just below the sum, it lands in the last token that has mass."""
    monkeypatch.setattr(torch, "rand", lambda *shape, **kw: torch.ones(*shape, **kw))
    assert inverse_cdf_draw(torch.tensor([[0.3, 0.7, 0.0, 0.0], [0.5, 0.0, 0.5, 0.0]])).tolist() == [1, 2]


def test_sample_batch_refuses_an_unknown_token_sampler(tiny_lm):
    with pytest.raises(ValueError, match="token sampler must be one of"):
        sample_batch(tiny_lm, [[1, 2, 3]], 0, [], 4, 1.0, sampler="gumbel")


def test_a_shared_prompt_prefix_is_encoded_once_and_changes_nothing(tiny_lm, maze_tokenizer, monkeypatch):
    import fedagent_flwr.agent.engine.sampling as sampling

    stop = stop_token_ids(maze_tokenizer)
    pad = maze_tokenizer.pad_token_id
    head = maze_tokenizer("You are an agent in a maze. Reach the goal at position 8, 6. The goal is at")["input_ids"]
    tails = ["position 1, 1.", "position 5, 9. There are walls above you, below you.", "move"]
    prompts = [head + maze_tokenizer(t)["input_ids"] for t in tails]
    assert shared_prefix(prompts)[: len(head)] == head

    calls = []
    forward = tiny_lm.forward
    monkeypatch.setattr(tiny_lm, "forward", lambda *a, **kw: calls.append(kw["input_ids"].shape) or forward(*a, **kw))
    got = sample_batch(tiny_lm, prompts, pad, stop, max_new_tokens=10, temperature=0.0)
    assert calls[0][0] == 1 and calls[0][1] >= len(head)  # the prefix pass: one row
    monkeypatch.setattr(tiny_lm, "forward", forward)
    for prompt, ids in zip(prompts, got):
        assert ids == _generate_one(tiny_lm, prompt, stop, pad, 10)
    # Every prompt keeps at least one token of its own, even a prompt that is all prefix.
    assert len(shared_prefix([head, head + [5]])) == len(head) - 1


def test_identical_prompts_are_prefilled_once_yet_sampled_independently(tiny_lm, maze_tokenizer, monkeypatch):
    stop = stop_token_ids(maze_tokenizer)
    pad = maze_tokenizer.pad_token_id
    a = maze_tokenizer("The goal is at position 8, 6. Your current position is at position 1, 4.")["input_ids"]
    b = maze_tokenizer("The goal is at position 8, 6. Your current position is at position 5, 9.")["input_ids"]
    prompts = [a, b, a, a, b, a]

    rows_prefilled = []
    forward = tiny_lm.forward
    monkeypatch.setattr(tiny_lm, "forward",
                        lambda *a_, **kw: rows_prefilled.append(kw["input_ids"].shape) or forward(*a_, **kw))
    greedy = sample_batch(tiny_lm, prompts, pad, stop, max_new_tokens=8, temperature=0.0)
    # First the shared-prefix pass (1 row), then the prompts' own tokens: 2 distinct rows, not 6.
    assert rows_prefilled[0][0] == 1 and rows_prefilled[1][0] == 2
    monkeypatch.setattr(tiny_lm, "forward", forward)
    for prompt, ids in zip(prompts, greedy):
        assert ids == _generate_one(tiny_lm, prompt, stop, pad, 8)

    # Copies of one prompt are separate samples, not one sample repeated.
    torch.manual_seed(0)
    sampled = sample_batch(tiny_lm, [a] * 16, pad, stop, max_new_tokens=8, temperature=1.0)
    assert len({tuple(ids) for ids in sampled}) > 1


def test_sampling_uses_the_cache_keyword_transformers_keeps(tiny_lm, maze_tokenizer):
    """transformers 5.24 deprecates `past_key_values` (removed in 5.40): the sampler, bare or under a LoRA
    wrapper, must pass the KV cache by the name the installed model's forward declares, with no FutureWarning."""
    import warnings

    from peft import LoraConfig, get_peft_model

    prompts = [maze_tokenizer(t)["input_ids"] for t in ("Reach the goal at 1, 2", "Reach the goal at 3, 4")]
    wrapped = get_peft_model(tiny_lm, LoraConfig(r=2, target_modules=["q_proj"]))
    for model in (tiny_lm, wrapped):
        with warnings.catch_warnings():
            warnings.simplefilter("error", FutureWarning)
            got = sample_batch(model, prompts, maze_tokenizer.pad_token_id, [], max_new_tokens=4, temperature=0.0)
        assert [len(ids) for ids in got] == [4, 4]
    wrapped.unload()


def test_the_prefill_scores_its_last_positions_from_a_contiguous_copy_for_a_frozen_model(tiny_lm, maze_tokenizer):
    """A frozen model (the base under a LoRA adapter, an evaluated model) must not meet torch's matmul with a strided
    [batch, 1, hidden] view of the last positions: it then expands the head's weight batch-fold and copies it
    (docs/performance.md). The head of the prefill gets a contiguous input of
    one row per distinct prompt, and the same next-token logits as the whole-sequence forward."""
    import copy

    model = copy.deepcopy(tiny_lm).eval().requires_grad_(False)
    seen = []
    head = model.get_output_embeddings()
    handle = head.register_forward_pre_hook(lambda module, args: seen.append((args[0].shape, args[0].is_contiguous())))
    prompts = [maze_tokenizer.encode(text) for text in ("go up now", "go down the long corridor", "left")]
    try:
        tokens = sample_batch(model, prompts, maze_tokenizer.pad_token_id, stop_token_ids(maze_tokenizer),
                              max_new_tokens=3, temperature=0.0)
    finally:
        handle.remove()
    prefill = seen[0]
    assert prefill == (torch.Size([3, 1, model.config.hidden_size]), True), seen[:2]
    with torch.no_grad():  # greedy: the first token of each row is the argmax of the prompt's own last logits
        firsts = [int(model(input_ids=torch.tensor([p])).logits[0, -1].argmax()) for p in prompts]
    assert [row[0] for row in tokens] == firsts
