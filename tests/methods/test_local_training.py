import torch

from fedagent_flwr.agent.models.loading import Agent
from fedagent_flwr.config import RunConfig
from fedagent_flwr.methods.local_round import train_locally
from fedagent_flwr.methods.tasks import learner_tasks as client_tasks
from fedagent_flwr.agent.models.pretrained import ModelSpec, fingerprint


def test_client_tasks_are_its_partition_of_the_training_split():
    cfg = RunConfig.from_run_config({"partition.tasks-per-client": 5, "seed": 3})
    mine = client_tasks(cfg, 1, 4)
    assert len(mine) == 5 and len({t.id for t in mine}) == 5
    assert all(t.split == "train" for t in mine)
    assert [t.id for t in client_tasks(cfg, 1, 4)] == [t.id for t in mine]  # reproducible
    assert [t.id for t in client_tasks(cfg, 2, 4)] != [t.id for t in mine]


def test_a_local_round_reports_metrics_and_learns_nothing_from_uniform_groups(tiny_lm, maze_tokenizer):
    torch.set_num_threads(1)
    agent = Agent(tiny_lm, maze_tokenizer, ModelSpec("test", built_here=True), torch.device("cpu"), fingerprint(tiny_lm))
    cfg = RunConfig.from_run_config({"grpo.tasks-per-epoch": 2, "grpo.num-generations": 2, "grpo.local-epochs": 2, "rollout.max-steps": 3,
                                     "rollout.max-completion-length": 8, "grpo.learning-rate": 1e-2, "rollout.invalid-penalty": 0.5})
    before = {k: v.clone() for k, v in tiny_lm.state_dict().items()}
    metrics = train_locally(agent, cfg, client_tasks(cfg, 0, 2), server_round=1, partition_id=0)
    assert metrics["episodes"] == 8.0  # 2 epochs x 2 tasks x group of 2
    assert metrics["seconds"] > 0
    assert all(isinstance(v, float) for v in metrics.values())
    # A random model writes no valid action: every episode gets the same reward (3 x -0.5),
    # so no group has a reward spread, no sample carries signal and the weights must not move.
    assert metrics["success_rate"] == 0.0 and metrics["mean_reward"] == -1.5
    assert metrics["optimizer_steps"] == 0.0
    assert all(torch.equal(before[k], v) for k, v in tiny_lm.state_dict().items())
