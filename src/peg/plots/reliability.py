"""Reliability diagrams: per-bin accuracy against confidence, one panel per method, from
predictions and labels or from reliability data computed already."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from peg.metrics.calibration import binned_ece, reliability
from peg.plots._figure import (
    MARKERS,
    SERIES,
    canvas,
    check_axes,
    check_path,
    finish,
    save,
    to_numpy,
)
from peg.utils.scalars import check_positive_int


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
    data: Any,
    *args: Any,
    labels: Any = None,
    path: str | os.PathLike[str] | None = None,
    ax: Any = None,
    title: str | None = None,
    per_row: int = 5,
    bins: int = 15,
) -> Any:
    """Reliability diagrams, one panel per method, side by side (`per_row` to a row).

    Two forms: `reliability_diagram(probs, labels, path=None, ...)` draws straight from
    predictions, and `reliability_diagram(curves, path=None, title=None, per_row=5, ...)` from
    reliability data computed already (positional arguments as named in each form).

    Each panel: per-bin accuracy as bars, the gap between accuracy and mean confidence shaded
    (red where over-confident, i.e. confidence > accuracy; green where under-confident), the
    diagonal of perfect calibration, and underneath the share of points per bin. The panel
    title gives the ECE of the bins, Σ_b count_b / N · |acc_b − conf_b| (N = total count), as
    `peg.metrics.calibration.binned_ece` computes it, the function `peg.metrics.ece` uses.

    Args:
        data: probabilities `[N, C]` or member logits `[M, N, C]` (tensors or arrays; one
            panel), or a dict {method name: such predictions} (a panel each: e.g. before and
            after calibration), with `labels`; or a dict {method name: reliability data as
            `peg.metrics.reliability` returns it: "edges" `[B+1]`, "confidence" `[B]` and
            "accuracy" `[B]` (NaN in empty bins), "count" `[B]`}.
        labels: the labels `[N]` of the predictions (their form only).
        path: a PNG file to write (atomically; parent folders are created), or None.
        ax: a matplotlib Axes to draw on, as scikit-learn's `CalibrationDisplay` does: one
            method as its bars and gaps, several as a line each, and the share of points per
            bin in a band under the accuracies (an inset of `ax`, inside its area); or a
            sequence of Axes, one per method, each drawn as one method. None: a new headless
            figure of one panel per method.
        title: figure title.
        per_row: panels in one row; more methods wrap onto further rows.
        bins: equal-width bins of the predictions' form (`peg.metrics.reliability`).

    Returns:
        given `ax`, `ax` (the figure is yours: pyplot shows it; with `path`, your whole
        figure is written); else `Path(path)` when `path` is given; else the new Figure.
    """
    options = {"labels": labels, "path": path, "title": title, "per_row": per_row}
    curves, path, title, per_row = _arguments(data, args, options, bins)
    if path is not None:
        check_path(path)
    per_row = check_positive_int(per_row, "per_row")
    axes = _check_axes(ax, len(curves))
    arrays = {str(name): _reliability_arrays(str(name), r) for name, r in curves.items()}
    if axes is not None:
        if len(axes) == 1:
            _on_axes(axes[0], arrays, title)
        else:
            for one, (name, values) in zip(axes, arrays.items(), strict=True):
                _on_axes(one, {name: values}, None)
            if title:
                one.figure.suptitle(title)
        if path is not None:
            save(axes[0], path)
        return ax
    n, rows = min(len(arrays), per_row), -(-len(arrays) // per_row)
    fig = canvas(ax, 3.1 * n + 0.4, 4.4 * rows + (0.3 if title else 0.0))
    grid = fig.add_gridspec(2 * rows, n, height_ratios=(3, 1) * rows)
    top_share = max(float(count.max() / count.sum()) for _, _, _, count in arrays.values())
    first_bottom = None
    for i, (name, values) in enumerate(arrays.items()):
        row, k = divmod(i, per_row)
        top = fig.add_subplot(grid[2 * row, k])
        bottom = fig.add_subplot(grid[2 * row + 1, k], sharex=top, sharey=first_bottom)
        first_bottom = first_bottom or bottom
        _panel(top, bottom, name, values, top_share)
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
    return finish(fig, path, ax)


def _arguments(
    data: Any, args: tuple[Any, ...], options: dict[str, Any], bins: int
) -> tuple[dict[str, Any], Any, Any, Any]:
    """(curves, path, title, per_row) of either form, positional arguments named by the form;
    the predictions' form turned into curves (`peg.metrics.reliability`)."""
    # reliability data: a dict of dicts, or any dict followed by a path (today's call)
    path_first = bool(args) and isinstance(args[0], (str, os.PathLike))
    curves_form = isinstance(data, Mapping) and (
        not data or path_first or all(isinstance(v, Mapping) for v in data.values())
    )
    names = ("path", "title", "per_row") if curves_form else ("labels", "path", "title", "per_row")
    if len(args) > len(names):
        raise TypeError(
            f"reliability_diagram: takes at most {len(names) + 1} positional arguments "
            f"(data, {', '.join(names)}), got {len(args) + 1}"
        )
    defaults = {"labels": None, "path": None, "title": None, "per_row": 5}
    for name, value in zip(names, args, strict=False):
        if options[name] is not defaults[name]:
            raise TypeError(f"reliability_diagram: got multiple values for argument {name!r}")
        options[name] = value
    if curves_form:
        if not data:
            raise ValueError("curves: expected a non-empty dict {method name: reliability data}")
        if options["labels"] is not None:
            raise ValueError(
                "labels: reliability data (a dict of edges, confidence, accuracy, count) "
                "takes no labels; pass the predictions themselves to draw from labels"
            )
        return dict(data), options["path"], options["title"], options["per_row"]
    if options["labels"] is None:
        raise ValueError(
            "labels: expected the labels [N] of the predictions (or pass reliability data, a "
            "dict {method name: peg.metrics.reliability(...)})"
        )
    preds = dict(data) if isinstance(data, Mapping) else {"": data}
    bins = check_positive_int(bins, "bins")
    curves = {}
    for name, pred in preds.items():
        try:
            curves[name] = reliability(pred, options["labels"], bins)
        except (TypeError, ValueError) as e:  # named as given here: data[...] and labels
            where = "data" if name == "" else f"data[{name!r}]"
            said = str(e)
            for before, after in (("pred:", f"{where}:"), ("y:", "labels:")):
                said = after + said[len(before) :] if said.startswith(before) else said
            said = said.replace("(N of pred)", f"(N of {where})")
            raise type(e)(said) from None
    return curves, options["path"], options["title"], options["per_row"]


