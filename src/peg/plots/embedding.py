"""The prediction map: a 2-D embedding (t-SNE) of models' predictions, trajectory by trajectory
(Fort et al. 2019, Figs. 2c and 4)."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from peg.plots._figure import MARKERS, PALETTE, check_axes, check_path, finish, panel, to_numpy


def prediction_map(
    points: Any,
    trajectory: Any,
    kind: Any,
    path: str | os.PathLike[str] | None = None,
    title: str | None = None,
    checkpoint_kind: str = "checkpoint",
    *,
    ax: Any = None,
) -> Any:
    """A 2-D embedding (t-SNE) of models' predictions (Fort et al. Figs. 2c, 4).

    Colour says which trajectory a model belongs to, the marker what it is: the trajectory's
    own checkpoints (`checkpoint_kind`) are circles joined in the given order, growing with
    training; every other kind (a subspace sampler's samples, PEG's members, ...) gets its own
    marker, drawn around its trajectory's final checkpoint.

    Args:
        points: `[K, 2]` positions.
        trajectory: `[K]` integer trajectory index per point.
        kind: `[K]` strings, e.g. "checkpoint", "PEG", "random subspace".
        path: a PNG file to write (atomically; parent folders are created), or None.
        title: figure title.
        checkpoint_kind: the `kind` of the trajectories' checkpoints.
        ax: a matplotlib Axes to draw into (its figure is the one written to `path`). None: a
            new headless figure.

    Returns:
        given `ax`, that Axes (the figure is yours: pyplot shows it); else `Path(path)` when
        `path` is given; else the new matplotlib Figure.
    """
    if path is not None:
        check_path(path)
    if ax is not None:
        check_axes(ax)
    P = to_numpy(points, "points")
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
    marker = {k: MARKERS[i % len(MARKERS)] for i, k in enumerate(others)}
    from matplotlib.lines import Line2D

    drawn = panel(ax, 7.2, 5.6 + (0.3 if title else 0.0))
    kinds_arr = np.array(kinds)
    for t in sorted(set(owner.tolist())):
        colour = PALETTE[t % len(PALETTE)]
        own = (owner == t) & (kinds_arr == checkpoint_kind)
        if own.any():
            drawn.plot(P[own, 0], P[own, 1], "-", color=colour, lw=0.8, alpha=0.6)
            sizes = np.linspace(12, 70, int(own.sum()))
            drawn.scatter(
                P[own, 0], P[own, 1], s=sizes, color=colour, edgecolors="k", lw=0.4, zorder=3
            )
        for k in others:
            sel = (owner == t) & (kinds_arr == k)
            if sel.any():
                drawn.scatter(
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
        Line2D([], [], color=PALETTE[t % len(PALETTE)], marker="o", ls="-", label=f"trajectory {t}")
        for t in sorted(set(owner.tolist()))
    ]
    handles += [
        Line2D([], [], color="k", marker=marker[k], ls="", mfc="none", label=k) for k in others
    ]
    drawn.legend(handles=handles, fontsize=7, loc="best", frameon=False)
    drawn.set_xlabel("t-SNE 1")
    drawn.set_ylabel("t-SNE 2")
    drawn.set_xticks([])
    drawn.set_yticks([])
    if title:
        drawn.set_title(title, fontsize=10)
    return finish(drawn, path, ax)
