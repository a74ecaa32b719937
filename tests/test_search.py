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


def test_stopping_above_the_best_changes_nothing_but_the_work():
    """A score that stops once it exceeds the best so far (returning a lower bound) leads to
    the same choice, and every point it did not stop keeps its exact value."""
    for opt in (3e-4, 0.03, 0.2, 40.0):
        f, _ = parabola(opt)
        exact_best, exact = select_scale(f, (1e-3, 1e-2, 1e-1, 1.0), refine=True)
        stopped = []

        def bounded(s: float, best: float, f=f, stopped=stopped) -> float:
            value = f(s)
            if value > best:
                stopped.append(s)
                return best + 0.5 * (value - best)  # a lower bound, still above the best
            return value

        best, seen = select_scale(bounded, (1e-3, 1e-2, 1e-1, 1.0), refine=True, stop_above=True)
        assert best == exact_best and seen.keys() == exact.keys()
        assert all(seen[s] == exact[s] for s in seen if s not in stopped)
        assert stopped  # the bound was used


def test_a_flat_edge_stops_the_grid_extension():
    """A score still falling by 1e-5 past the small edge: one step with tol, three without."""
    score = lambda s: 1.0 + 1e-5 * math.log10(s) if s < 1e-2 else 1.0 + (s - 1e-3)  # noqa: E731
    best, seen = select_scale(score, (1e-3, 1e-2, 1e-1, 1.0), refine=True, tol=1e-4)
    assert len(seen) == 5 and math.isclose(best, 1e-4)
    best, seen = select_scale(score, (1e-3, 1e-2, 1e-1, 1.0), refine=True)
    assert len(seen) == 7 and math.isclose(best, 1e-6)
