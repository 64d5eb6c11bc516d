"""Offline ALFWorld game generator: ALFRED-style PDDL problems from alfworld's own data.

A game puts every pickable object type of a floor plan (1-3 instances each, the
task's target 1-4, at least 2 for pick-two) into receptacles allowed by
`constants.VAL_RECEPTACLE_OBJECTS`, starts the agent on a free floor point, and
takes its goal from `goal_library.gdict[task_type]['pddl']` and its task text from
the same entry's templates. Task parameters are drawn among the combinations the
floor plan supports (the target must fit the receptacle; heat/cool/clean need a
microwave/fridge/sink basin and a heatable/coolable/cleanable target), in the rooms
ALFRED allows for the task type (`constants.GOALS_VALID`).

Splits follow ALFRED's scene split (`constants.TRAIN_SCENE_NUMBERS` /
`TEST_SCENE_NUMBERS`): train and valid_seen draw from the training floor plans with
different seeds, valid_unseen only from the held-out ones.

Gotchas handled: ids are ALFRED-mangled (`Apple_bar__plus_00_dot_10_...`), so the
package's Demangler names them "apple 1"; basins keep their fixture prefix
(`Sink_bar_..._bar_SinkBasin` -> "sinkbasin 1"); no target instance starts in a
receptacle of the goal type (the plan could be empty or trivial); lamps are placed
by the scene (see scenes.py) and are not pickable.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import alfworld.gen.constants as constants
import alfworld.gen.goal_library as goal_library

from .scenes import MOVABLE_RECEPTACLES, OPENABLE, Receptacle, Scene, available_scenes, load_scene, location_id
from .task_types import ALFWORLD_SPLITS, CLEAN, COOL, HEAT, LOOK_IN_LIGHT, PICK_TWO, TASK_TYPES

#: appliance each state-change task needs (the domain's CleanObject only accepts SinkBasinType)
APPLIANCE = {CLEAN: "SinkBasin", HEAT: "Microwave", COOL: "Fridge"}
PROPERTY = {CLEAN: "Cleanable", HEAT: "Heatable", COOL: "Coolable"}
MAX_DISTRACTOR_INSTANCES = constants.MAX_NUM_OF_OBJ_INSTANCES  # 3
MAX_TARGET_INSTANCES = constants.PICKUP_REPEAT_MAX  # 4
#: object types that can go somewhere; sliced variants only exist after slicing, so they start nowhere
PLACEABLE = frozenset(t for objs in constants.VAL_RECEPTACLE_OBJECTS.values() for t in objs if not t.endswith("Sliced"))
# Type constants the problem declares, as ALFRED does: every object type as an otype, every
# fixed receptacle as an rtype (the domain itself names SinkBasinType, KnifeType, ...).
RECEPTACLE_TYPES = sorted(set(constants.RECEPTACLES) - set(constants.MOVABLE_RECEPTACLES))
OBJECT_TYPES = sorted(set(constants.OBJECTS_SET) - set(RECEPTACLE_TYPES))
PDDL_CHARS = {"-": "_minus_", "|": "_bar_", "+": "_plus_", ".": "_dot_", ",": "_comma_"}


def pddl_name(alfred_id: str) -> str:
    """ALFRED's mangling of an id into a PDDL name (the Demangler reverses it)."""
    return "".join(PDDL_CHARS.get(ch, ch) for ch in alfred_id)


@dataclass(frozen=True)
class TaskParams:
    task_type: str
    object_target: str
    parent_target: str = ""
    toggle_target: str = ""

    def pddl_params(self) -> dict[str, Any]:
        # The layout ALFWorld's traj_data.json uses (and its hand-coded expert reads).
        return {
            "object_target": self.object_target,
            "parent_target": self.parent_target,
            "toggle_target": self.toggle_target,
            "mrecep_target": "",
            "object_sliced": False,
        }


def _hosts(scene: Scene, otype: str, exclude_type: str = "") -> list[Receptacle]:
    return [
        r
        for r in scene.receptacles
        if otype in constants.VAL_RECEPTACLE_OBJECTS[r.type] and r.type != exclude_type
    ]


def placeable_types(scene: Scene) -> list[str]:
    return sorted(t for t in scene.object_types & PLACEABLE if _hosts(scene, t))


