"""What the monitor shows: its chunks as flat records (results.csv, `to_pandas`), a markdown
table, the timeline figure and the one-file HTML report (`peg.apps.html`'s pieces), each
opening with the verdict line ("3 chunks, 2 alerts; latest estimate 0.79 [0.73, 0.86]", and
", unreliable: <reason>" where the latest estimate says so). The records keep their column
names (`COLUMNS`); the tables a person reads head them with words (`HEADERS`)."""

from __future__ import annotations

import datetime
import os
from typing import Any, Protocol

from peg._version import __version__
from peg.apps import html
from peg.apps.monitor import drift
from peg.apps.monitor.records import UNRELIABLE
from peg.utils.html import Markup, md


class Monitor(Protocol):
    """What the report reads of a `peg.apps.monitor.Monitor` (declared here: the monitor
    imports this module, not the other way round)."""

    chunks: list[Any]
    estimator: Any
    alpha: float
    band: Any
    chunker: Any

    @property
    def alerts(self) -> Any: ...


# a record's columns, and the words a table heads them with
HEADERS = {
    "chunk": "chunk",
    "source": "source",
    "n": "points",
    "accuracy": "estimated accuracy",
    "lo": "interval low",
    "hi": "interval high",
    "band_lo": "band low",
    "band_hi": "band high",
    "realized_accuracy": "realized accuracy",
    "label_shift_p": "label shift p",
    "domain_auroc": "domain AUROC",
    "covariate_p": "covariate shift p",
    "ood_share": "OOD share",
    "alert": "alert",
    "reasons": "reasons",
}
COLUMNS = tuple(HEADERS)
# the columns that hold a number (NaN where not computed)
FLOATS = tuple(c for c in COLUMNS if c not in ("chunk", "source", "n", "alert", "reasons"))
NOTE = (
    "Estimates hold under the shifts the interval was calibrated on (label shift, covariate "
    "shift towards harder inputs); a shift in p(y | x) is invisible without labels."
)


def records(monitor: Monitor) -> list[dict[str, Any]]:
    """One flat dict per chunk (the interval as `lo`, `hi`, the band as `band_lo`, `band_hi`;
    the reasons joined by "; ")."""
    out = []
    for c in monitor.chunks:
        row = {k: c.get(k) for k in COLUMNS}
        row["lo"], row["hi"] = c.interval
        row["band_lo"], row["band_hi"] = c.band
        row["reasons"] = "; ".join(c.reasons)
        out.append(row)
    return out


