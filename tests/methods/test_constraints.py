"""The generic argument checks (`peg.methods._constraints`) every class's table is made of: each
refuses what it should with a `peg.InvalidParameterError` naming the argument and what was
expected, lets the rest through (None only where optional) and prints what it accepts; every
refusal of `Params._check_params` is an `InvalidParameterError`."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest

import peg
from peg.errors import InvalidParameterError, NotFoldable
from peg.methods import _constraints as checks
from peg.methods import base
from peg.methods.base import Params, store_arguments
from peg.train import Recipe

# (check, accepted values, refused values, error type, regex of the message for "arg")
CASES: list[tuple[checks.Check, list[Any], list[Any], type[Exception], str]] = [
    (
        checks.interval(0, 1),
        [0.5, np.float32(0.1), 1e-9],
        [0, 1, 1.5, -0.1, float("nan"), True, "0.5", None],
        InvalidParameterError,
        r"^arg: expected a number in \(0, 1\), got ",
    ),
    (
        checks.interval(0, 1, "an accuracy", closed="[]", optional=True),
        [0, 1, 0.65, None],
        [1.01, -1e-9, float("inf"), False],
        InvalidParameterError,
        r"^arg: expected an accuracy in \[0, 1\] or None, got ",
    ),
    (
        checks.fraction(what="a momentum weight"),
        [0, 0.9],
        [1, -0.5, True],
        InvalidParameterError,
        r"^arg: expected a momentum weight in \[0, 1\), got ",
    ),
    (
        checks.instance_of((str, os.PathLike), "a file path", optional=True),
        ["run.ckpt", Path("run.ckpt"), None],
        [3, b"run.ckpt"],
        InvalidParameterError,
        r"^arg: expected a file path or None, got (int|bytes)$",
    ),
    (
        checks.instance_of(Recipe, "a peg.train.Recipe"),
        [Recipe()],
        [None, {"epochs": 1}],
        InvalidParameterError,
        r"^arg: expected a peg.train.Recipe, got ",
    ),
    (
        checks.function("a callable loss(outputs, y)"),
        [len, lambda o, y: o],
        [None, "cross_entropy"],
        InvalidParameterError,
        r"^arg: expected a callable loss\(outputs, y\), got ",
    ),
    (
        checks.optional_callable("a callable"),
        [None, len],
        [1],
        InvalidParameterError,
        r"^arg: expected a callable, got 1$",
    ),
    (
        checks.text("a module name", optional=True),
        ["fc", None],
        ["", 3],
        InvalidParameterError,
        r"^arg: expected a module name or None, got ",
    ),
    (
        checks.one_of(None, "covariate"),
        [None, "covariate"],
        ["label", 0, False],
        InvalidParameterError,
        r"^arg: expected one of \[None, 'covariate'\], got ",
    ),
    (
        checks.boolean(optional=True),
        [True, False, None],
        [1, "yes"],
        InvalidParameterError,
        r"^arg: expected True, False or None, got ",
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c[-1] for c in CASES])
def test_a_check_names_the_argument_and_what_was_expected(case):
    check, accepted, refused, kind, message = case
    for value in accepted:
        check(value, "arg")
    for value in refused:
        assert not check.is_satisfied_by(value) or value is None, value
        with pytest.raises(kind, match=message):
            check(value, "arg")
    assert all(check.is_satisfied_by(v) for v in accepted if v is not None)


# (constraint, what it prints): the whole of what it accepts, None included
PRINTED = [
    (checks.one_of("eval", "batch"), "one of ['eval', 'batch']"),
    (checks.boolean(), "True or False"),
    (checks.boolean(optional=True), "True, False or None"),
    (checks.positive_int(), "an integer >= 1"),
    (checks.positive_int(minimum=0, optional=True), "an integer >= 0 or None"),
    (checks.number(allow_zero=True), "a finite number >= 0"),
    (checks.interval(0, 1, "a p", closed="[]", optional=True), "a p in [0, 1] or None"),
    (checks.fraction(), "a fraction in [0, 1)"),
    (checks.instance_of(Recipe, "a peg.train.Recipe"), "a peg.train.Recipe"),
    (checks.choice_or_callable({"nll", "ece"}, "a map"), "one of ['ece', 'nll'] or a map"),
    (checks.optional_callable("a callable"), "a callable or None"),
    (checks.text("a module name"), "a module name"),
    (checks.positive_numbers(optional=True), "a non-empty list of numbers > 0 or None"),
    (checks.scale, "a number > 0, a non-empty list of numbers > 0 or 'search'"),
    (checks.batch_fn, "None or a callable batch_fn(batch) -> (inputs, y)"),
]  # fmt: skip


@pytest.mark.parametrize("constraint, printed", PRINTED, ids=[p for _, p in PRINTED])
def test_a_constraint_prints_what_it_accepts(constraint, printed):
    assert str(constraint) == printed
    assert printed in repr(constraint)


def test_one_error_type_for_a_bad_argument():
    assert issubclass(InvalidParameterError, ValueError)
    assert issubclass(InvalidParameterError, TypeError)
    assert peg.InvalidParameterError is InvalidParameterError
    assert "InvalidParameterError" in peg.__all__


def _plain(value: Any, name: str) -> None:
    """A check written as a function, raising a plain TypeError (as a table may hold)."""
    if not isinstance(value, int):
        raise TypeError(f"{name}: expected an int, got {type(value).__name__}")


def _not_foldable(method: Any) -> None:
    """A rule raising one of peg's own subclasses of ValueError."""
    if method.k == 7:
        raise NotFoldable("k: 7 cannot be folded")


