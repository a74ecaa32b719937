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

Here: the base every map's module derives from (`CalibrationMap`) and the lookups they share;
each calibrator builds its own module beside its `_apply` (`Calibrator._module`: `Temperature`
in `temperature.py`, `Affine` in `scaling.py`, ...); `LabelShift`'s (`PriorShift`) in
`_label_shift.py`, registered in `_calibrator.EXPORTS` by method name.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from peg.source._values import check_finite_logits

__all__ = [
    "CalibrationMap",
    "as_f64",
    "at_or_below",
    "interpolate",
    "interpolate_columns",
    "padded",
    "take",
]


def as_f64(t: Tensor | float) -> Tensor:
    return torch.as_tensor(t).detach().to(torch.float64).clone()


def at_or_below(x: Tensor, sorted_: Tensor) -> Tensor:
    """The number of entries of `sorted_` `[..., K]` at or below each value of `x` `[...]`
    (`torch.searchsorted(sorted_, x, right=True)`, in operators every exporter has)."""
    return (sorted_ <= x[..., None]).sum(-1)


def take(table: Tensor, index: Tensor) -> Tensor:
    """`table[c, index[n, c]]` `[N, C]` of a per-class `table` `[C, K]`."""
    width = table.shape[1]
    offsets = torch.arange(table.shape[0], device=index.device) * width
    return table.reshape(-1)[index + offsets]


def interpolate(x: Tensor, xs: Tensor, ys: Tensor) -> Tensor:
    """`numpy.interp` of each column of `x` `[N, C]` on its points (xs, ys) `[C, L]` (xs
    non-decreasing, L >= 2): linear between them, constant beyond the ends."""
    x = torch.minimum(torch.maximum(x, xs[:, 0]), xs[:, -1])
    right = at_or_below(x, xs[None]).clamp(1, xs.shape[1] - 1)
    x0, x1 = take(xs, right - 1), take(xs, right)
    y0, y1 = take(ys, right - 1), take(ys, right)
    width = x1 - x0
    share = torch.where(width > 0, (x - x0) / width.clamp_min(1e-300), torch.ones_like(x))
    return y0 + share * (y1 - y0)


interpolate_columns = interpolate  # beside a module's own 1-D `interpolate` (spline's)


def padded(points: Sequence[Tensor], length: int) -> Tensor:
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
