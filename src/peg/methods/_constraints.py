"""Argument checks as a table (scikit-learn's `_parameter_constraints`): one check per name.

A method class declares `parameter_constraints = {name: check}`, each check a callable
`check(value, name)` raising a ValueError (or TypeError) naming `name` and what was expected;
`check_constraints(method, table)` runs every check on the stored arguments. Constraints
between arguments (e.g. PEG's direction only with the vanilla variant) are plain functions of
the method, its `parameter_rules`, listed beside the table. `peg.methods.base.Params` runs
both at construction, in `set_params` and at `fit`. Every message names the argument and what
was expected (docs/errors.md lists them).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from peg._params import check_param_filter
from peg._scalars import check_number, check_positive_int, is_real
from peg.batches import check_batch_fn

Check = Callable[[Any, str], None]  # check(value, name): one argument
Rule = Callable[[Any], None]  # rule(method): between arguments (`parameter_rules`)


def one_of(*choices: Any) -> Check:
    """The value is one of `choices`: equal and of the same type (`True` is not `1`, `"1"` not
    `1`); the error lists them."""

    def check(value: Any, name: str) -> None:
        if not any(type(value) is type(c) and value == c for c in choices):
            raise ValueError(f"{name}: expected one of {list(choices)}, got {value!r}")

    return check


def boolean(optional: bool = False) -> Check:
    """True or False (or None when `optional`, e.g. `progress`: None means "on a terminal")."""

    def check(value: Any, name: str) -> None:
        if not (isinstance(value, bool) or (optional and value is None)):
            expected = "True, False or None" if optional else "True or False"
            raise TypeError(f"{name}: expected {expected}, got {value!r}")

    return check


def positive_int(minimum: int = 1, optional: bool = False) -> Check:
    """An int ≥ `minimum` (or None when `optional`)."""

    def check(value: Any, name: str) -> None:
        if not (optional and value is None):
            check_positive_int(value, name, minimum=minimum)

    return check


def number(allow_zero: bool = False, optional: bool = False) -> Check:
    """A finite number > 0 (≥ 0 with `allow_zero`; or None when `optional`)."""

    def check(value: Any, name: str) -> None:
        if not (optional and value is None):
            check_number(value, name, allow_zero=allow_zero)

    return check


def interval(
    low: float, high: float, what: str = "a number", closed: str = "()", optional: bool = False
) -> Check:
    """A finite number between `low` and `high`, each end included where `closed` says ("[)":
    low included, high not; ...), or None when `optional`; the error shows the interval."""
    left, right = closed

    def check(value: Any, name: str) -> None:
        if optional and value is None:
            return
        inside = is_real(value) and math.isfinite(float(value))
        if inside:
            inside = (low <= value if left == "[" else low < value) and (
                value <= high if right == "]" else value < high
            )
        if not inside:
            none = " or None" if optional else ""
            raise ValueError(
                f"{name}: expected {what} in {left}{low:g}, {high:g}{right}{none}, got {value!r}"
            )

    return check


def fraction(below: float = 1.0, what: str = "a fraction") -> Check:
    """A number in [0, `below`)."""
    return interval(0, below, what, closed="[)")


def instance_of(types: type | tuple[type, ...], what: str, optional: bool = False) -> Check:
    """An instance of `types` (`what` names it), or None when `optional` (a TypeError)."""

    def check(value: Any, name: str) -> None:
        if not (isinstance(value, types) or (optional and value is None)):
            none = " or None" if optional else ""
            raise TypeError(f"{name}: expected {what}{none}, got {type(value).__name__}")

    return check


def choice_or_callable(choices: Any, what: str) -> Check:
    """One of `choices` or a callable (`what` describes the callable)."""

    def check(value: Any, name: str) -> None:
        if not (callable(value) or (isinstance(value, str) and value in choices)):
            raise ValueError(f"{name}: expected one of {sorted(choices)} or {what}, got {value!r}")

    return check


def function(what: str, optional: bool = False) -> Check:
    """A callable (`what` describes it), or None when `optional`."""

    def check(value: Any, name: str) -> None:
        if not (callable(value) or (optional and value is None)):
            raise ValueError(f"{name}: expected {what}, got {value!r}")

    return check


def optional_callable(what: str) -> Check:
    """None or a callable (`what` describes it)."""
    return function(what, optional=True)


def text(what: str, optional: bool = False) -> Check:
    """A non-empty string (`what` names it), or None when `optional`."""

    def check(value: Any, name: str) -> None:
        if not ((isinstance(value, str) and value) or (optional and value is None)):
            none = " or None" if optional else ""
            raise ValueError(f"{name}: expected {what}{none}, got {value!r}")

    return check


def positive_numbers(optional: bool = False) -> Check:
    """A non-empty list (or tuple) of finite numbers > 0 (or None when `optional`)."""

    def check(value: Any, name: str) -> None:
        if optional and value is None:
            return
        ok = isinstance(value, (list, tuple)) and len(value) > 0
        if not ok or not all(is_real(v) and math.isfinite(float(v)) and v > 0 for v in value):
            what = "a non-empty list of numbers > 0" + (" or None" if optional else "")
            raise ValueError(f"{name}: expected {what}, got {value!r}")

    return check


def scale(value: Any, name: str) -> None:
    """A scale (PEG's η, PEP's σ): a number > 0, a non-empty list of them or "search"."""
    if isinstance(value, str) and value == "search":
        return
    single = is_real(value)
    try:
        positive_numbers()([value] if single else value, name)
    except ValueError:
        raise ValueError(
            f"{name}: expected a number > 0, a non-empty list of numbers > 0 "
            f"or 'search', got {value!r}"
        ) from None


def param_filter(value: Any, name: str) -> None:
    """A `params` choice (`peg._params.ParamFilter`)."""
    check_param_filter(value)


def batch_fn(value: Any, name: str) -> None:
    """None or a callable batch_fn(batch) -> (inputs, y)."""
    check_batch_fn(value, name)


def check_constraints(method: Any, table: Mapping[str, Check]) -> None:
    """Run every check of `table` on `method`'s stored argument of that name, in table order."""
    for name, check in table.items():
        check(getattr(method, name), name)
