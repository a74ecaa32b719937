"""The tables of `benchmarks/label_free.py`: every method's MAE per family with its interval's
coverage and half-width (`methods`), and the default's (`PerformanceEstimator()`, "auto")
MAE, coverage, mean half-width and share flagged unreliable per family (`default`).

A row is (family, name, true accuracy, `Estimate` of an `all_methods=True` estimator, n,
the learned mode's half-width or None). A method's interval other than the default's is the
one `PerformanceEstimator(method)` would give: its own scale q (`scales_`) times the same
target's distances (`Estimate.distances`, `_reliability.scale`), with the sampling error.
"""

from __future__ import annotations

import numpy as np

from peg.methods.estimation import ESTIMATORS, _reliability, _shifts

ORDER = (
    "clean",
    "label shift",
    "corruption 1-3",
    "corruption 4-5",
    "corruption + label shift",
    "weaker signal",
    "weaker signal + label shift",
    "p(y | x) change",
)


def _families(rows) -> list[str]:
    seen = {r[0] for r in rows}
    return [f for f in ORDER if f in seen] + sorted(seen - set(ORDER))


def _interval(row, key: str, est, learned: str | None) -> tuple[float, float]:
    _, _, _, e, n, width = row
    if key == "auto" and learned is None:
        return e.interval
    shift = est.scales_.get(key, est.scales_["auto"]) * float(
        _reliability.scale(np.asarray(list(e.distances.values())))
    )
    if key == learned:
        shift = max(shift, width)
    return _shifts.interval(e.estimates[key], shift, n, float(e.confidence))


def methods(rows, est, seconds, learned: str | None) -> None:
    """Per method: MAE (points) per family and over all sets; coverage / mean half-width."""
    fams = [*_families(rows), "all"]
    print(
        "\nMAE in accuracy points per family (worst |error| over all sets in the last cell); "
        "90% interval coverage / mean half-width (points) over all sets"
    )
    print("| method | " + " | ".join(fams) + " | coverage / half-width | s / estimate |")
    print("|" + "---|" * (len(fams) + 3))
    for key in [*ESTIMATORS, *([learned] if learned else [])]:
        cells = []
        for fam in fams:
            sel = [r for r in rows if fam == "all" or r[0] == fam]
            err = np.array([(r[3].estimates[key] - r[2]) * 100 for r in sel])
            last = f" / {np.abs(err).max():.1f}" if fam == "all" else ""
            cells.append(f"{np.abs(err).mean():.2f}{last}")
        spans = [_interval(r, key, est, learned) for r in rows]
        covered = np.mean([lo <= r[2] <= hi for r, (lo, hi) in zip(rows, spans, strict=True)])
        half = np.mean([(hi - lo) / 2 for lo, hi in spans])
        print(
            f"| {key} | " + " | ".join(cells) + f" | {covered * 100:.0f}% / {half * 100:.1f} | "
            f"{seconds.get(key, float('nan')):.3f} |"
        )


def default(rows, dataset: str) -> None:
    """The default's table: per family, sets, MAE, coverage, mean half-width, unreliable."""
    print(
        f"\n{dataset}: the default (PerformanceEstimator(), method 'auto'), its own 90% "
        "interval and `reliable` flag (half-width past 0.15: unreliable)"
    )
    print("| family | sets | MAE (points) | coverage | mean half-width (points) | unreliable |")
    print("|---|---|---|---|---|---|")
    for fam in [*_families(rows), "all"]:
        sel = [r for r in rows if fam == "all" or r[0] == fam]
        err = np.array([abs(r[3].accuracy - r[2]) * 100 for r in sel])
        cov = np.mean([r[3].interval[0] <= r[2] <= r[3].interval[1] for r in sel])
        half = np.mean([(r[3].interval[1] - r[3].interval[0]) / 2 for r in sel])
        unreliable = np.mean([not r[3].reliable for r in sel])
        print(
            f"| {fam} | {len(sel)} | {err.mean():.2f} | {cov * 100:.0f}% | {half * 100:.1f} | "
            f"{unreliable * 100:.0f}% |"
        )
