"""What every calibrator accepts as logits, and what it says about them (issue 46, items 4, 9,
10, 12, 13 and the few-points gap): one rule for NaN, +inf and -inf (refused everywhere, the
message naming the argument and the first row), real logits of at least two classes, float64
until the softmax (no NaN from finite logits), the temperature-bound warning's cause, and the
few-points warning of the maps shared by every class. The error cases are rendered into
docs/errors.md by tests/errors_table.py."""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable

import pytest
import torch
from torch import nn

import peg
from bad_inputs import raises_test
from peg.methods.calibration._calibrator import in_float32

IDENTITY = nn.Identity()
F32_MAX = torch.finfo(torch.float32).max


def _logits(n: int = 300, c: int = 3, margin: float = 2.0, seed: int = 0):
    """Logits `[n, c]` whose label class is raised by `margin`, and the labels."""
    g = torch.Generator().manual_seed(seed)
    y = torch.arange(n) % c
    z = torch.randn(n, c, generator=g)
    z[torch.arange(n), y] += margin
    return z, y


Z, Y = _logits()
CALIBRATORS = {
    "TS": peg.TemperatureScaling,
    "vector": peg.VectorScaling,
    "matrix": peg.MatrixScaling,
    "Dirichlet": peg.DirichletCalibration,
    "binning": peg.HistogramBinning,
    "isotonic": peg.IsotonicCalibration,
    "spline": peg.SplineCalibration,
    "ETS": peg.EnsembleTemperatureScaling,
    "OPS": peg.OrderPreservingScaling,
}


@pytest.fixture(scope="module")
def fitted() -> dict[str, object]:
    return {name: cls().fit(IDENTITY, (Z, Y)) for name, cls in CALIBRATORS.items()}


def _with(value: float, row: int = 2, n: int = 5) -> torch.Tensor:
    X = Z[:n].clone()
    X[row, 1] = value
    return X


# ---------------------------------------------------------------- items 4, 9: one rule
@pytest.mark.parametrize("name", list(CALIBRATORS))
@pytest.mark.parametrize(("value", "kind"), [("nan", "NaN"), ("inf", "+inf"), ("-inf", "-inf")])
def test_nan_and_inf_logits_are_refused_by_every_calibrator_naming_x_and_the_row(
    fitted, name, value, kind
):
    """Before: vector, matrix and order-preserving scaling returned NaN for NaN / +inf and
    accepted -inf; the others said "pred: expected finite values" (no argument, no row)."""
    message = (
        rf"X: the logits hold NaN or ±inf in 1 of 5 rows, the first in row 2 \({re.escape(kind)}\)"
    )
    with pytest.raises(ValueError, match=message):
        fitted[name].predict_proba(_with(float(value)))


def test_a_streamed_batch_names_the_row_in_the_whole_input(fitted):
    X = Z[:12].clone()
    X[9, 0] = float("-inf")
    batches = fitted["OPS"].iter_member_logits(X, batch_size=4)
    assert next(batches).shape == (1, 4, 3)  # the batches before it are mapped
    next(batches)
    with pytest.raises(ValueError, match=r"1 of 4 rows \(rows 8-11 of X\), the first in row 9"):
        next(batches)


def test_conformal_and_label_shift_follow_the_same_rule():
    """Before: a conformal predictor on logits accepted -inf; LabelShift said "pred: ..."."""
    rule = r"X: the logits hold NaN or ±inf in 1 of 5 rows, the first in row 2 \(-inf\)"
    sets = peg.ConformalClassifier().fit(IDENTITY, (Z, Y))
    with pytest.raises(ValueError, match=rule):
        sets.predict_set(_with(float("-inf")))
    shift = peg.LabelShift().fit(IDENTITY, (Z, Y), target=Z)
    with pytest.raises(ValueError, match=rule):
        shift.predict_proba(_with(float("-inf")))


