"""ALFWorld's six task types (the env's categories) and the rooms each is set in.

Names are ALFWorld's own `task_type` strings; the rooms come from ALFRED's
`constants.GOALS_VALID`. Kept free of the alfworld import so the registry can
list them without the optional dependency.
"""

from __future__ import annotations

PICK_AND_PLACE = "pick_and_place_simple"
LOOK_IN_LIGHT = "look_at_obj_in_light"
CLEAN = "pick_clean_then_place_in_recep"
HEAT = "pick_heat_then_place_in_recep"
COOL = "pick_cool_then_place_in_recep"
PICK_TWO = "pick_two_obj_and_place"

#: in ALFWorld's numbering (alfred_tw_env.TASK_TYPES 1..6)
TASK_TYPES = (PICK_AND_PLACE, LOOK_IN_LIGHT, CLEAN, HEAT, COOL, PICK_TWO)

#: ALFWorld's dataset folders; valid_seen shares floor plans with train, valid_unseen does not.
ALFWORLD_SPLITS = ("train", "valid_seen", "valid_unseen")
#: how each ALFWorld split maps onto the TextEnv contract's two splits and the `subset` tag in Task.data
CONTRACT_SPLIT = {"train": "train", "valid_seen": "test", "valid_unseen": "test"}
SUBSET = {"train": "train", "valid_seen": "seen", "valid_unseen": "unseen"}
