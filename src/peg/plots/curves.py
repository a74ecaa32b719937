"""Curves and point clouds: samples in the diversity–accuracy plane (Fort et al. 2019, Fig. 6),
accuracy and NLL against ensemble size, and the criterion against PEG's η / PEP's σ."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from peg.plots._figure import (
    MARKERS,
    SERIES,
    cells,
    check_axes,
    check_cells,
    check_path,
    finish,
    panel,
    to_numpy,
)


def _xy_series(name: str, series: Any, x: str, y: str, where: str) -> tuple[np.ndarray, np.ndarray]:
    if not isinstance(series, Mapping) or x not in series or y not in series:
        raise ValueError(f"{where}[{name!r}]: expected a dict with {x!r} and {y!r} lists")
    a = to_numpy(series[x], f"{where}[{name!r}][{x!r}]").reshape(-1)
    b = to_numpy(series[y], f"{where}[{name!r}][{y!r}]").reshape(-1)
    if a.shape != b.shape:
        raise ValueError(
            f"{where}[{name!r}]: {x!r} and {y!r} differ in length ({a.size} vs {b.size})"
        )
    return a, b


def diversity_accuracy_plane(
    samples: Mapping[str, Mapping[str, Any]],
    path: str | os.PathLike[str] | None = None,
    reference_accuracy: float | None = None,
    curves: Mapping[str, Mapping[str, Any]] | None = None,
    stars: tuple[str, ...] = ("independent inits",),
    title: str | None = None,
    *,
    ax: Any = None,
) -> Any:
    """Samples of each method in the diversity–accuracy plane (Fig. 6).

    Args:
        samples: method -> {"accuracy": [M], "diversity": [M]} (as
            `peg.analysis.diversity_accuracy` returns); non-finite points are left out.
        path: a PNG file to write (atomically; parent folders are created), or None.
        reference_accuracy: the reference solution's accuracy (drawn as a green star at 0);
            required (a keyword where `path` is left out).
        curves: name -> {"accuracy", "diversity"} reference curves, drawn dashed
            (`peg.analysis.reference_curves`).
        stars: methods drawn as large red-edged stars (the paper's independent optima).
        title: figure title.
        ax: a matplotlib Axes to draw into (its figure is the one written to `path`). None: a
            new headless figure.

    Returns:
        given `ax`, that Axes (the figure is yours: pyplot shows it); else `Path(path)` when
        `path` is given; else the new matplotlib Figure.
    """
    if not isinstance(samples, Mapping) or not samples:
        raise ValueError("samples: expected a non-empty dict {method: accuracy and diversity}")
    if path is not None:
        check_path(path)
    if ax is not None:
        check_axes(ax)
    if isinstance(reference_accuracy, bool) or not isinstance(reference_accuracy, (int, float)):
        raise ValueError(
            f"reference_accuracy: expected the reference solution's accuracy, a number, got "
            f"{reference_accuracy!r}"
        )
    data = {
        str(k): _xy_series(str(k), v, "accuracy", "diversity", "samples")
        for k, v in samples.items()
    }
    lines = {
        str(k): _xy_series(str(k), v, "accuracy", "diversity", "curves")
        for k, v in (curves or {}).items()
    }
    drawn = panel(ax, 7.0, 5.0 + (0.3 if title else 0.0))
    finite_y = [b[np.isfinite(b)] for _, b in data.values()]
    top = max([float(v.max()) for v in finite_y if v.size] + [0.1]) * 1.25
    for i, (name, (a, b)) in enumerate(lines.items()):
        ok = np.isfinite(b) & (b <= top)
        drawn.plot(a[ok], b[ok], ls=("--", ":", "-.")[i % 3], color="0.35", lw=1, label=name)
    for i, (name, (a, b)) in enumerate(data.items()):
        ok = np.isfinite(a) & np.isfinite(b)
        colour = SERIES[i % len(SERIES)]
        if name in stars:
            drawn.scatter(
                a[ok],
                b[ok],
                marker="*",
                s=160,
                color="#D62728",
                edgecolors="k",
                lw=0.5,
                label=name,
                zorder=4,
            )
        else:
            drawn.scatter(
                a[ok],
                b[ok],
                marker=MARKERS[i % len(MARKERS)],
                s=22,
                color=colour,
                alpha=0.8,
                label=name,
                zorder=3,
            )
    drawn.scatter(
        [reference_accuracy],
        [0.0],
        marker="*",
        s=200,
        color="#2CA02C",
        edgecolors="k",
        lw=0.5,
        label="reference solution",
        zorder=5,
    )
    drawn.set_ylim(-0.02 * top, top)
    drawn.set_xlabel("accuracy")
    drawn.set_ylabel("disagreement with reference / (1 − accuracy)")
    drawn.grid(alpha=0.3)
    drawn.legend(fontsize=7, loc="best", frameon=False)
    if title:
        drawn.set_title(title, fontsize=10)
    return finish(drawn, path, ax)


def ensemble_size_curves(
    curves: Mapping[str, Mapping[str, Any]],
    path: str | os.PathLike[str] | None = None,
    title: str | None = None,
    *,
    ax: Any = None,
) -> Any:
    """Accuracy and NLL of the ensemble against its size, one line per method (two panels).

    Args:
        curves: method -> {"size": [K], "accuracy": [K], "nll": [K]} (e.g. the random-order
            averages of `peg.metrics.diversity.size_curve`).
        path: a PNG file to write (atomically; parent folders are created), or None.
        title: figure title.
        ax: a matplotlib Axes per panel, each panel drawn on its own (one panel: on `ax`); or
            one Axes for several panels, drawn in its place (a SubFigure there; the Axes
            itself is removed). None: a new headless figure.

    Returns:
        given `ax`, `ax` (or the SubFigure in its place; the figure is yours: pyplot shows
        it); else
        `Path(path)` when `path` is given; else the new matplotlib Figure.
    """
    if not isinstance(curves, Mapping) or not curves:
        raise ValueError("curves: expected a non-empty dict {method: size, accuracy, nll}")
    if path is not None:
        check_path(path)
    check_cells(ax, 2)
    acc = {str(k): _xy_series(str(k), v, "size", "accuracy", "curves") for k, v in curves.items()}
    nll = {str(k): _xy_series(str(k), v, "size", "nll", "curves") for k, v in curves.items()}
    fig, (left, right) = cells(ax, 2, 9.5, 3.8 + (0.3 if title else 0.0))
    for i, name in enumerate(acc):
        style = {
            "color": SERIES[i % len(SERIES)],
            "marker": MARKERS[i % len(MARKERS)],
            "ms": 4,
            "lw": 1.2,
        }
        left.plot(*acc[name], label=name, **style)
        right.plot(*nll[name], label=name, **style)
    left.set_ylabel("accuracy")
    right.set_ylabel("NLL")
    for side in (left, right):
        side.set_xlabel("ensemble size")
        side.grid(alpha=0.3)
    right.legend(fontsize=7, frameon=False, loc="best")
    if title:
        fig.suptitle(title)
    return finish(fig, path, ax)


def scale_search(
    fitted: Any,
    path: str | os.PathLike[str] | None = None,
    title: str | None = None,
    *,
    ax: Any = None,
) -> Any:
    """The η (σ) search of a fitted PEG or PEP: the criterion at every scale scored exactly,
    the interpolated curve the default search minimised (`search_predicted_`), and the choice.

    Args:
        fitted: a fitted `PEG` or `PEP` whose scale was searched.
        path: a PNG file to write (atomically; parent folders are created), or None.
        title: figure title.
        ax: a matplotlib Axes to draw into (its figure is the one written to `path`). None: a
            new headless figure.

    Returns:
        given `ax`, that Axes (the figure is yours: pyplot shows it); else `Path(path)` when
        `path` is given; else the new matplotlib Figure.
    """
    scores = getattr(fitted, "search_", None)
    if not scores:
        raise ValueError("fitted: expected a PEG or PEP fitted with its scale searched")
    if path is not None:
        check_path(path)
    if ax is not None:
        check_axes(ax)
    name = fitted.scale_name
    chosen = float(getattr(fitted, f"{name}_"))
    finite = {s: v for s, v in scores.items() if math.isfinite(v)}
    drawn = panel(ax, 5.2, 3.6 + (0.3 if title else 0.0))
    predicted = {s: v for s, v in getattr(fitted, "search_predicted_", {}).items() if v < math.inf}
    if predicted:
        top = 2 * max(finite.values(), default=1.0)  # the interpolant grows fast far out
        xs = sorted(s for s, v in predicted.items() if v <= top)
        drawn.plot(xs, [predicted[s] for s in xs], color=SERIES[1], lw=1.2, label="interpolated")
    xs = sorted(finite)
    drawn.plot(xs, [finite[s] for s in xs], "o", color=SERIES[0], ms=5, label="scored exactly")
    drawn.plot([chosen], [scores[chosen]], "*", color=SERIES[2], ms=12, label="chosen")
    symbol = {"eta": "η", "sigma": "σ"}.get(name, name)
    drawn.set_xscale("log")
    drawn.set_xlabel(symbol)
    drawn.set_ylabel(f"held-out {fitted.meta_['criterion']}")
    drawn.grid(alpha=0.3)
    drawn.legend(fontsize=7, frameon=False, loc="best")
    if title:
        drawn.set_title(title, fontsize=10)
    return finish(drawn, path, ax)
