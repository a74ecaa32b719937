"""Temperature scaling (Guo et al. 2017): one scalar T > 0 fitted on validation NLL.

Works on a single model and on any ensemble: the scores scaled are the log of the averaged
predictive distribution, log p̄ `[N, C]` (for one model these are its logits up to a per-row
constant, which softmax ignores). T is fitted by a bracketed, safeguarded Newton search on
log T (`fit_temperature`: it cannot stall where the softmax saturates), within `bounds`, with a
warning where the optimum lies beyond them. The fitting, predicting and saving are every
calibrator's (`peg.methods.calibration._calibrator.Calibrator`).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping
from typing import Any, ClassVar

import torch
from torch import Tensor

from peg._schema import Fields
from peg.errors import ArchiveError
from peg.methods import _constraints as checks
from peg.methods.base import store_arguments
from peg.methods.calibration._calibrator import Calibrator
from peg.methods.calibration._export import CalibrationMap, as_f64
from peg.methods.calibration._streamed import Batches, fit_temperature_streamed
from peg.source._kinds import IGNORE_INDEX, Kind
from peg.source.batches import BatchFn
from peg.utils.scalars import check_number

BOUNDS = (1e-3, 1e3)  # T's search range: beyond it a prediction is one-hot or uniform to 1e-3
LOG10 = math.log(10.0)

__all__ = [
    "TemperatureScaling",
    "fit_temperature",
]


def check_bounds(value: Any, name: str) -> None:
    """`bounds`: a pair of finite numbers 0 < lowest < highest."""
    if not (isinstance(value, (tuple, list)) and len(value) == 2):
        raise ValueError(
            f"{name}: expected a pair (lowest, highest) of temperatures, got {value!r}"
        )
    for v in value:
        check_number(v, name)
    if not float(value[0]) < float(value[1]):
        raise ValueError(f"{name}: expected lowest < highest, got {tuple(value)!r}")


class Temperature(CalibrationMap):
    """Temperature scaling: s / T."""

    temperature: Tensor

    def __init__(self, scores: str, temperature: float) -> None:
        super().__init__(scores)
        self.register_buffer("temperature", as_f64(temperature))

    def log_probs(self, s: Tensor) -> Tensor:
        return s / self.temperature


class TemperatureScaling(Calibrator):
    """Post-hoc calibration of a model or an ensemble by one temperature: p = softmax(log p̄ / T),
    T > 0 minimising the validation NLL (Guo et al. 2017, "On Calibration of Modern Neural
    Networks", ICML). Pass logits (or a model returning them), not probabilities.

    Args:
        max_iter: Newton iterations once the optimum is bracketed (about six suffice).
        bounds: (lowest, highest) T searched, 0 < lowest < highest; an optimum beyond them is
            a warning naming the bound, which is then T.
        batch_size: rows per forward pass.
        batch_fn: `batch_fn(batch) -> (inputs, y)` for loader batches that are neither
            `(x, y, ...)` nor a mapping with "labels" (`peg.source.batches`); used by `fit` and
            `member_logits`. None: those conventions.
        task: the kind of input, read from the logits' and labels' shapes ("auto"), or
            "multiclass", "binary" or "multilabel" where the shapes could be either
            (`peg.source._kinds`).
        ignore_index: labels equal to it are left out of the fit (torch's -100; 255 in
            Cityscapes and VOC).
        per_label: on a multilabel head, one map per label instead of one shared map.
        class_dim: where dense logits hold the classes, 1 (`[B, C, *S]`) or -1 (`[B, *S, C]`, a
            language model's); None: read from the shapes (an error where both read).

    After `fit(predictor, val)`: `temperature_` (T), `predictor_`, `meta_` (method, T and the
    predictor's meta when it has one), `member_logits(X) -> [1, N, C]` (log p̄ / T),
    `predict_proba(X) -> [N, C]`, `predict(X) -> [N]` (temperature scaling never changes the
    class); `save(path)` writes the calibrated ensemble, its meta gaining
    `"calibration": {"method": "temperature", "temperature": T}`, which `peg.load(path, model)`
    gives back as a fitted `TemperatureScaling`.

    Examples:
        >>> import torch, peg
        >>> g = torch.Generator().manual_seed(0)
        >>> labels = torch.randint(0, 3, (300,), generator=g)
        >>> logits = torch.randn(300, 3, generator=g)
        >>> logits[torch.arange(300), labels] += 1.0
        >>> logits = 4 * logits  # an over-confident model's saved logits [N, C]
        >>> ts = peg.TemperatureScaling().fit(logits[:200], labels[:200])
        >>> ts.temperature_ > 1  # the logits were too sharp: T softens them
        True
        >>> ts.predict_proba(logits[200:]).shape
        torch.Size([100, 3])

    See Also:
        peg.AutoSelect: chooses between TS and the other maps by cross-validation.
        peg.compare: fits TS and the ensembles on one model, one table of costs and metrics.
        docs/calibration.md: when temperature scaling is enough, and the other maps.
    """

    method = "temperature"
    label = "temperature scaling"
    name = "TS"  # the registry's entry (`Calibrator`): compare's, AutoSelect's row
    kinds = ("multiclass", "binary", "multilabel", "dense")
    table_name = "Temp-scaled"
    growth = 0  # one parameter, T
    order = 0
    simplicity = 0
    cost_order = 0
    on_logits_default = True
    streams = True  # a model's dense outputs: `fit_temperature_streamed`, never gathered

    def __init__(
        self,
        *,
        max_iter: int = 100,
        bounds: tuple[float, float] = BOUNDS,
        batch_size: int = 512,
        batch_fn: BatchFn | None = None,
        task: str = "auto",
        ignore_index: int = IGNORE_INDEX,
        per_label: bool = False,
        class_dim: int | None = None,
    ) -> None:
        store_arguments(self, locals())

    parameter_constraints: ClassVar[Mapping[str, checks.Check]] = {
        "max_iter": checks.positive_int(),
        "bounds": checks.described(check_bounds, "a pair (lowest, highest), 0 < lowest < highest"),
        **Calibrator.parameter_constraints,
    }

    def _fit_map(self, scores: Tensor, y: Tensor) -> dict[str, Any]:
        bounds = (float(self.bounds[0]), float(self.bounds[1]))
        return {"temperature_": fit_temperature(scores, y, int(self.max_iter), bounds=bounds)}

    def _fit_stream(self, batches: Batches, kind: Kind) -> dict[str, Any]:
        bounds = (float(self.bounds[0]), float(self.bounds[1]))
        t = fit_temperature_streamed(
            batches,
            class_dim=kind.class_dim,
            ignore_index=kind.ignore_index,
            bounds=bounds,
            max_iter=int(self.max_iter),
            label=self.label,
        )
        return {"temperature_": t}

    def _module(self) -> CalibrationMap:
        """The fitted map as a module (`to_module`)."""
        return Temperature(self.scores_, self.temperature_)

    def _apply(self, scores: Tensor) -> Tensor:
        return scores / self.temperature_

    def _entry(self) -> dict[str, Any]:
        return {"temperature": float(self.temperature_)}

    def _archived(self) -> dict[str, Any]:
        # T and C alone: the arguments are the fit's, the scores log p̄
        return {"method": self.method, **self._map_entry(), **self._width()}

    def _described(self) -> dict[str, Any]:
        return {**self._map_entry(), **self._width()}

    def _restore(self, entry: Mapping[str, Any], tensors: Mapping[str, Tensor]) -> dict[str, Any]:
        temperature = entry.get("temperature")
        if (
            isinstance(temperature, bool)
            or not isinstance(temperature, (int, float))
            or not math.isfinite(temperature)
            or temperature <= 0
        ):
            raise ArchiveError(
                f"calibration: expected a temperature > 0 in the archive, got {temperature!r}"
            )
        return {"temperature_": float(temperature)}


def fitted_temperature(entry: Mapping[str, Any], bounds: tuple[float, float] = BOUNDS) -> float:
    """An archive entry's `"temperature"` as `fit_temperature` gives it within `bounds` (its
    default: the start of ensemble temperature and order-preserving scaling, which search no
    other range); an `ArchiveError` naming the field otherwise (ETS with T = 1e-300 loaded and
    predicted worse than the uniform distribution)."""
    fields = Fields(entry, "calibration", "meta.calibration.")
    t = fields.number("temperature", positive=True)
    low, high = bounds
    if not low * (1 - 1e-9) <= t <= high * (1 + 1e-9):
        raise fields.error("temperature", f"a temperature in [{low:g}, {high:g}] (its fit's)", t)
    return t


def fit_temperature(
    scores: Tensor,
    y: Tensor,
    max_iter: int = 100,
    *,
    bounds: tuple[float, float] = BOUNDS,
    label: str | None = "temperature scaling",
) -> float:
    """argmin_T NLL(softmax(scores / T), y) over T in `bounds`, for scores `[N, C]`, labels
    `[N]` (rows with a non-finite score left out).

    The NLL is convex in β = 1/T and its derivative g(β), the mean of E_p[s] - s_y, increases
    with β: its sign says on which side the optimum lies even where the softmax saturates and
    the curvature (the mean of Var_p[s]) underflows, where Newton's method alone stalls (scores
    45 apart: Var_p[s] ~ 1e-16 and steps of ~1e-17 left T at 1.0). So the root of g
    is bracketed first, log β stepped by log 10 from β = 1 until g changes sign, then found by
    Newton's method on log β safeguarded by bisection (a step leaving the bracket, or taken
    where the NLL is concave in log β, is a bisection): a few passes over `[N, C]` (float64)
    an iteration, about six from the bracket to full precision. Where g keeps its sign up to a
    bound the optimum lies beyond it: the bound is returned and, unless `label` is None (the
    calibrator's name), a warning names it and its cause (`_bound_cause`: constant scores;
    every validation point predicted right, T → 0; scores anti-correlated with the labels,
    T → ∞; or an optimum past the bound, scores of a very small or large scale)."""
    scores = scores.detach().double()
    finite = torch.isfinite(scores).all(-1)
    s, y = scores[finite], y[finite].long()
    true = s.gather(1, y[:, None])[:, 0]

    def slope(u: float) -> tuple[float, float]:
        """(dNLL/du, d²NLL/du²) at u = log β, from g and its derivative h = mean Var_p[s]."""
        beta = math.exp(u)
        p = (beta * s).softmax(-1)
        mean = (p * s).sum(-1)
        var = ((p * s.square()).sum(-1) - mean.square()).clamp_min(0)
        g, h = float((mean - true).mean()) if len(s) else 0.0, float(var.mean()) if len(s) else 0.0
        return g * beta, (g + h * beta) * beta

    low, high = -math.log(bounds[1]), -math.log(bounds[0])  # log β = -log T
    u = min(max(0.0, low), high)
    g, h = slope(u)
    direction = -1.0 if g > 0 else 1.0  # towards the optimum
    last = u
    while (g > 0) == (direction < 0) or g == 0:  # not yet past the optimum
        edge = u <= low + 1e-9 or u >= high - 1e-9
        last, u = u, min(max(u + direction * LOG10, low), high)
        # at a bound with the NLL still falling beyond it, or where the softmax saturated so
        # far that its derivative is 0.0 (the NLL no longer changes in float64)
        if edge or u == last or g == 0:
            u = last
            if label is not None:
                _warn_bound(label, math.exp(-u), s, true, direction)
            return math.exp(-u)
        g, h = slope(u)
    lo, hi = min(last, u), max(last, u)  # g(lo) <= 0 <= g(hi)
    for _ in range(max_iter):
        if g == 0:
            break
        step = g / h if h > 0 else math.inf
        new = u - step
        if not lo < new < hi:
            new, step = 0.5 * (lo + hi), u - 0.5 * (lo + hi)
        u = new
        g, h = slope(u)
        lo, hi = (lo, u) if g > 0 else (u, hi)
        if abs(step) <= 1e-10 or hi - lo <= 1e-12:
            break
    return math.exp(-u)


def _bound_cause(s: Tensor, true: Tensor, direction: float, wider: str) -> str:
    """Why the NLL still falls at a bound, from the scores `[N, C]` (not constant in every row)
    and the labels' scores `[N]`: the derivative in β = 1/T (the mean of E_p[s] - s_y)
    increases from the mean of (mean_c s - s_y) at β = 0 to the mean of (max_c s - s_y) as
    β → ∞, so its sign at the end searched towards says whether the optimum is that end (T → 0
    or ∞) or a finite T past the bound (scores of a very small or large scale)."""
    spread = f"their largest spread within a row is {float((s.amax(-1) - s.amin(-1)).max()):.3g}"
    if direction > 0:  # towards T → 0
        if bool((true >= s.amax(-1)).all()):
            return (
                "every validation point is predicted right (its label has its row's largest "
                "score): the NLL falls as T → 0, towards one-hot predictions"
            )
        return (
            "the optimum is a smaller T, though not every point is predicted right: the "
            f"scores' scale is small ({spread}){wider}"
        )
    if float((s.mean(-1) - true).mean()) >= 0:
        return (
            "the scores are anti-correlated with the labels (a label's score is at or below "
            "its row's mean on average): the NLL falls towards the uniform prediction (T → ∞)"
        )
    return f"the optimum is a larger T: the scores' scale is large ({spread}){wider}"


def _warn_bound(label: str, t: float, s: Tensor, true: Tensor, direction: float) -> None:
    """The warning of a temperature at a bound, naming the calibrator (`label`) and the cause."""
    if not len(s) or bool((s.amax(-1) == s.amin(-1)).all()):  # g = 0 for every T
        message = (
            f"{label}: the scores are equal within every validation row (constant logits): "
            f"they say nothing of the labels and the NLL does not depend on the temperature; "
            f"T = {t:g} is kept"
        )
    else:
        wider = "; widen `bounds` to reach it" if label == TemperatureScaling.label else ""
        message = (
            f"{label}: the optimal temperature is at or beyond T = {t:g} (a bound of the "
            "search, or where the NLL stops changing in float64): "
            f"{_bound_cause(s, true, direction, wider)}; T = {t:g} is used"
        )
    warnings.warn(message, stacklevel=5)
