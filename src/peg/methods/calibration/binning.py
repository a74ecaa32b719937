"""Non-parametric one-vs-rest calibrators: histogram binning (Zadrozny & Elkan 2001) and
isotonic regression (Zadrozny & Elkan 2002).

Both act on the averaged prediction p̄ `[N, C]` (exp of log p̄, what temperature scaling
scales), one class at a time: class c's probability p̄_c is mapped by a monotone (isotonic)
or piecewise-constant (binning) function fitted to the indicator 1[y = c] on validation data.
The C mapped values q_c of a row need not sum to 1, and may be 0: each is raised to `floor`
first (so the NLL stays finite), then the row is divided by its sum, p_c = max(q_c, floor) /
Σ_k max(q_k, floor). Every probability is then at least floor / C (the q are at most 1), and a
row whose every q_c is 0 becomes uniform. `member_logits(X)` returns log p `[1, N, C]`: the
log of the calibrated, renormalised probabilities (there are no logits), whose softmax is p.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor

from peg.errors import ArchiveError
from peg.methods import _constraints as checks
from peg.methods.base import store_arguments
from peg.methods.calibration._calibrator import Calibrator, stored
from peg.methods.calibration._export import (
    CalibrationMap,
    as_f64,
    at_or_below,
    interpolate,
    padded,
    take,
)
from peg.methods.calibration._few_points import warn_few_points
from peg.source._kinds import IGNORE_INDEX
from peg.source.batches import BatchFn
from peg.utils.memory import require_memory

STRATEGIES = ("uniform", "quantile")


def renormalised(q: Tensor, floor: float) -> Tensor:
    """log p `[N, C]` from per-class calibrated values q `[N, C]` in [0, 1]: each raised to
    `floor`, the row divided by its sum (see the module doc)."""
    q = q.clamp_min(floor)
    return (q / q.sum(-1, keepdim=True)).log()


def _labelled_rows(scores: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
    """p̄ `[N, C]` (float64) and labels of the rows whose scores are not NaN."""
    p = scores.detach().double().exp()
    keep = ~torch.isnan(p).any(-1)
    return p[keep], y[keep].long()


class Binned(CalibrationMap):
    """Histogram binning: each class's p̄_c replaced by its bin's value (empty bins: p̄_c
    kept), floored and renormalised (`binning.renormalised`)."""

    inner: Tensor
    values: Tensor
    empty: Tensor

    def __init__(self, scores: str, edges: Tensor, values: Tensor, floor: float) -> None:
        super().__init__(scores)
        values = as_f64(values)
        self.register_buffer("inner", as_f64(edges)[:, 1:-1].contiguous())  # [C, bins - 1]
        self.register_buffer("values", values.nan_to_num(0.0))
        self.register_buffer("empty", values.isnan())
        self.floor = float(floor)

    def log_probs(self, s: Tensor) -> Tensor:
        p = s.exp()
        index = at_or_below(p, self.inner[None])
        q = torch.where(take(self.empty, index), p, take(self.values, index))
        return renormalised(q, self.floor)


class Interpolated(CalibrationMap):
    """Isotonic regression: each class's p̄_c interpolated on its thresholds, floored and
    renormalised."""

    xs: Tensor
    ys: Tensor

    def __init__(self, scores: str, thresholds: Sequence[tuple[Tensor, Tensor]], floor: float):
        super().__init__(scores)
        length = max(2, *(len(xs) for xs, _ in thresholds))
        self.register_buffer("xs", padded([as_f64(xs) for xs, _ in thresholds], length))
        self.register_buffer("ys", padded([as_f64(ys) for _, ys in thresholds], length))
        self.floor = float(floor)

    def log_probs(self, s: Tensor) -> Tensor:
        return renormalised(interpolate(s.exp(), self.xs, self.ys), self.floor)


class _OneVsRest(Calibrator):
    """What histogram binning and isotonic regression share: `floor`, the renormalisation."""

    class_wise = True

    floor: float

    parameter_constraints: ClassVar[Mapping[str, checks.Check]] = {
        "floor": checks.interval(0, 1),
        **Calibrator.parameter_constraints,
    }

    def _warn_few(self, y: Tensor, classes: int) -> None:
        warn_few_points(
            y, classes, self.label,
            "its per-class maps rest on a handful of points: temperature scaling (one "
            "parameter) is safer",
        )  # fmt: skip

    def _apply(self, scores: Tensor) -> Tensor:
        p = scores.double().exp()
        return renormalised(self._map(p), float(self.floor))

    def _map(self, p: Tensor) -> Tensor:
        raise NotImplementedError


class HistogramBinning(_OneVsRest):
    """Histogram binning (Zadrozny & Elkan 2001, "Obtaining calibrated probability estimates
    from decision trees and naive Bayesian classifiers", ICML), one-vs-rest.

    For each class c, [0, 1] is cut into `n_bins` bins of p̄_c, [e_k, e_k+1) (the last one
    closed); the calibrated value of a bin is the fraction of the validation points in it whose
    label is c. An empty bin keeps the uncalibrated p̄_c (it has nothing to say). The values
    are then floored and renormalised over the classes (`peg.methods.calibration.binning`).

    Args:
        n_bins: bins per class (Zadrozny & Elkan use 10).
        strategy: "uniform" (equal-width bins) or "quantile" (equal-mass: the edges are the
            quantiles of p̄_c on the validation data; tied quantiles leave empty bins).
        floor: the least calibrated value of a class before renormalising, in (0, 1).
        batch_size: rows per forward pass.
        batch_fn: `batch_fn(batch) -> (inputs, y)` for loader batches of another shape.
        task: the kind of input, read from the logits' and labels' shapes ("auto"), or
            "multiclass", "binary" or "multilabel" where the shapes could be either
            (`peg.source._kinds`).
        ignore_index: labels equal to it are left out of the fit (torch's -100; 255 in
            Cityscapes and VOC).
        per_label: on a multilabel head, one map per label instead of one shared map.
        class_dim: where dense logits hold the classes, 1 (`[B, C, *S]`) or -1 (`[B, *S, C]`, a
            language model's); None: read from the shapes (an error where both read).

    After `fit(predictor, val)`: `bin_edges_` `[C, n_bins + 1]`, `bin_values_` `[C, n_bins]`
    (NaN: an empty bin), `predictor_`, `meta_`; `member_logits(X) -> [1, N, C]` (log of the
    calibrated probabilities), `predict_proba`, `predict`, `save` / `peg.load`.
    """

    method = "histogram-binning"
    label = "histogram binning"
    name = "Hist. binning"  # the registry's entry (`Calibrator`): compare's, AutoSelect's row
    kinds = ("multiclass", "binary", "multilabel")
    table_name = "Hist-binned"
    growth = 1  # bins per class
    order = 4
    simplicity = 7
    cost_order = 7

    def __init__(
        self,
        *,
        n_bins: int = 10,
        strategy: str = "uniform",
        floor: float = 1e-6,
        batch_size: int = 512,
        batch_fn: BatchFn | None = None,
        task: str = "auto",
        ignore_index: int = IGNORE_INDEX,
        per_label: bool = False,
        class_dim: int | None = None,
    ) -> None:
        store_arguments(self, locals())

    parameter_constraints: ClassVar[Mapping[str, checks.Check]] = {
        "n_bins": checks.positive_int(),
        "strategy": checks.one_of(*STRATEGIES),
        **_OneVsRest.parameter_constraints,
    }

    def _check_classes(self, classes: int) -> None:
        """`n_bins` refused before fitting where the map's four float64 `[C, n_bins + 1]`
        arrays cannot fit in memory (unchecked, 10⁹ bins were allocated until the OOM killer)."""
        super()._check_classes(classes)
        need = 4 * 8 * classes * (int(self.n_bins) + 1)
        what = f"four float64 [{classes}, n_bins + 1] arrays: edges, counts, values"
        require_memory("n_bins", self.n_bins, need, torch.device("cpu"), what)

    def _fit_map(self, scores: Tensor, y: Tensor) -> dict[str, Any]:
        p, y = _labelled_rows(scores, y)
        c, bins = p.shape[1], int(self.n_bins)
        self._warn_few(y, c)
        cuts = torch.linspace(0, 1, bins + 1, dtype=p.dtype, device=p.device)
        if self.strategy == "uniform":
            edges = cuts.expand(c, -1).clone()
        else:
            # NumPy's quantiles (linear interpolation, as torch.quantile's, without its size cap)
            quantiles = np.quantile(p.cpu().numpy(), cuts.cpu().numpy(), axis=0)
            edges = torch.from_numpy(quantiles).to(p).T.contiguous()  # [C, bins + 1]
            edges[:, 0], edges[:, -1] = 0.0, 1.0  # all of [0, 1]: no point falls outside
        index = _bin_index(p, edges)  # [N, C]
        counts = torch.zeros(c, bins, dtype=p.dtype, device=p.device)
        counts.scatter_add_(1, index.T, torch.ones_like(p.T))
        hits = torch.nn.functional.one_hot(y, c).to(p.dtype)
        positives = torch.zeros_like(counts).scatter_add_(1, index.T, hits.T)
        values = torch.where(counts > 0, positives / counts.clamp_min(1), torch.nan)
        return {"bin_edges_": edges, "bin_values_": values}

    def _map(self, p: Tensor) -> Tensor:
        edges, values = self.bin_edges_.to(p), self.bin_values_.to(p)
        q = values.gather(1, _bin_index(p, edges).T).T  # [N, C]
        return torch.where(torch.isnan(q), p, q)  # an empty bin: p̄_c as it is

    def _module(self) -> CalibrationMap:
        """The fitted map as a module (`to_module`)."""
        return Binned(self.scores_, self.bin_edges_, self.bin_values_, self.floor)

    def _tensors(self) -> dict[str, Tensor]:
        return {"bin_edges": self.bin_edges_, "bin_values": self.bin_values_}

    def _classes_of(self, state: Mapping[str, Any]) -> int | None:
        return int(state["bin_values_"].shape[0])

    def _restore(self, entry: Mapping[str, Any], tensors: Mapping[str, Tensor]) -> dict[str, Any]:
        values = stored(tensors, "bin_values", empty=True)
        if values.ndim != 2 or values.shape[1] != self.n_bins:
            raise ArchiveError(
                f"calibration: bin_values has shape {tuple(values.shape)}, expected [C, "
                f"{self.n_bins}]"
            )
        edges = stored(tensors, "bin_edges", (values.shape[0], self.n_bins + 1))
        return {"bin_edges_": edges, "bin_values_": values}


def _bin_index(p: Tensor, edges: Tensor) -> Tensor:
    """The bin `[N, C]` of each p̄_c: k with e_k <= p < e_k+1 (the last bin closed)."""
    inner = edges[:, 1:-1].contiguous()  # [C, bins - 1]
    return torch.searchsorted(inner, p.T.contiguous(), right=True).T


class IsotonicCalibration(_OneVsRest):
    """Isotonic regression (Zadrozny & Elkan 2002, "Transforming classifier scores into
    accurate multiclass probability estimates", KDD), one-vs-rest.

    For each class c, scikit-learn's `IsotonicRegression(out_of_bounds="clip", y_min=0,
    y_max=1)` is fitted to (p̄_c, 1[y = c]) on the validation data: the non-decreasing
    function of p̄_c closest to the labels in squared error, linear between its thresholds and
    constant beyond them. The values are then floored and renormalised over the classes
    (`peg.methods.calibration.binning`).

    Args:
        floor: the least calibrated value of a class before renormalising, in (0, 1).
        batch_size: rows per forward pass.
        batch_fn: `batch_fn(batch) -> (inputs, y)` for loader batches of another shape.
        task: the kind of input, read from the logits' and labels' shapes ("auto"), or
            "multiclass", "binary" or "multilabel" where the shapes could be either
            (`peg.source._kinds`).
        ignore_index: labels equal to it are left out of the fit (torch's -100; 255 in
            Cityscapes and VOC).
        per_label: on a multilabel head, one map per label instead of one shared map.
        class_dim: where dense logits hold the classes, 1 (`[B, C, *S]`) or -1 (`[B, *S, C]`, a
            language model's); None: read from the shapes (an error where both read).

    After `fit(predictor, val)`: `thresholds_` (per class, the fitted regressor's
    `(X_thresholds_, y_thresholds_)` as float64 tensors), `predictor_`, `meta_`;
    `member_logits(X) -> [1, N, C]` (log of the calibrated probabilities), `predict_proba`,
    `predict`. `save` stores the thresholds (no pickle); `peg.load` interpolates them as the
    regressor does.
    """

    method = "isotonic"
    label = "isotonic regression"
    name = "Isotonic"  # the registry's entry (`Calibrator`): compare's, AutoSelect's row
    kinds = ("multiclass", "binary", "multilabel")
    growth = 1  # thresholds per class
    order = 5
    simplicity = 8
    cost_order = 8

    def __init__(
        self,
        *,
        floor: float = 1e-6,
        batch_size: int = 512,
        batch_fn: BatchFn | None = None,
        task: str = "auto",
        ignore_index: int = IGNORE_INDEX,
        per_label: bool = False,
        class_dim: int | None = None,
    ) -> None:
        store_arguments(self, locals())

    def _fit_map(self, scores: Tensor, y: Tensor) -> dict[str, Any]:
        from sklearn.isotonic import IsotonicRegression

        p, y = _labelled_rows(scores, y)
        self._warn_few(y, p.shape[1])
        classes = torch.arange(p.shape[1], device=y.device)
        x, hits = p.cpu().numpy(), (y[:, None] == classes).cpu().numpy()
        thresholds = []
        for c in range(x.shape[1]):
            fitted = IsotonicRegression(out_of_bounds="clip", y_min=0.0, y_max=1.0)
            fitted.fit(x[:, c], hits[:, c].astype(np.float64))
            thresholds.append(
                (torch.from_numpy(fitted.X_thresholds_), torch.from_numpy(fitted.y_thresholds_))
            )
        return {"thresholds_": thresholds}

    def _map(self, p: Tensor) -> Tensor:
        x = p.detach().cpu().numpy()
        # IsotonicRegression.predict: clip to the thresholds' range, interpolate linearly
        q = np.stack(
            [
                np.interp(x[:, c], xs.numpy(), ys.numpy())
                for c, (xs, ys) in enumerate(self.thresholds_)
            ],
            1,
        )
        return torch.from_numpy(q).to(p)

    def _classes_of(self, state: Mapping[str, Any]) -> int | None:
        return len(state["thresholds_"])

    def _module(self) -> CalibrationMap:
        """The fitted map as a module (`to_module`)."""
        return Interpolated(self.scores_, self.thresholds_, self.floor)

    def _tensors(self) -> dict[str, Tensor]:
        xs, ys = zip(*self.thresholds_, strict=True)
        counts = torch.tensor([len(t) for t in xs], dtype=torch.int64)
        return {"x_thresholds": torch.cat(xs), "y_thresholds": torch.cat(ys), "counts": counts}

    def _restore(self, entry: Mapping[str, Any], tensors: Mapping[str, Tensor]) -> dict[str, Any]:
        counts = tensors.get("counts")
        if counts is None or counts.ndim != 1 or counts.is_floating_point() or (counts < 1).any():
            raise ArchiveError("calibration: expected the counts of thresholds per class (>= 1)")
        total = int(counts.sum())
        xs = stored(tensors, "x_thresholds", (total,)).split(counts.tolist())
        ys = stored(tensors, "y_thresholds", (total,)).split(counts.tolist())
        return {"thresholds_": list(zip(xs, ys, strict=True))}
