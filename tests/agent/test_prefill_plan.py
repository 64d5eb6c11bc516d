"""Which prompt prefixes the static engine's prefill computes once per group (agent/engine/prefill_plan.py).

That the two-pass prefill gives the same tokens and log-probs as the transformers forward is tested in
tests/agent/test_decode.py; here, the plan: its groups, its invariants, and that it never costs more than
prefilling every prompt whole."""

import random

from fedagent_flwr.agent.engine.prefill_plan import MIN_SHARED, PrefillPlan, plan_prefill


def _whole_cost(prompts):
    return len(prompts) * max(len(p) for p in prompts)


def _rollout_batch(seed=0, tasks=4, group=8):
    """System text, then a task's text shared by its G episodes, then each episode's own history."""
    rng = random.Random(seed)
    system = [rng.randrange(1000) for _ in range(30)]
    prompts = []
    for t in range(tasks):
        task = [rng.randrange(1000) for _ in range(40 + 10 * t)]
        for e in range(group):
            # a distinct first history token, so that a group shares exactly system + task
            prompts.append(system + task + [1000 + e] + [rng.randrange(1000) for _ in range(rng.randrange(60, 90))])
    return system, prompts


def _check_invariants(plan: PrefillPlan):
    for j, prompt in enumerate(plan.prompts):
        g = plan.group_of[j]
        if g >= 0:
            assert prompt[:len(plan.prefixes[g])] == plan.prefixes[g]  # the group's prefix is the prompt's own
            assert len(prompt) > len(plan.prefixes[g])  # a token of its own is left for the suffix pass
            assert len(plan.prefixes[g]) >= MIN_SHARED
    assert all(g in plan.group_of for g in range(len(plan.prefixes)))  # no group without members
    assert plan.cost <= _whole_cost(plan.prompts)


def test_a_rollout_batch_is_prefilled_as_one_prefix_per_task_then_the_histories():
    system, prompts = _rollout_batch()
    plan = plan_prefill(prompts)
    _check_invariants(plan)
    assert sorted(len(p) for p in plan.prefixes) == [30 + 40, 30 + 50, 30 + 60, 30 + 70]
    groups = [set(plan.group_of[t * 8:(t + 1) * 8]) for t in range(4)]
    assert all(len(g) == 1 for g in groups) and len(set.union(*groups)) == 4  # a group per task
    # the task texts make up a third of these prompts: the two passes compute 30-40 % fewer positions
    assert plan.cost < 0.7 * _whole_cost(prompts)


def test_one_long_prompt_alone_makes_the_common_prefix_the_cheaper_plan():
    """Groups shorten the suffixes only if every suffix gets shorter: one long prompt with nothing but the system text
    in common keeps the suffix pass wide, and the system text shared once is the cheaper plan."""
    system, prompts = _rollout_batch(tasks=2)
    prompts.append(system + list(range(200)))
    plan = plan_prefill(prompts)
    _check_invariants(plan)
    assert plan.prefixes == (tuple(system),) and set(plan.group_of) == {0}


def test_no_plan_below_the_shortest_prefix_worth_a_pass_or_for_one_prompt():
    short = [[1] * (MIN_SHARED - 1) + [2, 3], [1] * (MIN_SHARED - 1) + [4, 5, 6]]
    assert plan_prefill(short).prefixes == ()
    assert plan_prefill([[1] * MIN_SHARED + [2], [1] * MIN_SHARED + [3]]).prefixes == ((1,) * MIN_SHARED,)
    assert plan_prefill([list(range(50))]).prefixes == ()


def test_a_prompt_that_is_another_ones_prefix_keeps_a_token_of_its_own():
    base = list(range(40))
    plan = plan_prefill([base, base + [99, 98], base + [97]])
    _check_invariants(plan)
    assert plan.prefixes == (tuple(base[:-1]),)


def test_random_batches_keep_the_invariants_and_never_cost_more_than_whole_prompts():
    """Prompts grown as random trees of shared stems (a small alphabet, so that chance prefixes occur too)."""
    rng = random.Random(7)
    grouped = 0
    for _ in range(300):
        stems = [[rng.randrange(4) for _ in range(rng.randrange(0, 30))]]
        prompts = set()
        for _ in range(rng.randrange(1, 40)):
            stem = list(rng.choice(stems))
            p = stem + [rng.randrange(4) for _ in range(rng.randrange(1, 25))]
            prompts.add(tuple(p))
            if rng.random() < 0.3:
                stems.append(p)
        plan = plan_prefill(sorted(prompts, key=lambda _: rng.random()))
        _check_invariants(plan)
        grouped += bool(plan.prefixes)
    assert grouped > 100  # the random batches did exercise grouped plans
