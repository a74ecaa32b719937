"""Metrics of conformal prediction sets and intervals: pure functions of the sets (or
intervals) and the labels (or targets), computed in float64.

`sets` are bool `[N, C]` (`ConformalClassifier.predict_set`), `intervals` float `[N, 2]`
(lower, upper; `ConformalRegressor.predict_interval`), `y` labels `[N]` (targets for intervals).

- `coverage(sets_or_intervals, y)`: the fraction of points whose set (interval) holds y;
- `mean_size(sets_or_intervals)`: mean set size (mean interval width);
- `size_stratified_coverage(sets, y)`: `{size: (coverage, count)}` per set size (Angelopoulos
  et al. 2021's SSC: adaptive sets cover alike at every size);
- `class_coverage(sets, y, classes)`: coverage per class `[C]` (NaN for a class without points);
  `worst_class_coverage`: its minimum over the classes present;
- `conformal_metrics(sets, y, metrics)`: the selected ones as a dict (`CONFORMAL_METRICS`);
- `ConformalStream`: the same, accumulated batch by batch (state O(C²) counts), as
  `peg.evaluate` computes them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import Tensor

from peg.source._values import as_tensor

CONFORMAL_METRICS = ("coverage", "set_size", "worst_class_coverage", "worst_size_coverage")


def _sets(sets: Any, name: str = "sets") -> Tensor:
    t = as_tensor(sets, name)
    if t.ndim != 2 or t.shape[0] == 0:
        raise ValueError(
            f"{name}: expected prediction sets [N, C] or intervals [N, 2], got "
            f"shape {tuple(t.shape)}"
        )
    return t


def _labels(y: Any, sets: Tensor) -> Tensor:
    t = as_tensor(y, "y", sets.device)
    if t.ndim != 1 or t.shape[0] != sets.shape[0]:
        raise ValueError(f"y: expected {sets.shape[0]} labels [N], got shape {tuple(t.shape)}")
    if sets.dtype == torch.bool:
        t = t.long()
        if len(t) and (t.min() < 0 or t.max() >= sets.shape[1]):
            raise ValueError(f"y: expected labels in [0, {sets.shape[1]})")
    return t


def covered(sets: Any, y: Any) -> Tensor:
    """Whether each point's set (interval) holds its label (target), `[N]` bool."""
    s = _sets(sets)
    t = _labels(y, s)
    if s.dtype == torch.bool:
        return s.gather(1, t[:, None])[:, 0]
    if s.shape[1] != 2:
        raise ValueError(f"sets: intervals are [N, 2] (lower, upper), got {tuple(s.shape)}")
    t = t.double()
    return (s[:, 0].double() <= t) & (t <= s[:, 1].double())


def coverage(sets: Any, y: Any) -> float:
    """Empirical coverage in [0, 1]: the fraction of sets (intervals) holding y."""
    return float(covered(sets, y).double().mean())


def sizes(sets: Any) -> Tensor:
    """Set sizes `[N]` (int64) or interval widths `[N]` (float64)."""
    s = _sets(sets)
    if s.dtype == torch.bool:
        return s.sum(1)
    return s[:, 1].double() - s[:, 0].double()


def mean_size(sets: Any) -> float:
    """Mean set size (mean interval width)."""
    return float(sizes(sets).double().mean())


def size_stratified_coverage(sets: Any, y: Any) -> dict[int, tuple[float, int]]:
    """`{size: (coverage, count)}` for every set size that occurs, in increasing size."""
    hit, size = covered(sets, y), sizes(sets)
    out = {}
    for k in torch.unique(size).tolist():
        at = size == k
        out[int(k)] = (float(hit[at].double().mean()), int(at.sum()))
    return out


def class_coverage(sets: Any, y: Any) -> Tensor:
    """Coverage of each class's points `[C]` float64 (NaN where a class has none)."""
    s = _sets(sets)
    t = _labels(y, s)
    hit = covered(s, t).double()
    n = torch.bincount(t, minlength=s.shape[1]).double()
    return torch.bincount(t, weights=hit, minlength=s.shape[1]) / n


def worst_class_coverage(sets: Any, y: Any) -> float:
    """The lowest coverage over the classes with points."""
    per = class_coverage(sets, y)
    return float(per[~per.isnan()].min())


def check_conformal_metrics(metrics: Iterable[str]) -> tuple[str, ...]:
    keys = tuple(dict.fromkeys(metrics))
    unknown = [k for k in keys if k not in CONFORMAL_METRICS]
    if unknown:
        raise ValueError(f"metrics: unknown {unknown}; conformal: {list(CONFORMAL_METRICS)}")
    return keys


