"""What a resumed `peg.compare` accepts from a saved row (`peg.apps.compare.state`): the row,
its reliability data and set sizes, each checked before any is used, since the file may be
damaged or edited by hand."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from peg._schema import Fields, in_range


def check_saved(
    saved: dict[str, Any], name: str, sets: set[str], where: str, bins: int | None = None
) -> None:
    """A saved row, its reliability data and set sizes checked before any is used (a file
    damaged or edited by hand: an ArchiveError naming the field): every number of the row a
    non-negative number (NaN never; infinity only as an NLL), fractions within [0, 1]; each
    set's reliability data the `bins` bins `peg.metrics.reliability` gives."""
    tree = Fields(saved, where, what="saved row")
    row = tree.object("row")
    assert row is not None
    row.get("method", lambda v: v == name, f"the method's name {name!r}")
    row.number("fit_seconds", minimum=0)
    for key, value in row.obj.items():
        metric = key.split(" (")[0].split("@")[0]  # "nll (shifted)", "coverage@0.1"
        needed = key in NEEDED
        if (value is None or isinstance(value, str)) and not needed:
            continue
        if not _in_bounds(metric, value):
            top = "1" if metric in FRACTIONS else "2" if metric == "brier" else "∞"
            also = "" if needed else ", a string or null"
            raise row.error(key, f"a number in [0, {top}]{also}", value)
    for key in NEEDED:
        row.get(key, lambda v: True, "a number")  # present (checked above where it is)
    curves = tree.object("curves")
    assert curves is not None
    for set_name in curves.obj:
        known = set_name in sets
        curves.get(
            set_name,
            lambda v, known=known: known and _curve(v, bins),
            f"reliability data of one of the sets {sorted(sets)} ({bins} bins)",
        )
    sizes = tree.object("sizes")
    assert sizes is not None
    for set_name in sizes.obj:
        sizes.get(
            set_name,
            lambda v: (
                isinstance(v, (list, tuple))
                and len(v) == 2
                and in_range(v[0], 0, None, int)
                and v[1] in KINDS
            ),
            "[points, kind]",
        )
    tree.get(
        "archive", lambda v: v is None or isinstance(v, str), "a SHA-256 or null", optional=True
    )


# the metrics that are fractions (rows hold them as such); Brier's score lies in [0, 2]
FRACTIONS = {
    "error",
    "ece",
    "mce",
    "adaptive_ece",
    "classwise_ece",
    "aurc",
    "augrc",
    "auroc",
    "aupr",
    "aupr_in",
    "fpr95",
    "coverage",
}
KINDS = ("test", "shifted", "ood")
NEEDED = ("nll", "error", "ece")  # the test metrics a row shows in its line
CURVE = ("edges", "confidence", "accuracy", "count")


def _in_bounds(metric: str, v: Any) -> bool:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or math.isnan(v) or v < 0:
        return False
    top = 1.0 if metric in FRACTIONS else 2.0 if metric == "brier" else math.inf
    return v <= top and (math.isfinite(v) or metric == "nll")


def _curve(v: Any, bins: int | None) -> bool:
    """`peg.metrics.reliability` data of `bins` bins: edges `[bins + 1]` from 0 to 1;
    confidence and accuracy `[bins]` in [0, 1] (NaN in empty bins); count `[bins]`, integers."""
    if not (
        isinstance(v, Mapping)
        and sorted(v) == sorted(CURVE)
        and all(isinstance(t, Tensor) and t.ndim == 1 for t in v.values())
    ):
        return False
    n = len(v["count"]) if bins is None else bins
    if len(v["edges"]) != n + 1 or any(len(v[k]) != n for k in CURVE[1:]):
        return False
    count = v["count"]
    if count.dtype not in (torch.int64, torch.int32) or (count < 0).any():
        return False
    edges = v["edges"].double()
    fractions = [v[k].double() for k in ("confidence", "accuracy")]
    return bool(
        edges.isfinite().all()
        and (edges >= 0).all()
        and (edges <= 1).all()
        and all(((f >= 0) & (f <= 1) | f.isnan()).all() for f in fractions)
    )
