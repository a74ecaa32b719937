"""Argument checks as a table (scikit-learn's `_parameter_constraints`): one constraint per name.

A method class declares `parameter_constraints = {name: constraint}`. A constraint is an
object, as scikit-learn's `Interval` and `StrOptions`: `is_satisfied_by(value)` tests a value,
`str(constraint)` says what it accepts ("an integer >= 1", "one of ['eval', 'batch']"), and
`constraint(value, name)` raises `peg.InvalidParameterError` naming `name`, what was expected
and what was given. The factories (`one_of`, `interval`, `positive_int`, ...) build them; a
check too particular for them (`check(value, name)` raising a ValueError or a TypeError:
`check_alpha`, PEG's momentum, ...) enters a table as `described(check, what it accepts)`, so
that every table prints itself (`accepted`: each class's docstring and docs/errors.md).
Constraints between arguments (e.g. PEG's direction only with the vanilla variant) are plain
functions of the method, its `parameter_rules`, listed beside the table.

`peg.methods.base.Params._check_params` runs both, at construction, in `set_params` and at
`fit`, inside `refusals()`: whatever a check or a rule refuses leaves as one type,
`InvalidParameterError` (a ValueError and a TypeError, so older `except` clauses still catch
it). Every message names the argument and what was expected (docs/errors.md lists them).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import numpy as np

from peg._params import PARAM_CHOICES, check_param_filter
from peg.errors import InvalidParameterError
from peg.utils.scalars import is_real

Check = Callable[[Any, str], None]  # check(value, name): one argument (a Constraint is one)
Rule = Callable[[Any], None]  # rule(method): between arguments (`parameter_rules`)


class Constraint:
    """What one argument accepts: `is_satisfied_by(value)`, `str()` says it, a call refuses.

    `optional`: None is accepted too. The message is `"{name}: expected {expected}, got
    {shown}"`; `expected` is `str(self)` unless a subclass keeps an older wording (an optional
    integer's message does not add "or None", as before constraints were objects)."""

    optional: bool = False

    def is_satisfied_by(self, value: Any) -> bool:
        raise NotImplementedError

    def describe(self) -> str:
        """What is accepted, None aside."""
        raise NotImplementedError

    def __str__(self) -> str:
        return self.describe() + (" or None" if self.optional else "")

    def __repr__(self) -> str:
        return f"<{type(self).__name__}: {self}>"

    def expected(self) -> str:
        """The "expected ..." part of the error message."""
        return str(self)

    def shown(self, value: Any) -> str:
        """The "got ..." part of the error message."""
        return repr(value)

    def __call__(self, value: Any, name: str) -> None:
        if (self.optional and value is None) or self.is_satisfied_by(value):
            return
        raise InvalidParameterError(f"{name}: expected {self.expected()}, got {self.shown(value)}")


class Options(Constraint):
    """One of `choices`: equal and of the same type (`True` is not `1`, `"1"` not `1`)."""

    def __init__(self, choices: tuple[Any, ...]) -> None:
        self.choices = choices

    def is_satisfied_by(self, value: Any) -> bool:
        return any(type(value) is type(c) and value == c for c in self.choices)

    def describe(self) -> str:
        return f"one of {list(self.choices)}"


class Boolean(Constraint):
    """True or False (or None when `optional`)."""

    def __init__(self, optional: bool) -> None:
        self.optional = optional

    def is_satisfied_by(self, value: Any) -> bool:
        return isinstance(value, bool)

    def __str__(self) -> str:
        return "True, False or None" if self.optional else "True or False"


class Integer(Constraint):
    """An int (Python's or NumPy's, not a bool) >= `minimum`."""

    def __init__(self, minimum: int, optional: bool) -> None:
        self.minimum, self.optional = minimum, optional

    def is_satisfied_by(self, value: Any) -> bool:
        integer = isinstance(value, (int, np.integer)) and not isinstance(value, bool)
        return integer and value >= self.minimum

    def describe(self) -> str:
        return f"an integer >= {self.minimum}"

    def expected(self) -> str:
        return self.describe()


class Number(Constraint):
    """A finite real number > 0 (>= 0 with `allow_zero`)."""

    def __init__(self, allow_zero: bool, optional: bool) -> None:
        self.allow_zero, self.optional = allow_zero, optional

    def is_satisfied_by(self, value: Any) -> bool:
        if not (is_real(value) and math.isfinite(float(value))):
            return False
        return value >= 0 if self.allow_zero else value > 0

    def describe(self) -> str:
        return f"a finite number {'>= 0' if self.allow_zero else '> 0'}"

    def expected(self) -> str:
        return self.describe()


class Interval(Constraint):
    """A finite real number between `low` and `high`, each end included where `closed` says."""

    def __init__(self, low: float, high: float, what: str, closed: str, optional: bool) -> None:
        if closed not in ("()", "[)", "(]", "[]"):
            raise ValueError(f"closed: expected '()', '[)', '(]' or '[]', got {closed!r}")
        self.low, self.high, self.what, self.closed = low, high, what, closed
        self.optional = optional

    def is_satisfied_by(self, value: Any) -> bool:
        if not (is_real(value) and math.isfinite(float(value))):
            return False
        left, right = self.closed
        above = self.low <= value if left == "[" else self.low < value
        below = value <= self.high if right == "]" else value < self.high
        return bool(above and below)

    def describe(self) -> str:
        left, right = self.closed
        return f"{self.what} in {left}{self.low:g}, {self.high:g}{right}"


class InstanceOf(Constraint):
    """An instance of `types` (`what` names it); the message shows the type given."""

    def __init__(self, types: type | tuple[type, ...], what: str, optional: bool) -> None:
        self.types, self.what, self.optional = types, what, optional

    def is_satisfied_by(self, value: Any) -> bool:
        return isinstance(value, self.types)

    def describe(self) -> str:
        return self.what

    def shown(self, value: Any) -> str:
        return type(value).__name__


class OptionsOrCallable(Options):
    """One of `choices` (strings) or a callable (`what` describes the callable)."""

    def __init__(self, choices: Any, what: str) -> None:
        super().__init__(tuple(sorted(choices)))
        self.what = what

    def is_satisfied_by(self, value: Any) -> bool:
        return callable(value) or (isinstance(value, str) and value in self.choices)

    def describe(self) -> str:
        return f"{super().describe()} or {self.what}"


class Function(Constraint):
    """A callable (`what` describes it; the message keeps its older wording, `what` alone)."""

    def __init__(self, what: str, optional: bool) -> None:
        self.what, self.optional = what, optional

    def is_satisfied_by(self, value: Any) -> bool:
        return callable(value)

    def describe(self) -> str:
        return self.what

    def expected(self) -> str:
        return self.what


class Text(Constraint):
    """A non-empty string (`what` names it)."""

    def __init__(self, what: str, optional: bool) -> None:
        self.what, self.optional = what, optional

    def is_satisfied_by(self, value: Any) -> bool:
        return isinstance(value, str) and bool(value)

    def describe(self) -> str:
        return self.what


class PositiveNumbers(Constraint):
    """A non-empty list (or tuple) of finite real numbers > 0."""

    def __init__(self, optional: bool) -> None:
        self.optional = optional

    def is_satisfied_by(self, value: Any) -> bool:
        if not (isinstance(value, (list, tuple)) and len(value) > 0):
            return False
        return all(is_real(v) and math.isfinite(float(v)) and v > 0 for v in value)

    def describe(self) -> str:
        return "a non-empty list of numbers > 0"


class Scale(Constraint):
    """A scale (PEG's η, PEP's σ): a number > 0, a non-empty list of them or "search"."""

    def is_satisfied_by(self, value: Any) -> bool:
        if isinstance(value, str):
            return value == "search"
        return PositiveNumbers(False).is_satisfied_by([value] if is_real(value) else value)

    def describe(self) -> str:
        return "a number > 0, a non-empty list of numbers > 0 or 'search'"


class ParamFilter(Constraint):
    """A `params` choice (`peg._params.ParamFilter`)."""

    def is_satisfied_by(self, value: Any) -> bool:
        try:
            check_param_filter(value)
        except ValueError:
            return False
        return True

    def describe(self) -> str:
        return PARAM_CHOICES


class BatchFunction(Constraint):
    """None or a callable batch_fn(batch) -> (inputs, y); the message shows the type given."""

    optional = True

    def is_satisfied_by(self, value: Any) -> bool:
        return callable(value)

    def __str__(self) -> str:
        return "None or a callable batch_fn(batch) -> (inputs, y)"

    def shown(self, value: Any) -> str:
        return type(value).__name__


class Described(Constraint):
    """A check too particular for the classes above (`check(value, name)`, raising a ValueError
    or a TypeError), with what it accepts in words: in a table it prints itself like the rest."""

    def __init__(self, check: Check, what: str) -> None:
        self.check, self.what = check, what

    def is_satisfied_by(self, value: Any) -> bool:
        try:
            self.check(value, "value")
        except (TypeError, ValueError):
            return False
        return True

    def describe(self) -> str:
        return self.what

    def __call__(self, value: Any, name: str) -> None:
        self.check(value, name)  # its own message, made an InvalidParameterError by `refusals`


# ---------------------------------------------------------------- the factories tables use
def described(check: Check, what: str) -> Described:
    """`check(value, name)` as a constraint that says `what` it accepts."""
    return Described(check, what)


def one_of(*choices: Any) -> Options:
    """The value is one of `choices`: equal and of the same type (`True` is not `1`, `"1"` not
    `1`); the error lists them."""
    return Options(choices)


def boolean(optional: bool = False) -> Boolean:
    """True or False (or None when `optional`, e.g. `progress`: None means "on a terminal")."""
    return Boolean(optional)


def positive_int(minimum: int = 1, optional: bool = False) -> Integer:
    """An int ≥ `minimum` (or None when `optional`)."""
    return Integer(minimum, optional)


def number(allow_zero: bool = False, optional: bool = False) -> Number:
    """A finite number > 0 (≥ 0 with `allow_zero`; or None when `optional`)."""
    return Number(allow_zero, optional)


def interval(
    low: float, high: float, what: str = "a number", closed: str = "()", optional: bool = False
) -> Interval:
    """A finite number between `low` and `high`, each end included where `closed` says ("[)":
    low included, high not; ...), or None when `optional`; the error shows the interval."""
    return Interval(low, high, what, closed, optional)


def fraction(below: float = 1.0, what: str = "a fraction") -> Interval:
    """A number in [0, `below`)."""
    return Interval(0, below, what, "[)", False)


def instance_of(types: type | tuple[type, ...], what: str, optional: bool = False) -> InstanceOf:
    """An instance of `types` (`what` names it), or None when `optional`."""
    return InstanceOf(types, what, optional)


def choice_or_callable(choices: Any, what: str) -> OptionsOrCallable:
    """One of `choices` or a callable (`what` describes the callable)."""
    return OptionsOrCallable(choices, what)


def function(what: str, optional: bool = False) -> Function:
    """A callable (`what` describes it), or None when `optional`."""
    return Function(what, optional)


def optional_callable(what: str) -> Function:
    """None or a callable (`what` describes it)."""
    return Function(what, optional=True)


def text(what: str, optional: bool = False) -> Text:
    """A non-empty string (`what` names it), or None when `optional`."""
    return Text(what, optional)


def positive_numbers(optional: bool = False) -> PositiveNumbers:
    """A non-empty list (or tuple) of finite numbers > 0 (or None when `optional`)."""
    return PositiveNumbers(optional)


scale = Scale()  # PEG's `eta`, PEP's `sigma`
param_filter = ParamFilter()  # a `params` choice
batch_fn = BatchFunction()  # None or a callable batch_fn(batch) -> (inputs, y)


@contextmanager
def refusals() -> Iterator[None]:
    """Whatever a check or a rule inside refuses leaves as `InvalidParameterError` (its message
    and traceback kept): a plain ValueError or TypeError of a check written as a function
    becomes one; peg's own subclasses of them, which say more, pass unchanged."""
    try:
        yield
    except (ValueError, TypeError) as e:
        if type(e) not in (ValueError, TypeError):
            raise
        raise InvalidParameterError(str(e)).with_traceback(e.__traceback__) from None


def accepted(table: Mapping[str, Check]) -> list[str]:
    """`name: what it accepts`, one line per argument of a `parameter_constraints` table."""
    return [f"{name}: {check}" for name, check in table.items()]


def check_constraints(method: Any, table: Mapping[str, Check]) -> None:
    """Run every check of `table` on `method`'s stored argument of that name, in table order."""
    for name, check in table.items():
        check(getattr(method, name), name)
