"""QAvg / PAvg as Flower strategies: config wiring, message contents, and equality with fedrl's engine."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict

from fedagent_flwr.config import RunConfig
from fedagent_flwr.runs.preflight import preflight
from fedagent_flwr.methods import method_for
from fedrl_grid import LocalGrid, build_problem, strategy_for
from fedrl.engine import Cell, run_cells
from fedrl.mdps import RandomMDPs, WindyCliffs
from fedrl.tabular import project_to_simplex
from strategies import PAvg, QAvg


def _cfg(**over) -> RunConfig:
    return RunConfig.from_run_config(RunConfig().to_run_config() | over)


def run_in_process(cfg: RunConfig, K: int = 5):
    problem = build_problem(cfg, K)
    grid = LocalGrid(cfg, K)
    strategy = strategy_for(cfg, problem, {k: 100 + k for k in range(K)})
    values = {}

    def evaluate_fn(server_round, arrays):
        values[server_round] = problem.values(arrays["params"].numpy())
        return MetricRecord(values[server_round])

    result = strategy.start(grid=grid, initial_arrays=ArrayRecord({"params": Array(problem.init_params)}),
                            num_rounds=cfg.num_server_rounds, train_config=ConfigRecord({"fingerprint": problem.fingerprint()}),
                            evaluate_fn=evaluate_fn)
    return problem, strategy, grid, values, result


# --- the Flower strategies compute what fedrl's vectorised engine computes ---------------------------------


@pytest.mark.parametrize(
    "over, family, algo",
    [
        ({"strategy": "qavg", "env": "random-mdp", "fedrl.local-updates": 4, "num-server-rounds": 6}, RandomMDPs, "qavg"),
        ({"strategy": "pavg", "env": "random-mdp", "fedrl.pavg-variant": "soft", "fedrl.local-updates": 2, "num-server-rounds": 8}, RandomMDPs, "softpavg"),
        ({"strategy": "pavg", "env": "random-mdp", "fedrl.pavg-variant": "proj", "fedrl.local-updates": 4, "num-server-rounds": 5,
          "fedrl.random-mdp-reward-scale": 10.0, "fedrl.kappa": 0.8}, RandomMDPs, "projpavg"),
        ({"strategy": "qavg", "env": "windy-cliffs", "fedrl.local-updates": 2, "num-server-rounds": 6, "fedrl.kappa": 0.6}, WindyCliffs, "qavg"),
        ({"strategy": "pavg", "env": "windy-cliffs", "fedrl.pavg-variant": "proj", "fedrl.local-updates": 8, "num-server-rounds": 2}, WindyCliffs, "projpavg"),
        ({"strategy": "qavg", "env": "random-mdp", "fedrl.local-updates": 0, "fedrl.independent-steps-per-round": 3, "num-server-rounds": 4}, RandomMDPs, "qavg"),
        ({"strategy": "pavg", "env": "windy-cliffs", "fedrl.local-updates": 0, "fedrl.independent-steps-per-round": 4, "num-server-rounds": 3,
          "fedrl.step-size": 0.2, "fedrl.step-decay": 0.5}, WindyCliffs, "softpavg"),
    ],
)
def test_flower_rounds_equal_the_vectorised_engine_on_the_same_seed(run_identity, over, family, algo):
    for seed, rep in ((0, 0), (3, 7)):
        cfg = _cfg(**over, seed=seed, **{"fedrl.repetition": rep})
        problem, strategy, grid, values, _ = run_in_process(cfg)
        steps = cfg.num_server_rounds * (cfg.fedrl.local_updates or cfg.fedrl.independent_steps_per_round)
        fam = family(reward_scale=cfg.fedrl.random_mdp_reward_scale) if family is RandomMDPs else family()
        cell = Cell(algo, cfg.fedrl.local_updates or None, steps, problem.step_size, cfg.fedrl.kappa)
        (ref,) = run_cells(fam, [cell], reps=rep + 1, seed=seed)
        final = values[cfg.num_server_rounds]
        assert final["center_value"] == pytest.approx(ref.center_value[rep], rel=1e-10, abs=1e-12)
        assert final["train_value"] == pytest.approx(ref.train_value[rep], rel=1e-10, abs=1e-12)
        assert final["test_value"] == pytest.approx(ref.test_value[rep], rel=1e-10, abs=1e-12)
        assert strategy.failures == {r: [] for r in range(1, cfg.num_server_rounds + 1)}
    # training did something: the final policy beats the initial one on the clients' kernels
    assert values[cfg.num_server_rounds]["train_value"] > values[0]["train_value"]


def test_the_server_average_is_the_mean_of_the_replies_and_step_sizes_follow_theorem_2(run_identity):
    cfg = _cfg(strategy="qavg", env="random-mdp", **{"num-server-rounds": 3, "fedrl.local-updates": 4})
    problem, strategy, grid, values, result = run_in_process(cfg)
    last = [r for r in grid.replies if True][-5:]
    tables = np.stack([r.content.array_records["arrays"]["params"].numpy() for r in last])
    np.testing.assert_allclose(result.arrays["params"].numpy(), tables.mean(0), rtol=0, atol=1e-14)
    # eta_t = min(1, 2 / ((1 - gamma)(t + E))) with gamma = 0.9, E = 4, t = 8..11 in round 3
    np.testing.assert_allclose(strategy.step_sizes[3], [min(1.0, 2 / (0.1 * (t + 4))) for t in range(8, 12)])
    # every round every client gets the same global table and the same E step sizes
    round3 = grid.sent[-5:]
    assert sorted(m.content.config_records["config"]["partition-id"] for m in round3) == [0, 1, 2, 3, 4]
    assert all(list(m.content.config_records["config"]["step-sizes"]) == strategy.step_sizes[3] for m in round3)


def test_proj_pavg_keeps_tables_on_the_simplex_and_rejects_off_simplex_replies(run_identity):
    cfg = _cfg(strategy="pavg", env="random-mdp", **{"fedrl.pavg-variant": "proj", "num-server-rounds": 3, "fedrl.local-updates": 4,
                                                     "fedrl.step-size": 0.5})
    problem, strategy, grid, values, result = run_in_process(cfg)
    for reply in grid.replies:
        table = reply.content.array_records["arrays"]["params"].numpy()
        assert table.min() >= 0 and np.allclose(table.sum(-1), 1.0)
    avg = result.arrays["params"].numpy()
    assert avg.min() >= 0 and np.abs(avg.sum(-1) - 1).max() < 1e-12
    np.testing.assert_allclose(project_to_simplex(avg), avg, atol=1e-12)  # already a policy: projection leaves it
    # a reply off the simplex is left out of the average
    good = grid.replies[-1]
    bad_table = good.content.array_records["arrays"]["params"].numpy() * 1.5
    bad = Message(RecordDict({"arrays": ArrayRecord({"params": Array(bad_table)}), "metrics": MetricRecord({"start-objective": 1.0})}),
                  reply_to=grid.sent[-2])
    list(strategy.configure_train(4, result.arrays, ConfigRecord({"fingerprint": problem.fingerprint()}), grid=None))
    arrays, metrics = strategy.aggregate_train(4, [good, bad])
    np.testing.assert_array_equal(arrays["params"].numpy(), good.content.array_records["arrays"]["params"].numpy())
    assert metrics["replies"] == 1 and any("simplex" in f for f in strategy.failures[4])


def test_soft_pavg_averages_logits(run_identity):
    strategy = PAvg({0: 10, 1: 11}, local_steps=2, variant="soft")
    init = ArrayRecord({"params": Array(np.zeros((2, 3)))})
    msgs = list(strategy.configure_train(1, init, ConfigRecord(), grid=None))
    a, b = np.array([[1.0, -2.0, 5.0], [0.0, 3.0, 1.0]]), np.array([[3.0, 2.0, -1.0], [4.0, 1.0, 1.0]])
    replies = [Message(RecordDict({"arrays": ArrayRecord({"params": Array(x)})}), reply_to=m) for m, x in zip(msgs, (a, b))]
    arrays, _ = strategy.aggregate_train(1, replies)
    np.testing.assert_allclose(arrays["params"].numpy(), [[2.0, 0.0, 2.0], [2.0, 2.0, 1.0]])


def test_independent_baseline_sends_no_model_after_round_one(run_identity):
    cfg = _cfg(strategy="qavg", env="random-mdp", **{"num-server-rounds": 3, "fedrl.local-updates": 0, "fedrl.independent-steps-per-round": 2})
    problem, strategy, grid, values, _ = run_in_process(cfg)
    by_round = {}
    for m in grid.sent:
        by_round.setdefault(m.content.config_records["config"]["server-round"], []).append(m)
    assert all(len(m.content.array_records["arrays"]) == 1 for m in by_round[1])
    assert all(len(m.content.array_records["arrays"]) == 0 for r in (2, 3) for m in by_round[r])
    # each node carries its own table across rounds
    assert all("fedrl-local" in ctx.state.array_records for ctx in grid.contexts.values())


def test_sampled_clients_use_the_seeded_fraction(run_identity):
    cfg = _cfg(strategy="qavg", env="windy-cliffs", **{"num-server-rounds": 4, "fedrl.clients": "sampled", "clients-per-round": 2})
    _, strategy, grid, values, _ = run_in_process(cfg)
    assert all(len(p) == 2 and len(set(p)) == 2 for p in strategy.sampled.values())
    assert len(grid.sent) == 8
    _, again, _, values2, _ = run_in_process(cfg)
    assert again.sampled == strategy.sampled and values2 == values


def test_a_client_that_built_another_problem_is_refused(run_identity):
    cfg = _cfg(strategy="qavg", env="random-mdp")
    other = _cfg(strategy="qavg", env="random-mdp", **{"fedrl.kappa": 0.2})
    assert method_for(cfg).client_fingerprint(0, 5, None) != method_for(other).client_fingerprint(0, 5, None)
    problem = build_problem(cfg, 5)
    strategy = strategy_for(cfg, problem, {k: 100 + k for k in range(5)})
    (msg, *_) = strategy.configure_train(1, ArrayRecord({"params": Array(problem.init_params)}),
                                         ConfigRecord({"fingerprint": problem.fingerprint()}), grid=None)
    ctx = Context(run_id=1, node_id=100, node_config={"partition-id": 0, "num-partitions": 5}, state=RecordDict(), run_config={})
    with pytest.raises(ValueError, match="fingerprint"):
        method_for(other).train(msg, ctx, 0, 5, load_agent=None)


# --- configuration ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "override, message",
    [
        ({"strategy": "qavg", "env": "maze"}, "env='maze'"),
        ({"strategy": "fedagent-avg", "env": "random-mdp"}, "env='random-mdp'"),
        ({"strategy": "pavg", "env": "cartpole"}, "env='cartpole'"),
        ({"strategy": "qavg", "env": "pendulum"}, "env='pendulum'"),
        ({"strategy": "pavg", "env": "pendulum", "fedrl.pavg-variant": "proj"}, "fedrl.pavg-variant='proj'"),
        ({"strategy": "qavg", "env": "random-mdp", "fedrl.kappa": 1.5}, "fedrl.kappa=1.5"),
        ({"strategy": "pavg", "env": "random-mdp", "fedrl.pavg-variant": "natural"}, "fedrl.pavg-variant='natural'"),
        ({"strategy": "qavg", "env": "random-mdp", "fedrl.local-updates": -1}, "fedrl.local-updates=-1"),
        ({"strategy": "qavg", "env": "random-mdp", "fedrl.local-updates": 0, "fedrl.clients": "sampled"}, "fedrl.clients='sampled'"),
        ({"strategy": "qavg", "env": "random-mdp", "fedrl.step-decay": 0.0}, "fedrl.step-decay=0.0"),
        ({"strategy": "qavg", "env": "random-mdp", "fedrl.random-mdp-reward-scale": 0.0}, "fedrl.random-mdp-reward-scale=0.0"),
        ({"strategy": "qavg", "env": "random-mdp", "fedrl.env-embedding-dim": 4}, "fedrl.env-embedding-dim=4"),
    ],
)
def test_bad_qavg_pavg_configs_fail_before_work_starts(override, message):
    with pytest.raises(ValueError) as err:
        preflight(_cfg(**override))  # the run config's checks, then the machine's (which envs exist, which need what)
    assert message in str(err.value) and "expected" in str(err.value)


def test_mujoco_envs_need_mujoco_before_work_starts(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "mujoco" else real(name, *a))
    with pytest.raises(ValueError, match=r"env='hopper'.*mujoco"):
        preflight(_cfg(strategy="pavg", env="hopper"))
    assert preflight(_cfg(strategy="pavg", env="pendulum")).env == "pendulum"


def test_strategy_registry_and_arguments():
    nodes = {k: 100 + k for k in range(5)}
    assert type(strategy_for(_cfg(strategy="qavg", env="random-mdp"), build_problem(_cfg(strategy="qavg", env="random-mdp"), 5), nodes)) is QAvg
    proj = _cfg(strategy="pavg", env="random-mdp", **{"fedrl.pavg-variant": "proj"})
    strategy = strategy_for(proj, build_problem(proj, 5), nodes)
    assert type(strategy) is PAvg and strategy.algorithm == "projpavg" == method_for(proj).algorithm()
    assert PAvg(node_of_partition={0: 1}, local_steps=None, variant="proj").algorithm == "projpavg"
    with pytest.raises(ValueError, match="variant"):
        PAvg({0: 1}, local_steps=1, variant="natural")
    with pytest.raises(ValueError, match="E = inf"):
        QAvg({0: 1, 1: 2}, local_steps=None, clients_per_round=1)
    with pytest.raises(ValueError, match="local_steps"):
        QAvg({0: 1}, local_steps=0)


# --- deep: DQNAvg / PerDQNAvg --------------------------------------------------------------------------


@pytest.mark.parametrize("strategy, env, E", [("qavg", "cartpole", 1), ("pavg", "pendulum", 3)])
def test_per_deep_avg_never_sends_the_embedding_and_averages_the_shared_layers(run_identity, strategy, env, E):
    pytest.importorskip("torch")
    from fedagent_flwr.methods.fedrl import deep as fedrl_deep

    # pendulum: 3 episodes of 200 steps a round, so DDPG's 1,000 warm-up steps end in round 2 and the embedding trains
    cfg = _cfg(strategy=strategy, env=env, **{"fedrl.env-embedding-dim": 3, "fedrl.local-updates": E, "num-server-rounds": 2,
                                              "fedrl.test-envs": 1, "eval.samples-per-task": 1, "eval.test-freq": 2})
    K = 2
    problem = fedrl_deep.build_deep_problem(cfg, K)
    grid = LocalGrid(cfg, K)
    strategy = strategy_for(cfg, problem, {k: 100 + k for k in range(K)})
    result = strategy.start(grid=grid, initial_arrays=problem.initial_arrays(), num_rounds=2,
                            train_config=ConfigRecord({"fingerprint": problem.fingerprint()}))
    embeddings = []
    for ctx in grid.contexts.values():
        emb = ctx.state.array_records[fedrl_deep.STATE]["net/embedding"].numpy()
        assert emb.shape == (3,) and np.abs(emb).max() > 0  # it was trained (starts at zeros)
        embeddings.append(emb)
    assert not np.allclose(embeddings[0], embeddings[1])
    shared = [k for k in problem.learner(0).net.state_dict() if k != "embedding"]
    outgoing = grid.replies + [Message(RecordDict({"info": ConfigRecord({"fingerprint": method_for(cfg).client_fingerprint(k, K, None)})}), reply_to=grid.sent[k]) for k in range(K)]
    for msg in outgoing:
        for record in msg.content.array_records.values():
            assert sorted(record.keys()) == sorted(shared)
            for arr in record.values():
                a = arr.numpy().ravel()
                assert not any(a.size >= 3 and np.isin(e, a).all() for e in embeddings)  # no copy under another name
        for record in msg.content.config_records.values():
            assert not any(isinstance(v, list) for v in record.values())
    # the global model is the mean of the last round's replies
    last = grid.replies[-2:]
    for key in shared:
        mean = np.mean([r.content.array_records["arrays"][key].numpy().astype(np.float64) for r in last], axis=0)
        np.testing.assert_allclose(result.arrays[key].numpy(), mean.astype(np.float32), rtol=1e-6)
    # a reply that smuggles an embedding is left out
    bad_arrays = ArrayRecord(dict(last[0].content.array_records["arrays"].items()) | {"embedding": Array(embeddings[0])})
    bad = Message(RecordDict({"arrays": bad_arrays}), reply_to=grid.sent[-2])
    strategy._global = ArrayRecord(dict(result.arrays.items()) | {"embedding": Array(embeddings[0])})
    arrays, metrics = strategy.aggregate_train(3, [bad])
    assert arrays is None and any("embedding" in f for f in strategy.failures[3])
    assert np.isfinite(problem.values(result.arrays)["train_value"])


@pytest.mark.parametrize("strategy, env", [("qavg", "cartpole"), ("pavg", "pendulum")])
def test_learner_state_survives_the_round_trip_through_context_state(strategy, env):
    pytest.importorskip("torch")
    from dataclasses import replace

    from fedagent_flwr.methods.fedrl import deep as fedrl_deep

    cfg = _cfg(strategy=strategy, env=env, **{"fedrl.env-embedding-dim": 2})
    problem = fedrl_deep.build_deep_problem(cfg, 2)
    if problem.ddpg:  # a small ring buffer that wraps before the save: 3 x 200 steps into 250 slots, next slot 100
        problem = replace(problem, config=replace(problem.config, replay_size=250, warmup_steps=100))
    straight = problem.learner(1)
    straight.train_episodes(3)
    straight.train_episodes(2)
    resumed = problem.learner(1)
    resumed.train_episodes(3)
    state = RecordDict()
    fedrl_deep.save_learner(resumed, state)
    fresh = problem.learner(1)
    fedrl_deep.load_learner(fresh, state)
    fresh.train_episodes(2)
    assert straight.updates == fresh.updates > 0 and getattr(straight, "epsilon", 0) == getattr(fresh, "epsilon", 0)
    for a, b in zip(straight.get_weights(), fresh.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    assert straight.evaluate(episodes=1) == fresh.evaluate(episodes=1)  # evaluation streams restored too


def test_deep_env_lists_agree_with_the_config():
    pytest.importorskip("torch")
    from strategies import registry as config  # the strategies' registry holds what each runs on
    from fedagent_flwr.methods.fedrl import deep as fedrl_deep

    assert config.FEDRL_DQN_ENVS == fedrl_deep.DQN_ENVS and config.FEDRL_DDPG_ENVS == fedrl_deep.DDPG_ENVS
    # every env the config lets qavg / pavg run on is one the method can build
    assert set(config.FEDRL_ENVS) == set(fedrl_deep.DEEP_ENVS) | set(config.FEDRL_TABULAR_ENVS)
    for name, envs in config.FEDRL_STRATEGY_ENVS.items():
        assert set(envs) <= set(config.FEDRL_ENVS), name
    problem = fedrl_deep.build_deep_problem(_cfg(strategy="pavg", env="pendulum", **{"rollout.max-steps": 50}), 3)
    assert problem.name == "DDPGAvg" and len(problem.train_params) == 3 and all(len(p) == 2 for p in problem.train_params)
    assert problem.make_env(problem.train_params[0]).spec.max_episode_steps == 50
