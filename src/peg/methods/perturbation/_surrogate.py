"""The default scale search: a few exact scorings, guided by the members' outputs interpolated
along the scale.

Member i's weights θ + s·Dᵢ move on a straight line as the scale s grows, so its outputs on
the scoring points are a smooth curve in s — for a ReLU network without normalisation between
its perturbed layers, a polynomial in s of degree at most its depth (until a unit switches
on or off). Every exact scoring (S members on every scoring point, once) gives that curve's
value at one more scale; the base's own outputs give it at s = 0. `Interpolant` passes a
polynomial (Newton's form) through those nodes, for every member, point and output at once, so
the criterion at any scale costs arithmetic on `[M, N, C]` tensors instead of M forward passes.

`surrogate_search`:
1. scores exactly the grid's lowest scale (nodes 0 and it: the secant, which at a small scale
   is the linearised ensemble f(θ) + s·J·Dᵢ, without forward-mode differentiation);
2. minimises the criterion on the interpolant (`select_scale` on a grid of 2 scales per decade
   over the search range, then golden section); while the interpolant is linear the whole
   range is searched, after that at most `TRUST` × the largest exactly scored scale, since a
   polynomial is trusted only a little beyond its last node;
3. stops when (for "nll" and "brier", and the regression "nll": means of per-point losses)
   the minimiser lies below the largest scale scored (where the polynomial interpolates: an
   extrapolated minimiser is always checked) and its predicted gain over the best scale scored
   is below `INDIFFERENCE` standard errors of their paired per-point difference — the
   candidates left are statistically tied with it, and scoring them would decide nothing that
   matters: an indifference zone, which narrows as the scoring points grow, not a tolerance in
   the scale — or when the minimiser lies within `NEAR` (5%) of a scale already scored;
   otherwise it scores the minimiser exactly, adds it as a node, and goes to 2;
4. at most `max_scorings` exact scorings in all (default 3); the choice is the best of the
   scales scored exactly, never an interpolated one.

A diverged scale (non-finite outputs or criterion) scores +inf, is not a node, and caps the
range below it. benchmarks/scale_search.py checks the choice against a dense exact search.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from peg.methods.perturbation._golden import select_scale

TRUST = 4.0  # how far past its largest node a polynomial of degree >= 2 is minimised
NEAR = 1.05  # a minimiser within this factor of a scored scale is that scale
INDIFFERENCE = 0.5  # predicted gains below this many standard errors are ties
PER_DECADE = 2  # the interpolant's criterion is first evaluated at this many scales a decade


class Interpolant:
    """Member outputs `[M, N, C]` at any scale, from their values at a few scales (the nodes):
    the polynomial through them, entry by entry, in Newton's form.

    Float32 is enough: the divided difference of two close nodes subtracts nearby floats,
    which is exact, and the rounding of the outputs themselves is what bounds it.
    """

    def __init__(self, at_zero: Tensor) -> None:
        self.nodes: list[float] = [0.0]
        self.values: list[Tensor] = [at_zero]
        self.coefficients: list[Tensor] = [at_zero]

    @property
    def degree(self) -> int:
        return len(self.nodes) - 1

    def add(self, scale: float, outputs: Tensor) -> None:
        """One more node; the coefficients (divided differences) are recomputed."""
        self.nodes.append(scale)
        self.values.append(outputs.to(self.values[0].dtype))
        c = list(self.values)
        for j in range(1, len(c)):
            for i in range(len(c) - 1, j - 1, -1):
                c[i] = (c[i] - c[i - 1]) / (self.nodes[i] - self.nodes[i - j])
        self.coefficients = c

    def __call__(self, scale: float) -> Tensor:
        """The interpolated outputs at `scale` `[M, N, C]` (Horner's rule)."""
        c, x = self.coefficients, self.nodes
        out = c[-1]
        for i in range(len(c) - 2, -1, -1):
            out = out * (scale - x[i]) + c[i]
        return out


@dataclass
class SearchResult:
    """What `surrogate_search` found.

    Attributes:
        scale: the chosen scale (the best scored exactly).
        scores: {scale: criterion} for every scale scored exactly.
        predicted: {scale: criterion} of the last interpolant on its evaluation grid.
    """

    scale: float
    scores: dict[float, float]
    predicted: dict[float, float] = field(default_factory=dict)


def search_range(grid: Sequence[float], extend: int = 3) -> tuple[float, float]:
    """(low, high) log-scales searched: the grid's range widened on either side by `extend` of
    its mean log-spacing, and by at least `extend` decades (PEG's default grid 1e-3…1 gives
    1e-6…1e3, as far as the golden search's grid extension reaches; PEP's bracket 5e-4…5e-3,
    5e-7…5). Searching wide costs nothing here: scales are tried on the interpolant."""
    logs = sorted(math.log(g) for g in grid)
    step = (logs[-1] - logs[0]) / (len(logs) - 1) if len(logs) > 1 else 0.0
    widen = extend * max(step, math.log(10.0))
    return logs[0] - widen, logs[-1] + widen


def surrogate_search(
    exact: Callable[[float], Tensor | None],
    at_zero: Tensor,
    criterion: Callable[[Tensor], float],
    point_losses: Callable[[Tensor], Tensor] | None,
    grid: Sequence[float],
    max_scorings: int = 3,
    on_scored: Callable[[float, float], None] | None = None,
) -> SearchResult:
    """Choose a scale in at most `max_scorings` exact scorings (see the module docstring).

    Args:
        exact: scale -> member outputs `[M, N, C]` on the scoring points (None: not finite).
        at_zero: the members' outputs at scale 0 (each member's base model) `[M, N, C]`.
        criterion: outputs -> score, lower is better.
        point_losses: outputs -> per-point losses `[N]` whose mean is the criterion, or None
            (then only `NEAR` and the budget stop the search).
        grid: the scales whose range (widened by `search_range`) is searched; its lowest is
            scored first.
        on_scored: called with (scale, score) after every exact scoring (progress).
    """
    lo, hi = search_range(grid)
    interpolant = Interpolant(at_zero)
    scores: dict[float, float] = {}
    losses: dict[float, Tensor] = {}
    predicted: dict[float, float] = {}

    def score(scale: float) -> None:
        nonlocal hi
        outputs = exact(scale)
        value = math.inf if outputs is None else float(criterion(outputs))
        scores[scale] = value if math.isfinite(value) else math.inf
        if on_scored is not None:
            on_scored(scale, scores[scale])
        if scores[scale] == math.inf:
            hi = min(hi, math.log(scale) - math.log(NEAR))  # diverged: search below it
            return
        assert outputs is not None
        interpolant.add(scale, outputs)
        if point_losses is not None:
            losses[scale] = point_losses(outputs).double()

    def on_interpolant(scale: float) -> float:
        value = float(criterion(interpolant(scale)))
        return value if math.isfinite(value) else math.inf

    scale = float(min(grid))
    while True:
        score(scale)
        if len(scores) >= max_scorings or hi <= lo:
            break
        top = hi if interpolant.degree <= 1 else min(hi, math.log(TRUST * max(interpolant.nodes)))
        count = max(3, math.ceil((top - lo) / math.log(10.0) * PER_DECADE) + 1)
        candidates = torch.linspace(lo, top, count, dtype=torch.float64).exp().tolist()
        scale, predicted = select_scale(on_interpolant, candidates, refine=True, extend=0)
        if min(abs(math.log(scale / s)) for s in scores) < math.log(NEAR):
            break
        best = min(scores, key=scores.__getitem__)
        inside = scale <= NEAR * max(interpolant.nodes)  # interpolated, not extrapolated
        if point_losses is not None and best in losses and inside:
            d = losses[best] - point_losses(interpolant(scale)).double()  # > 0: predicted gain
            if float(d.mean()) <= INDIFFERENCE * float(d.std()) / math.sqrt(len(d)):
                break
    best = min(scores, key=lambda s: (scores[s], s))
    return SearchResult(best, dict(sorted(scores.items())), predicted)
