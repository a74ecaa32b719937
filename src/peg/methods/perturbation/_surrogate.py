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
   is below `INDIFFERENCE` standard errors of their paired per-point difference and surely
   cannot matter (`_candidate`): its expected improvement E[max(0, δ)], δ ~ N(gain, se²), is
   under `Settle.regret`, or every scoring point is scored already. A gain within noise that
   could still matter is *unsure*: every scale scored (and the base) is scored on twice the
   points, the interpolant rebuilt, and the question asked again (`Settle.grow`; on 384 points
   of a 10-class model at 25-45% error se is a few thousandths of a nat, so a 0.01-nat gain
   can look like noise there). It also stops when the minimiser lies within `NEAR` (5%) of a
   scale already scored; otherwise it scores the minimiser exactly, adds it as a node, and
   goes to 2;
4. at most `max_scorings` exact scorings in all (default 3); the choice is the best of the
   scales scored exactly, never an interpolated one.

Points by need (for a criterion that is a mean of per-point losses): the scorings
score the first `Settle.first` scoring points (1024 by default: the cap, so that by default
every scoring scores the capped points at once; smaller chunks missed the quality bar:
docs/performance.md, "The quality bar on more kinds of base"). After each scoring, the scale
just scored and the best other one are compared on the same points — the mean d̄ of their
paired per-point differences and its standard error se — and the pair is decided when they
are separated (|d̄| > z·se, z = 2), tied within what cannot matter (|d̄| + z·se < 0.001
nats), or when taking the better-looking one costs less than 0.001 nats in expectation
(`expected_regret`). Until then every scale scored, and the base's outputs, are scored on the
next chunk too, doubling the points (e.g. 384, 768, …), up to the cap (`ScaleSearch.exact_points`,
all N points given); the interpolant is rebuilt on the points scored. A decision on the first
chunk costs 2–3 scorings of the chunk instead of 2–3 of the cap; the worst, 3 of the cap (a
first chunk of 384 or 768 placed the second η by the noise of those points and missed the
quality bar on a ResNet and a BERT classifier, as that section measures). Another
criterion (ECE, a callable) scores all N points at once.

A diverged scale (non-finite outputs or criterion, on any chunk) scores +inf, is not a node,
and caps the range below it. The choice against a dense exact search and against the
1024-point search of three scorings: docs/performance.md, "Choosing η and σ", "Points by need".
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


def search_range(grid: Sequence[float], extend: int = 3) -> tuple[float, float]:
    """(low, high) log-scales searched: the grid's range widened on either side by `extend` of
    its mean log-spacing, and by at least `extend` decades (PEG's default grid 1e-3…1 gives
    1e-6…1e3, as far as the golden search's grid extension reaches; PEP's bracket 5e-4…5e-3,
    5e-7…5). Searching wide costs nothing here: scales are tried on the interpolant."""
    logs = sorted(math.log(g) for g in grid)
    step = (logs[-1] - logs[0]) / (len(logs) - 1) if len(logs) > 1 else 0.0
    widen = extend * max(step, math.log(10.0))
    return logs[0] - widen, logs[-1] + widen


@dataclass(frozen=True)
class Settle:
    """When two exactly scored scales are decided, so that scoring them on more points stops.

    The defaults are `ScaleSearch`'s (`first_points`, `settle_se`, `settle_nats`,
    `settle_regret`, which read them from here).

    Attributes:
        first: the scoring points of the first chunk (default 1024); each later chunk doubles
            the points scored (`first`, 2·`first`, …, at most all of them: the cap).
        z: the pair is separated once its mean paired per-point difference d̄ is more than
            `z` standard errors from 0 (default 2).
        nats: the pair is a tie that cannot matter once d̄ ± `z` standard errors lies within
            ±`nats` (default 0.001: the difference is below `nats` at that confidence, not only
            as a point estimate: a noisy pair that merely averages out near 0 is scored on).
        regret: the pair is decided once taking the one that looks better costs less than
            `regret` nats in expectation (default 0.001; `expected_regret`; 0: never).
        grow: a next candidate whose predicted gain is within noise but could matter is
            asked about again on twice the points (default True; `_candidate`); False: a tie.
    """

    first: int = 1024
    z: float = 2.0
    nats: float = 1e-3
    regret: float = 1e-3
    grow: bool = True

    def settled(self, d: Tensor) -> bool:
        """Whether paired per-point differences `d` `[n]` decide the pair."""
        mean, se = float(d.mean()), float(d.std()) / math.sqrt(len(d)) if len(d) > 1 else math.inf
        return (
            abs(mean) > self.z * se
            or abs(mean) + self.z * se < self.nats
            or expected_regret(mean, se) < self.regret
        )