def conformal_metrics(
    sets: Any, y: Any, metrics: Iterable[str] = CONFORMAL_METRICS
) -> dict[str, float]:
    """The selected metrics of prediction sets (`CONFORMAL_METRICS`) as a dict, by key."""
    stream = ConformalStream(metrics)
    stream.update(sets, y)
    return stream.compute()


class ConformalStream:
    """Conformal metrics accumulated batch by batch: `update(sets [B, C], y [B])`, then
    `compute() -> {key: value}` (equal to `conformal_metrics` on all the batches at once)."""

    def __init__(self, metrics: Iterable[str] = CONFORMAL_METRICS) -> None:
        self.metrics = check_conformal_metrics(metrics)
        self.hits: Tensor | None = None  # [C + 1 sizes, C classes] covered counts
        self.counts: Tensor | None = None  # the same, all points

    def update(self, sets: Any, y: Any) -> None:
        s = _sets(sets)
        if s.dtype != torch.bool:
            raise ValueError("sets: the streamed metrics are for prediction sets [N, C] (bool)")
        t = _labels(y, s)
        c = s.shape[1]
        if self.hits is None:
            self.hits = torch.zeros(c + 1, c, dtype=torch.float64)
            self.counts = torch.zeros(c + 1, c, dtype=torch.float64)
        assert self.counts is not None
        if self.hits.shape[1] != c:
            raise ValueError(f"sets: expected {self.hits.shape[1]} classes, got {c}")
        cell = (s.sum(1) * c + t).cpu()  # (size, class) of each point, flattened
        hit = s.gather(1, t[:, None])[:, 0].double().cpu()
        self.hits += torch.bincount(cell, weights=hit, minlength=(c + 1) * c).view(c + 1, c)
        self.counts += torch.bincount(cell, minlength=(c + 1) * c).view(c + 1, c).double()

    def compute(self) -> dict[str, float]:
        if self.hits is None or self.counts is None:
            raise ValueError("ConformalStream: no sets seen (call update first)")
        n = self.counts.sum()
        by_size = self.hits.sum(1) / self.counts.sum(1)
        by_class = self.hits.sum(0) / self.counts.sum(0)
        size = torch.arange(len(self.counts), dtype=torch.float64)
        values = {
            "coverage": float(self.hits.sum() / n),
            "set_size": float((self.counts.sum(1) * size).sum() / n),
            "worst_class_coverage": float(by_class[~by_class.isnan()].min()),
            "worst_size_coverage": float(by_size[~by_size.isnan()].min()),
        }
        return {k: values[k] for k in self.metrics}


class SetMetrics:
    """`ConformalStream` fed with member logits: `sets_fn(logits [M, B, C]) -> sets [B, C]`
    (`ConformalClassifier.sets_fn()`) makes each batch's sets."""

    def __init__(self, sets_fn: Callable[[Tensor], Tensor], metrics: Iterable[str]) -> None:
        self.sets_fn, self.stream = sets_fn, ConformalStream(metrics)

    def update(self, logits: Tensor, y: Tensor) -> None:
        self.stream.update(self.sets_fn(logits), y)

    def compute(self) -> dict[str, float]:
        return self.stream.compute()


def split_selection(
    metrics: str | Iterable[str] | None, predictor: Any
) -> tuple[Any, tuple[str, ...], SetMetrics | None]:
    """`peg.evaluate`'s selection split into the classification metrics (as given when it
    has no conformal key), every key in order, and the conformal metrics of `predictor`'s
    sets (None when none is selected; a ValueError when `predictor` makes no sets)."""
    if metrics is None:
        return None, (), None
    try:
        keys = (metrics,) if isinstance(metrics, str) else tuple(dict.fromkeys(metrics))
    except TypeError:
        return metrics, (), None  # `check_metrics` says what is wrong
    chosen = [k for k in keys if k in CONFORMAL_METRICS]
    if not chosen:
        return metrics, keys, None
    if not hasattr(predictor, "sets_fn"):
        raise ValueError(
            f"metrics: {chosen} are metrics of prediction sets; evaluate a fitted "
            f"peg.ConformalClassifier, not a {type(predictor).__name__}"
        )
    rest = tuple(k for k in keys if k not in CONFORMAL_METRICS)
    return rest, keys, SetMetrics(predictor.sets_fn(), chosen)
