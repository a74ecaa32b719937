"""`Comparison`: what `peg.compare` returns: one table (a row per method: its costs beside every
metric), the fitted predictors, reliability data; as markdown, figures and a results folder, and
(`peg.apps.html.Reported`) in a notebook, as a data frame, as CSV or JSON text and as one HTML
file (`to_html`: the tables, conformal coverage, the reliability diagrams before and after)."""

from __future__ import annotations

import datetime
import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch import Tensor

from peg import _html, plots
from peg._env import git_commit, machine
from peg._version import __version__
from peg.apps.bench.tables import HIGHER_IS_BETTER, OOD_ROWS, ROWS, metric_rows
from peg.apps.compare.faults import describe
from peg.apps.html import Report, Reported, figure_html, paragraph, section
from peg.apps.results import write_results

TEST = "test"
# (row key, column label, multiplier, format) of the costs, shown before the metrics
COSTS: tuple[tuple[str, str, float, str], ...] = (
    ("fit_seconds", "Fit s", 1, "{:.2f}"),
    ("forwards", "Forwards / input", 1, "{:.2f}"),
    ("memory_mb", "Memory MB", 1, "{:.3g}"),
    ("predict_seconds", "Predict s", 1, "{:.2f}"),
)
CHOSEN = (("chosen", "Chosen", 1, "{}"),)  # the scale a method chose: T, η or σ (text)
# the metric columns of the labelled sets' tables by default (keys of `ROWS`)
SHOWN = ("nll", "error", "brier", "ece", "adaptive_ece", "classwise_ece", "aurc", "augrc")
NOTE = (
    "Fit s: wall seconds to fit the method, its base's included (PEG + TS: PEG's and the "
    "temperature's). Forwards / input: the predictor's FLOPs per input over the model's "
    "(ensembles: members; last-layer PEG: one trunk and S heads). Memory MB: the tensors the "
    "predictor holds to predict (10^6 bytes). Predict s: wall seconds to predict the test set. "
    "Error, the ECEs, AURC and AUGRC as % (fractions in the table's rows and the JSON); OOD: "
    "OOD is the positive class, scored against the test set. Bold: the best of a column. "
    "Notes: ensembles indistinguishable from their base (every test log-probability within "
    "10^-4 of the base's: `vs_base` in the JSON), whose forwards buy nothing."
)


def check_shown(metrics: Any) -> tuple[str, ...]:
    """`metrics` (None: `SHOWN`) as a tuple of keys of `ROWS`, or a ValueError naming it."""
    if metrics is None:
        return SHOWN
    known = [row[0] for row in ROWS]
    keys = [metrics] if isinstance(metrics, str) else metrics
    if not isinstance(keys, (list, tuple)) or not keys or any(k not in known for k in keys):
        raise ValueError(f"metrics: expected a list of keys among {known}, got {metrics!r}")
    return tuple(dict.fromkeys(keys))


def column(metric: str, dataset: str) -> str:
    """The row key of `metric` on `dataset`: the bare name on the test set, `"nll (name)"`
    on any other."""
    return metric if dataset == TEST else f"{metric} ({dataset})"


