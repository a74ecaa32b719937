"""Reliability diagrams: per-bin accuracy against confidence, one panel per method."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from peg._scalars import check_positive_int
from peg.metrics.calibration import binned_ece
from peg.plots._figure import check_path, figure, save, to_numpy


def _reliability_arrays(name: str, r: Any) -> tuple[np.ndarray, ...]:
    if not isinstance(r, Mapping):
        raise ValueError(
            f"curves[{name!r}]: expected a dict with edges, confidence, accuracy and count "
            f"(as peg.metrics.reliability returns), got {type(r).__name__}"
        )
    missing = [k for k in ("edges", "confidence", "accuracy", "count") if k not in r]
    if missing:
        raise ValueError(f"curves[{name!r}]: missing keys {missing}")
    edges = to_numpy(r["edges"], f"curves[{name!r}]['edges']")
    conf = to_numpy(r["confidence"], f"curves[{name!r}]['confidence']")
    acc = to_numpy(r["accuracy"], f"curves[{name!r}]['accuracy']")
    count = to_numpy(r["count"], f"curves[{name!r}]['count']")
    b = conf.shape[0] if conf.ndim == 1 else -1
    if b < 1 or edges.shape != (b + 1,) or acc.shape != (b,) or count.shape != (b,):
        raise ValueError(
            f"curves[{name!r}]: expected edges [B+1] and confidence, accuracy, count [B], got "
            f"{edges.shape}, {conf.shape}, {acc.shape}, {count.shape}"
        )
    if not np.all(np.isfinite(edges)) or np.any(np.diff(edges) <= 0):
        raise ValueError(f"curves[{name!r}]['edges']: expected increasing finite bin edges")
    if np.any(count < 0) or count.sum() <= 0:
        raise ValueError(f"curves[{name!r}]['count']: expected non-negative counts, not all 0")
    full = count > 0
    if not (np.all(np.isfinite(conf[full])) and np.all(np.isfinite(acc[full]))):
        raise ValueError(
            f"curves[{name!r}]: confidence and accuracy must be finite in non-empty bins"
        )
    return edges, conf, acc, count


def _legend_handles() -> list[Any]:
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    return [
        Line2D([], [], color="k", ls="--", lw=1, label="perfect calibration"),
        Patch(facecolor="#4C72B0", label="accuracy"),
        Patch(
            facecolor="#D62728",
            alpha=0.35,
            edgecolor="#D62728",
            hatch="//",
            label="gap (over-confident)",
        ),
        Patch(
            facecolor="#B5E3A8",
            alpha=0.8,
            edgecolor="#2CA02C",
            hatch="\\\\",
            label="gap (under-confident)",
        ),
    ]


def reliability_diagram(
    curves: Mapping[str, Mapping[str, Any]],
    path: str | os.PathLike[str],
    title: str | None = None,
    per_row: int = 5,
) -> Path:
    """Reliability diagrams, one panel per method, side by side (`per_row` to a row); writes
    a PNG.

    Each panel: per-bin accuracy as bars, the gap between accuracy and mean confidence shaded
    (red where over-confident, i.e. confidence > accuracy; green where under-confident), the
    diagonal of perfect calibration, and underneath the share of points per bin. The panel
    title gives the ECE of the bins, Σ_b count_b / N · |acc_b − conf_b| (N = total count), as
    `peg.metrics.calibration.binned_ece` computes it, the function `peg.metrics.ece` uses.

    Args:
        curves: method name -> reliability data as `peg.metrics.reliability` returns it:
            "edges" `[B+1]`, "confidence" `[B]` and "accuracy" `[B]` (NaN in empty bins),
            "count" `[B]`. Tensors or arrays.
        path: PNG file to write (parent folders are created).
        title: figure title.
        per_row: panels in one row; more methods wrap onto further rows.

    Returns:
        `Path(path)`.
    """
    if not isinstance(curves, Mapping) or not curves:
        raise ValueError("curves: expected a non-empty dict {method name: reliability data}")
    check_path(path)
    per_row = check_positive_int(per_row, "per_row")
    data = {str(name): _reliability_arrays(str(name), r) for name, r in curves.items()}
    n, rows = min(len(data), per_row), -(-len(data) // per_row)
    fig = figure(3.1 * n + 0.4, 4.4 * rows + (0.3 if title else 0.0))
    grid = fig.add_gridspec(2 * rows, n, height_ratios=(3, 1) * rows)
    top_share = max(float(count.max() / count.sum()) for _, _, _, count in data.values())
    first_bottom = None
    for i, (name, (edges, conf, acc, count)) in enumerate(data.items()):
        row, k = divmod(i, per_row)
        top = fig.add_subplot(grid[2 * row, k])
        bottom = fig.add_subplot(grid[2 * row + 1, k], sharex=top, sharey=first_bottom)
        first_bottom = first_bottom or bottom
        centers = (edges[1:] + edges[:-1]) / 2
        widths = np.diff(edges)
        full = count > 0
        a = np.where(full, acc, 0.0)
        c = np.where(full, conf, 0.0)
        top.bar(
            centers[full],
            a[full],
            width=widths[full],
            color="#4C72B0",
            edgecolor="white",
            linewidth=0.6,
        )
        gap = c - a
        over = full & (gap > 0)
        under = full & (gap < 0)
        top.bar(
            centers[over],
            gap[over],
            bottom=a[over],
            width=widths[over],
            color="#D62728",
            alpha=0.35,
            edgecolor="#D62728",
            hatch="//",
            linewidth=0.6,
        )
        top.bar(
            centers[under],
            gap[under],
            bottom=a[under],
            width=widths[under],
            color="#B5E3A8",
            alpha=0.8,
            edgecolor="#2CA02C",
            hatch="\\\\",
            linewidth=0.6,
        )
        lo, hi = float(edges[0]), float(edges[-1])
        top.plot([lo, hi], [lo, hi], "k--", lw=1)
        top.set_xlim(lo, hi)
        top.set_ylim(0, max(1.0, hi))
        top.set_title(f"{name}\nECE {100 * binned_ece(conf, acc, count):.2f}%", fontsize=10)
        top.tick_params(labelbottom=False)
        share = count / count.sum()
        bottom.bar(centers, share, width=widths, color="#7F7F7F", edgecolor="white", lw=0.5)
        bottom.set_ylim(0, 1.05 * top_share)
        bottom.set_xlabel("confidence")
        if k == 0:
            top.set_ylabel("accuracy")
            bottom.set_ylabel("share of points")
            if i == 0:
                top.legend(handles=_legend_handles(), loc="upper left", fontsize=7, frameon=False)
        else:
            top.tick_params(labelleft=False)
            bottom.tick_params(labelleft=False)
    if title:
        fig.suptitle(title)
    return save(fig, path)
