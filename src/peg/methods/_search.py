"""Choosing a perturbation scale (PEG's η, PEP's σ): a grid, then golden section in log space.

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

from scipy import optimize


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
