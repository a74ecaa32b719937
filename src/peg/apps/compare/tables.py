"""`Comparison`'s tables as text and HTML, and what they mark: a cell is bold only where its row
is better than every other row beyond noise (`peg.apps.verdict.best_beyond_noise`: 2 paired SE
of the per-point values, on the metrics that have them), and the choice column says which row
is the best (the verdict's) and which the baseline (the model as it is)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from peg.utils import html as _html

Spec = Sequence[tuple[str, str, float, str]]
BEST, BASELINE = "best", "baseline"
CHOICE = "choice"  # the column saying which row is the best and which the baseline


def cell(value: Any, scale: float, fmt: str) -> str:
    if isinstance(value, str) or value is None:
        return value or "–"
    return fmt.format(value * scale)


def cells(
    table: Sequence[dict[str, Any]], spec: Spec, bold: Mapping[str, str]
) -> list[list[tuple[str, bool]]]:
    """Rows: methods; columns: `spec` (key, label, multiplier, format); each cell (text,
    whether it is bold: its row is `bold[key]`, the best of the column beyond noise)."""
    return [
        [(str(r["method"]), False)]
        + [(cell(r.get(key), s, f), bold.get(key) == r["method"]) for key, _, s, f in spec]
        for r in table
    ]


def markdown(
    table: Sequence[dict[str, Any]], spec: Spec, bold: Mapping[str, str], marks: Mapping[str, str]
) -> str:
    """A markdown table (every name escaped: `peg.utils.html.md`), bold where `bold` says, the
    choice column from `marks` (method → "best" / "baseline") where given."""
    choice = [CHOICE] if marks else []
    lines = [
        "| " + " | ".join(["method", *choice, *(s[1] for s in spec)]) + " |",
        "|---|" + "---|" * len(choice) + "---:|" * len(spec),
    ]
    for r, row in zip(table, cells(table, spec, bold), strict=True):
        texts = [_html.md(c) for c, _ in row]
        texts = [f"**{t}**" if b else t for t, (_, b) in zip(texts, row, strict=True)]
        if marks:
            texts.insert(1, marks.get(r["method"], ""))
        lines.append("| " + " | ".join(texts) + " |")
    return "\n".join(lines)


def html_table(
    table: Sequence[dict[str, Any]],
    spec: Spec,
    caption: str,
    bold: Mapping[str, str],
    marks: Mapping[str, str] | None = None,
) -> Any:
    """An HTML table (every name escaped), bold where `bold` says, the best row highlighted."""
    marks = marks or {}
    rows: list[list[Any]] = []
    for r, row in zip(table, cells(table, spec, bold), strict=True):
        texts: list[Any] = [_html.strong(c) if b else c for c, b in row]
        if marks:
            texts.insert(1, marks.get(r["method"], ""))
        rows.append(texts)
    choice = [CHOICE] if marks else []
    numeric = [False] * (1 + len(choice)) + [True] * len(spec)
    marked = [marks.get(r["method"]) == BEST for r in table]
    return _html.table(
        ["method", *choice, *(s[1] for s in spec)],
        rows,
        numeric=numeric,
        caption=caption,
        marked=marked if any(marked) else None,
    )


def grouped(reasons: Mapping[str, str]) -> str:
    """`name: why` pairs with each reason said once: "A, B: why; C: other"."""
    by_reason: dict[str, list[str]] = {}
    for name, why in reasons.items():
        by_reason.setdefault(why, []).append(name)
    return "; ".join(f"{', '.join(names)}: {why}" for why, names in by_reason.items())
