"""Figures: reliability diagrams and decision boundaries.

Headless: figures are drawn with matplotlib's object API on an Agg canvas (no pyplot, no
display, no global figure state), so importing or calling these never needs a screen and never
changes the caller's matplotlib backend. Every function writes its PNG atomically
(`peg._io.atomic_open`: a temporary file in the same folder, then `os.replace`), creates missing
parent folders and returns the path.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from peg._io import atomic_open
from peg.metrics.calibration import binned_ece

_DPI = 120
# colour-blind-friendly class colours (Okabe-Ito), then matplotlib's tab10
_PALETTE = (
    "#0072B2",
    "#E69F00",
    "#009E73",
    "#CC79A7",
    "#56B4E9",
    "#D55E00",
    "#F0E442",
    "#882255",
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
)


def _figure(width: float, height: float) -> Any:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=_DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _save(fig: Any, path: str | os.PathLike[str]) -> Path:
    """Write `fig` as PNG to `path` atomically (`peg._io.atomic_open`); returns the path."""
    with atomic_open(path) as f:
        fig.savefig(f, format="png", dpi=_DPI)
    return Path(path)


def _check_path(path: Any) -> None:
    if not isinstance(path, (str, os.PathLike)):
        raise ValueError(f"path: expected a file path, got {type(path).__name__}")


def _numpy(value: Any, where: str) -> np.ndarray:
    if isinstance(value, Tensor):
        return value.detach().cpu().double().numpy()
    try:
        return np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{where}: expected a tensor or array of numbers ({e})") from e


def _reliability_arrays(name: str, r: Any) -> tuple[np.ndarray, ...]:
    if not isinstance(r, Mapping):
        raise ValueError(
            f"curves[{name!r}]: expected a dict with edges, confidence, accuracy and count "
            f"(as peg.metrics.reliability returns), got {type(r).__name__}"
        )
    missing = [k for k in ("edges", "confidence", "accuracy", "count") if k not in r]
    if missing:
        raise ValueError(f"curves[{name!r}]: missing keys {missing}")
    edges = _numpy(r["edges"], f"curves[{name!r}]['edges']")
    conf = _numpy(r["confidence"], f"curves[{name!r}]['confidence']")
    acc = _numpy(r["accuracy"], f"curves[{name!r}]['accuracy']")
    count = _numpy(r["count"], f"curves[{name!r}]['count']")
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
) -> Path:
    """Reliability diagrams, one panel per method, side by side; writes a PNG.

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

    Returns:
        `Path(path)`.
    """
    if not isinstance(curves, Mapping) or not curves:
        raise ValueError("curves: expected a non-empty dict {method name: reliability data}")
    _check_path(path)
    data = {str(name): _reliability_arrays(str(name), r) for name, r in curves.items()}
    n = len(data)
    fig = _figure(3.1 * n + 0.4, 4.4 + (0.3 if title else 0.0))
    grid = fig.add_gridspec(2, n, height_ratios=(3, 1))
    top_share = max(float(count.max() / count.sum()) for _, _, _, count in data.values())
    first_bottom = None
    for k, (name, (edges, conf, acc, count)) in enumerate(data.items()):
        top = fig.add_subplot(grid[0, k])
        bottom = fig.add_subplot(grid[1, k], sharex=top, sharey=first_bottom)
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
            top.legend(handles=_legend_handles(), loc="upper left", fontsize=7, frameon=False)
        else:
            top.tick_params(labelleft=False)
            bottom.tick_params(labelleft=False)
    if title:
        fig.suptitle(title)
    return _save(fig, path)


def _probabilities(out: Any, rows: int, name: str, what: str) -> np.ndarray:
    p = _numpy(out, f"predictors[{name!r}] on {what}")
    if p.ndim != 2 or p.shape[0] != rows:
        raise ValueError(
            f"predictors[{name!r}]: expected probabilities [{rows}, C] for {what}, "
            f"got shape {p.shape}"
        )
    if not np.all(np.isfinite(p)) or p.min() < -1e-6 or p.max() > 1 + 1e-6:
        raise ValueError(
            f"predictors[{name!r}]: expected probabilities in [0, 1] (got values in "
            f"[{np.nanmin(p):.3g}, {np.nanmax(p):.3g}]); apply softmax to logits first"
        )
    if np.abs(p.sum(1) - 1).max() > 1e-3:
        raise ValueError(
            f"predictors[{name!r}]: rows of the probabilities must sum to 1 "
            f"(max deviation {np.abs(p.sum(1) - 1).max():.3g}); apply softmax to logits first"
        )
    return p


def decision_boundaries(
    predictors: Mapping[str, Callable[[Tensor], Tensor]],
    X: Tensor,
    y: Tensor,
    path: str | os.PathLike[str],
    title: str | None = None,
    resolution: int = 200,
) -> Path:
    """Predicted class shaded by confidence over the plane, one panel per predictor; PNG.

    Each panel colours a `resolution × resolution` grid covering the data (plus a 10% margin)
    by the predicted class, faded towards white as the confidence (max probability) drops to
    1/C; thin contours mark confidence 0.6, 0.8, 0.95 and black lines the class boundaries.
    The data points are drawn on top, coloured by their label. The panel title gives accuracy
    and NLL on `(X, y)` (NLL = −mean log p[y], p clamped at 1e-12).

    Args:
        predictors: name -> function mapping float32 points `[P, 2]` to probabilities
            `[P, C]` (Tensor or array); called under `torch.no_grad()`.
        X: points `[N, 2]`.
        y: labels `[N]`, integers in [0, C).
        path: PNG file to write (parent folders are created).
        title: figure title.
        resolution: grid points per axis (>= 2).

    Returns:
        `Path(path)`.
    """
    if not isinstance(predictors, Mapping) or not predictors:
        raise ValueError("predictors: expected a non-empty dict {name: points -> probabilities}")
    for name, f in predictors.items():
        if not callable(f):
            raise ValueError(f"predictors[{name!r}]: expected a callable, got {type(f).__name__}")
    _check_path(path)
    X = torch.as_tensor(X).detach().cpu()
    y = torch.as_tensor(y).detach().cpu()
    if X.ndim != 2 or X.shape[1] != 2 or X.shape[0] == 0:
        raise ValueError(f"X: expected 2-D points [N, 2] with N >= 1, got shape {tuple(X.shape)}")
    if y.shape != (X.shape[0],) or torch.is_floating_point(y) or y.dtype == torch.bool:
        raise ValueError(
            f"y: expected integer labels [{X.shape[0]}], got {y.dtype} {tuple(y.shape)}"
        )
    if int(y.min()) < 0:
        raise ValueError(f"y: labels must be >= 0, got {int(y.min())}")
    if isinstance(resolution, bool) or not isinstance(resolution, int) or resolution < 2:
        raise ValueError(f"resolution: expected an integer >= 2, got {resolution!r}")
    if not torch.isfinite(X).all():
        raise ValueError("X: contains NaN or infinite values")

    from matplotlib.colors import to_rgb

    Xf = X.to(torch.float32)
    Xd = X.double().numpy()
    yn = y.long().numpy()
    lo, hi = Xd.min(0), Xd.max(0)
    span = np.where(hi - lo > 0, hi - lo, 1.0)
    lo, hi = lo - 0.1 * span, hi + 0.1 * span
    gx, gy = np.meshgrid(
        np.linspace(lo[0], hi[0], resolution), np.linspace(lo[1], hi[1], resolution)
    )
    grid = torch.from_numpy(np.stack([gx.ravel(), gy.ravel()], 1).astype(np.float32))

    n = len(predictors)
    fig = _figure(3.8 * n, 3.9 + (0.3 if title else 0.0))
    axes = fig.subplots(1, n, squeeze=False)[0]
    extent = (float(lo[0]), float(hi[0]), float(lo[1]), float(hi[1]))
    for ax, (name, predict) in zip(axes, predictors.items(), strict=True):
        name = str(name)
        with torch.no_grad():
            p_grid = _probabilities(predict(grid), grid.shape[0], name, "the grid")
            p_data = _probabilities(predict(Xf), Xf.shape[0], name, "X")
        C = p_grid.shape[1]
        if p_data.shape[1] != C:
            raise ValueError(
                f"predictors[{name!r}]: {C} classes on the grid, {p_data.shape[1]} on X"
            )
        if int(yn.max()) >= C:
            raise ValueError(f"y: label {int(yn.max())} but predictors[{name!r}] gives {C} classes")
        colours = np.array([to_rgb(_PALETTE[c % len(_PALETTE)]) for c in range(max(C, 1))])
        conf = p_grid.max(1)
        cls = p_grid.argmax(1)
        fade = np.clip((conf - 1 / C) / (1 - 1 / C), 0, 1)[:, None] if C > 1 else np.ones((1, 1))
        rgb = 1 - fade * (1 - colours[cls])
        ax.imshow(
            rgb.reshape(resolution, resolution, 3),
            origin="lower",
            extent=extent,
            aspect="auto",
            interpolation="nearest",
        )
        conf2d = conf.reshape(resolution, resolution)
        levels = [v for v in (0.6, 0.8, 0.95) if conf2d.min() < v < conf2d.max()]
        if levels:
            cs = ax.contour(gx, gy, conf2d, levels=levels, colors="k", linewidths=0.4, alpha=0.5)
            ax.clabel(cs, fontsize=6, fmt="%.2f")
        cls2d = cls.reshape(resolution, resolution)
        for c in range(C):  # class boundaries: edges of each class's region
            region = (cls2d == c).astype(float)
            if 0 < region.sum() < region.size:
                ax.contour(gx, gy, region, levels=[0.5], colors="k", linewidths=0.8)
        ax.scatter(
            Xd[:, 0],
            Xd[:, 1],
            c=colours[yn % len(colours)],
            s=10,
            edgecolors="k",
            linewidths=0.3,
        )
        acc = float(np.mean(p_data.argmax(1) == yn))
        p_true = np.clip(p_data[np.arange(len(yn)), yn], 1e-12, None)
        nll = float(-np.mean(np.log(p_true)))
        ax.set_title(f"{name}\nacc {100 * acc:.2f}%, NLL {nll:.4f}", fontsize=10)
        ax.set_xlim(extent[0], extent[1])
        ax.set_ylim(extent[2], extent[3])
        ax.set_xticks([])
        ax.set_yticks([])
    if title:
        fig.suptitle(title)
    return _save(fig, path)


# ---------------------------------------------------------------- function-space diversity
# Figures of `peg.analysis` (Fort et al. 2019, "Deep ensembles: a loss landscape perspective").

_MARKERS = ("s", "D", "^", "v", "P", "X", "<", ">", "p", "h", "*", "o")
# series colours: black first (the baseline a figure compares against), then Okabe-Ito, then
# tab10 colours unlike those (no two near-identical blues)
_SERIES = ("#000000", *_PALETTE[:8], "#d62728", "#9467bd", "#8c564b", "#7f7f7f", "#17becf")


def _matrix(value: Any, where: str) -> np.ndarray:
    m = _numpy(value, where)
    if m.ndim != 2 or m.shape[0] != m.shape[1] or m.shape[0] < 1:
        raise ValueError(f"{where}: expected a square matrix [M, M], got shape {m.shape}")
    return m


def similarity_matrices(
    panels: Mapping[str, Any],
    path: str | os.PathLike[str],
    label: str,
    title: str | None = None,
    ticks: Mapping[str, Any] | None = None,
    vmin: float | None = None,
    vmax: float | None = None,
) -> Path:
    """Square similarity (or disagreement) matrices as heat maps side by side; writes a PNG.

    Fort et al. Figs. 2a/2b (along a trajectory) and 3 (between initialisations). Values are
    printed in the cells when a matrix has at most 12 rows.

    Args:
        panels: panel title -> matrix `[M, M]` (Tensor or array; panels may differ in M).
        path: PNG file to write (parent folders are created).
        label: colour-bar label, e.g. "cosine similarity".
        title: figure title.
        ticks: panel title -> M tick labels (e.g. epochs or seeds); default 0..M−1.
        vmin, vmax: colour range shared by all panels (default: the data's range).

    Returns:
        `Path(path)`.
    """
    if not isinstance(panels, Mapping) or not panels:
        raise ValueError("panels: expected a non-empty dict {panel title: [M, M] matrix}")
    _check_path(path)
    data = {str(k): _matrix(v, f"panels[{k!r}]") for k, v in panels.items()}
    labels: dict[str, list[str]] = {}
    for name, m in data.items():
        given = (ticks or {}).get(name)
        labels[name] = (
            [str(t) for t in given] if given is not None else list(map(str, range(len(m))))
        )
        if len(labels[name]) != len(m):
            raise ValueError(
                f"ticks[{name!r}]: expected {len(m)} labels for a {len(m)}×{len(m)} matrix, "
                f"got {len(labels[name])}"
            )
    finite = np.concatenate([m[np.isfinite(m)] for m in data.values()])
    lo = float(vmin) if vmin is not None else float(finite.min()) if finite.size else 0.0
    hi = float(vmax) if vmax is not None else float(finite.max()) if finite.size else 1.0
    n = len(data)
    fig = _figure(3.6 * n + 0.8, 3.7 + (0.3 if title else 0.0))
    axes = fig.subplots(1, n, squeeze=False)[0]
    image = None
    for ax, (name, m) in zip(axes, data.items(), strict=True):
        image = ax.imshow(m, vmin=lo, vmax=hi if hi > lo else lo + 1e-12, cmap="viridis")
        M = len(m)
        step = max(1, M // 10)  # at most ~10 tick labels per axis
        ax.set_xticks(range(0, M, step), labels[name][::step], fontsize=7, rotation=90)
        ax.set_yticks(range(0, M, step), labels[name][::step], fontsize=7)
        ax.set_title(name, fontsize=10)
        if M <= 12:
            mid = (lo + hi) / 2
            for i in range(M):
                for j in range(M):
                    colour = "k" if m[i, j] > mid else "w"
                    ax.text(
                        j, i, f"{m[i, j]:.2f}", ha="center", va="center", fontsize=6, color=colour
                    )
    fig.colorbar(image, ax=list(axes), label=label, shrink=0.85)
    if title:
        fig.suptitle(title)
    return _save(fig, path)


def prediction_map(
    points: Any,
    trajectory: Any,
    kind: Any,
    path: str | os.PathLike[str],
    title: str | None = None,
    checkpoint_kind: str = "checkpoint",
) -> Path:
    """A 2-D embedding (t-SNE) of models' predictions; writes a PNG (Fort et al. Figs. 2c, 4).

    Colour says which trajectory a model belongs to, the marker what it is: the trajectory's
    own checkpoints (`checkpoint_kind`) are circles joined in the given order, growing with
    training; every other kind (a subspace sampler's samples, PEG's members, ...) gets its own
    marker, drawn around its trajectory's final checkpoint.

    Args:
        points: `[K, 2]` positions.
        trajectory: `[K]` integer trajectory index per point.
        kind: `[K]` strings, e.g. "checkpoint", "PEG", "random subspace".
        path: PNG file to write (parent folders are created).
        title: figure title.
        checkpoint_kind: the `kind` of the trajectories' checkpoints.

    Returns:
        `Path(path)`.
    """
    _check_path(path)
    P = _numpy(points, "points")
    if P.ndim != 2 or P.shape[1] != 2 or P.shape[0] < 1:
        raise ValueError(f"points: expected [K, 2] with K >= 1, got shape {P.shape}")
    owner = np.asarray(trajectory)
    kinds = [str(k) for k in kind]
    if owner.shape != (len(P),) or not np.issubdtype(owner.dtype, np.integer):
        raise ValueError(
            f"trajectory: expected {len(P)} integer indices, got {owner.dtype} {owner.shape}"
        )
    if len(kinds) != len(P):
        raise ValueError(f"kind: expected {len(P)} labels, got {len(kinds)}")
    others = list(dict.fromkeys(k for k in kinds if k != checkpoint_kind))
    marker = {k: _MARKERS[i % len(_MARKERS)] for i, k in enumerate(others)}
    from matplotlib.lines import Line2D

    fig = _figure(7.2, 5.6 + (0.3 if title else 0.0))
    ax = fig.add_subplot()
    kinds_arr = np.array(kinds)
    for t in sorted(set(owner.tolist())):
        colour = _PALETTE[t % len(_PALETTE)]
        own = (owner == t) & (kinds_arr == checkpoint_kind)
        if own.any():
            ax.plot(P[own, 0], P[own, 1], "-", color=colour, lw=0.8, alpha=0.6)
            sizes = np.linspace(12, 70, int(own.sum()))
            ax.scatter(
                P[own, 0], P[own, 1], s=sizes, color=colour, edgecolors="k", lw=0.4, zorder=3
            )
        for k in others:
            sel = (owner == t) & (kinds_arr == k)
            if sel.any():
                ax.scatter(
                    P[sel, 0],
                    P[sel, 1],
                    marker=marker[k],
                    s=28,
                    facecolors="none",
                    edgecolors=colour,
                    lw=1.0,
                    zorder=2,
                )
    handles = [
        Line2D(
            [], [], color=_PALETTE[t % len(_PALETTE)], marker="o", ls="-", label=f"trajectory {t}"
        )
        for t in sorted(set(owner.tolist()))
    ]
    handles += [
        Line2D([], [], color="k", marker=marker[k], ls="", mfc="none", label=k) for k in others
    ]
    ax.legend(handles=handles, fontsize=7, loc="best", frameon=False)
    ax.set_xlabel("t-SNE 1")
    ax.set_ylabel("t-SNE 2")
    ax.set_xticks([])
    ax.set_yticks([])
    if title:
        ax.set_title(title, fontsize=10)
    return _save(fig, path)


def _xy_series(name: str, series: Any, x: str, y: str, where: str) -> tuple[np.ndarray, np.ndarray]:
    if not isinstance(series, Mapping) or x not in series or y not in series:
        raise ValueError(f"{where}[{name!r}]: expected a dict with {x!r} and {y!r} lists")
    a = _numpy(series[x], f"{where}[{name!r}][{x!r}]").reshape(-1)
    b = _numpy(series[y], f"{where}[{name!r}][{y!r}]").reshape(-1)
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
    _check_path(path)
    data = {
        str(k): _xy_series(str(k), v, "accuracy", "diversity", "samples")
        for k, v in samples.items()
    }
    lines = {
        str(k): _xy_series(str(k), v, "accuracy", "diversity", "curves")
        for k, v in (curves or {}).items()
    }
    fig = _figure(7.0, 5.0 + (0.3 if title else 0.0))
    ax = fig.add_subplot()
    finite_y = [b[np.isfinite(b)] for _, b in data.values()]
    top = max([float(v.max()) for v in finite_y if v.size] + [0.1]) * 1.25
    for i, (name, (a, b)) in enumerate(lines.items()):
        ok = np.isfinite(b) & (b <= top)
        ax.plot(a[ok], b[ok], ls=("--", ":", "-.")[i % 3], color="0.35", lw=1, label=name)
    for i, (name, (a, b)) in enumerate(data.items()):
        ok = np.isfinite(a) & np.isfinite(b)
        colour = _SERIES[i % len(_SERIES)]
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
                marker=_MARKERS[i % len(_MARKERS)],
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
    return _save(fig, path)


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
    _check_path(path)
    acc = {str(k): _xy_series(str(k), v, "size", "accuracy", "curves") for k, v in curves.items()}
    nll = {str(k): _xy_series(str(k), v, "size", "nll", "curves") for k, v in curves.items()}
    fig = _figure(9.5, 3.8 + (0.3 if title else 0.0))
    left, right = fig.subplots(1, 2)
    for i, name in enumerate(acc):
        style = {
            "color": _SERIES[i % len(_SERIES)],
            "marker": _MARKERS[i % len(_MARKERS)],
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
    return _save(fig, path)


def radial_landscape(
    cut: Mapping[str, Any], path: str | os.PathLike[str], title: str | None = None
) -> Path:
    """The radial landscape cut (Fig. 5): accuracy and agreement with each optimum; PNG.

    Args:
        cut: what `peg.analysis.radial_cut` returns: "x" `[nx]`, "y" `[ny]`, "accuracy",
            "agreement_1", "agreement_2" `[ny, nx]`, "optima" `[2, 2]`, optional "paths"
            {name: [K, 2]} drawn as lines (trajectories) or points.
        path: PNG file to write (parent folders are created).
        title: figure title.

    Returns:
        `Path(path)`.
    """
    if not isinstance(cut, Mapping):
        raise ValueError(f"cut: expected the dict radial_cut returns, got {type(cut).__name__}")
    missing = [
        k for k in ("x", "y", "accuracy", "agreement_1", "agreement_2", "optima") if k not in cut
    ]
    if missing:
        raise ValueError(f"cut: missing keys {missing}")
    _check_path(path)
    xs, ys = _numpy(cut["x"], "cut['x']"), _numpy(cut["y"], "cut['y']")
    optima = _numpy(cut["optima"], "cut['optima']")
    if optima.shape != (2, 2):
        raise ValueError(f"cut['optima']: expected [2, 2] coordinates, got shape {optima.shape}")
    panels = {}
    for key, name in (
        ("accuracy", "accuracy"),
        ("agreement_1", "agreement with optimum 1"),
        ("agreement_2", "agreement with optimum 2"),
    ):
        z = _numpy(cut[key], f"cut[{key!r}]")
        if z.shape != (len(ys), len(xs)):
            raise ValueError(f"cut[{key!r}]: expected [{len(ys)}, {len(xs)}], got {z.shape}")
        panels[name] = z
    fig = _figure(14.0, 4.3 + (0.3 if title else 0.0))
    axes = fig.subplots(1, 3)
    gx, gy = np.meshgrid(xs, ys)
    for ax, (name, z) in zip(axes, panels.items(), strict=True):
        filled = ax.contourf(gx, gy, z, levels=np.linspace(0, 1, 21), cmap="viridis")
        for i, (pname, pts) in enumerate((cut.get("paths") or {}).items()):
            p = _numpy(pts, f"cut['paths'][{pname!r}]")
            if p.ndim != 2 or p.shape[1] != 2:
                raise ValueError(f"cut['paths'][{pname!r}]: expected [K, 2], got {p.shape}")
            colour = ("#D62728", "#1F77B4", "#E377C2", "#FF7F0E")[i % 4]
            if pname.startswith("trajectory"):
                ax.plot(p[:, 0], p[:, 1], "-o", color=colour, ms=2.5, lw=1, label=pname)
            else:
                ax.scatter(p[:, 0], p[:, 1], s=8, color=colour, label=pname, zorder=3)
        ax.scatter(
            optima[:, 0],
            optima[:, 1],
            marker="*",
            s=150,
            color="w",
            edgecolors="k",
            zorder=4,
            label="optima",
        )
        for k in range(2):
            ax.annotate(
                f"θ{k + 1}", optima[k], textcoords="offset points", xytext=(5, 5), color="w"
            )
        ax.scatter([0], [0], marker="+", color="w", s=60, zorder=4)
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("weight-space coordinate along θ₁")
        ax.set_aspect("equal", adjustable="box")
        fig.colorbar(filled, ax=ax, shrink=0.8)
    axes[0].set_ylabel("orthogonal coordinate (towards θ₂)")
    axes[0].legend(fontsize=6, loc="lower left", frameon=True)
    if title:
        fig.suptitle(title)
    return _save(fig, path)
