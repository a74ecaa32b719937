"""Choosing a perturbation scale (PEG's η, PEP's σ): a grid, then golden section in log space.

The score function is memoised, so grid points are never evaluated twice and the golden-section
search starts from the grid's best point and its neighbours as a ready-made bracket. Where the
best grid point lies on the edge of the grid, `scipy.optimize.bracket` walks outwards to find
a bracket; where none is found (a plateau, a monotone score), the best point seen is kept.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from scipy import optimize


def select_scale(
    score: Callable[[float], float],
    grid: Sequence[float],
    refine: bool,
    maxiter: int = 10,
    xtol: float = 0.02,
) -> tuple[float, dict[float, float]]:
    """Minimise `score(scale)` over positive scales.

    Args:
        score: lower is better; non-finite values count as +inf (a diverged ensemble).
        grid: scales tried first (all > 0).
        refine: after the grid, run `scipy.optimize.minimize_scalar(method="golden")` on
            log(scale), bracketed by the best grid point's neighbours.
        maxiter: golden-section iterations at most (each costs one score evaluation).
        xtol: relative tolerance in log(scale) passed to scipy.

    Returns:
        (best scale, {scale: score} for every scale evaluated).
    """
    seen: dict[float, float] = {}
    exact = {math.log(g): float(g) for g in grid}  # grid points come back exactly as given

    def f(u: float) -> float:
        scale = exact.get(u, math.exp(u))
        if scale not in seen:
            value = float(score(scale))
            seen[scale] = value if math.isfinite(value) else math.inf
        return seen[scale]

    us = sorted(math.log(g) for g in grid)
    values = [f(u) for u in us]
    if refine and len(us) >= 2:
        i = min(range(len(us)), key=values.__getitem__)
        try:
            if 0 < i < len(us) - 1:
                bracket: tuple[float, ...] = (us[i - 1], us[i], us[i + 1])
            else:  # walk outwards from the edge of the grid
                start = (us[1], us[0]) if i == 0 else (us[-2], us[-1])
                bracket = optimize.bracket(f, *start, maxiter=8)[:3]
            optimize.minimize_scalar(
                f, bracket=bracket, method="golden", options={"xtol": xtol, "maxiter": maxiter}
            )
        except (ValueError, RuntimeError):  # scipy BracketError is a RuntimeError
            pass  # no bracket (flat or monotone score): keep the best point seen
    grid_points = set(exact.values())
    best = min(seen, key=lambda s: (seen[s], s not in grid_points, s))  # ties: a grid point
    return best, dict(sorted(seen.items()))