def expected_regret(mean: float, se: float) -> float:
    """What taking the better-looking of two scales costs in expectation, in the criterion's
    units, when their true difference δ is N(`mean`, `se`²) (the paired per-point differences'
    mean and standard error): E[max(0, |δ| against the look)] = se·φ(m/se) − |m|·Φ(−|m|/se),
    the expected opportunity cost of selection procedures (Chick & Inoue 2001). 0.4·se for a
    pair that looks tied; below 0.01·se once they are 2 standard errors apart."""
    if not math.isfinite(se):
        return math.inf
    if se == 0.0:
        return 0.0
    z = abs(mean) / se
    density = math.exp(-0.5 * z * z) / math.sqrt(2.0 * math.pi)
    return se * density - abs(mean) * 0.5 * math.erfc(z / math.sqrt(2.0))


@dataclass
class SearchResult:
    """What `surrogate_search` found.

    Attributes:
        scale: the chosen scale (the best scored exactly).
        scores: {scale: criterion} for every scale scored exactly, on the points it was last
            scored on (the finite ones all on the same points).
        predicted: {scale: criterion} of the last interpolant on its evaluation grid.
        points: {scale: scoring points it was scored on}.
    """

    scale: float
    scores: dict[float, float]
    predicted: dict[float, float] = field(default_factory=dict)
    points: dict[float, int] = field(default_factory=dict)


class _Scored:
    """The exactly scored scales' outputs on the first `n` scoring points, grown chunk by chunk
    (every finite scale and the base's outputs together, so that any two are paired)."""

    def __init__(
        self,
        exact: Callable[[float, int, int], Tensor | None],
        at_zero: Callable[[int, int], Tensor],
        y: Tensor,
        criterion: Callable[[Tensor, Tensor], float],
        n: int,
    ) -> None:
        self.exact, self.at_zero, self.y, self.criterion = exact, at_zero, y, criterion
        self.n = n
        self.zero = at_zero(0, n)
        self.outputs: dict[float, Tensor] = {}  # finite scales, in the order scored
        self.scores: dict[float, float] = {}
        self.points: dict[float, int] = {}

    def record(self, scale: float, outputs: Tensor | None) -> bool:
        """Store `scale`'s outputs on the first `n` points; False when they (or the criterion)
        are not finite: the scale then scores +inf and is dropped as a node."""
        value = math.inf if outputs is None else float(self.criterion(outputs, self.y[: self.n]))
        self.points[scale] = self.n
        if not math.isfinite(value):
            self.scores[scale] = math.inf
            self.outputs.pop(scale, None)
            return False
        assert outputs is not None
        self.scores[scale], self.outputs[scale] = value, outputs
        return True

    def grow(self, stop: int) -> list[float]:
        """Score every finite scale (and the base) on points n … stop-1 too; the scales that
        diverge there."""
        start, self.n = self.n, stop
        self.zero = torch.cat([self.zero, self.at_zero(start, stop)], dim=1)
        diverged = []
        for scale, have in list(self.outputs.items()):
            new = self.exact(scale, start, stop)
            if not self.record(scale, None if new is None else torch.cat([have, new], dim=1)):
                diverged.append(scale)
        return diverged

    def interpolant(self) -> Interpolant:
        """The polynomial through the base's outputs and every finite scale's, on n points."""
        interpolant = Interpolant(self.zero)
        for scale, outputs in self.outputs.items():
            interpolant.add(scale, outputs)
        return interpolant


def surrogate_search(
    exact: Callable[[float, int, int], Tensor | None],
    at_zero: Callable[[int, int], Tensor],
    y: Tensor,
    criterion: Callable[[Tensor, Tensor], float],
    point_losses: Callable[[Tensor, Tensor], Tensor] | None,
    grid: Sequence[float],
    max_scorings: int = 3,
    settle: Settle | None = None,
    on_scored: Callable[[float, float], None] | None = None,
) -> SearchResult:
    """Choose a scale in at most `max_scorings` exact scorings (see the module docstring).

    Args:
        exact: (scale, start, stop) -> member outputs `[M, stop - start, C]` on scoring points
            start … stop-1 (None: not finite).
        at_zero: (start, stop) -> the members' outputs at scale 0 (each member's base model).
        y: the scoring points' targets `[N]` (N: the cap on the points scored).
        criterion: (outputs, y) -> score, lower is better.
        point_losses: (outputs, y) -> per-point losses `[n]` whose mean is the criterion, or
            None (then every scale is scored on all N points at once, and only `NEAR` and the
            budget stop the search).
        grid: the scales whose range (widened by `search_range`) is searched; its lowest is
            scored first.
        settle: the chunks and the stopping rule (`Settle()`: its defaults).
        on_scored: called with (scale, score) after every exact scoring (progress).
    """
    settle = Settle() if settle is None else settle
    lo, hi = search_range(grid)
    first = len(y) if point_losses is None else min(settle.first, len(y))
    done = _Scored(exact, at_zero, y, criterion, first)
    predicted: dict[float, float] = {}

    def score(scale: float) -> None:
        nonlocal hi
        if not done.record(scale, exact(scale, 0, done.n)):
            hi = min(hi, math.log(scale) - math.log(NEAR))  # diverged: search below it
        if on_scored is not None:
            on_scored(scale, done.scores[scale])

    scale = float(min(grid))
    while True:
        score(scale)
        if point_losses is not None:
            for diverged in _decide(done, scale, point_losses, settle):
                hi = min(hi, math.log(diverged) - math.log(NEAR))
        if len(done.scores) >= max_scorings or hi <= lo:
            break
        while True:  # the next candidate, on more points while it is within noise
            interpolant = done.interpolant()
            scale, predicted = _minimise(interpolant, lo, hi, done.criterion, done.y[: done.n])
            if min(abs(math.log(scale / s)) for s in done.scores) < math.log(NEAR):
                verdict = STOP
            elif point_losses is None:
                verdict = SCORE
            else:
                verdict = _candidate(done, interpolant, scale, point_losses, settle)
            if verdict != UNSURE:
                break
            for diverged in done.grow(min(2 * done.n, len(done.y))):
                hi = min(hi, math.log(diverged) - math.log(NEAR))
            if hi <= lo or not done.outputs:
                verdict = STOP
                break
        if verdict == STOP:
            break
    best = min(done.scores, key=lambda s: (done.scores[s], s))
    return SearchResult(best, dict(sorted(done.scores.items())), predicted, done.points)


