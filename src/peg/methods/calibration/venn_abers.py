"""Inductive Venn-ABERS prediction (Vovk & Petej 2014, "Venn-Abers predictors", UAI; Vovk,
Petej & Fedorova 2015, "Large-scale probabilistic predictors with and without guarantees of
validity", NeurIPS).

A map of two-column rows (`kinds` binary and multilabel): s is the logit of the second
column. For a test score s, isotonic regression of the labels on the scores of the
calibration set with (s, 0) added gives p0 at s, and with (s, 1) added gives p1: the
multiprobability prediction [p0, p1] (p0 <= p1), one of which is valid (perfectly
calibrated, under exchangeability: E[y | p_y] = p_y). `predict_proba` gives the merged
p = p1 / (1 - p0 + p1) (the log-loss minimax of the two), `predict_interval` [p0, p1].

Computed as the second paper's algorithms 1-4: with the calibration scores' distinct values
x_1 < ... < x_K (w_k points each, of which y_k labelled 1), the cumulative sum diagram
P_0 = (0, 0), P_k = (Σ w, Σ y). p1 for a test point placed before x_k (or tied with it: the
same fit, a label 1 pools with the next group) is the slope of the greatest convex minorant of
the diagram with the segment (1, 1) inserted there; one stack scan of the diagram from the
left gives it for every k in O(K), and a scan from the right p0 for a label 0 after x_k (or
tied with it). The coordinates are integers (counts), so every turn is decided exactly. A
score above every x_k has p1 = 1 (the label 1 stays alone at the top), one below every x_k
p0 = 0. So the map is a lookup: `thresholds_` (the x_k) and the tables `p0_` and `p1_`
`[K + 1]`, indexed by the number of thresholds at or below s (p0) and strictly below s (p1).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import torch
from torch import Tensor

from peg.errors import ArchiveError
from peg.methods import _constraints as checks
from peg.methods._predictors import member_logits_of, scores_of
from peg.methods.base import store_arguments
from peg.methods.calibration._calibrator import Calibrator, stored
from peg.methods.calibration._export import CalibrationMap, as_f64, at_or_below
from peg.methods.calibration.platt import binary_score
from peg.source import Data
from peg.source._kinds import IGNORE_INDEX
from peg.source._namespace import like_input
from peg.source.batches import BatchFn

__all__ = ["VennAbers", "venn_abers_tables"]

Point = tuple[int, int]


def _cross(a: Point, b: Point, c: Point) -> int:
    """(b - a) × (c - b): > 0 a left turn at b, < 0 a right turn, 0 collinear."""
    return (b[0] - a[0]) * (c[1] - b[1]) - (b[1] - a[1]) * (c[0] - b[0])


def _slope(a: Point, b: Point) -> float:
    return (b[1] - a[1]) / (b[0] - a[0])


def _below(t: Point, a: Point, b: Point) -> bool:
    """Whether t lies strictly below the line through a and b (a ≠ b in x): (r - l) × (t - l)
    < 0 with l, r the one of them on the left and the one on the right."""
    left, right = (a, b) if a[0] < b[0] else (b, a)
    return _cross(left, right, t) < 0


def _ones(points: list[Point]) -> list[float]:
    """p1 for a test point before group k (k = 1..K) of the diagram `points` P_0..P_K."""
    k = len(points) - 1
    p = {-1: (-1, -1), **dict(enumerate(points))}  # P_{-1}: the inserted (1, 1) at the start
    stack = [p[-1], p[0]]
    for i in range(1, k + 1):  # the greatest convex minorant of P_{-1}, ..., P_K
        while len(stack) > 1 and _cross(stack[-2], stack[-1], p[i]) <= 0:
            stack.pop()
        stack.append(p[i])
    stack.reverse()
    out = []
    for i in range(1, k + 1):
        out.append(_slope(stack[-1], stack[-2]))
        # the (1, 1) segment moves one group right: P_{i-1} becomes the shifted one
        p[i - 1] = (p[i - 2][0] + p[i][0] - p[i - 1][0], p[i - 2][1] + p[i][1] - p[i - 1][1])
        if not _below(p[i - 1], stack[-1], stack[-2]):
            continue
        stack.pop()
        while len(stack) > 1 and _cross(p[i - 1], stack[-1], stack[-2]) <= 0:
            stack.pop()
        stack.append(p[i - 1])
    return out


def _zeros(points: list[Point]) -> list[float]:
    """p0 for a test point after group k (k = 1..K) of the diagram `points` P_0..P_K."""
    k = len(points) - 1
    p = dict(enumerate(points))
    p[k + 1] = (p[k][0] + 1, p[k][1])  # the inserted (1, 0) at the end
    stack = [p[k + 1], p[k]]
    for i in range(k - 1, -1, -1):
        while len(stack) > 1 and _cross(stack[-2], stack[-1], p[i]) >= 0:
            stack.pop()
        stack.append(p[i])
    stack.reverse()
    out = [0.0] * (k + 1)
    for i in range(k, 0, -1):
        out[i] = _slope(stack[-1], stack[-2])
        p[i] = (p[i - 1][0] + p[i + 1][0] - p[i][0], p[i - 1][1] + p[i + 1][1] - p[i][1])
        if not _below(p[i], stack[-1], stack[-2]):
            continue
        stack.pop()
        while len(stack) > 1 and _cross(p[i], stack[-1], stack[-2]) >= 0:
            stack.pop()
        stack.append(p[i])
    return out[1:]


def venn_abers_tables(s: Tensor, y: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(thresholds `[K]`, p0 `[K + 1]`, p1 `[K + 1]`) of calibration scores s `[N]` and labels
    y `[N]` in {0, 1} (the module doc): for a test score t, p0 = p0[#(thresholds <= t)] and
    p1 = p1[#(thresholds < t)] (float64)."""
    thresholds, groups = torch.unique(s.double(), sorted=True, return_inverse=True)
    counts = torch.bincount(groups, minlength=len(thresholds)).cumsum(0).tolist()
    ones = torch.bincount(groups, y.long(), minlength=len(thresholds)).round().long()
    points = [(0, 0), *zip(counts, ones.cumsum(0).tolist(), strict=True)]
    p0 = torch.tensor([0.0, *_zeros(points)], dtype=torch.float64)
    p1 = torch.tensor([*_ones(points), 1.0], dtype=torch.float64)
    return thresholds, p0, p1


