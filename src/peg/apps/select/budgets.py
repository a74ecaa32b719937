"""`AutoSelect`'s two budgets: the fit's time (`max_fit_seconds`: seconds, or "auto" from the
measured temperature scaling fit, which `peg.apps.select.race` spends) and the predictor's
forwards per input (`max_forwards`: a candidate over it dropped after the first fold)."""

from __future__ import annotations

from typing import Any

from peg.apps.select.cross import CrossFit
from peg.apps.select.race import AUTO_BUDGET, MIN_BUDGET_SECONDS
from peg.methods import _constraints as checks


def check_seconds(value: Any, name: str) -> None:
    """Seconds: "auto", None or a finite number > 0."""
    if value is None or (isinstance(value, str) and value == "auto"):
        return
    if isinstance(value, str):
        raise ValueError(f"{name}: expected seconds > 0, 'auto' or None, got {value!r}")
    checks.number()(value, name)


def budget_seconds(max_fit_seconds: Any, reference: float, load: float = 1.0) -> float | None:
    """The time budget in seconds (None: none); "auto": `AUTO_BUDGET` × the reference TS fit,
    at least its floor times the machine's `load` (`reference.slowdown`)."""
    if max_fit_seconds == "auto":
        return max(AUTO_BUDGET * reference, MIN_BUDGET_SECONDS * load)
    return None if max_fit_seconds is None else float(max_fit_seconds)


def drop_over_forwards(cross: CrossFit, limit: float | None) -> None:
    """After the first fold: drop the candidates over the forwards budget `limit`; a
    ValueError naming the cheapest candidate's cost when none is left."""
    fitted = [s.name for s in cross.specs if s.name not in cross.dropped]
    if limit is None or not fitted:
        return
    over = {n: c for n in fitted if (c := cross.forwards.get(n)) is not None and c > limit}
    if len(over) == len(fitted):
        name = min(over, key=lambda n: over[n])
        raise ValueError(
            f"max_forwards={limit}: every candidate is over the budget; the cheapest, {name}, "
            f"costs {over[name]:.3g} forwards per input"
        )
    for n, c in over.items():
        cross.dropped[n] = f"over budget: {c:.3g} forwards / input > max_forwards={limit}"
