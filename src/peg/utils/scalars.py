"""Checks of scalar arguments (counts, numbers, seeds), with errors naming the argument."""

from __future__ import annotations

import math
from typing import Any

import numpy as np


def is_real(value: Any) -> bool:
    """Whether `value` is a real number: a Python or NumPy int or float, not a bool (NumPy
    scalars are numbers: `np.float32(0.1)` is accepted wherever `0.1` is)."""
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(
        value, (bool, np.bool_)
    )


def check_positive_int(value: Any, name: str, minimum: int = 1) -> int:
    """Return `value` if it is an int >= minimum, else raise a ValueError naming `name`."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name}: expected an integer >= {minimum}, got {value!r}")
    return int(value)


def check_seed(seed: Any) -> int:
    """`seed` as an int if it is a non-negative integer, else a ValueError naming it."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed: expected a non-negative integer, got {seed!r}")
    return int(seed)


def check_number(value: Any, name: str, allow_zero: bool = False) -> float:
    """Return `value` as a float if it is a finite number > 0 (>= 0 with `allow_zero`), else
    raise a ValueError naming `name`."""
    ok = is_real(value) and math.isfinite(float(value))
    if not ok or value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name}: expected a finite number {bound}, got {value!r}")
    return float(value)
