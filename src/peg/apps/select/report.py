"""The choice of `AutoSelect` from cross-fitted scores (`choose`), and its report as markdown.

Each kept candidate has its CV mean ± SE of the per-point criterion and its paired difference
to the best candidate (mean and SE of the per-point differences, on the same folds). The best is
the lowest mean; with `one_se`, the cheapest candidate whose paired difference to the best is
within one SE of it: cheapest by prediction cost (forwards per input, to 0.1), then by
simplicity (`SIMPLICITY`: fewer fitted parameters first), then by fit seconds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from peg.apps.bench.spec import MethodSpec
from peg.apps.select.folds import mean_se

# the named candidates from the simplest to the richest (others after them, in their order)
SIMPLICITY = (
    "Model",
    "TS",
    "Vector scaling",
    "Dirichlet",
    "Matrix scaling",
    "Hist. binning",
    "Isotonic",
    "Laplace",
    "Last-layer PEG",
    "TS → PEG",
    "PEG",
    "PEG + TS",
    "PEG (ascent)",
    "PEP",
    "MC dropout",
)


def _cost(row: dict[str, Any], order: int) -> tuple[float, int, float]:
    fw = row["forwards"]
    rank = SIMPLICITY.index(row["candidate"]) if row["candidate"] in SIMPLICITY else 99 + order
    return (math.inf if fw is None else round(fw, 1), rank, row["fit_seconds"])


def choose(
    cross: Any, specs: Sequence[MethodSpec], covered: torch.Tensor, one_se: bool,
    skipped: dict[str, str],
) -> tuple[list[dict[str, Any]], str]:  # fmt: skip
    """The report (a row per candidate) and the chosen candidate's name."""
    rows: list[dict[str, Any]] = []
    for spec in specs:
        name = spec.name
        row: dict[str, Any] = {"candidate": name, "base": spec.base, "method": spec.method}
        seconds = cross.seconds.get(name) or []
        row["forwards"] = cross.forwards.get(name)
        row["fit_seconds"] = sum(seconds) / len(seconds) if seconds else None
        if name in cross.dropped:
            row |= {"status": "dropped", "why": cross.dropped[name]}
        else:
            mean, se = mean_se(cross.points[name][covered])
            row |= {"cv_mean": mean, "cv_se": se, "status": "kept", "why": ""}
        rows.append(row)
    rows += [{"candidate": k, "status": "dropped", "why": v} for k, v in skipped.items()]
    kept = [r for r in rows if r["status"] == "kept"]
    if not kept:
        raise ValueError("candidates: every candidate failed or was dropped: " + "; ".join(
            f"{r['candidate']}: {r['why']}" for r in rows))  # fmt: skip
    best = min(kept, key=lambda r: r["cv_mean"])
    for r in kept:
        diff = cross.points[r["candidate"]][covered] - cross.points[best["candidate"]][covered]
        r["diff"], r["diff_se"] = mean_se(diff)
        r["within_1se"] = r is best or r["diff"] <= r["diff_se"]
    chosen = best
    if one_se:
        within = [(i, r) for i, r in enumerate(kept) if r["within_1se"]]
        chosen = min(within, key=lambda ir: _cost(ir[1], ir[0]))[1]
    chosen["status"] = "chosen"
    if chosen is not best:
        chosen["why"] = f"the cheapest within one paired SE of the best ({best['candidate']})"
    else:
        chosen["why"] = "the best CV score"
    return rows, chosen["candidate"]


def _num(value: Any, fmt: str) -> str:
    return "–" if value is None or (isinstance(value, float) and math.isnan(value)) else (
        fmt.format(value))  # fmt: skip


def to_markdown(report: Sequence[dict[str, Any]], criterion: str) -> str:
    """The report as a markdown table (a row per candidate)."""
    lines = [
        f"| candidate | CV {criterion} (mean ± SE) | vs best (paired, ± SE) | forwards / input "
        "| fit s (per fold) | status |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for r in report:
        score = f"{r['cv_mean']:.4f} ± {r['cv_se']:.4f}" if "cv_mean" in r else "–"
        diff = f"{r['diff']:+.4f} ± {r['diff_se']:.4f}" if "diff" in r else "–"
        status = r["status"] + (f": {r['why']}" if r.get("why") else "")
        if r["status"] == "chosen":
            status = f"**{status}**"
        lines.append(
            f"| {r['candidate']} | {score} | {diff} | {_num(r.get('forwards'), '{:.2f}')} | "
            f"{_num(r.get('fit_seconds'), '{:.2f}')} | {status} |"
        )
    return "\n".join(lines) + "\n"
