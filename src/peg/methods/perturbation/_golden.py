"""The golden search for a perturbation scale (PEG's η, PEP's σ): a grid, then golden section
in log space (`select_scale`), each new scale raced against the best so far (`PairedRace`).

`peg.methods.perturbation._scale_search.ScaleSearch` runs it (or the default surrogate search) for a
fitted method.

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

import torch
from torch import Tensor


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
            from scipy import optimize  # here: `import peg` stays light

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
    difference of 0 and less for any other (docs/determinism.md: the chosen scale against
    scoring every point). Paired differences of two nearby scales vary much less than
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
