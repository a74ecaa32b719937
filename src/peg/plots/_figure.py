"""What every figure of `peg.plots` shares: the canvas, the PNG write, the checks of the path
and of numeric inputs, and the colours and markers.

`figure` draws with matplotlib's object API on an Agg canvas (no pyplot, no display, no global
figure state); `save` writes the PNG atomically (`peg._io.atomic_open`: a temporary file in the
same folder, then `os.replace`), creating missing parent folders.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
from torch import Tensor

from peg._io import atomic_open

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
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def save(fig: Any, path: str | os.PathLike[str]) -> Path:
    """Write `fig` as PNG to `path` atomically (`peg._io.atomic_open`); returns the path."""
    with atomic_open(path) as f:
        fig.savefig(f, format="png", dpi=DPI)
    return Path(path)


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
