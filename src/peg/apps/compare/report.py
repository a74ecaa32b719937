"""`Comparison`: what `peg.compare` returns: one table (a row per method: its costs beside every
metric), the fitted predictors, reliability data; as markdown, figures and a results folder, and
(`peg.apps.html.Reported`) in a notebook, as a data frame, as CSV or JSON text and as one HTML
file (`to_html`: the tables, conformal coverage, the reliability diagrams before and after)."""

from __future__ import annotations

import datetime
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch import Tensor

from peg._version import __version__
from peg.apps.bench.tables import OOD_ROWS, ROWS, metric_rows
from peg.apps.compare import diagrams, tables
from peg.apps.compare.faults import describe
from peg.apps.html import Report, Reported, paragraph, section, verdict_html
from peg.apps.results import write_results
from peg.apps.verdict import Verdict, best_beyond_noise, metric_se, own_se, real
from peg.utils import html as _html
from peg.utils.env import git_commit, machine

MODEL_ROW = "Model"  # the method that is the model as it is: the uncalibrated baseline
MODEL = "model"  # a row's base where it is the user's model (`peg.apps.compare.methods.MODEL`)
# the metrics whose per-point values (or paired bootstrap, the ECE) give a paired SE: the only
# columns a cell may be bold in
NOISY = ("nll", "error", "brier", "ece")