@pytest.mark.parametrize("name", ["OPS", "vector", "matrix"])
def test_float32_max_logits_give_probabilities_not_nan(name):
    """Item 4: a map with slopes > 1 (separable data: T ≈ 0.01) took a float32-max logit past
    float32's range in the cast, inf - inf = NaN in the softmax; float64 until the softmax."""
    z, y = _logits(200, 3, margin=8.0)
    m = CALIBRATORS[name]().fit(IDENTITY, (z, y))
    X = torch.tensor([[F32_MAX, 0.0, 1.0], [3e38, 3e38, 0.0], [-F32_MAX, 0.0, 1.0]])
    p = m.predict_proba(X)
    assert bool(torch.isfinite(p).all())
    torch.testing.assert_close(p.sum(-1), torch.ones(3))
    assert p[0, 0] == 1.0 and p[2, 2] > 0.99  # the class of the largest logit
    torch.testing.assert_close(p[1, :2], torch.full((2,), 0.5))  # a tie shares the mass


def test_in_float32_keeps_the_softmax_and_refuses_nan():
    scores = torch.tensor([[1e300, 0.0, -1e300], [float("inf"), float("inf"), 0.0], [0.0, 1, 2]])
    p = in_float32(scores.double(), "a map", "X").softmax(-1)
    expected = torch.tensor([[1.0, 0, 0], [0.5, 0.5, 0], [0.0, 1, 2]])
    expected[2] = expected[2].softmax(-1)
    torch.testing.assert_close(p, expected)
    bad = torch.tensor([[0.0, 1.0], [float("nan"), 1e300]], dtype=torch.float64)
    with pytest.raises(FloatingPointError, match=r"X: a map gives no probabilities .* row 1"):
        in_float32(bad, "a map", "X")


# ---------------------------------------------------------------- item 13: the same refusals
@pytest.mark.parametrize(
    ("what", "data", "message"),
    [
        ("complex logits", (Z.to(torch.complex64), Y), r"val: expected real logits, got dtype"),
        # one logit per row is a binary scorer now (`peg.source._kinds`): one class is the labels'
        ("one class", (Z, torch.zeros(len(Z), dtype=torch.long)), "one class only"),
    ],
)
def test_every_calibrator_refuses_complex_logits_and_one_class_alike(what, data, message):
    """Before: order-preserving (and vector, matrix) scaling fitted complex logits, dropping
    the imaginary part; order-preserving, TS, vector, matrix and Dirichlet fitted C = 1."""
    seen = set()
    for cls in CALIBRATORS.values():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # one class: its own warning
            with pytest.raises(ValueError, match=message) as caught:
                cls().fit(IDENTITY, data)
        seen.add(str(caught.value).replace(cls.label, "<map>"))
    assert len(seen) == 1, seen  # one message, the map's name aside


# ---------------------------------------------------------------- item 10: the bound's cause
RIGHT = "every validation point is predicted right"
TEMPERATURE_CAUSES = [
    ("constant logits", lambda: (torch.zeros(300, 3), Y), r"constant logits", RIGHT),
    ("logits x 1e5", lambda: (Z * 1e5, Y), r"the optimum is a larger T", "anti-correlated"),
    ("logits x 1e-5", lambda: (Z * 1e-5, Y), r"the optimum is a smaller T", RIGHT),
    ("anti-correlated", lambda: (-Z, Y), r"anti-correlated with the labels", "larger T"),
    ("all right", lambda: (5.0 * torch.eye(3)[Y], Y), r"every validation point is predicted"
     r" right", "smaller T"),
]  # fmt: skip


@pytest.mark.parametrize("name", ["TS", "ETS", "OPS"])
@pytest.mark.parametrize(
    ("case", "data", "cause", "not_said"),
    TEMPERATURE_CAUSES,
    ids=[c[0] for c in TEMPERATURE_CAUSES],
)
def test_the_temperature_bound_warning_names_the_map_and_the_true_cause(
    name, case, data, cause, not_said
):
    """Before: constant logits were "every validation point is predicted right", an optimum
    past T = 1e3 "anti-correlated", and ETS / OPS called themselves "temperature scaling"."""
    cls = CALIBRATORS[name]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cls().fit(IDENTITY, data())
    said = [str(w.message) for w in caught if "temperature" in str(w.message)]
    assert len(said) == 1, said
    assert said[0].startswith(f"{cls.label}: ")
    assert re.search(cause, said[0]) and not_said not in said[0], said[0]
    assert caught[0].filename == __file__  # points at the user's fit


