"""Held-out episodes as text: what the agent saw, wrote and did, step by step."""

from envs import Task
from fedagent_flwr.agent.play.rollout import StepRecord, Trajectory
from fedagent_flwr.agent.play.transcripts import sample_episodes, short_example, write_transcripts


def _episode(i: int, won: bool) -> Trajectory:
    step = StepRecord([1], [2], f"<think>go</think><action>move {i}</action>", f"move {i}", 1.0 if won else 0.0,
                      valid=won, observation=f"You are at cell {i}.\nWalls: north")
    return Trajectory(Task(f"t{i}", "near", "test"), [step], won=won, reward=1.0 if won else -0.1)


def test_transcripts_show_each_steps_observation_completion_action_validity_and_reward(tmp_path):
    episodes = [_episode(0, False), _episode(1, False), _episode(2, True), _episode(3, True)]
    assert [t.task.id for t in sample_episodes(episodes, 3)] == ["t0", "t2", "t1"]  # failures and successes alike
    path = write_transcripts(tmp_path / "episodes" / "round-0001.txt", episodes, 2, header="after round 1")
    text = path.read_text()
    assert text.startswith("after round 1")
    assert "=== episode 1: task t0 (near); failure after 1 steps" in text and "task t2 (near); success" in text
    assert "    You are at cell 0.\n    Walls: north" in text  # the whole observation, indented
    assert "    <think>go</think><action>move 0</action>" in text  # the model's whole completion
    assert "action: 'move 0'  valid: no  reward: 0" in text and "action: 'move 2'  valid: yes  reward: 1" in text
    assert "t1" not in text and "t3" not in text
    assert short_example(episodes) == "task t0, step 1 wrote '<think>go</think><action>move 0</action>' -> action 'move 0' (invalid)"