def _bounds(d: Tensor, thresholds: Tensor, p0: Tensor, p1: Tensor) -> tuple[Tensor, Tensor]:
    """(p0, p1) `[R]` of scores d `[R]` by the tables (counts of thresholds, no searchsorted:
    the exported module's lookup too)."""
    at_or_under = at_or_below(d, thresholds)
    under = (thresholds < d[:, None]).sum(-1)
    return p0[at_or_under], p1[under]


def _merged_rows(p0: Tensor, p1: Tensor) -> Tensor:
    """Log-probability rows [log(1 - p), log p] `[R, 2]` of p = p1 / (1 - p0 + p1) (0 < p1,
    p0 < 1: both logs finite)."""
    total = torch.log(1 - p0 + p1)
    return torch.stack([torch.log1p(-p0) - total, torch.log(p1) - total], -1)


class Lookup(CalibrationMap):
    """Venn-ABERS: the merged probability read from the tables of the calibration set."""

    thresholds: Tensor
    p0: Tensor
    p1: Tensor

    def __init__(self, scores: str, thresholds: Tensor, p0: Tensor, p1: Tensor) -> None:
        super().__init__(scores)
        self.register_buffer("thresholds", as_f64(thresholds))
        self.register_buffer("p0", as_f64(p0))
        self.register_buffer("p1", as_f64(p1))

    def log_probs(self, s: Tensor) -> Tensor:
        low, high = _bounds(s[:, 1] - s[:, 0], self.thresholds, self.p0, self.p1)
        return _merged_rows(low, high)


