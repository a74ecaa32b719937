"""What a map on the cached logits costs before it has run (`race.Plan` reads it): how its
parameters grow with the classes (`growth()`, each calibrator's declared `growth`), its fold
predicted in seconds of an unloaded machine (`predicted_fold`), and the share of the budget's
floor under which it is known cheap, always scored (`CHEAP_SHARE`; `race`'s module doc has the
rule).
"""

from __future__ import annotations

from peg.methods.calibration._calibrator import calibrators


def growth() -> dict[str, int]:
    """How each map's fitted parameters grow with the classes C, by key (0: a few, whatever C;
    1: O(C), one per class or one-vs-rest; 2: O(C²)), as each calibrator declares it
    (`Calibrator.growth`): a map is priced, before it has run, by the dearest measured fold of
    the maps of no richer structure (isotonic after Dirichlet: not at Dirichlet's fold)."""
    return {c.method: c.growth for c in calibrators()}


# a map on the cached logits is known cheap where its predicted fits of every fold take at most
# this share of the budget's floor (seconds of an unloaded machine; 2.5 s): at 10 classes every
# logits map up to 5,000 points, at 100 classes none of the O(C) or O(C²) ones at 2,000
CHEAP_SHARE = 0.25
# unloaded seconds a fold of a map costs per 1,000 validation points at 10 classes (measured
# with the Newton fits: 0.4-0.5 CPU seconds a fold of Dirichlet at 10 classes and 5,000
# points, the dearest of the maps there; TS and vector scaling a fraction of it)
FOLD_SECONDS_PER_1000 = 0.1
# a known-cheap map's measured fold may pass its prediction (a second at least) by this factor
# before its guarantee ends: more than a load explains (`reference.MAX_SLOWDOWN`'s 10; on the
# 2-core machine shared by several jobs a 0.2 s Dirichlet fold took 2.4 s)
LOAD_CAP = 10.0


def fold_limit(method: str, points: int, classes: int) -> float:
    """Seconds a known-cheap map's fold may take before its guarantee ends (`LOAD_CAP`)."""
    return LOAD_CAP * max(predicted_fold(method, points, classes), 1.0)


def predicted_fold(method: str, points: int, classes: int) -> float:
    """A map's fold on the cached logits, in seconds of an unloaded machine (an upper bound
    for the registered maps): linear in the points, in C / 10 to the power of its growth."""
    rank = growth().get(method, 2)
    return FOLD_SECONDS_PER_1000 * points / 1000 * max(1.0, classes / 10) ** rank
