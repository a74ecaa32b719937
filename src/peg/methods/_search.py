"""Choosing a perturbation scale (PEG's η, PEP's σ): a grid, then golden section in log space.

`ScaleSearch` runs it for a fitted method (criterion, racing, early stopping, progress).

The score function is memoised, so no scale is scored twice. Where the best grid point lies
on an edge of the grid, the grid is extended outwards at its own spacing (at most `extend`
steps: with the paper's grid, η stays within 1e-6…1e3) until the score turns up. The best point
and its neighbours then bracket `scipy.optimize.minimize_scalar(method="golden")` on log(scale).
If no bracket is found (a monotone or flat score), the best point seen is kept; a score that
has gone flat (a step past the edge gains at most `tol`) stops the extension.

Early stopping (`stop_above=True`): the score function also receives the best score so far and
may stop as soon as it knows its own score exceeds it, returning any value above it (e.g. the
partial mean of a non-negative per-point loss, a lower bound). This never changes the choice:
the grid phase only needs the minimum, and every golden-section step compares the new point
with the best point so far (the interior point it keeps), so "worse than the best" is all that
is ever asked of a stopped point.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from scipy import optimize
from torch import Tensor

from peg._progress import counter
from peg.batches import take_rows
from peg.methods._criteria import (
    CRITERIA,
    PER_POINT,
    POINT_LOSSES,
    REGRESSION_CRITERIA,
    Criterion,
    is_regression,
)


def select_scale(
    score: Callable[..., float],
    grid: Sequence[float],
    refine: bool,
    maxiter: int = 8,
    xtol: float = 0.05,
    extend: int = 3,
    stop_above: bool = False,
    tol: float = 0.0,
) -> tuple[float, dict[float, float]]:
    """Minimise `score(scale)` over positive scales.

    Args:
        score: lower is better; non-finite values count as +inf (a diverged ensemble).
        grid: scales tried first (all > 0).
        refine: extend the grid past its edges if needed and run golden-section search in
            log(scale) between the best point's neighbours (scipy).
        maxiter: golden-section iterations at most (each costs one score evaluation).
        xtol: relative tolerance on log(scale) passed to scipy.
        extend: grid steps added beyond either edge at most.
        stop_above: call `score(scale, best_so_far)` instead of `score(scale)` (see above).
        tol: stop extending the grid once a step past the edge improves the best score by at
            most `tol` (a flat score: further steps cannot matter, and would cost a full
            scoring each).

    Returns:
        (best scale, {scale: score} for every scale evaluated, sorted by scale).
    """
    seen: dict[float, float] = {}
    exact = {math.log(g): float(g) for g in grid}  # grid points come back exactly as given

    def f(u: float) -> float:
        scale = exact.get(u, math.exp(u))
        if scale not in seen:
            best = min(seen.values(), default=math.inf)
            value = float(score(scale, best) if stop_above else score(scale))
            seen[scale] = value if math.isfinite(value) else math.inf
        return seen[scale]

    us = sorted(exact)
    values = [f(u) for u in us]
    if refine and len(us) >= 2:
        for _ in range(extend):
            i = min(range(len(us)), key=values.__getitem__)
            if 0 < i < len(us) - 1:
                break
            u = us[0] - (us[1] - us[0]) if i == 0 else us[-1] + (us[-1] - us[-2])
            us.insert(0 if i == 0 else len(us), u)
            values.insert(0 if i == 0 else len(values), f(u))
            old_edge, new_edge = (values[1], values[0]) if i == 0 else (values[-2], values[-1])
            if 0 < old_edge - new_edge <= tol:  # flat: one more step would not matter either
                break
        i = min(range(len(us)), key=values.__getitem__)
        if 0 < i < len(us) - 1 and values[i] < min(values[i - 1], values[i + 1]):
            optimize.minimize_scalar(
                f,
                bracket=(us[i - 1], us[i], us[i + 1]),
                method="golden",
                options={"xtol": xtol, "maxiter": maxiter},
            )
    grid_points = set(exact.values())
    best = min(seen, key=lambda s: (seen[s], s not in grid_points, s))  # ties: a grid point
    return best, dict(sorted(seen.items()))


class PairedRace:
    """Score scales by racing each new one against the best so far on the same points.

    `losses(scale, start, stop)` returns the per-point losses `[stop - start]` of the ensemble at
    `scale` on scoring points `start … stop-1` (always the same points in the same order), or
    None when its outputs are not finite. The first scale is scored on the first `first` points.
    Every later one is scored on a growing prefix of the points (`first`, then doubling, at
    most all of them) together with the incumbent, the best scale so far (extended to the same
    prefix: losses are kept, never recomputed). After each prefix the mean paired difference
    d̄ = mean(new − incumbent) and its standard error s decide: once |d̄| > z·s the answer is
    clear and scoring stops; a race still open at the last point is decided exactly.

    The score returned is the incumbent's score + d̄, so a scale ranks above the incumbent
    exactly when it lost its race: `select_scale` (which only ever compares a new scale with
    the best so far) takes the decisions an exhaustive scoring would take, and picks the same
    scale, unless a race is decided wrongly by chance. That needs |d̄| > z·s against the sign
    of the true difference: at z = 3, less than 0.14% per look at the data for a true
    difference of 0 and less for any other (benchmarks/peg_creation.py checks the chosen scale
    against scoring every point). Paired differences of two nearby scales vary much less than
    the losses themselves, which is why most races end on the first prefix.

    Attributes:
        points: scale → number of points scored.
    """

    def __init__(
        self,
        losses: Callable[[float, int, int], Tensor | None],
        n_points: int,
        z: float = 3.0,
        first: int = 1024,
    ) -> None:
        self.losses = losses
        self.n = n_points
        self.z = z
        self.first = min(first, n_points)
        self.scores: dict[float, float] = {}
        self._losses: dict[float, Tensor] = {}  # scale → per-point losses on its prefix (float64)

    @property
    def points(self) -> dict[float, int]:
        return {scale: len(v) for scale, v in self._losses.items()}

    def _extend(self, scale: float, stop: int) -> bool:
        """Losses of `scale` on the first `stop` points; False when they are not finite."""
        have = self._losses.get(scale)
        start = 0 if have is None else len(have)
        if stop > start:
            new = self.losses(scale, start, stop)
            if new is None or not bool(torch.isfinite(new).all()):
                return False
            new = new.detach().to(torch.float64).cpu()
            self._losses[scale] = new if have is None else torch.cat([have, new])
        return True

    def __call__(self, scale: float, best: float = math.inf) -> float:
        finite = {s: v for s, v in self.scores.items() if math.isfinite(v)}
        if not finite:
            ok = self._extend(scale, self.first)
            value = float(self._losses[scale].mean()) if ok else math.inf
        else:
            value = self._race(scale, min(finite, key=finite.__getitem__))
        self.scores[scale] = value
        return value

    def _race(self, scale: float, incumbent: float) -> float:
        n = self.first
        while True:
            if not self._extend(scale, n):
                return math.inf  # diverged: the worst score
            if not self._extend(incumbent, n):  # the best so far diverges on later points:
                below = self.scores[incumbent] - 1.0  # it cannot be the best: the new scale wins
                self.scores[incumbent] = math.inf
                return below
            d = self._losses[scale][:n] - self._losses[incumbent][:n]
            mean = float(d.mean())
            if n >= self.n or abs(mean) > self.z * float(d.std()) / math.sqrt(n):
                return self.scores[incumbent] + mean
            n = min(2 * n, self.n)


RACE_FIRST = 1024  # scoring points of a race's first look (`PairedRace`), doubling after


class ScaleSearch:
    """The search for a perturbation scale on held-out points: one object per `fit`.

    `build(scale)` gives the ensemble at a scale (its directions computed once, so a scale
    costs forward passes only). A criterion that is a mean of per-point losses ("nll",
    "brier") is raced (`PairedRace`, `race` > 0) or, with `race=0`, scored batch by batch and
    stopped once its partial mean exceeds the best so far (`early_stop`); any other criterion
    is scored on all the points at once. `run(grid, refine)` chooses the scale
    (`select_scale`).

    Attributes after `run`: `scores` ({scale: criterion}), `points` ({scale: points scored}),
    `stopped` (scales scored on fewer than all the points). A raced scale's value is the
    incumbent's + the mean paired difference on the points raced (an estimate that ranks as
    the race decided); with `race=0` a stopped scale's value is a lower bound above the best.
    """

    def __init__(
        self,
        build: Callable[[float], Any],
        scoring: tuple[Any, Tensor],
        criterion: Criterion,
        *,
        batch_size: int,
        race: float,
        early_stop: bool,
        tol: float,
        label: str,
        name: str,
        progress: bool | None,
    ) -> None:
        self.build, (self.X, self.y) = build, scoring
        self.batch_size, self.early_stop, self.tol = batch_size, early_stop, tol
        regression = is_regression(self.y)
        table = REGRESSION_CRITERIA if regression else CRITERIA
        self.criterion = table.get(criterion, criterion)  # type: ignore[call-overload]
        self.per_point = criterion in PER_POINT and not regression
        self.race = (
            PairedRace(self._losses(POINT_LOSSES[str(criterion)]), len(self.y), race, RACE_FIRST)
            if self.per_point and race > 0
            else None
        )
        self.label, self.name, self.progress = label, name, progress
        self.points: dict[float, int] = {}

    def _losses(self, point_loss: Callable[[Tensor, Tensor], Tensor]) -> Callable[..., Any]:
        """Per-point losses of a scale on points start … stop-1, for `PairedRace`; the two
        scales racing are built once each."""
        built: dict[float, Any] = {}

        def losses(scale: float, start: int, stop: int) -> Tensor | None:
            if scale in built:
                built[scale] = built.pop(scale)  # the most recently used last
            else:
                while len(built) > 1:
                    del built[next(iter(built))]
                built[scale] = self.build(scale)
            x = take_rows(self.X, start, stop)
            logits = built[scale].member_logits(x, self.batch_size, progress=False)
            if not torch.isfinite(logits).all():
                return None
            return point_loss(logits, self.y[start:stop])

        return losses

    def _score(self, scale: float, stop_above: float = math.inf) -> float:
        """The criterion at `scale`: per point, batch by batch, stopped once above the best."""
        if self.race is not None:
            return self.race(scale)
        ensemble = self.build(scale)
        n = len(self.y)
        step = self.batch_size if self.per_point else n
        batches = (take_rows(self.X, a, a + step) for a in range(0, n, step))
        total, start = 0.0, 0  # per point: the sum of the losses seen so far
        self.points[scale] = n
        value = math.inf
        for x in batches:
            logits = ensemble.member_logits(x, self.batch_size, progress=False)
            if not torch.isfinite(logits).all():
                return math.inf  # diverged: the worst score
            rows = logits.shape[1]
            value = float(self.criterion(logits, self.y[start : start + rows]))
            if not self.per_point:
                return value  # one batch: the whole scoring set
            total += value * rows
            start += rows
            value = total / n  # until the last batch, a lower bound
            if value > stop_above and start < n:
                self.points[scale] = start  # above the best: it cannot win
                return value
        return value

    def run(self, grid: Sequence[float], refine: bool) -> float:
        """The chosen scale; fills `scores`, `points` and `stopped`."""
        with counter(f"{self.label} {self.name} search", self.progress) as shown:

            def shown_score(scale: float, stop_above: float = math.inf) -> float:
                value = self._score(scale, stop_above)
                shown.update(1)
                shown.set_postfix_str(f"{self.name}={scale:.3g} score={value:.4g}")
                return value

            best, self.scores = select_scale(
                shown_score, grid, refine=refine, stop_above=self.early_stop, tol=self.tol
            )
        points = self.race.points if self.race is not None else self.points
        self.points = {s: points.get(s, 0) for s in self.scores}
        self.stopped = [s for s, k in self.points.items() if k < len(self.y)]
        return best
