"""A floor plan as a text-game scene: its receptacles, their locations, its lamps.

Built from what alfworld ships in `alfworld/gen/layouts/`: `FloorPlanN-objects.json`
(object types present), `FloorPlanN-openable.json` (receptacle ids with the pose the
agent stands at to use them) and `FloorPlanN-layout.npy` (navigable floor points).
Receptacle types present in the floor plan but missing from the openable file
(garbage cans, stove burners, toasters, towel holders, ...) get ids at floor points
drawn with a per-floor-plan seed. Lamps are in no `VAL_RECEPTACLE_OBJECTS` list, so
they are placed by hand on a surface that can plausibly hold them. Everything here
depends on the floor plan only, so every game in one floor plan has the same room.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

import alfworld.gen
import alfworld.gen.constants as constants

LAYOUT_DIR = Path(alfworld.gen.__file__).parent / "layouts"
GRID = constants.AGENT_STEP_SIZE  # poses are on a 0.25 m grid; ALFRED's location ids count grid cells
ROTATIONS = (0, 90, 180, 270)

MOVABLE_RECEPTACLES = frozenset(constants.MOVABLE_RECEPTACLES)
#: receptacles fixed in the room that can hold something (PaintingHanger holds nothing, so it is left out)
STATIC_RECEPTACLES = frozenset(constants.VAL_RECEPTACLE_OBJECTS) - MOVABLE_RECEPTACLES
OPENABLE = frozenset(constants.OPENABLE_CLASS_LIST)
#: basins are named after their fixture in ALFRED ids ("Sink|x|y|z|SinkBasin")
BASIN_FIXTURE = {"SinkBasin": "Sink", "BathtubBasin": "Bathtub"}
#: iTHOR kitchens have four burners; other receptacles missing from the openable file get one instance
SYNTHESIZED_COUNT = {"StoveBurner": 4}
LAMPS = ("DeskLamp", "FloorLamp")
LAMP_HOSTS = {
    "DeskLamp": ("Desk", "SideTable", "Dresser", "Shelf", "CoffeeTable", "DiningTable", "TVStand", "CounterTop"),
    "FloorLamp": ("SideTable", "Dresser", "ArmChair", "Sofa", "Bed", "CoffeeTable", "Desk", "TVStand", "Shelf"),
}
ROOM_OF_SCENE = {n: room for room, numbers in constants.SCENE_TYPE.items() for n in numbers}


@dataclass(frozen=True)
class Receptacle:
    id: str  # ALFRED id before PDDL mangling, e.g. "Cabinet|+00.68|+00.50|-02.20"
    type: str  # e.g. "Cabinet"
    location: str  # e.g. "loc|0|-5|180|30"


@dataclass(frozen=True)
class Lamp:
    id: str
    type: str
    host: str  # id of the receptacle it stands in/on


@dataclass(frozen=True)
class Scene:
    number: int
    room: str
    object_types: frozenset[str]
    receptacles: tuple[Receptacle, ...]
    lamps: tuple[Lamp, ...]
    floor_points: tuple[tuple[float, float], ...]

    @property
    def name(self) -> str:
        return f"FloorPlan{self.number}"

    @property
    def receptacle_types(self) -> frozenset[str]:
        return frozenset(r.type for r in self.receptacles)

    def receptacles_of_type(self, rtype: str) -> list[Receptacle]:
        return [r for r in self.receptacles if r.type == rtype]


def available_scenes() -> list[int]:
    """Floor-plan numbers whose three layout files ship with alfworld."""
    numbers = []
    for path in LAYOUT_DIR.glob("FloorPlan*-objects.json"):
        n = int(path.name[len("FloorPlan") : -len("-objects.json")])
        if all((LAYOUT_DIR / f"FloorPlan{n}-{kind}").exists() for kind in ("openable.json", "layout.npy")):
            numbers.append(n)
    return sorted(numbers)


def location_id(x: float, z: float, rotation: int, horizon: int) -> str:
    return f"loc|{round(x / GRID)}|{round(z / GRID)}|{int(rotation)}|{int(horizon)}"


def _receptacle_type(alfred_id: str) -> str:
    parts = alfred_id.split("|")
    # "Sink|x|y|z|SinkBasin" names the basin last; plain ids start with their type
    return parts[-1] if len(parts) == 5 else parts[0]


def _coords_id(prefix: str, x: float, y: float, z: float, suffix: str = "") -> str:
    return f"{prefix}|{x:+06.2f}|{y:+06.2f}|{z:+06.2f}" + (f"|{suffix}" if suffix else "")


@lru_cache(maxsize=None)
def load_scene(number: int) -> Scene:
    if number not in ROOM_OF_SCENE:
        raise ValueError(f"unknown floor plan {number}; ALFRED floor plans are 1-30, 201-230, 301-330, 401-430")
    name = f"FloorPlan{number}"
    try:
        object_types = frozenset(json.loads((LAYOUT_DIR / f"{name}-objects.json").read_text()))
        openable = json.loads((LAYOUT_DIR / f"{name}-openable.json").read_text())
        points = np.load(LAYOUT_DIR / f"{name}-layout.npy")
    except FileNotFoundError as err:
        raise ValueError(f"{name}: layout file missing from the alfworld package ({err.filename})") from None
    rng = random.Random(f"alfworld-scene-{number}")
    floor_points = tuple((float(x), float(z)) for x, z in points)

    used_locations: set[str] = set()

    def unique_location(loc: str) -> str:
        # Two receptacles sharing a pose would share a location, and "go to" would then name both.
        candidate, k = loc, 1
        while candidate in used_locations:
            k += 1
            candidate = f"{loc}|{k}"
        used_locations.add(candidate)
        return candidate

    receptacles: list[Receptacle] = []
    for rid in sorted(openable):
        rtype = _receptacle_type(rid)
        if rtype not in STATIC_RECEPTACLES:
            continue
        x, z, rotation, horizon = openable[rid]
        receptacles.append(Receptacle(rid, rtype, unique_location(location_id(x, z, rotation, horizon))))

    present = {r.type for r in receptacles}
    for rtype in sorted((object_types & STATIC_RECEPTACLES) - present):
        for _ in range(SYNTHESIZED_COUNT.get(rtype, 1)):
            x, z = rng.choice(floor_points)
            y = round(rng.uniform(0.0, 1.5), 2)
            fixture = BASIN_FIXTURE.get(rtype)
            rid = _coords_id(fixture, x, y, z, rtype) if fixture else _coords_id(rtype, x, y, z)
            loc = location_id(x, z, rng.choice(ROTATIONS), 30)
            receptacles.append(Receptacle(rid, rtype, unique_location(loc)))

    lamps: list[Lamp] = []
    for lamp_type in LAMPS:
        if lamp_type not in object_types:
            continue
        hosts = [r for r in receptacles if r.type in LAMP_HOSTS[lamp_type]]
        hosts = hosts or [r for r in receptacles if r.type not in OPENABLE]
        if not hosts:
            continue
        host = rng.choice(hosts)
        hx, hz = (float(v) for v in host.id.split("|")[1:4:2])
        lamps.append(Lamp(_coords_id(lamp_type, hx, round(rng.uniform(0.5, 1.5), 2), hz), lamp_type, host.id))

    return Scene(
        number=number,
        room=ROOM_OF_SCENE[number],
        object_types=object_types,
        receptacles=tuple(receptacles),
        lamps=tuple(lamps),
        floor_points=floor_points,
    )
