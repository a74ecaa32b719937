"""The diversity–accuracy plane (Fort et al. 2019, §4.3, Fig. 6, Appendix D).

A sampled function f is placed relative to a reference solution f* (accuracy a*): its accuracy a
on the x-axis, and on the y-axis its disagreement with f* (fraction of points whose predicted
class differs) divided by its own error 1 − a, as §4.3 defines it ("we normalize this by
(1 − a), where a is the accuracy of the sampled solution").

Reference curves (Appendix D), for C classes:

- upper limit, predictions uncorrelated with f*'s:
  d(a) = (1 − a*)·a + (1 − a)·a* + (1 − a*)(1 − a)(C − 2)/(C − 1);
- lower limit, f*'s labels flipped with one probability p (p₊ = p₋ = p):
  a(p) = a*(1 − p) + p(1 − a*)/(C − 1), d = p;
- the 1-parameter family p₊ = p, p₋ = p^e (e = 0.22 fitted the paper's data):
  a = a*(1 − p₊) + (1 − a*)p₋/(C − 1), d = a*·p₊ + (1 − a*)·p₋.

The paper's Eqs. (3) and (4) print these last two with the names swapped (its Eq. 3 is the
accuracy); the forms here reduce to the lower limit at e = 1, as the appendix says they must.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from peg.metrics.diversity import disagreement, normalized_disagreement

PAPER_EXPONENT = 0.22  # the paper's best fit of the 1-parameter family (Fig. S6)


def _logits(value: Any, name: str, ndim: int) -> torch.Tensor:
    t = torch.as_tensor(value).detach().cpu()
    if t.ndim != ndim:
        want = "[N, C]" if ndim == 2 else "[M, N, C]"
        raise ValueError(f"{name}: expected logits {want}, got shape {tuple(t.shape)}")
    return t


def diversity_accuracy(reference_logits: Any, sample_logits: Any, y: Any) -> dict[str, Any]:
    """Where samples fall in the diversity–accuracy plane relative to a reference solution.

    Args:
        reference_logits: logits of the reference solution f*, `[N, C]`.
        sample_logits: logits of M >= 1 sampled functions, `[M, N, C]`.
        y: labels `[N]`.

    Returns:
        `{"reference_accuracy": a*, "accuracy": [M], "disagreement": [M] (fraction of points
        whose class differs from f*'s), "diversity": [M] (disagreement / (1 − a), inf for a
        perfect sample that disagrees)}` as floats and lists.
    """
    ref = _logits(reference_logits, "reference_logits", 2)
    samples = _logits(sample_logits, "sample_logits", 3)
    if samples.shape[0] < 1:
        raise ValueError("sample_logits: expected at least one sampled function (M >= 1)")
    if samples.shape[1:] != ref.shape:
        raise ValueError(
            f"sample_logits: expected [M, {ref.shape[0]}, {ref.shape[1]}] to match "
            f"reference_logits {tuple(ref.shape)}, got {tuple(samples.shape)}"
        )
    stack = torch.cat([ref[None], samples])  # member 0 is the reference
    # Row i of normalized_disagreement divides by member i's error: column 0 of rows 1..M is
    # each sample's disagreement with f* over the sample's own error, as §4.3 defines it.
    diversity = normalized_disagreement(stack, y)[1:, 0]
    labels = torch.as_tensor(y).long()
    accuracy = (stack.argmax(-1) == labels).double().mean(-1)
    return {
        "reference_accuracy": float(accuracy[0]),
        "accuracy": accuracy[1:].tolist(),
        "disagreement": disagreement(stack)[0, 1:].tolist(),
        "diversity": diversity.tolist(),
    }


def _check_reference(a_star: float, classes: int) -> None:
    if isinstance(classes, bool) or not isinstance(classes, int) or classes < 3:
        raise ValueError(f"classes: expected an integer >= 3 (C), got {classes!r}")
    if not (isinstance(a_star, (int, float)) and 1 / classes < a_star < 1):
        raise ValueError(
            f"a_star: expected the reference accuracy in (1/C, 1) = ({1 / classes:.3g}, 1), "
            f"got {a_star!r}"
        )


def flip_curve(
    a_star: float, classes: int, exponent: float = 1.0, points: int = 201
) -> dict[str, list[float]]:
    """The correlated-predictions model: f*'s labels flipped with p₊ = p, p₋ = p^exponent.

    exponent = 1 is the paper's lower limit (Eq. 2). Returns `{"p", "accuracy",
    "disagreement", "diversity"}` over p in [0, 1], diversity = disagreement / (1 − accuracy).
    """
    _check_reference(a_star, classes)
    if not (isinstance(exponent, (int, float)) and exponent > 0):
        raise ValueError(f"exponent: expected a number > 0, got {exponent!r}")
    p = np.linspace(0.0, 1.0, points)
    p_minus = p**exponent
    acc = a_star * (1 - p) + (1 - a_star) * p_minus / (classes - 1)
    dis = a_star * p + (1 - a_star) * p_minus
    return {
        "p": p.tolist(),
        "accuracy": acc.tolist(),
        "disagreement": dis.tolist(),
        "diversity": (dis / (1 - acc)).tolist(),
    }


def uncorrelated_curve(
    a_star: float, classes: int, accuracy: Sequence[float] | None = None, points: int = 201
) -> dict[str, list[float]]:
    """The upper limit: predictions independent of f*'s at accuracy a (Appendix D.1).

    `accuracy` defaults to `points` values from 1/C to a*. Returns `{"accuracy",
    "disagreement", "diversity"}`.
    """
    _check_reference(a_star, classes)
    a = np.linspace(1 / classes, a_star, points) if accuracy is None else np.asarray(accuracy)
    if a.ndim != 1 or np.any(a < 0) or np.any(a >= 1):
        raise ValueError("accuracy: expected accuracies in [0, 1) as a 1-D sequence")
    C = classes
    dis = (1 - a_star) * a + (1 - a) * a_star + (1 - a_star) * (1 - a) * (C - 2) / (C - 1)
    return {
        "accuracy": a.tolist(),
        "disagreement": dis.tolist(),
        "diversity": (dis / (1 - a)).tolist(),
    }


def reference_curves(
    a_star: float, classes: int, exponents: Sequence[float] = (PAPER_EXPONENT,), points: int = 201
) -> dict[str, dict[str, list[float]]]:
    """The paper's reference curves for a reference accuracy `a_star` and `classes` classes.

    Returns `{name: {"accuracy": [...], "diversity": [...], ...}}` with names "upper limit
    (uncorrelated)", "lower limit (p₊ = p₋)" and "flip model e = <e>" for each exponent.
    """
    curves = {
        "upper limit (uncorrelated)": uncorrelated_curve(a_star, classes, points=points),
        "lower limit (p₊ = p₋)": flip_curve(a_star, classes, 1.0, points),
    }
    for e in exponents:
        curves[f"flip model e = {e:g}"] = flip_curve(a_star, classes, float(e), points)
    return curves