class _Toy(Params):
    parameter_constraints: ClassVar[dict[str, checks.Check]] = {
        "k": _plain,
        "mode": checks.one_of("a", "b"),
    }
    parameter_rules = (_not_foldable,)

    def __init__(self, *, k: Any = 1, mode: Any = "a") -> None:
        store_arguments(self, locals())


def test_every_refusal_of_check_params_is_an_invalid_parameter_error():
    """A table entry that is a plain function, a constraint object, `set_params`' own refusals:
    one type, the message unchanged; a rule's more particular error (a peg subclass) is kept."""
    with pytest.raises(InvalidParameterError, match=r"^k: expected an int, got str$"):
        _Toy(k="1")
    with pytest.raises(InvalidParameterError, match=r"^mode: expected one of \['a', 'b'\]"):
        _Toy(mode="c")
    with pytest.raises(InvalidParameterError, match=r"unknown argument\(s\) \['j'\]"):
        _Toy().set_params(j=1)
    with pytest.raises(InvalidParameterError, match="no parameters of its own"):
        _Toy().set_params(k__x=1)
    with pytest.raises(NotFoldable) as kept:
        _Toy(k=7)
    assert type(kept.value) is NotFoldable


def _public_tables() -> dict[str, dict]:
    return {
        name: getattr(peg, name).parameter_constraints
        for name in peg.__all__
        if isinstance(getattr(peg, name), type) and getattr(peg, name).__dict__.get(
            "parameter_constraints"
        )
    }


def test_every_table_entry_prints_what_it_accepts_and_the_docstring_lists_it():
    tables = _public_tables()
    assert {"PEG", "TemperatureScaling", "AutoSelect", "ConformalClassifier"} <= set(tables)
    for name, table in tables.items():
        plain = [k for k, check in table.items() if not isinstance(check, checks.Constraint)]
        assert not plain, f"{name}: {plain} are plain functions (wrap them in checks.described)"
        doc = getattr(peg, name).__doc__
        assert base.ACCEPTED in doc and all(line in doc for line in checks.accepted(table)), name


def test_a_described_check_refuses_as_its_function_does():
    alpha = peg.methods.conformal._split.ALPHA
    assert str(alpha) == "a miscoverage level in (0, 1)"
    assert alpha.is_satisfied_by(0.1) and not alpha.is_satisfied_by(1.5)
    with pytest.raises(peg.InvalidParameterError, match="alpha: expected a miscoverage level"):
        peg.ConformalClassifier(alpha=1.5)
