"""Every strategy's name, what it trains and which run-wide features it supports.

The run config takes its `strategy` choices from here and asks these traits, never a name, whether a key applies; the
method registry (fedagent_flwr/methods/__init__.py) maps each name to its code, and strategies/registry.py says which
environments the QAvg / PAvg strategies run on (a preflight check: runs/preflight.py).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Traits:
    """What a strategy trains and which run-wide features it supports."""

    trains: str  # "llm": a language-model agent on text envs; "fedrl": RL tables or networks on fedrl's envs
    resume: bool = False  # the server's state is saved after every round (runs/resume.py)
    dp: bool = False  # Flower's DP wrappers apply (privacy/differential_privacy.py)
    secure_aggregation: bool = False  # SecAgg+ applies (privacy/secure_aggregation.py)
    baselines: bool = False  # the Table 1 baselines (baseline = centralized | local) apply
    experience_buffer: bool = False  # Fed-SE: clients train on a buffer seeded by demonstrations
    grpo: bool = False  # clients train with GRPO (finetuning, grpo.kl-reference apply)


STRATEGIES = {
    "fedagent-avg": Traits("llm", resume=True, dp=True, secure_aggregation=True, baselines=True, grpo=True),
    "fedse-lora": Traits("llm", resume=True, dp=True, experience_buffer=True),
    "qavg": Traits("fedrl"),  # deep QAvg is DQNAvg: discrete actions
    "pavg": Traits("fedrl"),  # deep PAvg is DDPGAvg: continuous actions
}


def named(trait: str) -> str:
    """The strategies that have `trait`, as a refusal names them ("fedagent-avg | fedse-lora")."""
    return " | ".join(name for name, traits in STRATEGIES.items() if getattr(traits, trait))
