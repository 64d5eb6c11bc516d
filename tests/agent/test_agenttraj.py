"""AgentTraj files as Fed-SE seed data (agent/agenttraj.py, run-config fedse.seed-data)."""

import json

import pytest

from envs import task_env
from fedagent_flwr.agent.agenttraj import client_share, item_steps, read_items, seed_trajectories
from fedagent_flwr.agent.play.rollout import stop_token_ids
from fedagent_flwr.agent.training.experience import SEED_ROUND
from fedagent_flwr.config import RunConfig
from fedagent_flwr.methods.fedse import agenttraj_seed
from fedagent_flwr.methods.tasks import learner_tasks


def chat(item_id: str, moves: list[str]) -> dict:
    """An AgentGym-shaped item: the instructions and the model's "OK" (not trained), then a turn per move."""
    turns = [{"from": "human", "loss": None, "value": "You are in a maze. Reach the goal."},
             {"from": "gpt", "loss": False, "value": "OK"}]
    for k, move in enumerate(moves):
        turns += [{"from": "human", "loss": None, "value": f"observation {k}: you are at cell {k}"},
                  {"from": "gpt", "loss": True, "value": f"<think>next: {move}</think><action>{move}</action>"}]
    return {"item_id": item_id, "conversations": turns}


def conditioned(tokenizer, turns: list[dict]) -> list[int]:
    """The chat as the model sees it before its next turn: human turns as user, gpt turns as assistant messages."""
    messages = [{"role": "user" if t["from"] == "human" else "assistant", "content": t["value"]} for t in turns]
    return tokenizer(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False),
                     add_special_tokens=False)["input_ids"]


def test_items_are_read_from_a_file_or_a_folder_of_json_and_json_lines(tmp_path):
    (tmp_path / "a.json").write_text(json.dumps([chat("maze_0", ["move up"]), chat("webshop_3", ["move down"])]))
    (tmp_path / "b.jsonl").write_text(json.dumps(chat("maze_1", ["move left"])) + "\n\n")
    (tmp_path / "notes.txt").write_text("not read")
    assert [i["item_id"] for i in read_items(tmp_path)] == ["maze_0", "webshop_3", "maze_1"]
    assert [i["item_id"] for i in read_items(tmp_path / "b.jsonl")] == ["maze_1"]


@pytest.mark.parametrize("content, says", [
    ("{not json", "a.json is not readable JSON"),
    (json.dumps({"item_id": "maze_0"}), "a.json holds a dict, not a list of items"),
    (json.dumps([chat("maze_0", ["move up"]), {"item_id": "maze", "conversations": []}]), "a.json item 1: item_id 'maze' is not '<env>_<n>'"),
    (json.dumps([{"item_id": "maze_0", "conversations": [{"from": "user", "value": "hi"}]}]), "item 0: maze_0: turn 0 is not"),
    (json.dumps([{"item_id": "maze_0", "conversations": [{"from": "human", "value": "a"}, {"from": "human", "value": "b"}]}]),
     "turns 0 and 1 are both 'human'"),
    (json.dumps([{"item_id": "maze_0", "conversations": [{"from": "human", "value": "a"}, {"from": "gpt", "value": "b", "loss": False}]}]),
     "hold a gpt turn to learn"),
], ids=["not-json", "not-a-list", "item-id", "role", "not-alternating", "nothing-to-learn"])
def test_a_malformed_file_is_refused_in_one_line_naming_the_key_file_and_item(tmp_path, content, says):
    (tmp_path / "a.json").write_text(content)
    with pytest.raises(ValueError) as refused:
        read_items(tmp_path / "a.json")
    message = str(refused.value)
    assert message.startswith(f"fedse.seed-data={str(tmp_path / 'a.json')!r}: ") and says in message
    assert "\n" not in message and "allowed: AgentTraj JSON" in message


def test_a_missing_path_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"fedse.seed-data=.*: no such file"):
        read_items(tmp_path / "absent.json")