def _decide(
    done: _Scored,
    new: float,
    point_losses: Callable[[Tensor, Tensor], Tensor],
    settle: Settle,
) -> list[float]:
    """Score every scale on more points, chunk by chunk, until `new` and the best other scale
    are decided (`Settle.settled`) or every point is scored; the scales that diverged."""
    diverged: list[float] = []
    while done.n < len(done.y):
        others = [s for s in done.outputs if s != new]
        if new not in done.outputs or not others:
            break  # nothing to decide: one finite scale
        rival = min(others, key=done.scores.__getitem__)
        y = done.y[: done.n]
        d = point_losses(done.outputs[new], y).double() - point_losses(done.outputs[rival], y)
        if settle.settled(d):
            break
        diverged += done.grow(min(2 * done.n, len(done.y)))
    return diverged


def _minimise(
    interpolant: Interpolant,
    lo: float,
    hi: float,
    criterion: Callable[[Tensor, Tensor], float],
    y: Tensor,
) -> tuple[float, dict[float, float]]:
    """The interpolant's minimiser (and its criterion on the evaluation grid): over the whole
    range while it is linear, else up to `TRUST` × its largest node."""
    top = hi if interpolant.degree <= 1 else min(hi, math.log(TRUST * max(interpolant.nodes)))
    count = max(3, math.ceil((top - lo) / math.log(10.0) * PER_DECADE) + 1)
    candidates = torch.linspace(lo, top, count, dtype=torch.float64).exp().tolist()

    def on_interpolant(scale: float) -> float:
        value = float(criterion(interpolant(scale), y))
        return value if math.isfinite(value) else math.inf

    return select_scale(on_interpolant, candidates, refine=True, extend=0)


SCORE, STOP, UNSURE = "score", "stop", "unsure"


def _candidate(
    done: _Scored,
    interpolant: Interpolant,
    scale: float,
    point_losses: Callable[[Tensor, Tensor], Tensor],
    settle: Settle,
) -> str:
    """What to do with the interpolant's minimiser `scale`, from its predicted gain over the
    best scale scored (the mean d̄ of their paired per-point differences, interpolated against
    exact, standard error se, on the points scored so far):

    - SCORE it when d̄ > `INDIFFERENCE` standard errors, or when it lies past the largest
      node (an extrapolated minimiser is always checked);
    - STOP when it cannot matter: the expected improvement of scoring it, E[max(0, δ)] with
      δ ~ N(d̄, se²), is below `settle.regret`, or d̄ + z·se < `settle.nats`; or when every
      point is already scored (then a gain within noise is a tie);
    - UNSURE otherwise: a gain within noise that could still matter; the caller scores every
      scale on more points and asks again (on 384 points of a 10-class model at 25% error,
      se is a few thousandths of a nat: a 0.01-nat gain can look like noise there).
    """
    finite = {s: v for s, v in done.scores.items() if s in done.outputs}
    if not finite or scale > NEAR * max(interpolant.nodes):
        return SCORE
    best = min(finite, key=finite.__getitem__)
    y = done.y[: done.n]
    d = point_losses(done.outputs[best], y).double() - point_losses(interpolant(scale), y).double()
    gain, se = float(d.mean()), float(d.std()) / math.sqrt(len(d))
    if gain > INDIFFERENCE * se:
        return SCORE
    if not settle.grow or done.n >= len(done.y) or gain + settle.z * se < settle.nats:
        return STOP
    improvement = expected_regret(gain, se) + max(gain, 0.0)  # E[max(0, δ)]
    return STOP if improvement < settle.regret else UNSURE
