"""Paper-style tables: rows NLL, Error %, Brier, ECE % (by default; `metric_rows` chooses
others of `ROWS`); one column per method.

A cell holds one value or one value per seed; several values print as mean ± std (sample
standard deviation, ddof=1). The best mean of each row is bold: the lowest, except for the
rows in `HIGHER_IS_BETTER` (AUROC, AUPR).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence

Row = tuple[str, str, float, str]  # (metric key, row label, multiplier, format)
# every row a labelled set's table can show (`peg.apps.scores.CLASSIFICATION` computes them all)
ROWS: tuple[Row, ...] = (
    ("nll", "NLL", 1, "{:.4f}"),
    ("error", "Error %", 100, "{:.2f}"),
    ("brier", "Brier", 1, "{:.4f}"),
    ("ece", "ECE %", 100, "{:.2f}"),
    ("mce", "MCE %", 100, "{:.2f}"),
    ("adaptive_ece", "aECE %", 100, "{:.2f}"),
    ("classwise_ece", "cwECE %", 100, "{:.2f}"),
    ("aurc", "AURC %", 100, "{:.2f}"),
    ("augrc", "AUGRC %", 100, "{:.2f}"),
)
DEFAULT_METRICS = ("nll", "error", "brier", "ece")  # the rows of a bench spec without `metrics:`

OOD_ROWS: tuple[Row, ...] = (
    ("auroc", "AUROC %", 100, "{:.2f}"),
    ("aupr", "AUPR-Out %", 100, "{:.2f}"),
    ("aupr_in", "AUPR-In %", 100, "{:.2f}"),
    ("fpr95", "FPR95 %", 100, "{:.2f}"),
)
COST_ROWS: tuple[Row, ...] = (
    ("seconds", "Fit s", 1, "{:.2f}"),
    ("predict_seconds", "Predict s", 1, "{:.2f}"),
    ("forwards", "Forwards", 1, "{:.0f}"),
)
HIGHER_IS_BETTER = frozenset({"auroc", "aupr", "aupr_in"})

Cell = float | Sequence[float]


def metric_rows(keys: Sequence[str] = DEFAULT_METRICS) -> tuple[Row, ...]:
    """The rows of `ROWS` for metric keys `keys`, in that order (each must be a key of it)."""
    by_key = {row[0]: row for row in ROWS}
    return tuple(by_key[k] for k in keys)


def _values(cell: Cell) -> list[float]:
    return [float(cell)] if isinstance(cell, (int, float)) else [float(v) for v in cell]


def markdown_table(
    columns: Mapping[str, Mapping[str, Cell]],
    rows: Sequence[Row] | None = None,
) -> str:
    """A markdown table of `columns[name][metric]` (a value or per-seed values); `rows`
    (default: those of `DEFAULT_METRICS`) say which metrics and how."""
    rows = metric_rows() if rows is None else rows
    names = list(columns)
    lines = ["| metric | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
    for key, label, scale, fmt in rows:
        cells = [[v * scale for v in _values(columns[n][key])] for n in names]
        means = [statistics.fmean(c) for c in cells]
        best = max(means) if key in HIGHER_IS_BETTER else min(means)
        texts = []
        for c, m in zip(cells, means, strict=True):
            text = fmt.format(m)
            if len(c) > 1:
                text += " ± " + fmt.format(statistics.stdev(c))
            texts.append(f"**{text}**" if m == best else text)
        lines.append(f"| {label} | " + " | ".join(texts) + " |")
    return "\n".join(lines)
