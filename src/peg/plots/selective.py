"""Risk–coverage curves of selective classification, one line per method."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from peg.metrics._predictive import Ranked
from peg.metrics.selective import augrc_of, aurc_of
from peg.plots._figure import SERIES, check_axes, check_path, finish, panel, root, to_numpy

KEYS = ("coverage", "risk", "generalized_risk", "accepted", "errors")


def _curve_arrays(name: str, curve: Any) -> tuple[np.ndarray, np.ndarray, Ranked]:
    """(coverage, generalised risk, the ranks behind them) of one curve, checked."""
    if not isinstance(curve, Mapping):
        raise ValueError(
            f"curves[{name!r}]: expected a dict as peg.metrics.risk_coverage_curve returns, "
            f"got {type(curve).__name__}"
        )
    missing = [k for k in KEYS if k not in curve]
    if missing:
        raise ValueError(f"curves[{name!r}]: missing keys {missing}")
    coverage = to_numpy(curve["coverage"], f"curves[{name!r}]['coverage']").reshape(-1)
    general = to_numpy(curve["generalized_risk"], f"curves[{name!r}]['generalized_risk']")
    general = general.reshape(-1)
    accepted = to_numpy(curve["accepted"], f"curves[{name!r}]['accepted']").reshape(-1)
    errors = to_numpy(curve["errors"], f"curves[{name!r}]['errors']").reshape(-1)
    shapes = {a.shape for a in (coverage, general, accepted, errors)}
    if len(shapes) != 1 or coverage.size == 0:
        raise ValueError(f"curves[{name!r}]: expected [K] arrays of one length, K >= 1")
    steps = np.diff(np.r_[0, accepted])
    wrong = np.diff(np.r_[0, errors])
    if np.any(steps <= 0) or np.any(wrong < 0) or np.any(wrong > steps):
        raise ValueError(
            f"curves[{name!r}]: 'accepted' must increase and 'errors' grow by at most as much"
        )
    # the areas come from the metrics' own code, on the counts (thresholds unused)
    counts = (torch.from_numpy(np.asarray(a, dtype=np.int64)) for a in (steps, wrong))
    return coverage, general, Ranked(torch.zeros(len(steps)), *counts)


def risk_coverage(
    curves: Mapping[str, Mapping[str, Any]],
    path: str | os.PathLike[str] | None = None,
    *,
    ax: Any = None,
    generalized: bool = False,
    title: str | None = None,
) -> Any:
    """Risk–coverage curves, one line per method, each labelled with its area (AURC, or AUGRC
    with `generalized=True`, as %); draws into `ax` or a new figure.

    The lines are the curves `peg.metrics.aurc` and `peg.metrics.augrc` integrate: the
    generalised risk linear between the curve's points (from (0, 0)); the selective risk is
    that divided by the coverage (drawn on a fine grid: between points it is not a straight
    line), constant below the first point.

    Args:
        curves: method name -> `peg.metrics.risk_coverage_curve` data.
        path: a PNG file to write (atomically; parent folders created), or None.
        ax: a matplotlib Axes to draw into (its figure is the one written to `path`); None:
            a new figure (headless, as every `peg.plots` figure).
        generalized: draw the generalised risk P(wrong, accepted) instead of the selective
            risk.
        title: the Axes' title.

    Returns:
        the Axes drawn into where `ax` or `path` is given (as it always has); else the new
        matplotlib Figure.
    """
    if not isinstance(curves, Mapping) or not curves:
        raise ValueError("curves: expected a non-empty dict {method name: risk-coverage curve}")
    if path is not None:
        check_path(path)
    if ax is not None:
        check_axes(ax)
    data = {str(name): _curve_arrays(str(name), c) for name, c in curves.items()}
    drawn = panel(ax, 6.0, 4.5 + (0.3 if title else 0.0))
    area, label = (augrc_of, "AUGRC") if generalized else (aurc_of, "AURC")
    for i, (name, (coverage, general, ranks)) in enumerate(data.items()):
        x = np.r_[0.0, coverage]
        y = np.r_[0.0, general]
        if not generalized:  # r = g / c, exactly, on a grid finer than the points
            x = np.union1d(coverage, np.linspace(coverage[0], 1.0, 512))
            y = np.interp(x, np.r_[0.0, coverage], np.r_[0.0, general]) / x
            x, y = np.r_[0.0, x], np.r_[y[0], y]
        text = f"{name} ({label} {100 * area(ranks):.2f}%)"
        drawn.plot(x, y, color=SERIES[i % len(SERIES)], lw=1.5, label=text)
    drawn.set_xlim(0, 1)
    drawn.set_ylim(bottom=0)
    drawn.set_xlabel("coverage")
    drawn.set_ylabel("P(wrong, accepted)" if generalized else "risk (error among accepted)")
    drawn.legend(loc="upper left", fontsize=8, frameon=False)
    drawn.grid(alpha=0.3)
    if title:
        drawn.set_title(title)
    finish(drawn, path, ax)
    return drawn if ax is not None or path is not None else root(drawn)