def _count(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def verdict(monitor: Monitor) -> str:
    """The answer in one line: chunks, alerts, the latest estimate (and why it is unreliable,
    where it says so)."""
    chunks = monitor.chunks
    said = f"{_count(len(chunks), 'chunk')}, {_count(len(monitor.alerts), 'alert')}"
    if not chunks:
        return said
    last = chunks[-1]
    lo, hi = last.interval
    said += f"; latest estimate {last.accuracy:.2f} [{lo:.2f}, {hi:.2f}]"
    unreliable = [a.detail or "no reason given" for a in last.alerts if a.kind == UNRELIABLE]
    return said + (f", unreliable: {'; '.join(unreliable)}" if unreliable else "")


def _settings(monitor: Monitor) -> str:
    return (
        f"Method: {monitor.estimator.method}; chunks: {monitor.chunker!r}; band: "
        f"{monitor.band.describe()}; tests fire at p < {monitor.alpha / drift.TESTS:.2g} "
        f"({monitor.alpha:g} split between {drift.TESTS})."
    )


def _cell(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "ALERT" if value else ""
    if isinstance(value, float):
        return f"{value:.3g}" if value < 0.01 else f"{value:.3f}"
    return str(value)


def title(monitor: Monitor) -> str:
    return f"peg monitor: accuracy without labels ({monitor.estimator.method})"


def markdown(monitor: Monitor) -> str:
    lines = [
        f"# {md(title(monitor))}",
        "",
        f"**{md(verdict(monitor))}**",
        "",
        md(_settings(monitor)),
        "",
        "| " + " | ".join(HEADERS.values()) + " |",
        "|" + "---|" * len(COLUMNS),
    ]
    for r in records(monitor):
        lines.append("| " + " | ".join(md(_cell(r[k])) for k in COLUMNS) + " |")
    return "\n".join(lines) + "\n"


def _names(chunks: list[Any]) -> list[str]:
    """The x axis's labels: each chunk's source (cut to 18 characters), else its number."""
    out = []
    for c in chunks:
        name = str(c.source) if c.source else str(c.chunk)
        out.append(name if len(name) <= 18 else name[:17] + "…")
    return out


def timeline(monitor: Monitor, ax: Any = None, path: str | os.PathLike[str] | None = None) -> Any:
    """Estimates with their intervals, each chunk's band shaded, realized accuracies, alerts
    in red; the chunks named on the x axis."""
    from peg.plots._figure import finish, panel

    chunks = monitor.chunks
    drawn = panel(ax, max(7.0, min(14.0, 0.45 * len(chunks))), 3.4)
    x = list(range(len(chunks)))
    for i, c in enumerate(chunks):  # the band of each chunk's own size
        lo, hi = c.band
        drawn.fill_between([i - 0.4, i + 0.4], lo, hi, color="0.88", lw=0,
                           label=None if i else f"band ({monitor.band!r})")  # fmt: skip
    if chunks:
        acc = [c.accuracy for c in chunks]
        err = [
            [a - c.interval[0] for a, c in zip(acc, chunks, strict=True)],
            [c.interval[1] - a for a, c in zip(acc, chunks, strict=True)],
        ]
        drawn.errorbar(x, acc, yerr=err, fmt="o-", color="C0", capsize=2, label="estimate")
        real = [(i, c.realized_accuracy) for i, c in enumerate(chunks) if c.realized_accuracy]
        if real:
            drawn.plot(*zip(*real, strict=True), "s", color="C2", label="realized")
        bad = [(i, c.accuracy) for i, c in enumerate(chunks) if c.alert]
        if bad:
            drawn.plot(
                *zip(*bad, strict=True), "x", color="C3", markersize=10, mew=2, label="alert"
            )
        names = _names(chunks)
        step = max(1, len(chunks) // 25)  # at most ~25 names on the axis
        drawn.set_xticks(x[::step])
        turn = 30 if any(len(n) > 6 for n in names) else 0
        drawn.set_xticklabels(names[::step], rotation=turn, ha="right" if turn else "center")
    drawn.set_xlabel("chunk")
    drawn.set_ylabel("accuracy")
    drawn.set_ylim(0, 1.02)
    drawn.legend(loc="lower left", fontsize=8)
    drawn.set_title(verdict(monitor), fontsize=10)
    return finish(drawn.figure if ax is None else drawn, path, ax)


def build(monitor: Monitor) -> html.Report:
    def sections(figures: bool) -> list[Markup]:
        from peg.utils import html as _html

        rows = records(monitor)
        tint = " peg-worse" if monitor.alerts else ""
        made = f"Made with peg {__version__}, {datetime.date.today().isoformat()}."
        parts = [
            html.paragraph(verdict(monitor), "peg-verdict" + tint),
            html.paragraph(f"{_settings(monitor)} {made}"),
        ]
        if figures:
            plot = html.figure_html(lambda: timeline(monitor), "estimated accuracy per chunk")
            parts.append(html.section("Timeline", plot))
        table = _html.table(
            list(HEADERS.values()),
            [[_cell(r[k]) for k in COLUMNS] for r in rows],
            alerted=[bool(r["alert"]) for r in rows],
        )
        parts += [html.section("Chunks", table), html.paragraph(NOTE)]
        return parts

    return html.Report(
        title=title(monitor),
        markdown=markdown(monitor),
        records=records(monitor),
        index="chunk",
        sections=sections,
        doc="Monitor",
    )
