"""What the monitor shows: its chunks as flat records, a markdown table, the timeline figure
and the one-file HTML report (`peg.apps.html`'s pieces)."""

from __future__ import annotations

import os
from typing import Any, Protocol

from peg.apps import html
from peg.apps.monitor import drift
from peg.utils.html import Markup, md


class Monitor(Protocol):
    """What the report reads of a `peg.apps.monitor.Monitor` (declared here: the monitor
    imports this module, not the other way round)."""

    chunks: list[dict[str, Any]]
    estimator: Any
    alpha: float
    sigmas: float

    @property
    def band(self) -> Any: ...

    @property
    def alerts(self) -> Any: ...


COLUMNS = (
    "chunk",
    "source",
    "n",
    "accuracy",
    "lo",
    "hi",
    "realized_accuracy",
    "label_shift_p",
    "domain_auroc",
    "covariate_p",
    "ood_share",
    "alert",
    "reasons",
)
# the columns that hold a number (NaN where not computed)
FLOATS = tuple(c for c in COLUMNS if c not in ("chunk", "source", "n", "alert", "reasons"))


def records(monitor: Monitor) -> list[dict[str, Any]]:
    """One flat dict per chunk (the interval as `lo`, `hi`; the reasons joined by "; ")."""
    out = []
    for c in monitor.chunks:
        row = {k: c.get(k) for k in COLUMNS}
        row["lo"], row["hi"] = c["interval"]
        row["reasons"] = "; ".join(c["reasons"])
        out.append(row)
    return out


def _cell(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "ALERT" if value else ""
    if isinstance(value, float):
        return f"{value:.3g}" if value < 0.01 else f"{value:.3f}"
    return str(value)


def markdown(monitor: Monitor) -> str:
    lo, hi = monitor.band
    lines = [
        f"# peg monitor: {len(monitor.chunks)} chunks, {len(monitor.alerts)} alerts",
        "",
        f"Method: {md(monitor.estimator.method)}; band [{lo:.3f}, {hi:.3f}] (reference chunks "
        f"± {monitor.sigmas:g} σ); tests fire at p < {monitor.alpha / drift.TESTS:.2g} "
        f"({monitor.alpha:g} split between {drift.TESTS}).",
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "|" + "---|" * len(COLUMNS),
    ]
    for r in records(monitor):
        lines.append("| " + " | ".join(md(_cell(r[k])) for k in COLUMNS) + " |")
    return "\n".join(lines) + "\n"


def timeline(monitor: Monitor, ax: Any = None, path: str | os.PathLike[str] | None = None) -> Any:
    """Estimates with their intervals, the band shaded, realized accuracies, alerts in red."""
    from peg.plots._figure import finish, panel

    drawn = panel(ax, 7.0, 3.2)
    chunks = monitor.chunks
    x = [c["chunk"] for c in chunks]
    lo, hi = monitor.band
    drawn.axhspan(lo, hi, color="0.88", label=f"band (± {monitor.sigmas:g} σ)")
    if chunks:
        acc = [c["accuracy"] for c in chunks]
        err = [
            [a - c["interval"][0] for a, c in zip(acc, chunks, strict=True)],
            [c["interval"][1] - a for a, c in zip(acc, chunks, strict=True)],
        ]
        drawn.errorbar(x, acc, yerr=err, fmt="o-", color="C0", capsize=2, label="estimate")
        real = [(c["chunk"], c["realized_accuracy"]) for c in chunks if c["realized_accuracy"]]
        if real:
            drawn.plot(*zip(*real, strict=True), "s", color="C2", label="realized")
        bad = [(c["chunk"], c["accuracy"]) for c in chunks if c["alert"]]
        if bad:
            drawn.plot(
                *zip(*bad, strict=True), "x", color="C3", markersize=10, mew=2, label="alert"
            )
    drawn.set_xlabel("chunk")
    drawn.set_ylabel("accuracy")
    drawn.set_ylim(0, 1.02)
    drawn.legend(loc="lower left", fontsize=8)
    drawn.set_title(f"peg monitor ({monitor.estimator.method})")
    return finish(drawn.figure if ax is None else drawn, path, ax)


def build(monitor: Monitor) -> html.Report:
    def sections(figures: bool) -> list[Markup]:
        from peg.utils import html as _html

        rows = records(monitor)
        table = _html.table(
            list(COLUMNS),
            [[_cell(r[k]) for k in COLUMNS] for r in rows],
            marked=[bool(r["alert"]) for r in rows],
        )
        parts = [html.section("Chunks", table)]
        if figures:
            parts.insert(
                0,
                html.section(
                    "Timeline",
                    html.figure_html(lambda: timeline(monitor), "estimated accuracy per chunk"),
                ),
            )
        parts.append(
            html.paragraph(
                "Estimates hold under the shifts the interval was calibrated on (label shift, "
                "covariate shift towards harder inputs); a shift in p(y | x) is invisible without "
                "labels."
            )
        )
        return parts

    return html.Report(
        title="peg monitor",
        markdown=markdown(monitor),
        records=records(monitor),
        index="chunk",
        sections=sections,
        doc="Monitor",
    )
