"""Heat maps: similarity (or disagreement) matrices between models, and the radial landscape
cut through two optima (Fort et al. 2019, Figs. 2a/2b, 3 and 5)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from peg.plots._figure import cells, check_cells, check_path, finish, to_numpy


def _matrix(value: Any, where: str) -> np.ndarray:
    m = to_numpy(value, where)
    if m.ndim != 2 or m.shape[0] != m.shape[1] or m.shape[0] < 1:
        raise ValueError(f"{where}: expected a square matrix [M, M], got shape {m.shape}")
    return m


def similarity_matrices(
    panels: Mapping[str, Any],
    path: str | os.PathLike[str] | None = None,
    label: str = "",
    title: str | None = None,
    ticks: Mapping[str, Any] | None = None,
    vmin: float | None = None,
    vmax: float | None = None,
    *,
    ax: Any = None,
) -> Any:
    """Square similarity (or disagreement) matrices as heat maps side by side.

    Fort et al. Figs. 2a/2b (along a trajectory) and 3 (between initialisations). Values are
    printed in the cells when a matrix has at most 12 rows.

    Args:
        panels: panel title -> matrix `[M, M]` (Tensor or array; panels may differ in M).
        path: a PNG file to write (atomically; parent folders are created), or None.
        label: colour-bar label, e.g. "cosine similarity".
        title: figure title.
        ticks: panel title -> M tick labels (e.g. epochs or seeds); default 0..M−1.
        vmin, vmax: colour range shared by all panels (default: the data's range).
        ax: a matplotlib Axes per panel, each panel drawn on its own (one panel: on `ax`); or
            one Axes for several panels, drawn in its place (a SubFigure there; the Axes
            itself is removed). None: a new headless figure.

    Returns:
        given `ax`, `ax` (or the SubFigure in its place; the figure is yours: pyplot shows
        it); else
        `Path(path)` when `path` is given; else the new matplotlib Figure.
    """
    if not isinstance(panels, Mapping) or not panels:
        raise ValueError("panels: expected a non-empty dict {panel title: [M, M] matrix}")
    if path is not None:
        check_path(path)
    check_cells(ax, len(panels))
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
    fig, axes = cells(ax, n, 3.6 * n + 0.8, 3.7 + (0.3 if title else 0.0))
    image = None
    for cell, (name, m) in zip(axes, data.items(), strict=True):
        image = cell.imshow(m, vmin=lo, vmax=hi if hi > lo else lo + 1e-12, cmap="viridis")
        M = len(m)
        step = max(1, M // 10)  # at most ~10 tick labels per axis
        cell.set_xticks(range(0, M, step), labels[name][::step], fontsize=7, rotation=90)
        cell.set_yticks(range(0, M, step), labels[name][::step], fontsize=7)
        cell.set_title(name, fontsize=10)
        if M <= 12:
            mid = (lo + hi) / 2
            for i in range(M):
                for j in range(M):
                    colour = "k" if m[i, j] > mid else "w"
                    cell.text(
                        j, i, f"{m[i, j]:.2f}", ha="center", va="center", fontsize=6, color=colour
                    )
    fig.colorbar(image, ax=list(axes), label=label, shrink=0.85)
    if title:
        fig.suptitle(title)
    return finish(fig, path, ax)


def radial_landscape(
    cut: Mapping[str, Any],
    path: str | os.PathLike[str] | None = None,
    title: str | None = None,
    *,
    ax: Any = None,
) -> Any:
    """The radial landscape cut (Fig. 5): accuracy and agreement with each optimum.

    Args:
        cut: what `peg.analysis.radial_cut` returns: "x" `[nx]`, "y" `[ny]`, "accuracy",
            "agreement_1", "agreement_2" `[ny, nx]`, "optima" `[2, 2]`, optional "paths"
            {name: [K, 2]} drawn as lines (trajectories) or points.
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
    if not isinstance(cut, Mapping):
        raise ValueError(f"cut: expected the dict radial_cut returns, got {type(cut).__name__}")
    missing = [
        k for k in ("x", "y", "accuracy", "agreement_1", "agreement_2", "optima") if k not in cut
    ]
    if missing:
        raise ValueError(f"cut: missing keys {missing}")
    if path is not None:
        check_path(path)
    check_cells(ax, 3)
    xs, ys = to_numpy(cut["x"], "cut['x']"), to_numpy(cut["y"], "cut['y']")
    optima = to_numpy(cut["optima"], "cut['optima']")
    if optima.shape != (2, 2):
        raise ValueError(f"cut['optima']: expected [2, 2] coordinates, got shape {optima.shape}")
    panels = {}
    for key, name in (
        ("accuracy", "accuracy"),
        ("agreement_1", "agreement with optimum 1"),
        ("agreement_2", "agreement with optimum 2"),
    ):
        z = to_numpy(cut[key], f"cut[{key!r}]")
        if z.shape != (len(ys), len(xs)):
            raise ValueError(f"cut[{key!r}]: expected [{len(ys)}, {len(xs)}], got {z.shape}")
        panels[name] = z
    fig, axes = cells(ax, 3, 14.0, 4.3 + (0.3 if title else 0.0))
    gx, gy = np.meshgrid(xs, ys)
    for cell, (name, z) in zip(axes, panels.items(), strict=True):
        filled = cell.contourf(gx, gy, z, levels=np.linspace(0, 1, 21), cmap="viridis")
        for i, (pname, pts) in enumerate((cut.get("paths") or {}).items()):
            p = to_numpy(pts, f"cut['paths'][{pname!r}]")
            if p.ndim != 2 or p.shape[1] != 2:
                raise ValueError(f"cut['paths'][{pname!r}]: expected [K, 2], got {p.shape}")
            colour = ("#D62728", "#1F77B4", "#E377C2", "#FF7F0E")[i % 4]
            if pname.startswith("trajectory"):
                cell.plot(p[:, 0], p[:, 1], "-o", color=colour, ms=2.5, lw=1, label=pname)
            else:
                cell.scatter(p[:, 0], p[:, 1], s=8, color=colour, label=pname, zorder=3)
        cell.scatter(
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
            cell.annotate(
                f"θ{k + 1}", optima[k], textcoords="offset points", xytext=(5, 5), color="w"
            )
        cell.scatter([0], [0], marker="+", color="w", s=60, zorder=4)
        cell.set_title(name, fontsize=10)
        cell.set_xlabel("weight-space coordinate along θ₁")
        cell.set_aspect("equal", adjustable="box")
        fig.colorbar(filled, ax=cell, shrink=0.8)
    axes[0].set_ylabel("orthogonal coordinate (towards θ₂)")
    axes[0].legend(fontsize=6, loc="lower left", frameon=True)
    if title:
        fig.suptitle(title)
    return finish(fig, path, ax)