class VennAbers(Calibrator):
    """Inductive Venn-ABERS predictor of a binary scorer (Vovk & Petej 2014; Vovk, Petej &
    Fedorova 2015, `peg.methods.calibration.venn_abers`): for each test score, the isotonic
    fits of the calibration set with the test point labelled 0 and labelled 1 give [p0, p1];
    `predict_proba` gives the merged p = p1 / (1 - p0 + p1), `predict_interval` [p0, p1].

    It takes a binary scorer's scores `[N]` (or `[N, 1]`) with 0/1 labels, and a multilabel
    head's logits `[N, K]` with multi-hot labels (one shared map, or one per label with
    `per_label=True`); it acts on their canonical rows `[0, s]` (`peg.source._kinds`). The
    fitted map holds the validation scores' distinct values (its archive too): memory K per
    row predicted by the exported module's lookup, K the distinct validation scores.

    Args:
        batch_size: rows per forward pass.
        batch_fn: `batch_fn(batch) -> (inputs, y)` for loader batches of another shape
            (`peg.source.batches`).
        task: the kind of input, read from the logits' and labels' shapes ("auto"), or
            "binary" or "multilabel" where the shapes could be either (`peg.source._kinds`).
        ignore_index: labels equal to it are left out of the fit (torch's -100).
        per_label: on a multilabel head, one map per label instead of one shared map.
        class_dim: unused by a map of two-column rows (dense input is not among its kinds);
            accepted as by every calibrator.

    After `fit(predictor, val)`: `thresholds_` `[K]`, `p0_` and `p1_` `[K + 1]` (the tables;
    per label: `label_maps_`, one fitted map per label), `kind_`, `predictor_`, `meta_`;
    `predict_proba(X)` (the merged P(y = 1) in the input's shape: `[N]`, or `[N, K]` for a
    multilabel head), `predict_interval(X)` ([p0, p1] in the input's shape and a last
    dimension of 2: `[N, 2]`, `[N, K, 2]`), `predict`, `member_logits(X)`, `save` /
    `peg.load`, `to_module()`.

    Examples:
        >>> import torch, peg
        >>> g = torch.Generator().manual_seed(0)
        >>> y = torch.randint(0, 2, (600,), generator=g)
        >>> s = 3.0 * (2 * y - 1) + 2 * torch.randn(600, generator=g)  # scores [N]
        >>> va = peg.VennAbers().fit(s[:400], y[:400])
        >>> interval = va.predict_interval(s[400:])  # [N, 2]: p0 <= p1
        >>> bool((interval[:, 0] <= interval[:, 1]).all())
        True
        >>> p = va.predict_proba(s[400:])  # merged, within [p0, p1]
        >>> bool(((interval[:, 0] <= p + 1e-6) & (p <= interval[:, 1] + 1e-6)).all())
        True

    See Also:
        peg.IsotonicCalibration: the isotonic fit of the calibration set alone.
        peg.PlattScaling: two parameters, for few validation points.
        docs/calibration.md: the binary maps and when to use which.
    """

    method = "venn-abers"
    label = "Venn-ABERS"
    name = "Venn-ABERS"  # the registry's entry (`Calibrator`): compare's, AutoSelect's row
    growth = 0  # two columns whatever the task: the tables grow with the validation points
    kinds: ClassVar[tuple[str, ...]] = ("binary", "multilabel")
    order = 11
    simplicity = 8.5  # isotonic, after the isotonic map
    cost_order = 8.5

    def __init__(
        self,
        *,
        batch_size: int = 512,
        batch_fn: BatchFn | None = None,
        task: str = "auto",
        ignore_index: int = IGNORE_INDEX,
        per_label: bool = False,
        class_dim: int | None = None,
    ) -> None:
        store_arguments(self, locals())

    parameter_constraints: ClassVar[Mapping[str, checks.Check]] = {
        **Calibrator.parameter_constraints,
    }

    def _fit_map(self, scores: Tensor, y: Tensor) -> dict[str, Any]:
        thresholds, p0, p1 = venn_abers_tables(binary_score(scores).cpu(), y.cpu())
        device = scores.device
        return {"thresholds_": thresholds.to(device), "p0_": p0.to(device), "p1_": p1.to(device)}

    def _tables(self, device: torch.device) -> tuple[Tensor, Tensor, Tensor]:
        return self.thresholds_.to(device), self.p0_.to(device), self.p1_.to(device)

    def _apply(self, scores: Tensor) -> Tensor:
        return _merged_rows(*_bounds(binary_score(scores), *self._tables(scores.device)))

    def predict_interval(
        self, X: Data, batch_size: int | None = None, batch_fn: BatchFn | None = None
    ) -> Any:
        """[p0, p1] (float64) of the predictor's scores on X: the probabilities of label 1
        from the isotonic fits with the test point labelled 0 and labelled 1, in the input's
        shape with a last dimension of 2 (`[N]` scores: `[N, 2]`; a multilabel head `[N, K]`:
        `[N, K, 2]`); NumPy for NumPy inputs."""
        self._check_fitted()
        size, split = self._reading(batch_size, batch_fn)
        logits = member_logits_of(self.predictor_, X, size, split)
        if self._multiclass():  # an archive that recorded no kind: two-column rows
            self._check_width(logits, "X")
            rows = logits
        else:
            rows = self._kind().rows(logits, "X")  # [M, R, 2]
        d = binary_score(scores_of(rows, self.scores_, "X"))
        maps = self.__dict__.get("label_maps_") or [self]
        out = torch.empty(len(d), 2, dtype=torch.float64, device=d.device)
        for k, fitted in enumerate(maps):  # per label: label k's tables on its rows k::K
            out[k :: len(maps)] = torch.stack(
                _bounds(d[k :: len(maps)], *fitted._tables(d.device)), -1
            )
        shape = logits.shape[1:] if rows is not logits else logits.shape[1:-1]
        return like_input(out.reshape(*shape, 2), X)

    def _module(self) -> CalibrationMap:
        """The fitted map as a module (`to_module`)."""
        return Lookup(self.scores_, self.thresholds_, self.p0_, self.p1_)

    def _tensors(self) -> dict[str, Tensor]:
        return {"thresholds": self.thresholds_, "p0": self.p0_, "p1": self.p1_}

    def _restore(self, entry: Mapping[str, Any], tensors: Mapping[str, Tensor]) -> dict[str, Any]:
        xs = stored(tensors, "thresholds")
        if xs.ndim != 1 or not len(xs) or not bool((xs.diff() > 0).all()):
            raise ArchiveError("calibration: 'thresholds' must be a 1-D increasing array")
        p0 = stored(tensors, "p0", (len(xs) + 1,))
        p1 = stored(tensors, "p1", (len(xs) + 1,))
        if not bool(((p0 >= 0) & (p0 < 1) & (p1 > 0) & (p1 <= 1) & (p0 <= p1)).all()):
            raise ArchiveError("calibration: 'p0' and 'p1' must hold 0 <= p0 <= p1 <= 1, p0 < 1")
        return {"thresholds_": xs, "p0_": p0, "p1_": p1}