# ---------------------------------------------------------------- silent gap: few points
@pytest.mark.parametrize(("name", "parameters"), [("ETS", "3"), ("OPS", r"\d+")])
def test_a_map_shared_by_every_class_warns_of_few_points(name, parameters):
    """Before: ensemble temperature and order-preserving scaling fitted 5 points silently;
    the per-class maps warn below 10 points a class, these below 10 points a parameter."""
    cls = CALIBRATORS[name]
    z, y = _logits(6)
    message = rf"val: {cls.label} fits {parameters} parameters shared by every class from 6"
    with pytest.warns(UserWarning, match=message) as caught:
        cls().fit(IDENTITY, (z, y))
    assert {w.filename for w in caught} == {__file__}  # points at the user's fit
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cls().fit(IDENTITY, _logits(400))  # enough: nothing to say


# ---------------------------------------------------------------- the error cases
def _overflowing() -> nn.Module:
    class Overflows(nn.Module):
        """Logits of the identity, NaN on the inputs whose first feature is > 50."""

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.where(x[:, :1] > 50, float("nan"), x)

    return Overflows()


def _target_with(value: float) -> torch.Tensor:
    target = Z.clone()
    target[[4, 9], 0] = value
    return target


def _overflowing_target() -> torch.Tensor:
    target = Z.clone()
    target[7, 0] = 100.0  # finite: the model's output is not
    return target


ERROR_CASES: list[tuple[str, str, Callable[[], object], type[BaseException], str]] = [
    (
        "calibrators",
        "order-preserving scaling of complex logits",
        lambda: peg.OrderPreservingScaling().fit(IDENTITY, (Z.to(torch.complex64), Y)),
        ValueError,
        r"val: expected real logits, got dtype torch.complex64",
    ),
    (
        "calibrators",
        "order-preserving scaling of one score per row (a binary scorer)",
        lambda: peg.OrderPreservingScaling().fit(IDENTITY, (Z[:, :1], Y * 0)),
        ValueError,
        r"val: OrderPreservingScaling does not take binary input .* The maps that take binary "
        r"input \(calibrators\('binary'\)\): \['TemperatureScaling'",
    ),
    (
        "calibrators",
        "a +inf logit at predict (any calibrator)",
        lambda: (
            peg.OrderPreservingScaling().fit(IDENTITY, (Z, Y)).predict_proba(_with(float("inf")))
        ),
        ValueError,
        r"X: the logits hold NaN or ±inf in 1 of 5 rows, the first in row 2 \(\+inf\)",
    ),
    (
        "calibrators",
        "-inf (a class ruled out) at predict: refused by every calibrator",
        lambda: peg.VectorScaling().fit(IDENTITY, (Z, Y)).predict_proba(_with(float("-inf"))),
        ValueError,
        r"X: the logits hold NaN or ±inf in 1 of 5 rows, the first in row 2 \(-inf\)",
    ),
    (
        "LabelShift",
        "a NaN in the target",
        lambda: peg.LabelShift().fit(IDENTITY, (Z, Y), target=_target_with(float("nan"))),
        ValueError,
        r"target: the inputs contain NaN or inf \(2 of 300 samples\)",
    ),
    (
        "LabelShift",
        "a model giving NaN on the target",
        lambda: peg.LabelShift().fit(_overflowing(), (Z, Y), target=_overflowing_target()),
        ValueError,
        r"target: the logits hold NaN or ±inf in 1 of 300 rows, the first in row 7 \(NaN\)",
    ),
]
test_bad_input_raises_a_clear_error = raises_test(ERROR_CASES)