@lru_cache(maxsize=None)
def task_candidates(scene_number: int, task_type: str) -> tuple[TaskParams, ...]:
    """Every parameter combination of `task_type` that the floor plan supports."""
    if task_type not in TASK_TYPES:
        raise ValueError(f"unknown task type {task_type!r}; expected one of {TASK_TYPES}")
    scene = load_scene(scene_number)
    if scene.room not in constants.GOALS_VALID[task_type]:
        return ()
    objects = placeable_types(scene)
    if task_type == LOOK_IN_LIGHT:
        lamps = sorted({lamp.type for lamp in scene.lamps})
        return tuple(TaskParams(task_type, o, toggle_target=lamp) for o in objects for lamp in lamps)
    appliance = APPLIANCE.get(task_type)
    if appliance is not None:
        if appliance not in scene.receptacle_types:
            return ()
        objects = [o for o in objects if o in constants.VAL_ACTION_OBJECTS[PROPERTY[task_type]]]
    out = []
    for o in objects:
        for parent in sorted(scene.receptacle_types):
            # The appliance as destination would make the task degenerate ("cool X and put it in fridge").
            if parent == appliance or o not in constants.VAL_RECEPTACLE_OBJECTS[parent]:
                continue
            if _hosts(scene, o, exclude_type=parent):  # the target must be able to start elsewhere
                out.append(TaskParams(task_type, o, parent_target=parent))
    return tuple(out)


def task_description(params: TaskParams, rng: random.Random) -> str:
    template = rng.choice(goal_library.gdict[params.task_type]["templates"])
    return template.format(
        obj=params.object_target.lower(), recep=params.parent_target.lower(), toggle=params.toggle_target.lower()
    )


def goal_pddl(params: TaskParams) -> str:
    goal = goal_library.gdict[params.task_type]["pddl"].format(
        obj=params.object_target, recep=params.parent_target, toggle=params.toggle_target
    )
    return goal.replace("#", "-")  # the library writes types as "?r # receptacle"


def _place_objects(scene: Scene, params: TaskParams, rng: random.Random) -> list[tuple[str, str, Receptacle]]:
    """(object id, type, host) for every object instance of one game."""
    used_ids = {r.id for r in scene.receptacles} | {lamp.id for lamp in scene.lamps}
    placed = []
    for otype in placeable_types(scene):
        if otype == params.object_target:
            count = rng.randint(2 if params.task_type == PICK_TWO else 1, MAX_TARGET_INSTANCES)
            hosts = _hosts(scene, otype, exclude_type=params.parent_target)
        else:
            count = rng.randint(1, MAX_DISTRACTOR_INSTANCES)
            hosts = _hosts(scene, otype)
        for _ in range(count):
            host = rng.choice(hosts)
            hx, hz = (float(v) for v in host.id.split("|")[1:4:2])
            while True:  # ids only need to be unique; nearby coordinates keep them ALFRED-like
                oid = f"{otype}|{hx + rng.uniform(-0.3, 0.3):+06.2f}|{rng.uniform(0.0, 1.8):+06.2f}|{hz + rng.uniform(-0.3, 0.3):+06.2f}"
                if oid not in used_ids:
                    break
            used_ids.add(oid)
            placed.append((oid, otype, host))
    return placed


def _start_location(scene: Scene, rng: random.Random) -> str:
    taken = {r.location for r in scene.receptacles}
    while True:
        x, z = rng.choice(scene.floor_points)
        loc = location_id(x, z, rng.choice((0, 90, 180, 270)), 30)
        if loc not in taken:
            return loc


def problem_pddl(scene: Scene, params: TaskParams, rng: random.Random, problem_name: str) -> str:
    placed = _place_objects(scene, params, rng)
    start = _start_location(scene, rng)
    n = pddl_name
    receptacle_of = {r.id: r for r in scene.receptacles}
    obj_lines = ["agent1 - agent"]
    obj_lines += [f"{t}Type - otype" for t in OBJECT_TYPES]
    obj_lines += [f"{t}Type - rtype" for t in RECEPTACLE_TYPES]
    obj_lines += [f"{n(r.id)} - receptacle" for r in scene.receptacles]
    obj_lines += [f"{n(oid)} - object" for oid, _, _ in placed]
    obj_lines += [f"{n(lamp.id)} - object" for lamp in scene.lamps]
    obj_lines += [f"{n(r.location)} - location" for r in scene.receptacles] + [f"{n(start)} - location"]

    init = [f"(atLocation agent1 {n(start)})"]
    for r in scene.receptacles:
        init += [f"(receptacleType {n(r.id)} {r.type}Type)", f"(receptacleAtLocation {n(r.id)} {n(r.location)})"]
        if r.type in OPENABLE:
            init.append(f"(openable {n(r.id)})")
    for oid, otype, host in placed:
        o = n(oid)
        init += [
            f"(objectType {o} {otype}Type)",
            f"(pickupable {o})",
            f"(inReceptacle {o} {n(host.id)})",
            f"(objectAtLocation {o} {n(host.location)})",
        ]
        for prop, predicate in (("Cleanable", "cleanable"), ("Heatable", "heatable"), ("Coolable", "coolable"), ("Sliceable", "sliceable")):
            if otype in constants.VAL_ACTION_OBJECTS[prop]:
                init.append(f"({predicate} {o})")
        if otype in MOVABLE_RECEPTACLES:
            init.append(f"(isReceptacleObject {o})")
    for lamp in scene.lamps:
        o, host = n(lamp.id), receptacle_of[lamp.host]
        init += [
            f"(objectType {o} {lamp.type}Type)",
            f"(toggleable {o})",
            f"(inReceptacle {o} {n(host.id)})",
            f"(objectAtLocation {o} {n(host.location)})",
        ]
    present_objects = sorted({otype for _, otype, _ in placed} | {lamp.type for lamp in scene.lamps})
    for rtype in sorted(scene.receptacle_types):
        for otype in present_objects:
            if otype in constants.VAL_RECEPTACLE_OBJECTS[rtype]:
                init.append(f"(canContain {rtype}Type {otype}Type)")

    sep = "\n        "
    return (
        f"(define (problem {problem_name})\n    (:domain alfred)\n"
        f"    (:objects{sep}{sep.join(obj_lines)}\n    )\n"
        f"    (:init{sep}{sep.join(init)}\n    )\n"
        f"{goal_pddl(params)}"
    )


