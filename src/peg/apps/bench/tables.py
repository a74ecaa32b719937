"""Paper-style tables: rows NLL, Error %, Brier, ECE %; one column per method.

A cell holds one value or one value per seed; several values print as mean ± std (sample
standard deviation, ddof=1). The best mean of each row is bold: the lowest, except for the
rows in `HIGHER_IS_BETTER` (AUROC, AUPR).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence

# (metric key, row label, multiplier, format)
ROWS: tuple[tuple[str, str, float, str], ...] = (
    ("nll", "NLL", 1, "{:.4f}"),
    ("error", "Error %", 100, "{:.2f}"),
    ("brier", "Brier", 1, "{:.4f}"),
    ("ece", "ECE %", 100, "{:.2f}"),
)

OOD_ROWS: tuple[tuple[str, str, float, str], ...] = (
    ("auroc", "AUROC %", 100, "{:.2f}"),
    ("aupr", "AUPR-Out %", 100, "{:.2f}"),
    ("aupr_in", "AUPR-In %", 100, "{:.2f}"),
    ("fpr95", "FPR95 %", 100, "{:.2f}"),
)
COST_ROWS: tuple[tuple[str, str, float, str], ...] = (
    ("seconds", "Fit s", 1, "{:.2f}"),
    ("predict_seconds", "Predict s", 1, "{:.2f}"),
    ("forwards", "Forwards", 1, "{:.0f}"),
)
HIGHER_IS_BETTER = frozenset({"auroc", "aupr", "aupr_in"})

Cell = float | Sequence[float]


def _values(cell: Cell) -> list[float]:
    return [float(cell)] if isinstance(cell, (int, float)) else [float(v) for v in cell]


def markdown_table(
    columns: Mapping[str, Mapping[str, Cell]],
    rows: Sequence[tuple[str, str, float, str]] = ROWS,
) -> str:
    """A markdown table of `columns[name][metric]` (a value or per-seed values)."""
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
