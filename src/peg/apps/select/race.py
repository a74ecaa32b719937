"""The cost rule of `AutoSelect`'s cross-fitting (`Plan`): cheap candidates first, a race over
the folds and a time budget for the whole fit, relative to temperature scaling's.

- **Order** (`cheap_first`): the maps on the cached logits, by expected value per cost (TS,
  ensemble TS, vector scaling, then the others: `cost_order()`), then the candidates that touch
  the network from the cheapest expected (MC dropout, Laplace, last-layer PEG) to the dearest
  (PEG, its chains, PEP); a chained candidate always after its base. It is the order of
  admission: under a tight budget what is left out is what is least likely to win for its
  price. Every candidate is fitted on fold k before any on fold k + 1, so every decision is
  made on paired scores.
- **Race**: once two folds are in, after each fold, a candidate whose paired mean difference to
  the leader (the best mean over the folds so far) exceeds `race` standard errors of that
  difference is dropped, saying so (it cannot win, nor be within one SE of the winner).
- **Budget** (seconds, for the whole `AutoSelect.fit`: the validation pass, every fold, the
  refit of the choice): a candidate is started on the first fold only if the budget allows it
  and every candidate already kept to finish (its cost estimated, before it has run, by the
  dearest network candidate fitted so far, and at least its `members` forward passes of the
  validation data); after each fold, while the kept candidates' cost of the remaining folds
  (measured: their mean seconds a fold, fit and scoring) and the refit of the leader would pass
  the budget, one is dropped, saying so: of those whose drop alone would do, the dearest
  unless one scored worse beyond a paired SE, else the one whose drop saves most (the leader
  only where it alone passes the budget: a candidate running past the budget is stopped at the
  next fold). The maps on the cached logits (no forward pass: temperature, ensemble TS, ...,
  vector and matrix scaling, Dirichlet) are admitted the same way, each priced by its own
  structure (`cheap.growth()`): the dearest map fitted so far of no more parameters per class (at
  1,000 classes matrix scaling's fold costs 20-40 TS fits, and would otherwise spend the
  budget of the cheaper maps; a full map, matrix scaling or Dirichlet, is priced at least at
  the diagonal map's measured fold × `full_map_factor(C)`, C² parameters against C). Every
  price and measured fold is wall seconds on the machine that timed the reference TS fit, so
  a load that slows both moves the budget and the prices together; the `MIN_BUDGET_SECONDS`
  floor is in seconds of an unloaded machine (× `reference.slowdown`), for the same reason.
  The first candidate in the order (temperature scaling by default) is never dropped.
- **Known cheap** (`known_cheap`): a map on the cached logits whose predicted fit of every fold
  (`predicted_fold`: from its growth and the data's size, in seconds of an unloaded machine)
  takes at most `CHEAP_SHARE` of the `MIN_BUDGET_SECONDS` floor is always scored: never left
  out, dropped or stopped for time, whatever the load (one run under load had skipped matrix
  scaling and Dirichlet at 10 classes and 2,000 points, the next one scored them). Only a
  measured fold far past its prediction (`cheap.fold_limit`: more than a load explains) ends
  the guarantee. The race still drops it where it scores worse.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor
from tqdm.auto import tqdm

from peg.apps.bench.spec import MethodSpec
from peg.apps.compare.collapse import indistinguishable
from peg.apps.compare.methods import MODEL
from peg.apps.select.cheap import CHEAP_SHARE, fold_limit, growth, predicted_fold
from peg.apps.select.folds import beyond, mean_se
from peg.methods.calibration._calibrator import Calibrator, display_names
from peg.methods.calibration.temperature import TemperatureScaling
from peg.utils.progress import _disable, lines

# max_fit_seconds="auto": the whole fit's budget, in temperature scaling fits on the same model
# and data (a forward pass of val and the one-parameter fit, measured in the run)
AUTO_BUDGET = 25.0
# ... and never less than this many seconds of an unloaded machine (× the load measured on the
# reference pass, `reference.slowdown`; a run of seconds is not worth cutting: on a tiny
# model or saved logits a fit's fixed costs, not its forward passes, would set the budget; at
# 100 classes a 5 s floor left out vector scaling, the exhaustive run's choice, at +0.013 nats)
MIN_BUDGET_SECONDS = 10.0
# the order the candidates are fitted in within a fold (`cost_order()`: the maps by their
# declared `cost_order`, then these), which is the order they are admitted in (others after
# them, in their order): by expected value per cost, so that under a tight budget the maps
# left out are the least likely to win for their price
NETWORK_ORDER = (
    "MC dropout",
    "Last-layer PEG",
    "Laplace",
    "PEG",
    f"PEG + {TemperatureScaling.name}",
    f"{TemperatureScaling.name} → PEG",
    "PEP",
)


def cost_order() -> tuple[str, ...]:
    """The named candidates in fitting order: the registered maps by their declared
    `cost_order`, then `NETWORK_ORDER`."""
    return (*display_names("cost_order"), *NETWORK_ORDER)


# a full affine map's fold (matrix scaling, Dirichlet: C² parameters) in the diagonal map's
# folds (vector scaling: C), its price before it has run. Measured with the Newton
# fits (CPU seconds of one fit): 1.2-1.8 at 10 and 100 classes, 500 or 5,000 points (3.1 for
# Dirichlet at 100 classes and 5,000), 15-40 at 1,000 classes and 500 points (truncated
# Newton on 10⁶ parameters), ~9 on saturated 10-class logits, whose diagonal map is TS's
# (held: a trivial fit); a full map over its price is measured on its first fold and trimmed
# (the full map's `priced_from`: the diagonal map its price is measured from)


def full_map_factor(classes: int) -> float:
    """A full map's fold seconds over the diagonal map's at `classes` classes (see above)."""
    return max(2.0, (classes / 100) ** 2)


# the members a network candidate forwards by default: a fold of it costs at least this many
# forward passes of the validation data (fitted on K - 1 folds, predicting the held-out one)
MEMBERS = {"peg": 15, "pep": 15, "mc-dropout": 15}


# a network candidate's fold besides its members' forward passes of the validation data, in
# forward passes of it: PEG's and PEP's gradient pass over the K - 1 training folds (forward
# and backward), Laplace's curvature. Its price before it has run is (members + these) forward
# passes: measured on the Fashion-MNIST CNN (2,000 points, one thread, a pass ~0.3 s), a fold of
# PEG-15 or PEP-15 3-6 s (~18 passes), last-layer PEG ~1.2 s (~4), Laplace 2-4 s (~10)
# (results/benchmarks/auto_select.txt); a fold past its price is stopped at its share of the
# budget (`Plan.allowance`), so the price need not be exact
FIT_PASSES = {"peg": 3.0, "pep": 3.0, "laplace": 9.0}


def members(spec: MethodSpec) -> int:
    """Members `spec` forwards (1: one forward, or a head after one: last-layer PEG)."""
    if spec.options.get("params") == "last_layer":
        return 1
    return int(spec.options.get("n_members", MEMBERS.get(spec.method, 1)))


def fold_lines(progress: bool | None) -> Callable[[str], None]:
    """Where a fold's line goes: stderr in a log (`peg.utils.progress.lines`) and on a terminal
    (above the bar); nowhere with progress off."""
    log = lines(progress)
    if _disable(progress) is True or not sys.stderr.isatty():
        return log
    return lambda line: tqdm.write(line, file=sys.stderr)


def cheap_first(specs: list[MethodSpec], on_logits: Callable[[MethodSpec], bool]) -> list[Any]:
    """`specs` in fitting order: the maps on the cached logits first, then `cost_order()`, others
    after in their order; a chained candidate after its base."""

    ordered = cost_order()

    def rank(i_spec: tuple[int, MethodSpec]) -> tuple[int, int, int]:
        i, spec = i_spec
        named = ordered.index(spec.name) if spec.name in ordered else len(ordered)
        return (0 if on_logits(spec) else 1, named, i)

    order = [s for _, s in sorted(enumerate(specs), key=rank)]
    placed: list[MethodSpec] = []
    names = {s.name for s in specs}
    while order:  # a chained candidate waits for its base (the bases come first: no cycles)
        spec = next(s for s in order if s.base == MODEL or s.base not in names or any(
            p.name == s.base for p in placed))  # fmt: skip
        order.remove(spec)
        placed.append(spec)
    return placed


class Plan:
    """The budget and the race of one cross-fitting (see the module doc).

    Args:
        budget: seconds for the whole fit, from `started` (None: no budget, no race: every
            candidate on every fold).
        race: standard errors of the paired difference beyond which a candidate is dropped
            (None: no race).
        started: `time.perf_counter()` when the fit began.
        say: where the fold lines go (`AutoSelect [fold 2/5] ...; ETA 40 s`).
    """

    def __init__(
        self, budget: float | None, race: float | None, started: float,
        say: Callable[[str], None], forward: float = 0.0, classes: int = 0,
    ) -> None:  # fmt: skip
        self.budget, self.race, self.started, self.say = budget, race, started, say
        self.forward, self.classes = forward, classes

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    # ---------------------------------------------------------------- estimates
    def _per_fold(self, cross: Any, name: str) -> float | None:
        """`name`'s measured seconds a fold (fit and scoring, its own), None before it ran."""
        steps = cross.steps.get(name) or []
        return sum(steps) / len(steps) if steps else None

    def _prior(self, cross: Any, spec: MethodSpec) -> float:
        """`spec`'s price, its seconds a fold before it has run: the dearest so far of its kind
        (network candidates, or maps on the cached logits of no richer growth; 0 before
        any); for a full affine
        map whose diagonal map ran, that map's measured fold × `full_map_factor` instead; for a
        network candidate at least its `members` forward passes of the validation data and its
        fit's (`FIT_PASSES`)."""
        cheap = cross.cheap(spec.name)
        grows = growth()
        rank = grows.get(spec.method, 2)  # an unknown map: any map's fold may be its price
        guess = max((max(v) for n, v in cross.steps.items() if v and cross.cheap(n) == cheap
                     and (not cheap or grows.get(self._method(cross, n) or "", 2) <= rank)),
                    default=0.0)  # fmt: skip
        priced_from = getattr(Calibrator.registry.get(spec.method), "priced_from", "")
        if cheap and priced_from:  # from its diagonal map where that ran: not
            # from the other full map's (Dirichlet on saturated logits: 2.8 s a fold, matrix
            # scaling a tenth of it, priced out at Dirichlet's and the choice +0.2 nats off)
            diagonal = [max(v) for n, v in cross.steps.items() if v and self._method(cross, n)
                        == priced_from]  # fmt: skip
            if diagonal:
                guess = max(diagonal) * full_map_factor(self.classes)
        elif not cheap:  # chained ones too ("TS → PEG": its members forward its base)
            passes = members(spec) + FIT_PASSES.get(spec.method, 0.0)
            guess = max(guess, passes * self.forward)
        return guess

    def known_cheap(self, cross: Any, name: str, folds: int) -> bool:
        """Whether `name` is always scored (see the module doc): a map on the cached logits
        whose predicted folds take at most `CHEAP_SHARE` of the budget's floor, none of its
        measured folds past `fold_limit`; not where the classes are unknown (0), nor a map of
        another candidate's output (it waits for its base's fits)."""
        spec = next((s for s in cross.order if s.name == name), None)
        if self.classes < 2 or spec is None or spec.method not in growth():
            return False
        if spec.base != MODEL or not cross.cheap(name):
            return False
        points = len(next(iter(cross.points.values())))
        fold = predicted_fold(spec.method, points, self.classes)
        if folds * fold > CHEAP_SHARE * MIN_BUDGET_SECONDS:
            return False
        limit = fold_limit(spec.method, points, self.classes)
        return all(t <= limit for t in cross.steps.get(name) or [])

    def _method(self, cross: Any, name: str) -> str | None:
        return next((s.method for s in cross.order if s.name == name), None)

    def _kept(self, cross: Any) -> list[str]:
        return [s.name for s in cross.order if s.name not in cross.dropped]

    def _remaining(self, cross: Any, names: list[str], folds_left: int) -> float:
        """Seconds to fit `names` (and the bases they need) on `folds_left` more folds."""
        needed = set(names) | {cross.base_of[n] for n in names}
        return folds_left * sum(self._per_fold(cross, n) or 0.0 for n in needed)

    def _refit(self, cross: Any, leader: str | None, folds: int) -> float:
        """The leader's refit on all points (a fold's seconds × folds / (folds − 1))."""
        if leader is None:
            return 0.0
        return (self._per_fold(cross, leader) or 0.0) * folds / (folds - 1)

    def _saving(self, cross: Any, name: str, kept: list[str]) -> float:
        """Seconds a fold that dropping `name` saves: its own, unless a kept candidate is
        chained on it, and its base's where nothing else kept needs that."""
        others = [n for n in kept if n != name]
        if any(cross.base_of[n] == name for n in others):
            return 0.0  # still fitted as a base: drop what is chained on it first
        base = cross.base_of[name]
        shared = base in others or any(cross.base_of[n] == base for n in others)
        return (self._per_fold(cross, name) or 0.0) + (
            0.0 if shared else self._per_fold(cross, base) or 0.0)  # fmt: skip

    # ---------------------------------------------------------------- decisions
    def allowance(self, cross: Any, spec: MethodSpec, f: int, folds: int) -> float | None:
        """Seconds `spec`'s fold `f` may run before it is stopped (`deadline.stop_at`; None:
        no budget, or the first candidate, never stopped): its share of what the budget leaves
        after the other kept candidates' remaining fits (their measured or priced folds: those
        after it in this fold, and every later fold), over its own folds left, this one
        included. A fold past it could not be followed by the rest within the budget."""
        if self.budget is None or spec is cross.order[0]:
            return None
        left, at = folds - 1 - f, cross.order.index(spec)
        # the others started: on the first fold those before it (the rest are not admitted yet)
        # and, as in `admit`, no dearer a fold than its price (the trim drops those first)
        started = set(self._kept(cross))
        if f == 0:
            price = self._price(cross, spec.name)
            started = {s.name for s in cross.order[:at] if s is cross.order[0]
                       or (self._per_fold(cross, s.name) or 0.0) <= price}  # fmt: skip
        others = [n for n in self._kept(cross) if n != spec.name and n in started]
        needed = (set(others) | {cross.base_of[n] for n in others}) - {spec.name}
        later = {s.name for s in cross.order[at + 1 :]} & needed
        owed = sum(self._price(cross, n) for n in needed) * left
        owed += sum(self._price(cross, n) for n in later)
        share = (self.budget - self.elapsed() - owed) / (left + 1)
        if self.known_cheap(cross, spec.name, folds):  # stopped only far past its prediction
            points = len(next(iter(cross.points.values())))
            return max(share, fold_limit(spec.method, points, self.classes))
        return share

    def _price(self, cross: Any, name: str) -> float:
        """`name`'s seconds a fold: measured, else its price before it ran (`_prior`)."""
        measured = self._per_fold(cross, name)
        if measured is not None:
            return measured
        spec = next((s for s in cross.order if s.name == name), None)
        return 0.0 if spec is None else self._prior(cross, spec)

    def admit(self, cross: Any, spec: MethodSpec, folds: int) -> str | None:
        """Why `spec` is not started on the first fold (None: it is)."""
        first = spec is cross.order[0]
        if self.budget is None or first or self.known_cheap(cross, spec.name, folds):
            return None
        guess = self._prior(cross, spec)
        kept = [n for n in self._kept(cross) if n != spec.name]
        if spec.base not in set(kept) | {cross.base_of[n] for n in kept} | {MODEL}:
            guess += self._price(cross, spec.base)  # fitted for it alone ("PEG + TS" on PEG)
        cost = self._remaining(cross, kept, folds - 1) + folds * guess
        if self.elapsed() + cost <= self.budget:
            return None
        # the trim after this fold drops the dearest kept first: it starts where the kept ones
        # no dearer a fold than it leave it room (saturated logits: Dirichlet's 3.4 s folds, to
        # be dropped after the fold, left no room for matrix scaling's 0.14 s, the choice)
        cheaper = [n for n in kept if n == cross.order[0].name or (self._per_fold(cross, n)
                                                                   or 0.0) <= guess]  # fmt: skip
        if self.elapsed() + self._remaining(cross, cheaper, folds - 1) + folds * guess <= \
                self.budget:  # fmt: skip
            return None
        return (
            f"not started: budget {self.budget:.3g} s ({self.elapsed():.3g} s spent; the kept "
            f"candidates' remaining folds and {folds} folds of this one at a price of "
            f"{guess:.3g} s each would take {cost:.3g} s more)"
        )

    def after_fold(self, cross: Any, folds: list[Tensor], f: int) -> None:
        """After fold `f`: the race (from the second fold), then the budget, then the fold's
        line with its ETA."""
        covered = torch.cat(folds[: f + 1])
        leader = self._leader(cross, covered)
        if self.budget is not None and self.race is not None and f >= 1 and leader is not None:
            self._race(cross, covered, leader, f)
        left = len(folds) - 1 - f
        if self.budget is not None and left > 0:
            self._trim(cross, leader, len(folds), left, covered)
        eta = self._remaining(cross, self._kept(cross), left)
        eta += self._refit(cross, leader, len(folds))
        budget = "" if self.budget is None else f" of the {self.budget:.3g} s budget"
        self.say(
            f"AutoSelect [fold {f + 1}/{len(folds)}] done: {self.elapsed():.1f} s{budget}; "
            f"{len(self._kept(cross))} candidates kept, leader {leader}; ETA {eta:.0f} s"
        )

    def _leader(self, cross: Any, covered: Tensor) -> str | None:
        scores = {n: cross.points[n][covered] for n in self._kept(cross)}
        scores = {n: s for n, s in scores.items() if not bool(torch.isnan(s).any())}
        return min(scores, key=lambda n: float(scores[n].mean()), default=None)

    def _race(self, cross: Any, covered: Tensor, leader: str, f: int) -> None:
        best = cross.points[leader][covered]
        for name in self._kept(cross):
            diff, se = mean_se(cross.points[name][covered] - best)
            if name != leader and beyond(diff, se, self.race):
                why = (f"raced out after fold {f + 1}: worse than {leader} by {diff:+.4f} ± "
                       f"{se:.4f} (paired), beyond {self.race:g} SE")  # fmt: skip
                if indistinguishable(cross.gaps.get(name)):  # still said (`collapse`)
                    why += f"; indistinguishable from its base ({cross.base_of[name]}) so far"
                cross.dropped[name] = why

    def _worst(
        self, cross: Any, saving: dict[str, float], excess: float, left: int, covered: Tensor
    ) -> str:
        """Which of `saving` (name → seconds a fold its drop saves) to drop for `excess` seconds
        over the budget: of those whose drop alone suffices, the dearest, unless another scored
        worse than it beyond one paired SE so far (the least value for the price: not the
        better of two maps whose folds differ by the load's noise); none sufficing, the one
        whose drop saves most."""
        enough = [n for n in saving if saving[n] * left >= excess]
        dearest = max(enough or saving, key=lambda n: saving[n])
        worse = [n for n in enough if n != dearest and beyond(
            *mean_se(cross.points[n][covered] - cross.points[dearest][covered]))]  # fmt: skip
        return max(worse, key=lambda n: float(cross.points[n][covered].mean()), default=dearest)

    def _trim(self, cross: Any, leader: str | None, folds: int, left: int, covered: Tensor) -> None:
        """Drop kept candidates (`_worst`; the leader only where it alone passes the budget)
        until the rest fit the budget."""
        while True:
            kept = self._kept(cross)
            cost = self._remaining(cross, kept, left) + self._refit(cross, leader, folds)
            if self.elapsed() + cost <= self.budget:
                return
            saving = {n: v for n in kept if n != cross.order[0].name
                      and not self.known_cheap(cross, n, folds)
                      and (v := self._saving(cross, n, kept)) > 0}  # fmt: skip
            core = [n for n in kept if n in (leader, cross.order[0].name)]
            alone = self._remaining(cross, core, left) + self._refit(cross, leader, folds)
            # the leader is kept unless it alone passes the budget: then it is stopped first
            pick = saving if self.elapsed() + alone > self.budget else {
                n: v for n, v in saving.items() if n != leader}  # fmt: skip
            if not pick:
                return
            name = self._worst(cross, pick, self.elapsed() + cost - self.budget, left, covered)
            cross.dropped[name] = (
                f"over budget after fold {folds - left}: {left} more folds at "
                f"{self._per_fold(cross, name):.3g} s would pass {self.budget:.3g} s "
                f"({self.elapsed():.3g} s spent, {cost:.3g} s more with it)"
            )
            if name == leader:
                leader = self._leader(cross, covered)
