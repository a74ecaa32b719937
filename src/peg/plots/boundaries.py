"""Decision boundaries: predicted class shaded by confidence over the plane of 2-D data."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch
from torch import Tensor

from peg.plots._figure import PALETTE, cells, check_cells, check_path, finish, to_numpy


def _probabilities(out: Any, rows: int, name: str, what: str) -> np.ndarray:
    p = to_numpy(out, f"predictors[{name!r}] on {what}")
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


def _check(
    predictors: Any, X: Any, y: Any, path: Any, resolution: Any, ax: Any
) -> tuple[Tensor, Tensor]:
    """Every argument of `decision_boundaries` checked before any drawing; (X, y) on the CPU."""
    if not isinstance(predictors, Mapping) or not predictors:
        raise ValueError("predictors: expected a non-empty dict {name: points -> probabilities}")
    for name, f in predictors.items():
        if not callable(f):
            raise ValueError(f"predictors[{name!r}]: expected a callable, got {type(f).__name__}")
    if path is not None:
        check_path(path)
    check_cells(ax, len(predictors))
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
    return X, y


class _Plane:
    """The grid a panel is drawn on: the data's bounding box plus a 10% margin, `resolution`
    points per axis."""

    def __init__(self, Xd: np.ndarray, resolution: int) -> None:
        lo, hi = Xd.min(0), Xd.max(0)
        span = np.where(hi - lo > 0, hi - lo, 1.0)
        lo, hi = lo - 0.1 * span, hi + 0.1 * span
        self.resolution = resolution
        self.gx, self.gy = np.meshgrid(
            np.linspace(lo[0], hi[0], resolution), np.linspace(lo[1], hi[1], resolution)
        )
        points = np.stack([self.gx.ravel(), self.gy.ravel()], 1).astype(np.float32)
        self.points = torch.from_numpy(points)
        self.extent = (float(lo[0]), float(hi[0]), float(lo[1]), float(hi[1]))

    def square(self, values: np.ndarray) -> np.ndarray:
        return values.reshape(self.resolution, self.resolution, *values.shape[1:])


def _panel(
    ax: Any, name: str, predict: Callable[[Tensor], Any], plane: _Plane, X: Tensor, yn: np.ndarray
) -> None:
    """One predictor's panel: classes shaded by confidence, its contours and boundaries, the
    data, and accuracy and NLL in the title."""
    from matplotlib.colors import to_rgb

    with torch.no_grad():
        p_grid = _probabilities(predict(plane.points), plane.points.shape[0], name, "the grid")
        p_data = _probabilities(predict(X.to(torch.float32)), X.shape[0], name, "X")
    C = p_grid.shape[1]
    if p_data.shape[1] != C:
        raise ValueError(f"predictors[{name!r}]: {C} classes on the grid, {p_data.shape[1]} on X")
    if int(yn.max()) >= C:
        raise ValueError(f"y: label {int(yn.max())} but predictors[{name!r}] gives {C} classes")
    colours = np.array([to_rgb(PALETTE[c % len(PALETTE)]) for c in range(max(C, 1))])
    conf, cls = p_grid.max(1), p_grid.argmax(1)
    fade = np.clip((conf - 1 / C) / (1 - 1 / C), 0, 1)[:, None] if C > 1 else np.ones((1, 1))
    rgb = 1 - fade * (1 - colours[cls])
    ax.imshow(
        plane.square(rgb),
        origin="lower",
        extent=plane.extent,
        aspect="auto",
        interpolation="nearest",
    )
    conf2d, gx, gy = plane.square(conf), plane.gx, plane.gy
    levels = [v for v in (0.6, 0.8, 0.95) if conf2d.min() < v < conf2d.max()]
    if levels:
        cs = ax.contour(gx, gy, conf2d, levels=levels, colors="k", linewidths=0.4, alpha=0.5)
        ax.clabel(cs, fontsize=6, fmt="%.2f")
    cls2d = plane.square(cls)
    for c in range(C):  # class boundaries: edges of each class's region
        region = (cls2d == c).astype(float)
        if 0 < region.sum() < region.size:
            ax.contour(gx, gy, region, levels=[0.5], colors="k", linewidths=0.8)
    Xd = X.double().numpy()
    ax.scatter(
        Xd[:, 0], Xd[:, 1], c=colours[yn % len(colours)], s=10, edgecolors="k", linewidths=0.3
    )
    acc = float(np.mean(p_data.argmax(1) == yn))
    p_true = np.clip(p_data[np.arange(len(yn)), yn], 1e-12, None)
    nll = float(-np.mean(np.log(p_true)))
    ax.set_title(f"{name}\nacc {100 * acc:.2f}%, NLL {nll:.4f}", fontsize=10)
    ax.set_xlim(plane.extent[0], plane.extent[1])
    ax.set_ylim(plane.extent[2], plane.extent[3])
    ax.set_xticks([])
    ax.set_yticks([])


def decision_boundaries(
    predictors: Mapping[str, Callable[[Tensor], Tensor]],
    X: Tensor,
    y: Tensor,
    path: str | os.PathLike[str] | None = None,
    title: str | None = None,
    resolution: int = 200,
    *,
    ax: Any = None,
) -> Any:
    """Predicted class shaded by confidence over the plane, one panel per predictor.

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
        path: a PNG file to write (atomically; parent folders are created), or None.
        title: figure title.
        resolution: grid points per axis (>= 2).
        ax: a matplotlib Axes per panel, each panel drawn on its own (one panel: on `ax`); or
            one Axes for several panels, drawn in its place (a SubFigure there; the Axes
            itself is removed). None: a new headless figure.

    Returns:
        given `ax`, `ax` (or the SubFigure in its place; the figure is yours: pyplot shows
        it); else
        `Path(path)` when `path` is given; else the new matplotlib Figure.
    """
    X, y = _check(predictors, X, y, path, resolution, ax)
    plane = _Plane(X.double().numpy(), resolution)
    n = len(predictors)
    fig, axes = cells(ax, n, 3.8 * n, 3.9 + (0.3 if title else 0.0))
    for cell, (name, predict) in zip(axes, predictors.items(), strict=True):
        _panel(cell, str(name), predict, plane, X, y.long().numpy())
    if title:
        fig.suptitle(title)
    return finish(fig, path, ax)