TEST = "test"
# (row key, column label, multiplier, format) of the costs, shown before the metrics
COSTS: tuple[tuple[str, str, float, str], ...] = (
    ("fit_seconds", "Fit s", 1, "{:.2f}"),
    ("forwards", "Forwards / input", 1, "{:.2f}"),
    ("memory_mb", "Memory MB", 1, "{:.3g}"),
    ("predict_seconds", "Predict s", 1, "{:.2f}"),
)
CHOSEN = (("chosen", "Fitted scale", 1, "{}"),)  # the scale a method chose: T, η or σ (text)
# the metric columns of the labelled sets' tables by default (keys of `ROWS`)
SHOWN = ("nll", "error", "brier", "ece", "adaptive_ece", "classwise_ece", "aurc", "augrc")
NOTE = (
    "Fit s: wall seconds to fit the method, its base's included (PEG + TS: PEG's and the "
    "temperature's). Forwards / input: the predictor's FLOPs per input over the model's "
    "(ensembles: members; last-layer PEG: one trunk and S heads). Memory MB: the tensors the "
    "predictor holds to predict (10^6 bytes). Predict s: wall seconds to predict the test set. "
    "Error, the ECEs, AURC and AUGRC as % (fractions in the table's rows and the JSON); OOD: "
    "OOD is the positive class, scored against the test set. Choice: the best test NLL (the "
    "verdict's) and the baseline, the model as it is. Bold: better than every other row beyond "
    "2 paired SE of the per-point values on the same points (NLL, error, Brier; ECE by a "
    "paired bootstrap); a tie, or a column without per-point values, has no bold. Fitted "
    "scale: the T, η or σ a method fitted. "
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
        points: labelled set → method → per-point values `[N]` (NLL, Brier, confidence,
            correct: `peg.apps.verdict.per_point`), what `verdict()` and the bold cells read.
    """

    table: list[dict[str, Any]]
    predictors: dict[str, Any]
    curves: dict[str, dict[str, dict[str, Tensor]]]
    skipped: dict[str, str]
    sets: dict[str, dict[str, Any]]
    ood_score: str = "entropy"
    figures: list[Path] = field(default_factory=list)
    metrics: tuple[str, ...] = SHOWN
    # labelled set → method → per-point values (`peg.apps.verdict.per_point`): the paired SEs
    points: dict[str, dict[str, dict[str, Tensor]]] = field(default_factory=dict)
    # what the report computed once (bold cells, the verdict: bootstraps of every point)
    _bold: dict[str, str] | None = field(default=None, init=False, repr=False, compare=False)
    _said: tuple[Verdict | None] | None = field(default=None, init=False, repr=False, compare=False)

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

    def verdict(self) -> Verdict | None:
        """The answer: the best test NLL against the model as it is ("Model"), on the same
        test points (`peg.apps.verdict`); None where no method has a test NLL."""
        if self._said is None:
            self._said = (self._verdict(),)
        return self._said[0]

    def _verdict(self) -> Verdict | None:
        rows = {r["method"]: r for r in self.table if _finite(r.get("nll"))}
        if not rows:
            return None
        baseline = MODEL_ROW if MODEL_ROW in rows else None
        methods = [k for k in rows if k != baseline] or [MODEL_ROW]
        best = min(methods, key=lambda k: rows[k]["nll"])
        points = self.points.get(TEST, {})
        n = self.sets.get(TEST, {}).get("points", 0)
        ties = [
            k
            for k in methods
            if k != best
            and k in points
            and best in points
            and not real(*metric_se(points[k], points[best], "nll"))
        ]
        said = Verdict(best, "nll", rows[best]["nll"], math.nan, n, "test points", ties=ties)
        if baseline is None or best == baseline:
            if best in points:
                said.se = own_se(points[best], "nll")
            said.baseline = baseline
            said.before = None if baseline is None else rows[baseline]["nll"]
            return said
        said.baseline, said.before = baseline, rows[baseline]["nll"]
        said.ece_before, said.ece_after = rows[baseline].get("ece"), rows[best].get("ece")
        if best in points and baseline in points:
            said.se = metric_se(points[best], points[baseline], "nll")[1]
            said.ece_se = metric_se(points[best], points[baseline], "ece")[1]
        return said

    def _marks(self) -> dict[str, str]:
        """Method → "best" / "baseline": the choice column."""
        said = self.verdict()
        if said is None:
            return {}
        marks = {said.choice: tables.BEST}
        if said.baseline is not None:
            marks[said.baseline] = tables.BASELINE + (
                f" ({tables.BEST})" if said.baseline == said.choice else ""
            )
        return marks

    def _best(self) -> dict[str, str]:
        """Column key → the method bold in it: better than every other row beyond noise."""
        if self._bold is None:
            self._bold = {}
            for name, info in self.sets.items():
                points = self.points.get(name, {})
                for metric in NOISY if info["kind"] != "ood" else ():
                    key = column(metric, name)
                    scores = {r["method"]: r.get(key) for r in self.table}
                    top = best_beyond_noise(scores, points, metric, higher=False)
                    if top is not None:
                        self._bold[key] = top
        return self._bold

    def to_markdown(self) -> str:
        """The verdict, then the table as markdown: one table with the costs and the test
        metrics, then one per shifted and OOD set (rows: methods)."""
        shown = metric_rows(self.metrics)
        said = self.verdict()
        parts = [f"**{_html.md(said.text())}**"] if said is not None else []
        test = [*COSTS, *shown, *CHOSEN]
        parts.append(tables.markdown(self.table, test, self._best(), self._marks()))
        for name, info in self.sets.items():
            if name == TEST:
                continue
            rows = OOD_ROWS if info["kind"] == "ood" else shown
            spec = [(column(k, name), lab, s, f) for k, lab, s, f in rows]
            parts.append(
                f"{_html.md(name)} ({info['kind']}, {info['points']} points)\n\n"
                + tables.markdown(self.table, spec, self._best(), {})
            )
        return "\n\n".join(parts + [_html.md(n) for n in self._notes()]) + "\n"

    def _notes(self) -> list[str]:
        """What was left out, what failed, the notes and the warnings: a line each, if any."""
        parts = []
        if self.skipped:
            parts.append("Left out: " + tables.grouped(self.skipped))
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
        return (
            f"<Comparison: {len(self.table)} methods{failed} on {sets or 'no set'}; "
            ".to_markdown(), .to_html(), .to_pandas()>"
        )

    def __str__(self) -> str:
        return self.to_markdown()

    def _records(self) -> list[dict[str, Any]]:
        """The table's rows as `to_pandas` and `to_text` give them: the choice after the
        method ("best", "baseline", or None), "chosen" as "fitted_scale" (the T, η or σ
        fitted), the model as a base by its name ("Model"), a failure as one line."""
        marks, out = self._marks(), []
        for r in self.table:
            record = {"method": r["method"], "choice": marks.get(r["method"])}
            for k, v in r.items():
                if k == "failed":
                    v = describe(r["method"], v)
                record["fitted_scale" if k == "chosen" else k] = v
            if record.get("base") == MODEL:  # the model as a base, by its row's name
                record["base"] = MODEL_ROW
            out.append(record)
        return out

    def _report(self) -> Report:
        records = self._records()
        return Report(
            "compare",
            self.to_markdown(),
            records,
            "method",
            self._sections,
            doc="compare",
            verdict=self.verdict(),
        )

    def _sections(self, figures: bool) -> list[_html.Markup]:
        """The HTML of the result: the sets, the tables, conformal coverage, the reliability
        diagrams (with `figures`), the notes."""
        sets = "; ".join(f"{n}: {i['kind']}, {i['points']} points" for n, i in self.sets.items())
        made = f"peg {__version__}, {datetime.date.today().isoformat()}, {machine()}"
        said = self.verdict()
        parts = [verdict_html(said)] if said is not None else []
        parts.append(paragraph(f"Evaluated on {sets}. Made with {made}."))
        shown = metric_rows(self.metrics)
        test = self.sets.get(TEST, {}).get("points", "?")
        parts.append(
            tables.html_table(
                self.table,
                [*COSTS, *shown, *CHOSEN],
                f"Test set ({test} points)",
                self._best(),
                self._marks(),
            )
        )
        for name, info in self.sets.items():
            if name != TEST:
                rows = OOD_ROWS if info["kind"] == "ood" else shown
                spec = [(column(k, name), lab, s, f) for k, lab, s, f in rows]
                caption = f"{name} ({info['kind']}, {info['points']} points)"
                parts.append(tables.html_table(self.table, spec, caption, self._best()))
        parts += self._conformal()
        if figures:
            parts += diagrams.embedded(self.curves, self.sets)
        parts.append(section("Notes", *map(paragraph, self._notes()), paragraph(NOTE)))
        return parts

    def _conformal(self) -> list[_html.Markup]:
        """Coverage and set size per α and set (`conformal=`), where present."""
        alphas = sorted(
            {
                k.split("@")[1]
                for r in self.table
                for k in r
                if k.startswith("coverage@") and " " not in k
            },
            key=float,
        )
        if not alphas:
            return []
        found = []
        for name, info in self.sets.items():
            if info["kind"] == "ood":
                continue
            spec = [
                row
                for a in alphas
                for row in (
                    (column(f"coverage@{a}", name), f"Coverage % (α={a})", 100, "{:.2f}"),
                    (column(f"set_size@{a}", name), f"Set size (α={a})", 1, "{:.2f}"),
                )
            ]
            found.append(
                tables.html_table(self.table, spec, f"{name} ({info['points']} points)", {})
            )
        note = (
            "Split conformal sets: calibrated on half of the test set, scored on the other "
            "half and on the shifted sets (peg.apps.conformal); coverage aims at 1 − α."
        )
        return [section("Conformal prediction", paragraph(note), *found)]

    def plot(self, folder: str | Path) -> list[Path]:
        """Reliability diagrams (`peg.plots.reliability_diagram`), one figure per labelled set
        some method was scored on: `folder/reliability-<set>.png`; returns the paths."""
        self.figures = diagrams.plot(self.curves, self.sets, folder)
        return self.figures

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
        said = self.verdict()
        results["verdict"] = None if said is None else said.to_dict()
        markdown = (
            f"Command: {_html.md_code(command)}; machine: {_html.md(results['machine'])}"
            f"\n\n{self.to_markdown()}"
        )
        return write_results(folder, results, markdown + "\n" + NOTE + "\n", strict=True)


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)
