"""How PEG's η / PEP's σ is chosen: the options (`ScaleSearch`, public) and one run of the
search on held-out points (`SearchRun`, one per `fit`).

`ScaleSearch` is the one place that lists the search's options, their defaults and checks
(its `parameter_constraints`), and what a recipe records of them (`recorded`); PEG and PEP take
one as `search=` (scikit-learn's estimators take a `cv` splitter the same way), and
`get_params(deep=True)` shows its options as `search__<option>`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Literal

import torch
from torch import Tensor

from peg.errors import InvalidParameterError
from peg.methods._constraints import (
    Check,
    boolean,
    choice_or_callable,
    described,
    fraction,
    number,
    one_of,
    positive_int,
    positive_numbers,
)
from peg.methods.base import Params, store_arguments
from peg.methods.perturbation._criteria import (
    CRITERIA,
    PER_POINT,
    POINT_LOSSES,
    REGRESSION_CRITERIA,
    REGRESSION_POINT_LOSSES,
    Criterion,
    is_regression,
)
from peg.methods.perturbation._golden import RACE_FIRST, PairedRace, select_scale
from peg.methods.perturbation._members import SearchTarget
from peg.methods.perturbation._surrogate import Settle, surrogate_search
from peg.source.batches import take_rows
from peg.utils.progress import counter

SEARCHES = ("surrogate", "golden")
UNSURE = (
    "points",
    "stop",
)  # a candidate whose predicted gain is within noise: more points, or a tie
SearchMethod = Literal["surrogate", "golden"]
# The surrogate search's defaults: at most 3 scales, scored on the first FIRST_POINTS scoring
# points, then on twice as many, ... up to SEARCH_POINTS, until decided (`Settle`: 2 SE apart,
# surely within 0.001 nats, or an expected regret < SETTLE_REGRET), and a next candidate
# within noise asked about again on more points (`unsure="points"`). The bar: the choice's
# test NLL within max(0.002, 5% of the gain) of `ScaleSearch.exhaustive()`'s on every base and
# seed measured (docs/performance.md, "The quality bar on more kinds of base"); 2 scorings
# that took a within-noise candidate for a tie on the first 384 points missed it on a
# CIFAR-10 CNN, a ResNet and a BERT classifier, and 3 from 384 points still missed it on
# the ResNet and BERT (the second η placed by the first chunk's noise), and 768 missed it
# on the ResNet at 4,000 (seed 2: η ≈ 0 looked better on 768 points): 1024, the cap, so
# that on up to ~2,000 held-out points the default is the exhaustive search.
SEARCH_POINTS: int | None = 1024
FIRST_POINTS = Settle.first  # 1024
SCORINGS = 3
SETTLE_REGRET = Settle.regret  # 1e-3
# Default cap on the points a scale is scored on: a larger validation set costs no more to search
MAX_SCORE_POINTS = 10_000


class ScaleSearch(Params):
    """How a perturbation scale (PEG's η, PEP's σ) is chosen, when it is searched (`eta` /
    `sigma` = "search") or given as a list of candidates: `PEG(search=ScaleSearch(...))`.

    Args (all keyword-only):
        method: "surrogate" (default): the grid's lowest scale is scored exactly, the members'
            outputs are interpolated along the scale through the exactly scored ones (and the
            base's own, at scale 0), the criterion is minimised on that interpolant, and its
            minimiser is scored exactly, at most `scorings` exact scorings in all (default 3),
            fewer once the predicted gain is under half a standard error on every scoring
            point or surely too small to matter (`unsure`); the choice is the
            best scale scored exactly (`peg.methods.perturbation._surrogate`). Its scorings
            score points by need: the first `first_points` scoring points, then twice as many,
            … up to `exact_points`, until the scale just scored and the best other are
            decided (`settle_se`, `settle_nats`, `settle_regret`). "golden":
            the grid, extended past its edges, then golden section, raced (`race`,
            `early_stop`, `tol`; `peg.methods.perturbation._golden`); 12–15 scorings. A list of
            scales is always scored one by one, as "golden" scores its grid.
        criterion: what the scale minimises on held-out validation points: "nll" (default),
            "ece", "brier" or a callable (member_logits [M, N, C], y [N]) -> float.
        holdout: PEG: the fraction of the validation set held out for scoring η (default 0.5;
            the other part feeds the gradient steps); 0 scores on the points that feed the
            steps, as the paper does. PEP has no gradient step: it scores σ on the same
            fraction of the points (the ones PEG holds out; the rest unused), so its search
            costs what PEG's does; 0 scores on every point (PEP's default before).
        max_points: score on a seeded random subset of at most this many held-out points
            (default 10,000, so a large validation set does not multiply the search's cost, nor
            its memory: the scoring points are gathered; None: all of them; from an
            IterableDataset, its first `max_points` points).
        exact_points: "surrogate": the cap on the scoring points its exact scorings score (a
            seeded random subset of the held-out points; default 1024, `SEARCH_POINTS`; None:
            every scoring point, up to `max_points`).
        first_points: "surrogate" with criterion "nll" or "brier": its scorings score the
            first this many scoring points (default 1024, `FIRST_POINTS`), then the scales
            scored so far are scored on twice as many, and so on up to `exact_points`, until
            the stopping rule decides the scale just scored against the best other: their mean
            paired per-point difference d̄ (standard error se) is more than `settle_se`
            standard errors from 0 (separated), or lies within ±`settle_nats` at `settle_se`
            standard errors (a tie that cannot matter), or taking the better-looking one costs
            less than `settle_regret` in expectation (256 first points chose a worse η on an
            over-fitted base: docs/performance.md, "Cheaper scorings"). Any other
            criterion scores `exact_points` at once.
        settle_se: the separation in paired standard errors that decides a pair (default 2).
        settle_nats: a pair whose difference is surely below this many nats (of the
            criterion) is a tie (default 0.001).
        settle_regret: a pair is decided once the expected cost of taking the one that looks
            better, se·φ(d̄/se) − |d̄|·Φ(−|d̄|/se) (the true difference taken as
            N(d̄, se²); `_surrogate.expected_regret`), is below this many nats (default 0.001,
            half the 0.002 nats the search's bar allows; 0: `settle_se`, `settle_nats` alone).
        scorings: "surrogate": the exact scorings at most (default 3).
        unsure: "surrogate", criterion "nll" or "brier": what the search does when the next
            candidate's predicted gain over the best scale scored is within half a standard
            error but could still matter (its expected improvement is at least
            `settle_regret`, and not surely below `settle_nats`): "points" (default) scores
            the scales scored so far on twice as many points and asks again, up to
            `exact_points`; "stop" takes it as a tie at once (the rule before, which on 384
            points of a 10-class model at 25-45% error stopped one scoring early).
        race: "golden" or a list: with criterion "nll" or "brier" (means of per-point losses),
            score each new scale against the best so far on the same points, a growing prefix
            of them (1024, then doubling), and stop once the mean paired difference is more
            than `race` standard errors from 0 (`PairedRace`): the choice is the one scoring
            every point would make unless a comparison is settled wrongly by chance (at the
            default z = 3, < 0.14% per look when the two tie; the PEG-creation benchmark
            checks it). 0 turns racing off: every scale is scored on every point, with
            `early_stop`.
        early_stop: "golden" or a list, with `race=0` and criterion "nll" or "brier": stop
            scoring a scale once its partial sum already exceeds the best score so far; exact
            (the choice an exhaustive search makes), only cheaper. False scores every scale
            on every point.
        tol: "golden": when the best scale lies on an edge of the grid, the grid is extended
            (at most 3 steps) only while a step improves the criterion by more than this
            (default 1e-4: a flat curve, e.g. a well-calibrated base whose score keeps falling
            by 1e-5 nats as η → 0, stops after one step); 0 extends while it improves at all.
        grid: the scales a search starts from (None, the default: the method's own, PEG's
            paper grid (0.001, 0.01, 0.1, 1), PEP's (5e-4, 1.58e-3, 5e-3) around the PEG
            paper's σ bracket).
    """

    parameter_constraints: ClassVar[dict[str, Check]] = {
        "method": one_of(*SEARCHES),
        "criterion": choice_or_callable(CRITERIA, "a callable"),
        "holdout": fraction(),
        "max_points": positive_int(optional=True),
        "exact_points": positive_int(optional=True),
        "first_points": positive_int(),
        "settle_se": number(allow_zero=True),
        "settle_nats": number(allow_zero=True),
        "settle_regret": number(allow_zero=True),
        "scorings": positive_int(),
        "unsure": one_of(*UNSURE),
        "race": number(allow_zero=True),
        "early_stop": boolean(),
        "tol": number(allow_zero=True),
        "grid": positive_numbers(optional=True),
    }

    def __init__(
        self,
        *,
        method: SearchMethod = "surrogate",
        criterion: Criterion = "nll",
        holdout: float = 0.5,
        max_points: int | None = MAX_SCORE_POINTS,
        exact_points: int | None = SEARCH_POINTS,
        first_points: int = FIRST_POINTS,
        settle_se: float = Settle.z,
        settle_nats: float = Settle.nats,
        settle_regret: float = SETTLE_REGRET,
        scorings: int = SCORINGS,
        unsure: Literal["points", "stop"] = "points",
        race: float = 3.0,
        early_stop: bool = True,
        tol: float = 1e-4,
        grid: Sequence[float] | None = None,
    ) -> None:
        store_arguments(self, locals())

    @classmethod
    def exhaustive(cls, **options: Any) -> ScaleSearch:
        """The search the default is held to: up to 3 exact scorings, each on the first 1024
        scoring points at once, no points by need (`exact_points=1024, first_points=1024,
        scorings=3`; the default before points by need); `options` override these. On a
        few thousand validation points it is the default (a first chunk of 1024 is the cap);
        with `first_points` below `exact_points` the chunks and the unsure rule act
        (docs/performance.md)."""
        return cls(**{"exact_points": 1024, "first_points": 1024, "scorings": 3, **options})

    @classmethod
    def quick(cls, **options: Any) -> ScaleSearch:
        """At most 2 exact scorings on 384 points by need, the candidate dropped once its
        predicted gain is within half a standard error on the first chunk (`first_points=384,
        scorings=2, unsure="stop"`: the default before the unsure rule). Cheaper, but it missed the
        quality bar on a CIFAR-10 CNN, a ResNet and a BERT classifier (docs/performance.md)."""
        return cls(**{"first_points": 384, "scorings": 2, "unsure": "stop", **options})

    @classmethod
    def of(cls, search: ScaleSearch | SearchMethod) -> ScaleSearch:
        """`search` as given to PEG/PEP (checked by its constraint): a ScaleSearch, or a
        method's name for one with that method and the other options' defaults."""
        return search if isinstance(search, ScaleSearch) else cls(method=search)

    def recorded(self) -> dict[str, Any] | None:
        """The options as a recipe records them (JSON; None: a callable criterion, which a
        recipe cannot express)."""
        if callable(self.criterion):
            return None
        options = self.get_params(deep=False)
        options["grid"] = None if self.grid is None else [float(g) for g in self.grid]
        return options

    def criterion_name(self) -> str:
        """The criterion's name as the fitted meta records it."""
        if isinstance(self.criterion, str):
            return self.criterion
        return getattr(self.criterion, "__name__", "callable")


def _search_option(value: Any, name: str) -> None:
    """PEG/PEP's `search`: a ScaleSearch, or one of `SEARCHES` (a ScaleSearch with that method)."""
    if not isinstance(value, ScaleSearch):
        one_of(*SEARCHES)(value, name)


SEARCH_OPTION = described(_search_option, f"a ScaleSearch or one of {list(SEARCHES)}")


# the search's options by their former names, PEG/PEP's own (and recipe version 2's)
SEARCH_OPTIONS = {
    "search": "method",
    "criterion": "criterion",
    "eta_holdout": "holdout",
    "max_score_points": "max_points",
    "race": "race",
    "early_stop": "early_stop",
    "search_tol": "tol",
}


# PEG/PEP's former options that are now the scale search's (`search=ScaleSearch(...)`)
MOVED_TO_SEARCH = {**SEARCH_OPTIONS, "bracket": "grid"}


def refuse_moved(given: dict[str, Any]) -> None:
    """A TypeError for PEG/PEP arguments that are not theirs (`InvalidParameterError`, also a
    TypeError, for a moved one, naming where it went)."""
    for name in given:
        if name in MOVED_TO_SEARCH and name != "search":
            raise InvalidParameterError(
                f"{name}: now an option of the scale search; pass "
                f"search=peg.ScaleSearch({MOVED_TO_SEARCH[name]}=...)"
            )
        raise TypeError(f"unexpected keyword argument {name!r}")


class SearchRun:
    """The search for a perturbation scale on held-out points: one object per `fit`.

    `target.at(scale)` gives the ensemble at a scale (its directions computed once, so a scale
    costs forward passes only; `peg.methods.perturbation._members.SearchTarget`). Two searches:

    - "surrogate" (the default): `peg.methods.perturbation._surrogate`, on a growing prefix of
      the scoring points (`first_points`, doubling while undecided, at most `exact_points`).
    - "golden", and a list of scales (`refine=False`: every one scored): `select_scale`; a
      criterion that is a mean of per-point losses is raced (`PairedRace`, `race` > 0) or,
      with `race=0`, stopped once its partial mean exceeds the best so far (`early_stop`).

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
        options: ScaleSearch,
        *,
        batch_size: int,
        label: str,
        name: str,
        progress: bool | None,
    ) -> None:
        self.target, self.X, self.y = target, target.inputs, y
        self.method, self.batch_size = options.method, batch_size
        self.early_stop, self.tol = options.early_stop, options.tol
        self.exact_points, self.scorings = options.exact_points, options.scorings
        self.settle = Settle(
            options.first_points,
            options.settle_se,
            options.settle_nats,
            options.settle_regret,
            options.unsure == "points",
        )
        criterion, race = options.criterion, options.race
        regression = is_regression(self.y)
        table = REGRESSION_CRITERIA if regression else CRITERIA
        # a name is looked up (`check_task` has refused one the task's table lacks), a callable kept
        self.criterion = criterion if callable(criterion) else table[criterion]
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
        """`surrogate_search` on every member and the first `exact_points` scoring points (all
        of them where there are fewer, or without a cap)."""
        cap = self.exact_points
        n = len(self.y) if cap is None else min(len(self.y), cap)
        base_of = torch.tensor(list(self.target.member_base))  # member -> its base
        bases = self.target.bases()

        def at_zero(start: int, stop: int) -> Tensor:
            x = take_rows(self.X, start, stop)
            zero = bases.member_logits(x, self.batch_size, progress=False)
            return zero[base_of.to(zero.device)]

        built: dict[float, Any] = {}  # the scales in play, built once (at most `scorings`)

        def exact(scale: float, start: int, stop: int) -> Tensor | None:
            if scale not in built:
                while len(built) >= max(self.scorings, 2):
                    del built[next(iter(built))]
                built[scale] = self.target.at(scale)
            return self._logits(built[scale], start, stop)

        result = surrogate_search(
            exact,
            at_zero,
            self.y[:n],
            self.criterion,
            self.point_loss,
            grid,
            max_scorings=self.scorings,
            settle=self.settle,
            on_scored=show,
        )
        self.scores, self.predicted = result.scores, result.predicted
        self.points = dict(result.points)
        return result.scale

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