def generate_game(scene: Scene, params: TaskParams, rng: random.Random, game_id: str) -> dict[str, Any]:
    """One game as a JSON-able record (the PDDL problem plus what the env and the experts need)."""
    task_desc = task_description(params, rng)
    return {
        "id": game_id,
        "task_type": params.task_type,
        "floor_plan": scene.name,
        "pddl_params": params.pddl_params(),
        "task_desc": task_desc,
        "pddl_problem": problem_pddl(scene, params, rng, problem_name=game_id.replace("-", "_")),
    }


def split_scenes(split: str) -> list[int]:
    if split not in ALFWORLD_SPLITS:
        raise ValueError(f"split must be one of {ALFWORLD_SPLITS}, got {split!r}")
    numbers = constants.TEST_SCENE_NUMBERS if split == "valid_unseen" else constants.TRAIN_SCENE_NUMBERS
    shipped = set(available_scenes())
    return [n for n in numbers if n in shipped]


def generate_split(
    split: str, task_type: str, count: int, seed: int, scenes: list[int] | None = None
) -> list[dict[str, Any]]:
    """`count` games of one task type, from `scenes` (default: the split's floor plans).

    Game i depends on (seed, split, task_type, i) and the scene list only."""
    eligible = [n for n in (split_scenes(split) if scenes is None else scenes) if task_candidates(n, task_type)]
    if count > 0 and not eligible:
        raise ValueError(f"no floor plan of split {split!r} supports task type {task_type!r}")
    # Cycle through a seeded ordering of the floor plans, so a pool covers as many rooms as it can.
    order = random.Random(f"{seed}-{split}-{task_type}-scenes").sample(eligible, len(eligible))
    games = []
    for i in range(count):
        rng = random.Random(f"{seed}-{split}-{task_type}-{i}")
        number = order[i % len(order)]
        params = rng.choice(task_candidates(number, task_type))
        games.append(generate_game(load_scene(number), params, rng, game_id=f"alfworld-{split}-{task_type}-{i:03d}"))
    return games


def generate_pool(seed: int, games_per_type: dict[str, int]) -> list[dict[str, Any]]:
    """All games: for each ALFWorld split, `games_per_type[split]` games of each task type.

    valid_seen only uses floor plans that the generated train games use, so "seen" holds
    for this pool and not just for ALFRED's scene list."""
    unknown = set(games_per_type) - set(ALFWORLD_SPLITS)
    if unknown:
        raise ValueError(f"games_per_type has unknown splits {sorted(unknown)}; expected {ALFWORLD_SPLITS}")
    games = []
    for split in ALFWORLD_SPLITS:
        count = int(games_per_type.get(split, 0))
        if count < 0:
            raise ValueError(f"games_per_type[{split!r}] must be >= 0, got {count}")
        scenes = None
        if split == "valid_seen":
            used = {g["floor_plan"] for g in games if g["split"] == "train"}
            scenes = [n for n in split_scenes(split) if f"FloorPlan{n}" in used] or None
        for task_type in TASK_TYPES:
            games.extend(dict(g, split=split) for g in generate_split(split, task_type, count, seed, scenes))
    return games


__all__ = [
    "TaskParams",
    "generate_game",
    "generate_pool",
    "generate_split",
    "goal_pddl",
    "pddl_name",
    "problem_pddl",
    "split_scenes",
    "task_candidates",
]