def _panel(
    top: Any, bottom: Any, name: str, values: tuple[np.ndarray, ...], top_share: float
) -> None:
    """One method's panel: accuracy bars, the gaps, the diagonal (`top`); share of points per
    bin (`bottom`)."""
    edges, conf, acc, count = values
    _bars(top, values)
    lo, hi = float(edges[0]), float(edges[-1])
    top.plot([lo, hi], [lo, hi], "k--", lw=1)
    top.set_xlim(lo, hi)
    top.set_ylim(0, max(1.0, hi))
    ece = f"ECE {100 * binned_ece(conf, acc, count):.2f}%"
    top.set_title(f"{name}\n{ece}" if name else ece, fontsize=10)
    top.tick_params(labelbottom=False)
    share = count / count.sum()
    centers, widths = (edges[1:] + edges[:-1]) / 2, np.diff(edges)
    bottom.bar(centers, share, width=widths, color="#7F7F7F", edgecolor="white", lw=0.5)
    bottom.set_ylim(0, 1.05 * top_share)
    bottom.set_xlabel("confidence")


def _bars(ax: Any, values: tuple[np.ndarray, ...]) -> None:
    """Per-bin accuracy as bars, the gap to the mean confidence shaded on top of each."""
    edges, conf, acc, count = values
    centers = (edges[1:] + edges[:-1]) / 2
    widths = np.diff(edges)
    full = count > 0
    a = np.where(full, acc, 0.0)
    c = np.where(full, conf, 0.0)
    ax.bar(
        centers[full],
        a[full],
        width=widths[full],
        color="#4C72B0",
        edgecolor="white",
        linewidth=0.6,
    )
    gap = c - a
    # the gap to the diagonal: over-confident bins red, under-confident ones green
    for side, face, alpha, edge, hatch in (
        (gap > 0, "#D62728", 0.35, "#D62728", "//"),
        (gap < 0, "#B5E3A8", 0.8, "#2CA02C", "\\\\"),
    ):
        shown = full & side
        ax.bar(
            centers[shown],
            gap[shown],
            bottom=a[shown],
            width=widths[shown],
            color=face,
            alpha=alpha,
            edgecolor=edge,
            hatch=hatch,
            linewidth=0.6,
        )


