"""The generic argument checks (`peg.methods._constraints`) every class's table is made of: each
refuses what it should with an error naming the argument and what was expected, and lets the
rest through (None only where optional)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from peg.methods import _constraints as checks
from peg.train import Recipe

# (check, accepted values, refused values, error type, regex of the message for "arg")
CASES: list[tuple[checks.Check, list[Any], list[Any], type[Exception], str]] = [
    (
        checks.interval(0, 1),
        [0.5, np.float32(0.1), 1e-9],
        [0, 1, 1.5, -0.1, float("nan"), True, "0.5", None],
        ValueError,
        r"^arg: expected a number in \(0, 1\), got ",
    ),
    (
        checks.interval(0, 1, "an accuracy", closed="[]", optional=True),
        [0, 1, 0.65, None],
        [1.01, -1e-9, float("inf"), False],
        ValueError,
        r"^arg: expected an accuracy in \[0, 1\] or None, got ",
    ),
    (
        checks.fraction(what="a momentum weight"),
        [0, 0.9],
        [1, -0.5, True],
        ValueError,
        r"^arg: expected a momentum weight in \[0, 1\), got ",
    ),
    (
        checks.instance_of((str, os.PathLike), "a file path", optional=True),
        ["run.ckpt", Path("run.ckpt"), None],
        [3, b"run.ckpt"],
        TypeError,
        r"^arg: expected a file path or None, got (int|bytes)$",
    ),
    (
        checks.instance_of(Recipe, "a peg.train.Recipe"),
        [Recipe()],
        [None, {"epochs": 1}],
        TypeError,
        r"^arg: expected a peg.train.Recipe, got ",
    ),
    (
        checks.function("a callable loss(outputs, y)"),
        [len, lambda o, y: o],
        [None, "cross_entropy"],
        ValueError,
        r"^arg: expected a callable loss\(outputs, y\), got ",
    ),
    (
        checks.optional_callable("a callable"),
        [None, len],
        [1],
        ValueError,
        r"^arg: expected a callable, got 1$",
    ),
    (
        checks.text("a module name", optional=True),
        ["fc", None],
        ["", 3],
        ValueError,
        r"^arg: expected a module name or None, got ",
    ),
    (
        checks.one_of(None, "covariate"),
        [None, "covariate"],
        ["label", 0, False],
        ValueError,
        r"^arg: expected one of \[None, 'covariate'\], got ",
    ),
    (
        checks.boolean(optional=True),
        [True, False, None],
        [1, "yes"],
        TypeError,
        r"^arg: expected True, False or None, got ",
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c[-1] for c in CASES])
def test_a_check_names_the_argument_and_what_was_expected(case):
    check, accepted, refused, kind, message = case
    for value in accepted:
        check(value, "arg")
    for value in refused:
        with pytest.raises(kind, match=message):
            check(value, "arg")
