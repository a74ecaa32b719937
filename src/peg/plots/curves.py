"""Curves and point clouds: samples in the diversity–accuracy plane (Fort et al. 2019, Fig. 6),
accuracy and NLL against ensemble size, and the criterion against PEG's η / PEP's σ."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from peg.plots._figure import MARKERS, SERIES, check_path, figure, save, to_numpy


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
    path: str | os.PathLike[str],
    reference_accuracy: float,
    curves: Mapping[str, Mapping[str, Any]] | None = None,
    stars: tuple[str, ...] = ("independent inits",),
    title: str | None = None,
) -> Path:
    """Samples of each method in the diversity–accuracy plane; writes a PNG (Fig. 6).

    Args:
        samples: method -> {"accuracy": [M], "diversity": [M]} (as
            `peg.analysis.diversity_accuracy` returns); non-finite points are left out.
        path: PNG file to write (parent folders are created).
        reference_accuracy: the reference solution's accuracy (drawn as a green star at 0).
        curves: name -> {"accuracy", "diversity"} reference curves, drawn dashed
            (`peg.analysis.reference_curves`).
        stars: methods drawn as large red-edged stars (the paper's independent optima).
        title: figure title.

    Returns:
        `Path(path)`.
    """
    if not isinstance(samples, Mapping) or not samples:
        raise ValueError("samples: expected a non-empty dict {method: accuracy and diversity}")
    check_path(path)
    data = {
        str(k): _xy_series(str(k), v, "accuracy", "diversity", "samples")
        for k, v in samples.items()
    }
    lines = {
        str(k): _xy_series(str(k), v, "accuracy", "diversity", "curves")
        for k, v in (curves or {}).items()
    }
    fig = figure(7.0, 5.0 + (0.3 if title else 0.0))
    ax = fig.add_subplot()
    finite_y = [b[np.isfinite(b)] for _, b in data.values()]
    top = max([float(v.max()) for v in finite_y if v.size] + [0.1]) * 1.25
    for i, (name, (a, b)) in enumerate(lines.items()):
        ok = np.isfinite(b) & (b <= top)
        ax.plot(a[ok], b[ok], ls=("--", ":", "-.")[i % 3], color="0.35", lw=1, label=name)
    for i, (name, (a, b)) in enumerate(data.items()):
        ok = np.isfinite(a) & np.isfinite(b)
        colour = SERIES[i % len(SERIES)]
        if name in stars:
            ax.scatter(
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
            ax.scatter(
                a[ok],
                b[ok],
                marker=MARKERS[i % len(MARKERS)],
                s=22,
                color=colour,
                alpha=0.8,
                label=name,
                zorder=3,
            )
    ax.scatter(
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
    ax.set_ylim(-0.02 * top, top)
    ax.set_xlabel("accuracy")
    ax.set_ylabel("disagreement with reference / (1 − accuracy)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="best", frameon=False)
    if title:
        ax.set_title(title, fontsize=10)
    return save(fig, path)


def ensemble_size_curves(
    curves: Mapping[str, Mapping[str, Any]],
    path: str | os.PathLike[str],
    title: str | None = None,
) -> Path:
    """Accuracy and NLL of the ensemble against its size, one line per method; writes a PNG.

    Args:
        curves: method -> {"size": [K], "accuracy": [K], "nll": [K]} (e.g. the random-order
            averages of `peg.metrics.diversity.size_curve`).
        path: PNG file to write (parent folders are created).
        title: figure title.

    Returns:
        `Path(path)`.
    """
    if not isinstance(curves, Mapping) or not curves:
        raise ValueError("curves: expected a non-empty dict {method: size, accuracy, nll}")
    check_path(path)
    acc = {str(k): _xy_series(str(k), v, "size", "accuracy", "curves") for k, v in curves.items()}
    nll = {str(k): _xy_series(str(k), v, "size", "nll", "curves") for k, v in curves.items()}
    fig = figure(9.5, 3.8 + (0.3 if title else 0.0))
    left, right = fig.subplots(1, 2)
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
    for ax in (left, right):
        ax.set_xlabel("ensemble size")
        ax.grid(alpha=0.3)
    right.legend(fontsize=7, frameon=False, loc="best")
    if title:
        fig.suptitle(title)
    return save(fig, path)


def scale_search(fitted: Any, path: str | os.PathLike[str], title: str | None = None) -> Path:
    """The η (σ) search of a fitted PEG or PEP: the criterion at every scale scored exactly,
    the interpolated curve the default search minimised (`search_predicted_`), and the choice;
    writes a PNG.

    Args:
        fitted: a fitted `PEG` or `PEP` whose scale was searched.
        path: PNG file to write (parent folders are created).
        title: figure title.

    Returns:
        `Path(path)`.
    """
    scores = getattr(fitted, "search_", None)
    if not scores:
        raise ValueError("fitted: expected a PEG or PEP fitted with its scale searched")
    check_path(path)
    name = fitted.scale_name
    chosen = float(getattr(fitted, f"{name}_"))
    finite = {s: v for s, v in scores.items() if math.isfinite(v)}
    fig = figure(5.2, 3.6 + (0.3 if title else 0.0))
    ax = fig.subplots()
    predicted = {s: v for s, v in getattr(fitted, "search_predicted_", {}).items() if v < math.inf}
    if predicted:
        top = 2 * max(finite.values(), default=1.0)  # the interpolant grows fast far out
        xs = sorted(s for s, v in predicted.items() if v <= top)
        ax.plot(xs, [predicted[s] for s in xs], color=SERIES[1], lw=1.2, label="interpolated")
    xs = sorted(finite)
    ax.plot(xs, [finite[s] for s in xs], "o", color=SERIES[0], ms=5, label="scored exactly")
    ax.plot([chosen], [scores[chosen]], "*", color=SERIES[2], ms=12, label="chosen")
    symbol = {"eta": "η", "sigma": "σ"}.get(name, name)
    ax.set_xscale("log")
    ax.set_xlabel(symbol)
    ax.set_ylabel(f"held-out {fitted.meta_['criterion']}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, frameon=False, loc="best")
    if title:
        ax.set_title(title, fontsize=10)
    return save(fig, path)
