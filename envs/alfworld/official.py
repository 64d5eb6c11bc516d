"""The official ALFWorld games, where the user has them ($ALFWORLD_DATA/json_2.1.1/<split>/...).

Selection follows ALFWorld's AlfredTWEnv.collect_game_files: a game is a folder with
traj_data.json and game.tw-pddl; movable-receptacle and sliced tasks, task types
outside the six, and games marked unsolvable are skipped.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path
from typing import Any

from .task_types import ALFWORLD_SPLITS, TASK_TYPES

DATA_FOLDER = "json_2.1.1"


def official_data_root(data_dir: str | os.PathLike | None) -> Path | None:
    """`data_dir`/json_2.1.1 when it holds at least one game, else None."""
    if not data_dir:
        return None
    root = Path(data_dir).expanduser() / DATA_FOLDER
    for split in ALFWORLD_SPLITS:
        split_dir = root / split
        if split_dir.is_dir() and next(split_dir.rglob("game.tw-pddl"), None) is not None:
            return root
    return None


def find_official_games(root: Path, games_per_type: dict[str, int | None], seed: int) -> list[dict[str, Any]]:
    """Records for the official games; `games_per_type[split]` caps each task type (None: all)."""
    games: list[dict[str, Any]] = []
    for split in ALFWORLD_SPLITS:
        split_dir = root / split
        if not split_dir.is_dir():
            continue
        by_type: dict[str, list[dict[str, Any]]] = {t: [] for t in TASK_TYPES}
        for traj_path in sorted(split_dir.rglob("traj_data.json")):
            folder = traj_path.parent
            rel = folder.relative_to(split_dir).as_posix()
            game_path = folder / "game.tw-pddl"
            if "movable" in rel or "Sliced" in rel or not game_path.exists():
                continue
            traj = json.loads(traj_path.read_text())
            if traj.get("task_type") not in by_type:
                continue
            with open(game_path) as f:
                if not json.load(f).get("solvable", False):
                    continue
            by_type[traj["task_type"]].append(
                {
                    "id": f"alfworld-official-{split}-{rel}",
                    "split": split,
                    "task_type": traj["task_type"],
                    "floor_plan": traj.get("scene", {}).get("floor_plan", ""),
                    "pddl_params": traj["pddl_params"],
                    "game_file": str(game_path),
                }
            )
        cap = games_per_type.get(split)
        for task_type in TASK_TYPES:
            found = by_type[task_type]
            if cap is not None and len(found) > cap:
                chosen = set(random.Random(f"{seed}-{split}-{task_type}").sample(range(len(found)), cap))
                found = [g for i, g in enumerate(found) if i in chosen]
            games.extend(found)
    if not games:
        raise ValueError(f"no playable ALFWorld games under {root}")
    return games


def load_official_game(record: dict[str, Any], task_text_seed: int) -> dict[str, Any]:
    """The game.tw-pddl content, with a task text templated in if the grammar still lacks one."""
    with open(record["game_file"]) as f:
        game = json.load(f)
    if "UNKNOWN GOAL" in game["grammar"]:
        from .generator import TaskParams, task_description

        p = record["pddl_params"]
        params = TaskParams(record["task_type"], p["object_target"], p.get("parent_target", ""), p.get("toggle_target", ""))
        text = task_description(params, random.Random(task_text_seed))
        game["grammar"] = game["grammar"].replace("UNKNOWN GOAL", text)
    return game
