"""A fitted calibrator's map as a frozen `nn.Module` (`Calibrator.to_module()`): logits `[N, C]`
in, probabilities `[N, C]` out, for deployment graphs (`torch.export.export`, `torch.onnx.export`,
`torch.jit.trace`) with a dynamic batch dimension.

Each module holds the fitted arrays as buffers and nothing else: no fit state, no logging, no
grad-mode switch (such a switch becomes a node of the exported graph), so that the graph is the
map alone. Two checks guard its input, as `predict_proba`'s do:

- the class count: logits with another C than the map was fitted on are refused (a ValueError,
  eagerly and when traced or exported), and the graph keeps the check: the logits are reshaped
  to C columns, which fails at run time in a `torch.jit.trace` and in ONNX Runtime on any other
  width, where a map of C classes would broadcast 1 column to C or map 3 of them;
- the values: run eagerly, logits holding NaN or ±inf are refused with `predict_proba`'s
  message; in a graph (traced, exported, ONNX), which cannot raise on values, such a row comes
  out NaN, never a distribution. It computes as `predict_proba` does, in float64
(the scores are the fitted map's: log softmax of the logits, or the logits themselves where
the map was fitted on a one-member predictor's raw logits, `scores_`), with the same functions
where they export, and returns the probabilities in the logits' dtype. The one difference:
lookups in sorted arrays (bins, knots, interpolation points) count the entries at or below a
value instead of `torch.searchsorted`, which ONNX has no operator for: memory B·C·K for a batch
of B rows, C classes and K entries (isotonic regression's thresholds per class, spline
calibration's validation confidences), the same numbers.

A map fitted on an ensemble acts on its log p̄ (`scores_` "log_probs"): its module takes the
ensemble's log p̄ `[N, C]` (log softmax leaves normalised log-probabilities as they are).

The builders are registered by calibrator `method` name in `_calibrator.EXPORTS` when this
module is imported (by `peg.methods`, before any calibrator can be used).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from peg.methods.calibration import _calibrator
from peg.methods.calibration._affine import affine, finite_scores
from peg.methods.calibration._label_shift import calibrated_log_probs
from peg.methods.calibration._monotone import evaluate
from peg.methods.calibration.binning import renormalised
from peg.methods.calibration.ensemble_temperature import mixture_log_probs
from peg.methods.calibration.spline import top_label_recalibrated
from peg.source._values import check_finite_logits

__all__ = ["CalibrationMap", "interpolate"]


def _f64(t: Tensor | float) -> Tensor:
    return torch.as_tensor(t).detach().to(torch.float64).clone()


def at_or_below(x: Tensor, sorted_: Tensor) -> Tensor:
    """The number of entries of `sorted_` `[..., K]` at or below each value of `x` `[...]`
    (`torch.searchsorted(sorted_, x, right=True)`, in operators every exporter has)."""
    return (sorted_ <= x[..., None]).sum(-1)


def _take(table: Tensor, index: Tensor) -> Tensor:
    """`table[c, index[n, c]]` `[N, C]` of a per-class `table` `[C, K]`."""
    width = table.shape[1]
    offsets = torch.arange(table.shape[0], device=index.device) * width
    return table.reshape(-1)[index + offsets]


def interpolate(x: Tensor, xs: Tensor, ys: Tensor) -> Tensor:
    """`numpy.interp` of each column of `x` `[N, C]` on its points (xs, ys) `[C, L]` (xs
    non-decreasing, L >= 2): linear between them, constant beyond the ends."""
    x = torch.minimum(torch.maximum(x, xs[:, 0]), xs[:, -1])
    right = at_or_below(x, xs[None]).clamp(1, xs.shape[1] - 1)
    x0, x1 = _take(xs, right - 1), _take(xs, right)
    y0, y1 = _take(ys, right - 1), _take(ys, right)
    width = x1 - x0
    share = torch.where(width > 0, (x - x0) / width.clamp_min(1e-300), torch.ones_like(x))
    return y0 + share * (y1 - y0)


def _padded(points: Sequence[Tensor], length: int) -> Tensor:
    """1-D arrays `[L_c]` as one `[C, length]`, each continued by its last value (which
    `interpolate` reads as the same function)."""
    return torch.stack([torch.cat([p, p[-1:].expand(length - len(p))]) for p in points])


def _eager() -> bool:
    """Run as Python, not recorded into a graph (`torch.jit.trace`, `torch.export`, the ONNX
    exporters, `torch.compile`), where a check of values has nothing to compare."""
    return not (torch.jit.is_tracing() or torch.compiler.is_compiling())


class CalibrationMap(nn.Module):
    """Logits `[N, C]` -> calibrated probabilities `[N, C]` (in the logits' dtype), computed
    in float64: the scores the map was fitted on (`scores`: "log_probs", log softmax of the
    logits, or "logits", the logits as they are), mapped by `log_probs`, then the softmax.
    `classes`: C of the fitted map (set by `to_module`; None, a map of an older archive that
    did not record it: any C)."""

    classes: int | None = None

    def __init__(self, scores: str) -> None:
        super().__init__()
        self.normalise = scores == "log_probs"  # fixed at export: no branch in the graph

    def log_probs(self, s: Tensor) -> Tensor:
        """Calibrated log-scores `[N, C]` (float64) of scores `s` `[N, C]`."""
        raise NotImplementedError

    def forward(self, logits: Tensor) -> Tensor:
        if self.classes is not None:
            # checked when exported too (C is a constant there); a trace has the reshape's
            if not torch.jit.is_tracing() and logits.shape[-1] != self.classes:
                raise ValueError(
                    f"logits: this map was fitted on {self.classes} classes, got logits with "
                    f"{logits.shape[-1]} columns (shape {tuple(logits.shape)})"
                )
            # kept in the graph: a reshape to C columns fails on any other width at run time
            logits = logits.reshape((*logits.shape[:-1], self.classes))
        if _eager():
            check_finite_logits(logits, "logits")  # predict_proba's refusal, with its message
        z = logits.to(torch.float64)
        s = z.log_softmax(-1) if self.normalise else z
        p = self.log_probs(s).softmax(-1)
        finite = torch.isfinite(z).all(-1, keepdim=True)  # in a graph: NaN rows, no guess
        return torch.where(finite, p, torch.full_like(p, float("nan"))).to(logits.dtype)


class Temperature(CalibrationMap):
    """Temperature scaling: s / T."""

    temperature: Tensor

    def __init__(self, scores: str, temperature: float) -> None:
        super().__init__(scores)
        self.register_buffer("temperature", _f64(temperature))

    def log_probs(self, s: Tensor) -> Tensor:
        return s / self.temperature


class Affine(CalibrationMap):
    """Vector and matrix scaling, Dirichlet calibration: s W^T + b (W `[C, C]`, or `[C]`)."""

    weights: Tensor
    bias: Tensor

    def __init__(self, scores: str, weights: Tensor, bias: Tensor) -> None:
        super().__init__(scores)
        self.register_buffer("weights", _f64(weights))
        self.register_buffer("bias", _f64(bias))

    def log_probs(self, s: Tensor) -> Tensor:
        return affine(s, self.weights, self.bias)


class Mixture(CalibrationMap):
    """Ensemble temperature scaling: w · (softmax(s / T), softmax(s), 1 / C)."""

    temperature: Tensor
    weights: Tensor

    def __init__(self, scores: str, temperature: float, weights: Tensor) -> None:
        super().__init__(scores)
        self.register_buffer("temperature", _f64(temperature))
        self.register_buffer("weights", _f64(weights))

    def log_probs(self, s: Tensor) -> Tensor:
        temperature: Any = self.temperature  # a 0-d buffer where a float is documented
        return mixture_log_probs(s, temperature, self.weights)


class TopLabel(CalibrationMap):
    """Spline calibration: the top-label confidence interpolated on (confidences, calibrated),
    the other classes renormalised (`spline.top_label_recalibrated`)."""

    confidences: Tensor
    calibrated: Tensor

    def __init__(self, scores: str, confidences: Tensor, calibrated: Tensor, floor: float) -> None:
        super().__init__(scores)
        self.register_buffer("confidences", _f64(confidences)[None])
        self.register_buffer("calibrated", _f64(calibrated)[None])
        self.floor = float(floor)

    def log_probs(self, s: Tensor) -> Tensor:
        if torch.onnx.is_in_onnx_export() and torch.jit.is_tracing():
            raise TypeError(
                "torch.onnx.export: the TorchScript exporter (dynamo=False) has no ONNX "
                "operator for spline calibration's logaddexp; export with dynamo=True (the "
                "default since torch 2.9; needs onnxscript: pip install 'peg[export]')"
            )
        log_p = s.log_softmax(-1)
        top = log_p.max(-1).values.exp()[:, None]
        q = interpolate(top, self.confidences, self.calibrated)[:, 0]
        return top_label_recalibrated(log_p, q, self.floor)


class Monotone(CalibrationMap):
    """Order-preserving scaling: one monotone piecewise-linear g of every score."""

    knots: Tensor
    slopes: Tensor
    anchors: Tensor
    base: Tensor

    def __init__(self, scores: str, knots: Tensor, slopes: Tensor) -> None:
        super().__init__(scores)
        self.register_buffer("knots", _f64(knots))
        self.register_buffer("slopes", _f64(slopes))
        self.register_buffer("anchors", torch.cat([self.knots[:1], self.knots]))
        # g at each piece's anchor, computed once here: the graph has no diff or cumsum, which
        # the TorchScript ONNX exporter lacks (`_monotone.evaluate` at offset 0)
        pieces = torch.arange(len(self.slopes))
        zero = torch.zeros(len(self.slopes), dtype=torch.float64)
        self.register_buffer("base", evaluate(pieces, zero, self.knots, self.slopes))

    def log_probs(self, s: Tensor) -> Tensor:
        s = finite_scores(s)
        idx = at_or_below(s, self.knots)  # the piece of each score (`_monotone.pieces`)
        return self.base[idx] + self.slopes[idx] * (s - self.anchors[idx])


class Binned(CalibrationMap):
    """Histogram binning: each class's p̄_c replaced by its bin's value (empty bins: p̄_c
    kept), floored and renormalised (`binning.renormalised`)."""

    inner: Tensor
    values: Tensor
    empty: Tensor

    def __init__(self, scores: str, edges: Tensor, values: Tensor, floor: float) -> None:
        super().__init__(scores)
        values = _f64(values)
        self.register_buffer("inner", _f64(edges)[:, 1:-1].contiguous())  # [C, bins - 1]
        self.register_buffer("values", values.nan_to_num(0.0))
        self.register_buffer("empty", values.isnan())
        self.floor = float(floor)

    def log_probs(self, s: Tensor) -> Tensor:
        p = s.exp()
        index = at_or_below(p, self.inner[None])
        q = torch.where(_take(self.empty, index), p, _take(self.values, index))
        return renormalised(q, self.floor)


class Interpolated(CalibrationMap):
    """Isotonic regression: each class's p̄_c interpolated on its thresholds, floored and
    renormalised."""

    xs: Tensor
    ys: Tensor

    def __init__(self, scores: str, thresholds: Sequence[tuple[Tensor, Tensor]], floor: float):
        super().__init__(scores)
        length = max(2, *(len(xs) for xs, _ in thresholds))
        self.register_buffer("xs", _padded([_f64(xs) for xs, _ in thresholds], length))
        self.register_buffer("ys", _padded([_f64(ys) for _, ys in thresholds], length))
        self.floor = float(floor)

    def log_probs(self, s: Tensor) -> Tensor:
        return renormalised(interpolate(s.exp(), self.xs, self.ys), self.floor)


class PriorShift(CalibrationMap):
    """`LabelShift`: softmax(s / T + b) reweighted by the target-to-source prior ratios."""

    temperature: Tensor
    bias: Tensor
    log_weights: Tensor

    def __init__(self, scores: str, temperature: float, bias: Tensor, weights: Tensor) -> None:
        super().__init__(scores)
        self.register_buffer("temperature", _f64(temperature))
        self.register_buffer("bias", _f64(bias))
        tiny = torch.finfo(torch.float64).tiny
        self.register_buffer("log_weights", _f64(weights).clamp_min(tiny).log())

    def log_probs(self, s: Tensor) -> Tensor:
        temperature: Any = self.temperature  # a 0-d buffer where a float is documented
        cal = calibrated_log_probs(s, temperature, self.bias)
        return cal + self.log_weights


def _affine(c: Any) -> CalibrationMap:
    return Affine(c.scores_, c.weights_, c.bias_)


BUILDERS: dict[str, Callable[[Any], CalibrationMap]] = {
    "temperature": lambda c: Temperature(c.scores_, c.temperature_),
    "vector-scaling": _affine,
    "matrix-scaling": _affine,
    "dirichlet": _affine,
    "ensemble-temperature": lambda c: Mixture(c.scores_, c.temperature_, c.weights_),
    "spline": lambda c: TopLabel(c.scores_, c.confidences_, c.calibrated_, c.floor),
    "order-preserving": lambda c: Monotone(c.scores_, c.knots_, c.slopes_),
    "histogram-binning": lambda c: Binned(c.scores_, c.bin_edges_, c.bin_values_, c.floor),
    "isotonic": lambda c: Interpolated(c.scores_, c.thresholds_, c.floor),
    "label_shift": lambda c: PriorShift(c.scores_, c.temperature_, c.bias_, c.weights_),
}


def _with_classes(build: Callable[[Any], CalibrationMap]) -> Callable[[Any], CalibrationMap]:
    """`build` whose module checks its logits' C against the fitted map's."""

    def built(c: Any) -> CalibrationMap:
        module = build(c)
        module.classes = c._fitted_classes()
        return module

    return built


_calibrator.EXPORTS.update({name: _with_classes(b) for name, b in BUILDERS.items()})
