"""Step-size presets of the tabular QAvg / PAvg experiments: total local steps and step-size rule per
(family, algorithm). Shared by the Flower app (`fedrl.step-size = 0` picks "fast") and the Table 1 command
(fedagent_flwr/experiments/fedrl_table1.py, `--preset`).
"""

from __future__ import annotations

from dataclasses import dataclass

from .tabular import HarmonicStepSize, StallDecayStepSize


@dataclass(frozen=True)
class Setting:
    total_steps: int
    step_size: HarmonicStepSize | StallDecayStepSize


# (family, algorithm) -> (total local steps, step-size rule) per preset. The stall-decay
# learning rates and decay factors are the reference code's (tabular/heter_*.py). QAvg uses
# Theorem 2's harmonic step in both: the reference's QAvg differs by its V update, which is
# not a step size (fedrl/README.md), so "reference" matches its step counts only there.
PRESETS: dict[str, dict[tuple[str, str], Setting]] = {
    "fast": {
        ("RandomMDPs", "qavg"): Setting(128, HarmonicStepSize()),
        ("RandomMDPs", "softpavg"): Setting(64, StallDecayStepSize(0.05, 0.9)),
        ("RandomMDPs", "projpavg"): Setting(128, StallDecayStepSize(0.05, 0.9)),
        ("WindyCliffs", "qavg"): Setting(64, HarmonicStepSize()),
        ("WindyCliffs", "softpavg"): Setting(16, StallDecayStepSize(0.1, 0.4)),
        # one round of E = 32: the reference's reported ProjPAvg value is the model after 32 of its 64 steps
        ("WindyCliffs", "projpavg"): Setting(32, StallDecayStepSize(0.01, 0.5)),
    },
    "reference": {
        ("RandomMDPs", "qavg"): Setting(128, HarmonicStepSize()),
        ("RandomMDPs", "softpavg"): Setting(512, StallDecayStepSize(0.05, 0.9)),
        ("RandomMDPs", "projpavg"): Setting(960, StallDecayStepSize(0.01, 0.9)),
        ("WindyCliffs", "qavg"): Setting(640, HarmonicStepSize()),
        ("WindyCliffs", "softpavg"): Setting(192, StallDecayStepSize(0.1, 0.4)),
        ("WindyCliffs", "projpavg"): Setting(64, StallDecayStepSize(0.01, 0.5)),
    },
}
