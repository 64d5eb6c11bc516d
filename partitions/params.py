"""Type checks for partition parameters, so a bad value fails with its name before any work."""

from __future__ import annotations

import math
from numbers import Integral, Real


def check_int(name: str, value: object, minimum: int) -> int:
    # bool is an Integral in Python; a flag passed where a count belongs is a mistake.
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value}")
    return int(value)


def check_real(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    return float(value)