def test_each_environments_items_are_dealt_over_the_clients_holding_it_and_capped():
    items = [chat(f"maze_{i}", ["move up"]) for i in range(5)] + [chat(f"wordle_{i}", ["move up"]) for i in range(3)]
    holders = {"maze": [0, 2], "wordle": [1]}
    share = {p: [i["item_id"] for i in client_share(items, holders, p)] for p in range(3)}
    assert share == {0: ["maze_0", "maze_2", "maze_4"], 1: ["wordle_0", "wordle_1", "wordle_2"], 2: ["maze_1", "maze_3"]}
    assert [i["item_id"] for i in client_share(items, holders, 0, {"maze": 3})] == ["maze_0", "maze_2"]


def test_each_trained_turn_is_a_step_conditioned_on_the_chat_before_it(maze_tokenizer):
    item = chat("maze_0", ["move up", "move left", "move down"])
    steps, left_out = item_steps(item, maze_tokenizer)
    assert left_out == 0 and len(steps) == 3  # the "OK" is context, not a target
    stop = stop_token_ids(maze_tokenizer)[0]
    turns = item["conversations"]
    for n, (prompt, completion) in zip((3, 5, 7), steps):
        assert prompt == conditioned(maze_tokenizer, turns[:n])
        assert completion == maze_tokenizer(turns[n]["value"], add_special_tokens=False)["input_ids"] + [stop]


def test_a_context_limit_leaves_out_the_oldest_exchanges_after_the_instructions(maze_tokenizer):
    item = chat("maze_0", ["move up", "move left", "move down", "move right"])
    whole, _ = item_steps(item, maze_tokenizer)
    last_prompt, last_completion = whole[-1]
    limit = len(last_prompt) + len(last_completion) - 1  # the last step no longer fits whole
    steps, left_out = item_steps(item, maze_tokenizer, limit)
    assert left_out == 0 and steps[:-1] == whole[:-1]
    turns = item["conversations"]
    cut = turns[:2] + turns[4:9]  # instructions and OK kept, the first exchange out
    assert steps[-1][0] == conditioned(maze_tokenizer, cut)
    assert all(len(p) + len(c) <= limit for p, c in steps)
    entries, dropped = seed_trajectories([item], maze_tokenizer, 10)  # no step fits: each left out, counted
    assert entries == [] and dropped == 4


def test_a_client_seeds_its_share_of_its_environments_items(tmp_path, maze_tokenizer):
    """Two environments over four clients (uniform split): every item of a held environment goes to exactly one
    client holding it; the entries are D_k^0's (the seed round, counted won)."""
    items = [chat(f"maze_{i}", ["move up"]) for i in range(6)] + [chat(f"gridworld_{i}", ["move up"]) for i in range(4)]
    items.append(chat("webshop_0", ["move up"]))  # an environment no client holds: read, never seeded
    (tmp_path / "agenttraj.json").write_text(json.dumps(items))
    cfg = RunConfig.from_run_config({"strategy": "fedse-lora", "env": "maze,gridworld", "num-clients": 4,
                                     "fedse.seed-data": str(tmp_path / "agenttraj.json"), "fedse.seed-demos": "maze=5"})
    seeded = {}
    for p in range(4):
        entries, _ = agenttraj_seed(cfg, maze_tokenizer, p, 4)
        assert all(e.round == SEED_ROUND and e.won and len(e.steps) == 1 for e in entries)
        seeded[p] = [e.task_id for e in entries]
    flat = [i for ids in seeded.values() for i in ids]
    assert sorted(flat) == sorted(set(flat)) == sorted([f"maze_{i}" for i in range(5)] + [f"gridworld_{i}" for i in range(4)])
    for p, ids in seeded.items():  # a client seeds only environments its own training tasks come from
        assert {i.rsplit("_", 1)[0] for i in ids} <= {task_env(t) for t in learner_tasks(cfg, p, 4)}
