"""AgentGym's AgentTraj trajectories as a Fed-SE client's seed data D_k^0 (run-config fedse.seed-data).

AgentTraj (the seed data of Fed-SE's second version) is a JSON list, or a JSON Lines file, of items
`{"item_id": "<env>_<n>", "conversations": [{"from": "human" | "gpt", "value": text, "loss": bool?}, ...]}`: one
multi-turn chat an episode, the environment named by the item id's prefix (webshop_5238). AgentGym's trainer tokenizes
an item as one sequence with every "gpt" turn a target; here each target turn becomes one agent step of the buffer,
conditioned on the chat before it (the tokenizer's chat template, the turns as user and assistant messages), which is
the same loss turn by turn. A turn marked `"loss": false` (AgentGym marks the model's first "OK" so) is context only.

What this data is not: our environments' text. AgentTraj's observations, action syntax and answers ("Thought: ...
Action: ...") are AgentGym's environments', written by GPT-4 and people; our tasks are our own. Seeding from it teaches
AgentGym's conversations, and the model then plays ours (docs/presets.md).

Written here rather than read through `datasets`: a few hundred lines of JSON per environment, read once per client,
where the library would add a cache folder and a conversion for nothing.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

from fedagent_flwr.agent.play.rollout import stop_token_ids
from fedagent_flwr.agent.training.experience import SEED_ROUND, StoredTrajectory

FORMAT = ('AgentTraj JSON: a list (or one object a line, .jsonl) of {"item_id": "<env>_<n>", "conversations": '
          '[{"from": "human" | "gpt", "value": text}, ...]}')


def read_items(path: str | Path) -> list[dict]:
    """Every item of an AgentTraj file, or of the .json / .jsonl files of a folder (in name order), checked; a
    ValueError naming fedse.seed-data, the file, the item and what is wrong."""
    root = Path(path).expanduser()
    files = sorted(f for f in root.iterdir() if f.suffix in (".json", ".jsonl")) if root.is_dir() else [root]
    if not root.exists() or not files:
        raise ValueError(f"fedse.seed-data={str(path)!r}: no such file, or a folder without .json / .jsonl files; "
                         f"allowed: {FORMAT}")
    items = []
    for f in files:
        try:
            text = f.read_text()
            loaded = [json.loads(line) for line in text.splitlines() if line.strip()] if f.suffix == ".jsonl" else json.loads(text)
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
            raise ValueError(f"fedse.seed-data={str(path)!r}: {f.name} is not readable JSON ({err}); allowed: {FORMAT}") from None
        if not isinstance(loaded, list):
            raise ValueError(f"fedse.seed-data={str(path)!r}: {f.name} holds a {type(loaded).__name__}, not a list of "
                             f"items; allowed: {FORMAT}")
        for i, item in enumerate(loaded):
            problem = item_problem(item)
            if problem:
                raise ValueError(f"fedse.seed-data={str(path)!r}: {f.name} item {i}: {problem}; allowed: {FORMAT}")
        items.extend(loaded)
    return items


def item_problem(item: object) -> str | None:
    """What makes `item` not an AgentTraj item, or None."""
    if not isinstance(item, Mapping):
        return f"a {type(item).__name__}, not an object"
    item_id, turns = item.get("item_id"), item.get("conversations")
    if not isinstance(item_id, str) or "_" not in item_id.strip("_"):
        return f"item_id {item_id!r} is not '<env>_<n>'"
    if not isinstance(turns, list) or not turns:
        return f"{item_id}: conversations is not a non-empty list"
    for k, turn in enumerate(turns):
        if not isinstance(turn, Mapping) or turn.get("from") not in ("human", "gpt") or not isinstance(turn.get("value"), str):
            return f"{item_id}: turn {k} is not {{\"from\": \"human\" | \"gpt\", \"value\": text}}"
        if k and turn["from"] == turns[k - 1]["from"]:
            return f"{item_id}: turns {k - 1} and {k} are both {turn['from']!r} (a chat alternates)"
    if turns[0]["from"] != "human" or not any(trained(t) for t in turns):
        return f"{item_id}: a chat must open with a human turn and hold a gpt turn to learn"
    return None


def trained(turn: Mapping) -> bool:
    return turn["from"] == "gpt" and turn.get("loss", True) is not False


def item_env(item: Mapping) -> str:
    """The environment an item belongs to: its id's prefix (webshop_5238: webshop)."""
    return item["item_id"].rsplit("_", 1)[0]


def client_share(items: Sequence[dict], holders: Mapping[str, Sequence[int]], partition_id: int,
                 caps: Mapping[str, int] | None = None) -> list[dict]:
    """Client `partition_id`'s items: of each environment it holds (holders[env]: the partition ids holding env,
    sorted), the first caps[env] items of the file (all where not capped) dealt round-robin over the holders."""
    by_env: dict[str, list[dict]] = {}
    for item in items:
        by_env.setdefault(item_env(item), []).append(item)
    mine = []
    for env, owners in holders.items():
        if partition_id in owners:
            pool = by_env.get(env, [])[: (caps or {}).get(env)]
            mine.extend(pool[list(owners).index(partition_id) :: len(owners)])
    return mine


def item_steps(item: Mapping, tokenizer, max_context_tokens: int = 0) -> tuple[list[tuple[list[int], list[int]]], int]:
    """An item's agent steps, (prompt ids, completion ids) for each trained gpt turn, and how many were left out.
    With max_context_tokens, a step's oldest past exchanges (after the chat's opening pair, the instructions) are left
    out until prompt and completion fit; a step that does not fit with none of them is left out."""
    turns = item["conversations"]
    opening = 2 if len(turns) > 2 and turns[1]["from"] == "gpt" else 1
    stop = stop_token_ids(tokenizer)[0]
    steps, left_out = [], 0
    for k, turn in enumerate(turns):
        if not trained(turn):
            continue
        completion = tokenizer(turn["value"], add_special_tokens=False)["input_ids"] + [stop]
        kept = list(range(k))
        prompt = _encode([turns[i] for i in kept], tokenizer)
        while max_context_tokens and len(prompt) + len(completion) > max_context_tokens and len(kept) > opening + 1:
            kept = kept[:opening] + kept[opening + 2:]  # the oldest exchange after the opening: its two turns
            prompt = _encode([turns[i] for i in kept], tokenizer)
        if max_context_tokens and len(prompt) + len(completion) > max_context_tokens:
            left_out += 1
            continue
        steps.append((prompt, completion))
    return steps, left_out


def _encode(turns: Sequence[Mapping], tokenizer) -> list[int]:
    """The chat so far as the model is conditioned on it before its next turn."""
    if getattr(tokenizer, "chat_template", None):
        messages = [{"role": "user" if t["from"] == "human" else "assistant", "content": t["value"]} for t in turns]
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])
    return list(tokenizer("\n".join(t["value"] for t in turns), add_special_tokens=True)["input_ids"])


def seed_trajectories(items: Sequence[dict], tokenizer, max_context_tokens: int = 0) -> tuple[list[StoredTrajectory], int]:
    """The items as buffer entries of D_k^0 (each counted won: demonstrations, as the scripted experts' episodes that
    seed the buffer otherwise are), and the steps left out by the context limit."""
    out, left_out = [], 0
    for item in items:
        steps, dropped = item_steps(item, tokenizer, max_context_tokens)
        left_out += dropped
        if steps:
            out.append(StoredTrajectory(task_id=item["item_id"], round=SEED_ROUND, won=True, steps=steps))
    return out, left_out
