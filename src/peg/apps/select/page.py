"""`AutoSelect` outside a terminal (`peg.apps.html.Reported`): its report as records, its
reasoning as HTML (the choice and its scores, the table a row per candidate with why it was
kept, chosen or dropped, what the fit cost), and the reliability diagrams before and after on
the validation data (`reliability`): the model as it is, and the chosen candidate's cross-fitted
predictions, each point predicted by the candidate fitted without its fold (the refit on all of
the validation data predicts points it was fitted on: its diagram would flatter it).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from peg import metrics, plots
from peg.apps.compare.methods import MODEL
from peg.apps.html import Report, figure_html, paragraph, section, verdict_html
from peg.apps.select.report import BASELINE, baseline_row, cost_line, footnoted, header, to_table
from peg.apps.verdict import Verdict, ece, metric_se, own_se, per_point
from peg.metrics.calibration import reliability_from
from peg.utils import html as _html

BINS = 15


def reliability(logits: Tensor, y: Tensor, top: tuple[Tensor, Tensor], chosen: str) -> dict:
    """Reliability data before (the model's validation logits `[M, N, C]`) and after (the
    chosen candidate's out-of-fold top-class confidence and correctness, `CrossFit.top`)."""
    confidence, correct = top
    seen = ~torch.isnan(confidence)
    return {
        "Model (before)": metrics.reliability(logits, y, BINS),
        f"{chosen} (cross-fitted)": reliability_from(confidence[seen], correct[seen], BINS),
    }


def verdict(
    logits: Tensor, y: Tensor, cross: Any, chosen: str, rows: list[dict[str, Any]]
) -> tuple[Verdict, dict[str, Any]]:
    """The choice against the uncalibrated model (`logits` `[M, N, C]` as they are) on the same
    validation points, the choice's scores out of fold (`peg.apps.verdict`), and the baseline's
    report row."""
    model = per_point(logits, y)
    confidence, correct = cross.top[chosen]
    after = {
        cross.criterion: cross.points[chosen].float(),
        "confidence": confidence.float(),
        "correct": correct.bool(),
    }
    seen = ~torch.isnan(confidence)
    after = {k: v[seen] for k, v in after.items()}
    model = {k: v[seen] for k, v in model.items()}
    said = Verdict(
        chosen,
        cross.criterion,
        float(after[cross.criterion].double().mean()),
        metric_se(after, model, cross.criterion)[1],
        int(seen.sum()),
        "validation points, out of fold",
        BASELINE,
        lead="chosen",
    )
    said.before = float(model[cross.criterion].double().mean())
    said.ece_before = ece(model["confidence"], model["correct"])
    said.ece_after = ece(after["confidence"], after["correct"])
    said.ece_se = metric_se(after, model, "ece")[1]
    best = next((r for r in rows if r.get("diff") == 0.0), None)
    diff = (math.nan, math.nan)
    if best is not None:
        best_points = {cross.criterion: cross.points[best["candidate"]].float()[seen]}
        diff = metric_se(model, best_points, cross.criterion)
    row = baseline_row(said.before, own_se(model, cross.criterion), *diff)
    if all(cross.forwards.get(r["candidate"]) is None for r in rows):  # saved logits: no model
        row["forwards"] = None
    return said, row


def records(selector: Any) -> list[dict[str, Any]]:
    """A flat record per row, the baseline's first: no lists (`fold_seconds` as the number of
    folds fitted), candidates and bases by their display names (the registry's keys left
    out), None where a value is missing (`to_pandas`: NaN)."""
    out = []
    for r in _rows(selector):
        record = {k: v for k, v in r.items() if k not in ("method", "fold_seconds")}
        record["folds"] = len(r.get("fold_seconds") or [])
        if record.get("base") == MODEL:
            record["base"] = "Model"
        out.append(record)
    return out


def _rows(selector: Any) -> list[dict[str, Any]]:
    baseline = getattr(selector, "baseline_", None)
    return ([baseline] if baseline is not None else []) + list(selector.report_)


def markdown(selector: Any) -> str:
    """The verdict, the table (the baseline's row first), the cost, the choice's scores."""
    said = getattr(selector, "verdict_", None)
    text = f"**{_html.md(said.text())}**\n\n" if said is not None else ""
    text += to_table(_rows(selector), selector.criterion) + cost_line(selector.cost_)
    s = selector.score_
    text += (
        f"\nChosen: {_html.md(selector.chosen_)} (CV {s['criterion']} {s['mean']:.4f} ± "
        f"{s['se']:.4f}, optimistically biased: it won on these folds)"
    )
    if selector.nested_ is not None:
        n = selector.nested_
        text += f"; nested CV: {n['mean']:.4f} ± {n['se']:.4f}"
    return text + "\n"


def report(selector: Any) -> Report:
    """The `Report` of a fitted `AutoSelect`."""
    return Report(
        "AutoSelect",
        selector.to_markdown(),
        records(selector),
        "candidate",
        lambda f: sections(selector, f),
        doc="AutoSelect",
        verdict=getattr(selector, "verdict_", None),
    )


def sections(selector: Any, figures: bool) -> list[_html.Markup]:
    """The choice, the table of candidates, the cost, the diagrams (with `figures`) and the
    markdown report as it prints."""
    s = selector.score_
    verdict_ = getattr(selector, "verdict_", None)
    said = (
        f"Chosen: {selector.chosen_}, by {selector.cv}-fold cross-validation of the "
        f"{s['criterion']} on the validation data (CV {s['mean']:.4f} ± {s['se']:.4f}, "
        "optimistically biased: it won on these folds"
    )
    if selector.nested_ is not None:
        said += f"; nested CV: {selector.nested_['mean']:.4f} ± {selector.nested_['se']:.4f}"
    rule = (
        "the cheapest candidate within one paired SE of the best"
        if selector.one_se
        else "the best CV score"
    )
    parts = [verdict_html(verdict_)] if verdict_ is not None else []
    parts.append(paragraph(said + f"). The rule: {rule}.", ""))
    shown = _rows(selector)
    rows, notes = footnoted(shown)
    chosen = [r["status"] == "chosen" for r in shown]
    numeric = [False, True, True, True, True, False]
    caption = "Candidates (a row each: why kept, chosen or dropped; the baseline first)"
    parts.append(
        _html.table(
            header(selector.criterion), rows, numeric=numeric, marked=chosen, caption=caption
        )
    )
    parts += [paragraph(n) for n in notes]
    parts.append(paragraph(cost_line(selector.cost_).strip()))
    curves = getattr(selector, "reliability_", None)
    if figures and curves:
        title = "Reliability on the validation data"
        draw = lambda: plots.reliability_diagram(curves, title=title)  # noqa: E731
        note = (
            "Before: the model as it is. After: the chosen candidate, each point predicted "
            "by its fit on the other folds (out of fold)."
        )
        parts.append(section("Reliability diagrams", paragraph(note), figure_html(draw, title)))
    text = _html.element("pre", selector.to_markdown())
    parts.append(_html.element("details", _html.join([_html.element("summary", "As text"), text])))
    return parts
