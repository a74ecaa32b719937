"""The scale search: a grid, then golden section in log space (scipy)."""

from __future__ import annotations

import math

import torch

from peg.methods.perturbation._golden import PairedRace, select_scale

GRID = (1e-3, 1e-2, 1e-1, 1.0)


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


def _losses(n: int, opt: float, spread: float, seed: int = 0):
    """Per-point losses smooth in the scale, as a PEG ensemble's are: a shared spread + a bowl
    in log(scale) + a per-point slope in log(scale) (zero on average)."""
    g = torch.Generator().manual_seed(seed)
    shared, slope = (
        torch.rand(n, generator=g, dtype=torch.float64) * 2,
        torch.randn(n, generator=g, dtype=torch.float64),
    )
    calls: list[tuple[float, int, int]] = []

    def of(scale: float) -> torch.Tensor:
        u = math.log(scale) - math.log(opt)
        return shared + 0.05 * u**2 + spread * u * slope

    def losses(scale: float, start: int, stop: int) -> torch.Tensor:
        calls.append((scale, start, stop))
        return of(scale)[start:stop]

    return of, losses, calls


def test_a_race_picks_what_scoring_every_point_picks_on_fewer_points():
    for opt, spread in [(0.03, 0.05), (0.3, 0.2), (2e-3, 0.01)]:
        of, losses, calls = _losses(5000, opt, spread)
        race = PairedRace(losses, 5000, z=3.0, first=256)
        best, seen = select_scale(race, GRID, refine=True, stop_above=True)
        exhaustive, every = select_scale(lambda s, of=of: float(of(s).mean()), GRID, refine=True)
        assert best == exhaustive and seen.keys() == every.keys()
        # far from the optimum one look settles it; next to it, golden-section steps compare
        # nearly equal scales, which may take every point
        far = max(GRID, key=lambda s, opt=opt: abs(math.log(s / opt)))
        assert race.points[far] == 256
        assert sum(race.points.values()) < 0.8 * 5000 * len(seen)
        assert len(calls) == len({(s, a) for s, a, _ in calls})  # nothing scored twice


def test_a_tied_race_is_settled_on_every_point():
    same = torch.linspace(0, 1, 300, dtype=torch.float64)
    race = PairedRace(lambda s, a, b: same[a:b], 300, first=32)
    first = race(0.1)
    assert race(0.2) == first and race.points == {0.1: 300, 0.2: 300}


def test_a_diverged_scale_loses_and_a_best_that_diverges_later_is_replaced():
    good = torch.full((100,), 0.5, dtype=torch.float64)

    def losses(scale: float, start: int, stop: int) -> torch.Tensor | None:
        if scale == 9.0 or (scale == 1.0 and stop > 10):
            return None  # 9 diverges at once; 1 (the first, best so far) beyond 10 points
        if scale == 2.0:  # ties with 1 on average: the race goes on past 10 points
            return (good + 0.1 * torch.tensor([-1.0, 1.0]).repeat(50))[start:stop]
        return (good * scale)[start:stop]

    race = PairedRace(losses, 100, first=10)
    assert race(1.0) == 0.5
    assert race(9.0) == math.inf
    won = race(2.0)  # needs 1.0 beyond its first 10 points: 1.0 diverges, 2.0 wins
    assert won < 0.5 and race.scores[1.0] == math.inf
    assert race(3.0) > won  # and races against 2.0 from now on