@dataclass(repr=False)
class Comparison(Reported):
    """The result of `peg.compare`: `to_markdown()` (also `str()`), `to_html(path=None)` (one
    self-contained file), `to_pandas()`, `to_text("csv" | "json" | "md")`, `plot(folder)`, and
    in a notebook its tables (`_repr_html_`, `_repr_markdown_`).

    Attributes:
        table: one row per method (a dict: "method", "base", "fit_seconds", "forwards",
            "memory_mb", "predict_seconds", "chosen" (T, η or σ), "vs_base" (the largest
            |log p − log p_base| on the test set, against the base's prediction, for a method
            with more members than its base, else None: `peg.apps.compare.collapse`), "note"
            (only where that is under `collapse.INDISTINGUISHABLE`: the members collapsed onto
            the base, whose predictions it gives at its own cost), the test metrics "nll",
            "error", "brier", "ece", "mce", "adaptive_ece", "classwise_ece", "aurc", "augrc"
            (`peg.apps.scores`), the same as `"nll (name)"` per shifted set, and
            "auroc (name)", "aupr (name)", "aupr_in (name)", "fpr95 (name)" per OOD set);
            `comparison.to_pandas()` makes it a data frame (indexed by method). A method that
            failed has "method", "base" and "failed" (the error) only.
        predictors: method name → fitted predictor (anything `peg.evaluate` takes).
        curves: data set → method name → `peg.metrics.reliability` data (labelled sets).
        skipped: methods left out before any fitting → why.
        sets: data set → {"points": N, "kind": "test" | "shifted" | "ood"}.
        ood_score: the OOD score (`peg.metrics.ood`).
        figures: the reliability diagrams written by `plot` or `write`.
        metrics: the metric columns of the markdown tables (keys of
            `peg.apps.bench.tables.ROWS`); the table and the JSON hold every metric.
    """

    table: list[dict[str, Any]]
    predictors: dict[str, Any]
    curves: dict[str, dict[str, dict[str, Tensor]]]
    skipped: dict[str, str]
    sets: dict[str, dict[str, Any]]
    ood_score: str = "entropy"
    figures: list[Path] = field(default_factory=list)
    metrics: tuple[str, ...] = SHOWN

    @property
    def failed(self) -> dict[str, dict[str, Any]]:
        """Methods that failed → their error: `{"type", "message", "hint"}` (what to do)."""
        return {r["method"]: r["failed"] for r in self.table if "failed" in r}

    def row(self, name: str) -> dict[str, Any]:
        """The table's row of method `name`."""
        for r in self.table:
            if r["method"] == name:
                return r
        raise KeyError(f"{name!r}: no such method; methods: {[r['method'] for r in self.table]}")

    def to_markdown(self) -> str:
        """The table as markdown: one table with the costs and the test metrics, then one per
        shifted and OOD set (rows: methods)."""
        shown = metric_rows(self.metrics)
        parts = [_markdown(self.table, [*COSTS, *shown, *CHOSEN])]
        for name, info in self.sets.items():
            if name == TEST:
                continue
            rows = OOD_ROWS if info["kind"] == "ood" else shown
            spec = [(column(k, name), lab, s, f) for k, lab, s, f in rows]
            parts.append(f"{name} ({info['kind']}, {info['points']} points)\n\n" + _markdown(
                self.table, spec))  # fmt: skip
        return "\n\n".join(parts + self._notes()) + "\n"

    def _notes(self) -> list[str]:
        """What was left out, what failed, the notes and the warnings: a line each, if any."""
        parts = []
        if self.skipped:
            parts.append("Left out: " + "; ".join(f"{k}: {v}" for k, v in self.skipped.items()))
        if self.failed:
            parts.append("Failed: " + "; ".join(describe(k, e) for k, e in self.failed.items()))
        noted = [f"{r['method']}: {r['note']}" for r in self.table if "note" in r]
        if noted:
            parts.append("Notes: " + "; ".join(noted))
        warned = [f"{r['method']}: {r['warning']}" for r in self.table if "warning" in r]
        if warned:
            parts.append("Warnings: " + "; ".join(warned))
        return parts

    def __repr__(self) -> str:
        sets = ", ".join(f"{n} ({i['kind']}, {i['points']} points)" for n, i in self.sets.items())
        failed = f", {len(self.failed)} failed" if self.failed else ""
        return (f"<Comparison: {len(self.table)} methods{failed} on {sets or 'no set'}; "
                ".to_markdown(), .to_html(), .to_pandas()>")  # fmt: skip

    def __str__(self) -> str:
        return self.to_markdown()

    def _report(self) -> Report:
        records = [{k: describe(r["method"], v) if k == "failed" else v for k, v in r.items()}
                   for r in self.table]  # fmt: skip
        return Report("peg compare", self.to_markdown(), records, "method", self._sections)

    def _sections(self, figures: bool) -> list[_html.Markup]:
        """The HTML of the result: the sets, the tables, conformal coverage, the reliability
        diagrams (with `figures`), the notes."""
        sets = "; ".join(f"{n}: {i['kind']}, {i['points']} points" for n, i in self.sets.items())
        made = f"peg {__version__}, {datetime.date.today().isoformat()}, {machine()}"
        parts = [paragraph(f"Evaluated on {sets}. Made with {made}.")]
        shown = metric_rows(self.metrics)
        test = self.sets.get(TEST, {}).get("points", "?")
        parts.append(_table(self.table, [*COSTS, *shown, *CHOSEN], f"Test set ({test} points)"))
        for name, info in self.sets.items():
            if name != TEST:
                rows = OOD_ROWS if info["kind"] == "ood" else shown
                spec = [(column(k, name), lab, s, f) for k, lab, s, f in rows]
                caption = f"{name} ({info['kind']}, {info['points']} points)"
                parts.append(_table(self.table, spec, caption))
        parts += self._conformal()
        if figures:
            parts += self._figures()
        parts.append(section("Notes", *map(paragraph, self._notes()), paragraph(NOTE)))
        return parts

    def _conformal(self) -> list[_html.Markup]:
        """Coverage and set size per α and set (`conformal=`), where present."""
        alphas = sorted({k.split("@")[1] for r in self.table for k in r
                         if k.startswith("coverage@") and " " not in k}, key=float)  # fmt: skip
        if not alphas:
            return []
        tables = []
        for name, info in self.sets.items():
            if info["kind"] == "ood":
                continue
            spec = [row for a in alphas for row in (
                (column(f"coverage@{a}", name), f"Coverage % (α={a})", 100, "{:.2f}"),
                (column(f"set_size@{a}", name), f"Set size (α={a})", 1, "{:.2f}"))]  # fmt: skip
            tables.append(_table(self.table, spec, f"{name} ({info['points']} points)", best=False))
        note = (
            "Split conformal sets: calibrated on half of the test set, scored on the other "
            "half and on the shifted sets (peg.apps.conformal); coverage aims at 1 − α."
        )
        return [section("Conformal prediction", paragraph(note), *tables)]

    def _figures(self) -> list[_html.Markup]:
        """The reliability diagrams of every labelled set, embedded."""
        parts = []
        for name, curves in self.curves.items():
            if not curves or name not in self.sets:
                continue
            title = f"Reliability on {name} ({self.sets[name]['points']} points)"
            parts.append(figure_html(lambda c=curves, t=title: plots.reliability_diagram(
                c, title=t), title))  # fmt: skip
        if not parts:
            return []
        said = "Before: Model, the model as it is; after: every other method." if any(
            "Model" in c for c in self.curves.values()) else "One panel per method."  # fmt: skip
        return [section("Reliability diagrams", paragraph(said), *parts)]

    def plot(self, folder: str | Path) -> list[Path]:
        """Reliability diagrams (`peg.plots.reliability_diagram`), one figure per labelled set
        some method was scored on: `folder/reliability-<set>.png`; returns the paths."""
        paths = []
        for name, curves in self.curves.items():
            if not curves or name not in self.sets:  # every method failed: no figure to draw
                continue
            path = Path(folder) / figure_name(name)
            title = f"Reliability on {name} ({self.sets[name]['points']} points)"
            paths.append(plots.reliability_diagram(curves, path, title=title))
        self.figures = paths
        return paths

    def write(self, folder: str | Path, command: str) -> tuple[Path, Path]:
        """`folder/results.json` (the table, the sets, provenance), `folder/results.md` and
        the reliability diagrams, each written atomically."""
        figures = self.plot(folder)
        results = {
            "command": command,
            "commit": git_commit(),
            "machine": machine(),
            "sets": self.sets,
            "ood": {"positive": "ood", "score": self.ood_score, "against": TEST},
            "skipped": self.skipped,
            "failed": self.failed,
            "table": self.table,
            "figures": [p.name for p in figures],
            "note": NOTE,
        }
        markdown = f"Command: `{command}`; machine: {results['machine']}\n\n{self.to_markdown()}"
        return write_results(folder, results, markdown + "\n" + NOTE + "\n", strict=True)


