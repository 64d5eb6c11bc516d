"""The PDDL-planner expert, run on the task-relevant part of the current state.

textworld's `replan` runs fast-downward's lazy search with only the path cost as
guide (a uniform-cost search) over the whole game. With every object of the room in
the problem, a pick-two game whose targets sit in closed cabinets did not finish in
minutes and grew past 5 GB. ALFRED's own planner problems list only the objects the
task is about; this does the same at planning time: the current facts restricted to
the instances of the target (and lamp) type and whatever the agent holds, with the
game's own goal, solved by the same fast-downward search on a private library copy.
Distractors cannot help reach an ALFRED goal (receptacles have no capacity), so the
plan is one of the full game's too; its steps are written with the full game's names.
"""

from __future__ import annotations

import sys
from typing import Any, Mapping

import fast_downward

IGNORED_FACT_MARKERS = ("@",)  # fast-downward's derived axiom atoms ("new-axiom@3") are not PDDL facts


def goal_section(pddl_problem: str) -> str:
    """The problem's `(:goal ...)` block with the closing parenthesis of `define`."""
    lowered = pddl_problem.lower()
    start = lowered.find("(:goal")
    if start < 0:
        raise ValueError("PDDL problem has no (:goal ...) section")
    return pddl_problem[start:]


def relevant_problem(pddl_state: Any, task_params: Mapping[str, Any], goal: str) -> str:
    """A PDDL problem of the current state restricted to the task's objects."""
    pddl_params = task_params.get("pddl_params", {})
    wanted_types = {
        f"{pddl_params[key]}type".lower()
        for key in ("object_target", "toggle_target", "mrecep_target")
        if pddl_params.get(key)
    }
    facts = [f for f in pddl_state.facts if not any(m in f.name for m in IGNORED_FACT_MARKERS)]
    keep = {
        f.arguments[0].name
        for f in facts
        if f.name == "objecttype" and f.arguments[1].name in wanted_types
    }
    keep |= {f.arguments[1].name for f in facts if f.name == "holds"}
    objects = [
        (name, type_) for name, type_ in sorted(pddl_state.name2type.items()) if type_ != "object" or name in keep
    ]
    kept_facts = [
        f for f in facts if all(v.type != "object" or v.name in keep for v in f.arguments)
    ]
    sep = "\n        "
    return (
        "(define (problem relevant)\n    (:domain alfred)\n"
        f"    (:objects{sep}{sep.join(f'{n} - {t}' for n, t in objects)}\n    )\n"
        f"    (:init{sep}{sep.join('(' + ' '.join([f.name] + [v.name for v in f.arguments]) + ')' for f in kept_facts)}\n    )\n"
        f"{goal}"
    )


class RelevantPlanner:
    """Plans from a game's current state; holds its own copy of fast-downward's library."""

    def __init__(self) -> None:
        self._lib = fast_downward.load_lib()

    def plan(self, pddl_state: Any, entity_infos: Mapping[str, Any], domain: str, pddl_problem: str,
             task_params: Mapping[str, Any]) -> list[str]:
        problem = relevant_problem(pddl_state, task_params, goal_section(pddl_problem))
        argv = list(sys.argv)
        try:  # the translator overwrites sys.argv
            _, sas = fast_downward.pddl2sas(domain, problem, optimize=True)
        finally:
            sys.argv = argv
        if not self._lib.solve_sas(sas.encode("utf-8"), False):
            return []
        operators = (fast_downward.Operator * self._lib.get_last_plan_length())()
        self._lib.get_last_plan(operators)
        return pddl_state.plan_to_templated_actions([op.name for op in operators], entity_infos)

    def close(self) -> None:
        # Deliberately no fast_downward.close_lib(): unloading the library while the
        # process still holds its C++ static objects segfaults at interpreter exit
        # (seen here as exit code 139 after every test that planned). The OS frees it.
        self._lib = None
