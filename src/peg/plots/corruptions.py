"""A grid of one image under every corruption of `peg.data.corruptions` at a few severities.

    from peg.plots import corruption_grid
    corruption_grid(X[0], "corruptions.png")   # all 20 (grey images: 19), severities 1, 3, 5
    fig = corruption_grid(X[0])                 # no path: the matplotlib Figure

`scripts/corruptions_figure.py` draws `docs/corruptions.png` with it.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from peg.data import corruptions as cc
from peg.plots._figure import canvas, check_path, check_place, finish, to_numpy


def _show(ax: Any, image: np.ndarray) -> None:
    """One image `[C, H, W]` in [0, 1], pixels as squares."""
    if image.shape[0] == 1:
        ax.imshow(image[0], cmap="gray", vmin=0.0, vmax=1.0, interpolation="nearest")
    else:
        ax.imshow(image.transpose(1, 2, 0), interpolation="nearest")
    ax.set_xticks([])
    ax.set_yticks([])


def corruption_grid(
    image: Any,
    path: str | os.PathLike[str] | None = None,
    names: Sequence[str] | None = None,
    severities: Sequence[int] = (1, 3, 5),
    seed: int = 0,
    columns: int = 10,
    *,
    ax: Any = None,
) -> Any:
    """Draw `image` under each corruption (columns) at each severity (rows), clean at the left.

    Args:
        image: one image `[C, H, W]` or `[1, C, H, W]` in [0, 1], C = 1 or 3.
        path: a PNG file to write (atomically; parent folders are created), or None.
        names: corruptions to show, in order; default `corruptions.applicable(C)`.
        severities: one row each, within every block of `columns` corruptions.
        seed: seed of the random corruptions (`corruptions.corrupt`).
        columns: corruptions per block of rows.
        ax: a matplotlib Axes: the panels are drawn in its place in its figure (a SubFigure
            there; the Axes itself is removed). None: a new headless figure.

    Returns:
        given `ax`, the SubFigure drawn into (the figure is yours: pyplot shows it); else
        `Path(path)` when `path` is given; else the new matplotlib Figure.
    """
    if path is not None:
        check_path(path)
    if ax is not None:
        check_place(ax)
    x = to_numpy(image, "image").astype(np.float32)
    x = x[None] if x.ndim == 3 else x
    if x.ndim != 4 or x.shape[0] != 1:
        raise ValueError(f"image: expected one image [C, H, W] or [1, C, H, W], got {x.shape}")
    if isinstance(columns, bool) or not isinstance(columns, int) or columns < 1:
        raise ValueError(f"columns: expected an integer >= 1, got {columns!r}")
    severities = tuple(severities)
    # shifted_sets checks the image, names, severities and seed at once, before any drawing.
    sets = cc.shifted_sets(torch.from_numpy(x), names, severities, seed)
    shown = [(n, s, y[0].numpy()) for n, s, y in sets]
    order = list(dict.fromkeys(n for n, _, _ in shown))
    blocks = math.ceil(len(order) / columns)
    rows = blocks * len(severities)
    fig = canvas(ax, 1.1 * (min(columns, len(order)) + 1), 1.15 * rows + 0.3)
    grid = fig.add_gridspec(rows, min(columns, len(order)) + 1)
    for b in range(blocks):
        top = b * len(severities)
        clean = fig.add_subplot(grid[top, 0])
        _show(clean, x[0])
        clean.set_title("clean", fontsize=8)
    for name, severity, y in shown:
        i = order.index(name)
        b, column = divmod(i, columns)
        row = b * len(severities) + severities.index(severity)
        cell = fig.add_subplot(grid[row, column + 1])
        _show(cell, y)
        if row == b * len(severities):
            cell.set_title(name, fontsize=7)
        if column == 0:
            cell.set_ylabel(f"severity {severity}", fontsize=7)
    return finish(fig, path, ax)