def _check_axes(ax: Any, n: int) -> list[Any] | None:
    """`ax` as a list of Axes: one (every method on it) or one per method; None without."""
    if ax is None:
        return None
    axes = list(ax) if isinstance(ax, (list, tuple, np.ndarray)) else [ax]
    if len(axes) not in (1, n):
        raise ValueError(f"ax: expected one Axes or one per method ({n}), got {len(axes)}")
    for one in axes:
        check_axes(one)
    return axes


BAND = 0.3  # the share of points' band under the accuracies, as a fraction of their height


def _on_axes(ax: Any, arrays: dict[str, tuple[np.ndarray, ...]], title: str | None) -> None:
    """Every method on the caller's `ax`: one as its bars and gaps, several as a line each;
    the diagonal; the share of points per bin in a band under the accuracies (an inset Axes
    of `ax`, in `ax`'s own area: below 0 on its y-axis)."""
    lo = min(float(v[0][0]) for v in arrays.values())
    hi = max(float(v[0][-1]) for v in arrays.values())
    top = max(1.0, hi)
    band = ax.inset_axes((lo, -BAND * top, hi - lo, 0.9 * BAND * top), transform=ax.transData)
    share_top = 0.0
    for i, (name, values) in enumerate(arrays.items()):
        edges, conf, acc, count = values
        share = count / count.sum()
        share_top = max(share_top, float(share.max()))
        ece = f"ECE {100 * binned_ece(conf, acc, count):.2f}%"
        if len(arrays) == 1:
            _bars(ax, values)
            band.stairs(share, edges, fill=True, color="#7F7F7F")
            heading = f"{name}\n{ece}" if name else ece
            ax.set_title(f"{title}\n{heading}" if title else heading, fontsize=10)
            continue
        full = count > 0
        colour, marker = SERIES[(i + 1) % len(SERIES)], MARKERS[i % len(MARKERS)]
        ax.plot(conf[full], acc[full], marker=marker, ms=4, color=colour, label=f"{name} ({ece})")
        band.stairs(share, edges, color=colour)
    ax.plot([lo, hi], [lo, hi], "k--", lw=1, label="perfect calibration")
    ax.set_xlim(lo, hi)
    ax.set_ylim(-BAND * top, top)
    ax.set_yticks([t for t in ax.get_yticks() if 0 <= t <= top])
    ax.axhline(0, color="k", lw=0.6)
    ax.set_xlabel("confidence")
    ax.set_ylabel("accuracy")
    if len(arrays) == 1:
        ax.legend(handles=_legend_handles(), loc="upper left", fontsize=7, frameon=False)
    else:
        ax.legend(loc="upper left", fontsize=7, frameon=False)
        if title:
            ax.set_title(title, fontsize=10)
    band.set_xlim(lo, hi)
    band.set_ylim(0, 1.05 * share_top)
    band.set_xticks([])
    band.yaxis.tick_right()
    band.tick_params(labelsize=6)
    band.set_ylabel("share of points", fontsize=6)
    band.yaxis.set_label_position("right")
    band.patch.set_alpha(0.0)
