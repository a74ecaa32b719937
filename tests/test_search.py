"""The scale search: a grid, then golden section in log space (scipy)."""

from __future__ import annotations

import math

from peg.methods._search import select_scale


def parabola(opt: float):
    calls = []

    def f(s: float) -> float:
        calls.append(s)
        return (math.log(s) - math.log(opt)) ** 2

    return f, calls


def test_refines_between_grid_points():
    f, calls = parabola(0.03)
    best, seen = select_scale(f, (1e-3, 1e-2, 1e-1, 1.0), refine=True)
    assert abs(math.log(best / 0.03)) < 0.1
    assert len(calls) == len(set(calls)) == len(seen)  # memoised: nothing scored twice


def test_grid_only_picks_the_best_grid_point():
    f, _ = parabola(0.03)
    best, seen = select_scale(f, (1e-3, 1e-2, 1e-1, 1.0), refine=False)
    assert best == 0.01 and len(seen) == 4


def test_walks_outside_the_grid_when_best_is_on_its_edge():
    f, _ = parabola(20.0)
    best, seen = select_scale(f, (1e-3, 1e-2, 1e-1, 1.0), refine=True, maxiter=30)
    assert abs(math.log(best / 20.0)) < 0.2
    assert {10.0, 100.0} <= {round(s, 6) for s in seen}  # extended at the grid's spacing


def test_extension_is_bounded():
    best, seen = select_scale(lambda s: s, (1e-3, 1e-2, 1e-1, 1.0), refine=True)  # monotone
    assert len(seen) == 7 and math.isclose(best, 1e-6)


def test_non_finite_scores_count_as_worst():
    best, seen = select_scale(lambda s: math.nan if s > 0.5 else -s, (0.01, 0.1, 1.0), refine=True)
    assert best <= 0.5 and seen[1.0] == math.inf


def test_flat_score_keeps_a_grid_point():
    best, _ = select_scale(lambda s: 1.0, (0.01, 0.1, 1.0), refine=True)
    assert best in (0.01, 0.1, 1.0)
