"""Reliability diagrams of the other kinds of output, drawn by `reliability_diagram` from the
reliability data of their metrics (`peg.metrics.binary`, `peg.metrics.dense`), so the bins
and the ECE in each panel's title are those of the metrics:

- `binary_reliability_diagram`: P(y = 1) against the fraction of labels 1;
- `multilabel_reliability_diagram`: every label entry pooled, or a panel per label;
- `dense_reliability_diagram`: the top-class confidence of every position not ignored.

Each takes predictions and labels (or a dict {method name: predictions}, a panel each) and
returns what `reliability_diagram` returns: the new Figure, `ax`, or the path written.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from peg.metrics.binary import IGNORE_INDEX, binary_reliability, multilabel_reliability
from peg.metrics.calibration import reliability
from peg.metrics.dense import dense_rows
from peg.plots._figure import check_path, root, save
from peg.plots.reliability import reliability_diagram
from peg.utils.scalars import check_positive_int

PathLike = str | os.PathLike[str] | None


def binary_reliability_diagram(
    p: Any,
    labels: Any,
    *,
    bins: int = 15,
    ignore_index: int = IGNORE_INDEX,
    path: PathLike = None,
    ax: Any = None,
    title: str | None = None,
    per_row: int = 5,
) -> Any:
    """Reliability diagram of a binary scorer: the mean P(y = 1) of each equal-width bin of
    p against the fraction of its labels that are 1 (`peg.metrics.binary_reliability`).

    Args:
        p: P(y = 1) `[N]` (or `[N, 1]`), or a dict {method name: such probabilities}.
        labels: `[N]`, 0 or 1 (`ignore_index` left out).
        bins, ignore_index: as `peg.metrics.binary_ece`.
        path, ax, title, per_row: as `peg.plots.reliability_diagram`.
    """
    bins = check_positive_int(bins, "bins")
    curves = {
        name: binary_reliability(one, labels, bins, ignore_index) for name, one in _named(p).items()
    }
    return _drawn(curves, ("P(y = 1)", "fraction of 1s"), path, ax, title, per_row)


def multilabel_reliability_diagram(
    p: Any,
    labels: Any,
    *,
    per_label: bool = False,
    label_names: Sequence[str] | None = None,
    bins: int = 15,
    ignore_index: int = IGNORE_INDEX,
    path: PathLike = None,
    ax: Any = None,
    title: str | None = None,
    per_row: int = 5,
) -> Any:
    """Reliability diagram of a multi-label head: every label entry's P(label) against the
    fraction labelled, pooled over the labels (`peg.metrics.multilabel_reliability`), or a
    panel per label (`per_label=True`, one head only).

    Args:
        p: probabilities `[N, K]`, or a dict {method name: such probabilities} (pooled only).
        labels: multi-hot `[N, K]` (`ignore_index` left out).
        per_label: a panel per label, named by `label_names` (`[K]`; default "label k").
        bins, ignore_index: as `peg.metrics.multilabel_ece`.
        path, ax, title, per_row: as `peg.plots.reliability_diagram`.
    """
    bins = check_positive_int(bins, "bins")
    if not per_label:
        curves = {
            name: multilabel_reliability(one, labels, bins, False, ignore_index)
            for name, one in _named(p).items()
        }
        return _drawn(curves, ("P(label)", "fraction labelled"), path, ax, title, per_row)
    if isinstance(p, Mapping):
        raise ValueError("p: per_label=True draws one head's labels: pass its probabilities [N, K]")
    r = multilabel_reliability(p, labels, bins, True, ignore_index)
    k = r["count"].shape[0]
    names = [f"label {i}" for i in range(k)] if label_names is None else list(label_names)
    if len(names) != k:
        raise ValueError(f"label_names: expected {k} names (K of p), got {len(names)}")
    curves = {}
    for i, name in enumerate(names):
        if int(r["count"][i].sum()) > 0:  # a label whose every entry is ignored: no panel
            curves[str(name)] = {"edges": r["edges"]} | {
                key: r[key][i] for key in ("confidence", "accuracy", "count")
            }
    return _drawn(curves, ("P(label)", "fraction labelled"), path, ax, title, per_row)


def dense_reliability_diagram(
    logits: Any,
    labels: Any,
    *,
    bins: int = 15,
    ignore_index: int = IGNORE_INDEX,
    path: PathLike = None,
    ax: Any = None,
    title: str | None = None,
    per_row: int = 5,
) -> Any:
    """Reliability diagram of dense predictions: the top-class confidence of every position
    whose label is not `ignore_index` against its accuracy (`peg.metrics.reliability` of the
    positions as rows, the data of `peg.metrics.dense_metrics`'s ECE).

    Args:
        logits: `[B, C, *S]`, or a dict {method name: such logits}.
        labels: `[B, *S]`.
        bins, ignore_index: as `peg.metrics.dense_metrics`.
        path, ax, title, per_row: as `peg.plots.reliability_diagram`.
    """
    bins = check_positive_int(bins, "bins")
    curves = {}
    for name, one in _named(logits).items():
        rows, kept = dense_rows(one, labels, ignore_index)
        if not len(kept):
            raise ValueError(f"labels: every label is ignore_index ({ignore_index})")
        curves[name] = reliability(rows, kept, bins)
    return _drawn(curves, ("confidence", "accuracy"), path, ax, title, per_row)


def _named(pred: Any) -> dict[str, Any]:
    """{method name: predictions}: a dict as given, else one unnamed panel."""
    return {str(k): v for k, v in pred.items()} if isinstance(pred, Mapping) else {"": pred}


def _drawn(
    curves: dict[str, Any],
    axis_labels: tuple[str, str],
    path: PathLike,
    ax: Any,
    title: str | None,
    per_row: int,
) -> Any:
    """`reliability_diagram(curves)` with the axes named for the kind, written to `path`
    after the naming (so the file has the names too)."""
    if path is not None:
        check_path(path)
    drawn = reliability_diagram(curves, title=title, per_row=per_row, ax=ax)
    from matplotlib.axes import Axes

    # one Axes, a SubFigure or a Figure; a sequence of Axes (one per method) share a figure
    anchor = np.ravel(np.asarray(drawn, dtype=object))[0] if _many(drawn) else drawn
    x_name, y_name = axis_labels
    for one in root(anchor).findobj(Axes):
        if one.get_xlabel() == "confidence":
            one.set_xlabel(x_name)
        if one.get_ylabel() == "accuracy":
            one.set_ylabel(y_name)
        legend = one.get_legend()
        for text in legend.get_texts() if legend is not None else ():
            if text.get_text() == "accuracy":  # the bars' entry
                text.set_text(y_name)
    if path is None:
        return drawn
    save(anchor, path)
    return drawn if ax is not None else Path(path)


def _many(drawn: Any) -> bool:
    return isinstance(drawn, (list, tuple, np.ndarray))
