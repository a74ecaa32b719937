"""Bad input to plots: each case raises the documented error,
before any work. The cases are rendered into docs/errors.md by tests/errors_table.py.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from bad_inputs import (
    logits,
    raises_test,
)
from peg import metrics, plots


def _placed_axes() -> object:
    """An Axes placed by `add_axes`: on no grid."""
    from matplotlib.figure import Figure

    return Figure().add_axes((0.1, 0.1, 0.8, 0.8))


# (area, bad input, call, error type, regex the message must match)
ERROR_CASES: list[tuple[str, str, Callable[[], object], type[BaseException], str]] = [
    (
        "plots",
        "risk-coverage curves without the counts",
        lambda: plots.risk_coverage({"m": {"coverage": [1.0], "risk": [0.1]}}),
        ValueError,
        r"curves\['m'\]: missing keys",
    ),
    (
        "plots",
        "risk-coverage into something that is not an Axes",
        lambda: plots.risk_coverage(
            {"m": metrics.risk_coverage_curve(logits, [0, 1, 2, 0])}, ax="left"
        ),
        ValueError,
        "ax: expected a matplotlib Axes",
    ),
    (
        "plots",
        "a reliability diagram of probabilities without their labels",
        lambda: plots.reliability_diagram(logits),
        ValueError,
        "labels: expected the labels",
    ),
    (
        "plots",
        "a figure of several panels in the place of an Axes on no grid",
        lambda: plots.similarity_matrices({"a": np.eye(2), "b": np.eye(2)}, ax=_placed_axes()),
        ValueError,
        "ax: this figure has several panels",
    ),
    (
        "plots",
        "a reliability diagram of two methods on three Axes",
        lambda: plots.reliability_diagram(
            {"a": logits, "b": logits}, [0, 1, 2, 0], ax=[_placed_axes()] * 3
        ),
        ValueError,
        r"ax: expected one Axes or one per method \(2\), got 3",
    ),
    (
        "plots",
        "two similarity matrices on three Axes",
        lambda: plots.similarity_matrices(
            {"a": np.eye(2), "b": np.eye(2)}, ax=[_placed_axes()] * 3
        ),
        ValueError,
        r"ax: expected one Axes, or 2 \(one per panel\), got 3",
    ),
]


test_bad_input_raises_a_clear_error = raises_test(ERROR_CASES)
