"""What every figure of `peg.plots` shares: the canvas, where a figure is drawn (`canvas`,
`panel`: a new figure or the caller's Axes), what it returns (`finish`), the PNG write, the
checks of the path and of numeric inputs, and the colours and markers.

`figure` draws with matplotlib's object API on an Agg canvas (no pyplot, no display, no global
figure state: pyplot's registry never holds it, so Jupyter shows a returned figure once, through
its `_repr_png_` or the inline backend's formatter, never again at the end of the cell); `save`
writes the PNG atomically (`peg.utils.io.atomic_open`: a temporary file in the same folder, then
`os.replace`), creating missing parent folders.
"""

from __future__ import annotations

import functools
import io
import os
from pathlib import Path
from typing import Any

import numpy as np
from torch import Tensor

from peg.utils.io import atomic_open

DPI = 120
# colour-blind-friendly class colours (Okabe-Ito), then matplotlib's tab10
PALETTE = (
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
MARKERS = ("s", "D", "^", "v", "P", "X", "<", ">", "p", "h", "*", "o")
# series colours: black first (the baseline a figure compares against), then Okabe-Ito, then
# tab10 colours unlike those (no two near-identical blues)
SERIES = ("#000000", *PALETTE[:8], "#d62728", "#9467bd", "#8c564b", "#7f7f7f", "#17becf")


def figure(width: float, height: float) -> Any:
    """A new headless figure (`width` × `height` inches, constrained layout) on an Agg canvas."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fig = _shown()(figsize=(width, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


@functools.cache
def _shown() -> type:
    """The Figure class of `figure`, made on first use (matplotlib is imported only then)."""
    from matplotlib.figure import Figure

    class Shown(Figure):
        """A Figure that a notebook shows as PNG where no matplotlib backend is set up."""

        def _repr_png_(self) -> bytes:
            return png_bytes(self)

    return Shown


def png_bytes(fig: Any) -> bytes:
    """`fig` (a Figure, SubFigure or Axes: its whole figure) as PNG bytes."""
    buffer = io.BytesIO()
    root(fig).savefig(buffer, format="png", dpi=DPI)
    return buffer.getvalue()


def save(fig: Any, path: str | os.PathLike[str]) -> Path:
    """Write `fig` (its whole figure) as PNG to `path` atomically (`peg.utils.io.atomic_open`);
    returns the path."""
    with atomic_open(path) as f:
        root(fig).savefig(f, format="png", dpi=DPI)
    return Path(path)


def root(drawn: Any) -> Any:
    """The top-level Figure of a Figure, SubFigure or Axes."""
    from matplotlib.figure import Figure

    fig = drawn
    while not isinstance(fig, Figure):
        fig = fig.figure
    return fig


def check_axes(ax: Any) -> None:
    if not (hasattr(ax, "plot") and hasattr(ax, "figure") and hasattr(ax, "remove")):
        raise ValueError(f"ax: expected a matplotlib Axes, got {type(ax).__name__}")


def panel(ax: Any, width: float, height: float) -> Any:
    """The Axes a one-panel figure is drawn into: `ax` (checked), or a new figure's."""
    if ax is None:
        return figure(width, height).add_subplot()
    check_axes(ax)
    return ax


def check_place(ax: Any) -> Any:
    """`ax`'s place on its figure's grid (checked before any work by the figures of several
    panels, which are drawn there); a ValueError naming `ax` otherwise."""
    check_axes(ax)
    spec = ax.get_subplotspec()
    if spec is None:
        raise ValueError(
            "ax: this figure has several panels, drawn in the place of the given Axes: expected an "
            "Axes on a grid (from fig.subplots or fig.add_subplot), got one placed by add_axes"
        )
    return spec


def canvas(ax: Any, width: float, height: float) -> Any:
    """Where a figure of several panels is drawn: a new figure (`width` × `height` inches), or,
    given `ax`, a SubFigure in that Axes' place in its figure (`ax` itself removed), which
    the panels share as they would a figure of their own."""
    if ax is None:
        return figure(width, height)
    sub = ax.figure.add_subfigure(check_place(ax))
    ax.remove()
    sub.in_place_of_axes = True  # `finish` returns it: the panels are there, not on `ax`
    return sub


def check_cells(ax: Any, n: int) -> list[Any] | None:
    """`ax` of a figure of `n` panels, checked before any work: a sequence of `n` Axes (a panel
    drawn on each) or one Axes for one panel (drawn on it) as a list; None without `ax`, or for
    one Axes on a grid given several panels (drawn in its place: `canvas`)."""
    if ax is None:
        return None
    if isinstance(ax, (list, tuple, np.ndarray)):
        axes = list(np.ravel(np.asarray(ax, dtype=object)))
        if len(axes) != n:
            raise ValueError(f"ax: expected one Axes, or {n} (one per panel), got {len(axes)}")
        for one in axes:
            check_axes(one)
        return axes
    if n == 1:
        check_axes(ax)
        return [ax]
    check_place(ax)
    return None


def cells(ax: Any, n: int, width: float, height: float) -> tuple[Any, list[Any]]:
    """A figure of `n` panels in a row: where it is drawn (titles, colour bars) and its panels:
    the given Axes on their own figure (`check_cells`), else a new figure's or, in `ax`'s
    place, a SubFigure's (`canvas`)."""
    given = check_cells(ax, n)
    if given is not None:
        return given[0].figure, given
    fig = canvas(ax, width, height)
    return fig, list(fig.subplots(1, n, squeeze=False)[0])


def finish(drawn: Any, path: str | os.PathLike[str] | None, ax: Any) -> Any:
    """What a figure function returns, having drawn into `drawn` (a new Figure, the caller's
    Axes or their figure, or a SubFigure in the caller's Axes' place): the figure is written
    to `path` when one is given (the caller's whole figure where `ax` was given); then, given
    `ax`, what was drawn into (`ax` itself, or the SubFigure of the panels in its place: the
    figure is the caller's, which pyplot shows; returning it would show it twice in a
    notebook), else `Path(path)` when written, else the new Figure."""
    if path is not None:
        save(drawn, path)
    if ax is not None:
        return drawn if getattr(drawn, "in_place_of_axes", False) else ax
    return Path(path) if path is not None else root(drawn)


def check_path(path: Any) -> None:
    if not isinstance(path, (str, os.PathLike)):
        raise ValueError(f"path: expected a file path, got {type(path).__name__}")


def to_numpy(value: Any, where: str) -> np.ndarray:
    if isinstance(value, Tensor):
        return value.detach().cpu().double().numpy()
    try:
        return np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{where}: expected a tensor or array of numbers ({e})") from e
