"""`ScaleSearch`: the search for PEG's η / PEP's σ on held-out points, one object per `fit`."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from peg._progress import counter
from peg.batches import take_rows
from peg.methods._criteria import (
    CRITERIA,
    PER_POINT,
    POINT_LOSSES,
    REGRESSION_CRITERIA,
    REGRESSION_POINT_LOSSES,
    Criterion,
    is_regression,
)
from peg.methods._members import SearchTarget
from peg.methods._search import RACE_FIRST, PairedRace, select_scale
from peg.methods._surrogate import surrogate_search

SEARCHES = ("surrogate", "golden")
# What the surrogate search scores exactly: every member (fewer members' ensemble prefers
# another scale), on the first SEARCH_POINTS scoring points (a
# seeded random subset already): each exact scoring costs S forwards of each point, and on a
# Fashion-MNIST CNN three of them on 2000 points were 83% of PEG-15's fit (8.6 × temperature
# scaling's); on 1024 the choice stayed within one SE of the one on every point
# (results/benchmarks/peg_cost.txt).
SEARCH_POINTS: int | None = 1024


class ScaleSearch:
    """The search for a perturbation scale on held-out points: one object per `fit`.

    `target.at(scale)` gives the ensemble at a scale (its directions computed once, so a scale
    costs forward passes only; `peg.methods._members.SearchTarget`). Two searches:

    - "surrogate" (the default): at most 3 exact scorings, guided by the members' outputs
      interpolated along the scale (`peg.methods._surrogate`), on the first `SEARCH_POINTS`
      scoring points.
    - "golden": a grid, extended past its edges, then golden section (`select_scale`). A
      criterion that is a mean of per-point losses ("nll", "brier") is raced (`PairedRace`,
      `race` > 0) or, with `race=0`, scored batch by batch and stopped once its partial mean
      exceeds the best so far (`early_stop`); any other criterion is scored on all the points
      at once.

    A list of scales without refinement (`refine=False`) is scored as in "golden", every one.

    Attributes after `run`: `scores` ({scale: criterion}), `points` ({scale: points scored}),
    `stopped` (scales scored on fewer than all the points), `predicted` (the surrogate's
    criterion on its last evaluation grid; empty for "golden"). A raced scale's value is the
    incumbent's + the mean paired difference on the points raced (an estimate that ranks as
    the race decided); with `race=0` a stopped scale's value is a lower bound above the best.
    """

    def __init__(
        self,
        target: SearchTarget,
        y: Tensor,
        criterion: Criterion,
        *,
        method: str,
        batch_size: int,
        race: float,
        early_stop: bool,
        tol: float,
        label: str,
        name: str,
        progress: bool | None,
    ) -> None:
        self.target, self.X, self.y = target, target.inputs, y
        self.method, self.batch_size = method, batch_size
        self.early_stop, self.tol = early_stop, tol
        regression = is_regression(self.y)
        table = REGRESSION_CRITERIA if regression else CRITERIA
        self.criterion = table.get(criterion, criterion)  # type: ignore[call-overload]
        self.per_point = criterion in PER_POINT and not regression
        point_losses = REGRESSION_POINT_LOSSES if regression else POINT_LOSSES
        self.point_loss = point_losses.get(criterion) if isinstance(criterion, str) else None
        self.race = (
            PairedRace(self._losses(POINT_LOSSES[str(criterion)]), len(self.y), race, RACE_FIRST)
            if self.per_point and race > 0
            else None
        )
        self.label, self.name, self.progress = label, name, progress
        self.points: dict[float, int] = {}
        self.predicted: dict[float, float] = {}

    def _logits(self, ensemble: Any, start: int = 0, stop: int | None = None) -> Tensor | None:
        """Member outputs `[M, stop - start, C]` of `ensemble` on scoring points start …
        stop-1 (default: all); None when they are not finite."""
        x = take_rows(self.X, start, len(self.y) if stop is None else stop)
        logits = ensemble.member_logits(x, self.batch_size, progress=False)
        return logits if bool(torch.isfinite(logits).all()) else None

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
                built[scale] = self.target.at(scale)
            logits = self._logits(built[scale], start, stop)
            return None if logits is None else point_loss(logits, self.y[start:stop])

        return losses

    def _score(self, scale: float, stop_above: float = math.inf) -> float:
        """The criterion at `scale`: per point, batch by batch, stopped once above the best."""
        if self.race is not None:
            return self.race(scale)
        ensemble = self.target.at(scale)
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

    def _surrogate(self, grid: Sequence[float], show: Callable[[float, float], None]) -> float:
        """`surrogate_search` on `search_subset`'s members and points."""
        members, n = self.search_subset()
        X, y = take_rows(self.X, 0, n), self.y[:n]
        zero = self.target.bases().member_logits(X, self.batch_size, progress=False)
        base_of = [self.target.member_base[j] for j in members]
        at_zero = zero[torch.tensor(base_of, device=zero.device)]
        point_loss = self.point_loss
        every = len(members) == len(self.target.member_base)

        def exact(scale: float) -> Tensor | None:
            ensemble = self.target.at(scale)
            return self._logits(ensemble if every else ensemble.subset(members), 0, n)

        def scored(scale: float, value: float) -> None:
            self.points[scale] = n
            show(scale, value)

        result = surrogate_search(
            exact,
            at_zero,
            lambda logits: self.criterion(logits, y),
            None if point_loss is None else lambda logits: point_loss(logits, y),
            grid,
            on_scored=scored,
        )
        self.scores, self.predicted = result.scores, result.predicted
        return result.scale

    def search_subset(self) -> tuple[list[int], int]:
        """(members, points) the surrogate search scores: every member on the first `n` scoring
        points (all of them, or `SEARCH_POINTS` when there are more)."""
        members = list(range(len(self.target.member_base)))
        n = len(self.y) if SEARCH_POINTS is None else min(len(self.y), SEARCH_POINTS)
        return members, n

    def run(self, grid: Sequence[float], refine: bool) -> float:
        """The chosen scale; fills `scores`, `points`, `stopped` and `predicted`."""
        with counter(f"{self.label} {self.name} search", self.progress) as shown:

            def show(scale: float, value: float) -> None:
                shown.update(1)
                shown.set_postfix_str(f"{self.name}={scale:.3g} score={value:.4g}")

            def shown_score(scale: float, stop_above: float = math.inf) -> float:
                value = self._score(scale, stop_above)
                show(scale, value)
                return value

            if refine and self.method == "surrogate":
                best, points = self._surrogate(grid, show), self.points
            else:
                best, self.scores = select_scale(
                    shown_score, grid, refine=refine, stop_above=self.early_stop, tol=self.tol
                )
                points = self.race.points if self.race is not None else self.points
        self.points = {s: points.get(s, 0) for s in self.scores}
        self.stopped = [s for s, k in self.points.items() if k < len(self.y)]
        return best