def _cell(value: Any, scale: float, fmt: str) -> str:
    if isinstance(value, str) or value is None:
        return value or "–"
    return fmt.format(value * scale)


Spec = Sequence[tuple[str, str, float, str]]


def _cells(table: Sequence[dict[str, Any]], spec: Spec, best: bool = True) -> list[list[Any]]:
    """Rows: methods; columns: `spec` (key, label, multiplier, format); each cell (text,
    whether it is the best of its column: the highest for `HIGHER_IS_BETTER` metrics, else the
    lowest; none with `best=False`)."""
    top: dict[str, str | None] = {}
    for key, _, scale, fmt in spec:
        values = [r[key] for r in table if isinstance(r.get(key), (int, float))]
        pick: Callable[..., Any] = max if key.split(" ")[0] in HIGHER_IS_BETTER else min
        top[key] = _cell(pick(values), scale, fmt) if best and len(values) > 1 else None
    return [[(str(r["method"]), False)] + [(c, c == top[key]) for c, (key, *_) in zip(
        (_cell(r.get(key), scale, fmt) for key, _, scale, fmt in spec), spec, strict=True)]
        for r in table]  # fmt: skip


def _markdown(table: Sequence[dict[str, Any]], spec: Spec) -> str:
    """`_cells` as a markdown table, the best of each column bold."""
    lines = ["| method | " + " | ".join(s[1] for s in spec) + " |",
             "|---|" + "---:|" * len(spec)]  # fmt: skip
    for row in _cells(table, spec):
        lines.append("| " + " | ".join(f"**{c}**" if b else c for c, b in row) + " |")
    return "\n".join(lines)


def _table(table: Sequence[dict[str, Any]], spec: Spec, caption: str, best: bool = True) -> Any:
    """`_cells` as an HTML table (every name escaped), the best of each column bold."""
    rows = [[_html.strong(c) if b else c for c, b in row] for row in _cells(table, spec, best)]
    numeric = [False] + [True] * len(spec)
    return _html.table(["method", *(s[1] for s in spec)], rows, numeric=numeric, caption=caption)


def figure_name(name: str) -> str:
    """The file name of the reliability diagram of set `name`, one per name: a plain name
    (lower-case ASCII letters, digits, `-_.`) as it is; any other (`a/b` next to `a_b`, `A`
    next to `a` on a disk that ignores case, a long name) shortened and made safe, with a
    hash of the whole name after it."""
    safe = "".join(c if c.isascii() and (c.isalnum() or c in "-_.") else "_" for c in name)
    if safe == name.lower() == name and 0 < len(name) <= 64:
        return f"reliability-{name}.png"
    digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:10]
    return f"reliability-{safe[:64]}-{digest}.png"
