"""`AutoSelect` outside a terminal (`peg.apps.html.Reported`): its report as records, its
reasoning as HTML (the choice and its scores, the table a row per candidate with why it was
kept, chosen or dropped, what the fit cost), and the reliability diagrams before and after on
the validation data (`reliability`): the model as it is, and the chosen candidate's cross-fitted
predictions, each point predicted by the candidate fitted without its fold (the refit on all of
the validation data predicts points it was fitted on: its diagram would flatter it).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from peg import _html, metrics, plots
from peg.apps.html import Report, figure_html, paragraph, section
from peg.apps.select.report import cost_line, header, row_cells
from peg.metrics.calibration import reliability_from

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


def report(selector: Any) -> Report:
    """The `Report` of a fitted `AutoSelect`."""
    records = [dict(r) for r in selector.report_]
    return Report(
        "peg select", selector.to_markdown(), records, "candidate", lambda f: sections(selector, f)
    )


def sections(selector: Any, figures: bool) -> list[_html.Markup]:
    """The choice, the table of candidates, the cost, the diagrams (with `figures`) and the
    markdown report as it prints."""
    s = selector.score_
    said = (
        f"Chosen: {selector.chosen_}, by {selector.cv}-fold cross-validation of the "
        f"{s['criterion']} on the validation data (CV {s['mean']:.4f} ± {s['se']:.4f}, "
        "optimistically biased: it won on these folds"
    )
    if selector.nested_ is not None:
        said += f"; nested CV: {selector.nested_['mean']:.4f} ± {selector.nested_['se']:.4f}"
    rule = ("the cheapest candidate within one paired SE of the best" if selector.one_se else
            "the best CV score")  # fmt: skip
    parts = [paragraph(said + f"). The rule: {rule}.", "")]
    rows = [row_cells(r) for r in selector.report_]
    chosen = [r["status"] == "chosen" for r in selector.report_]
    numeric = [False, True, True, True, True, False]
    caption = "Candidates (a row each: why kept, chosen or dropped)"
    parts.append(_html.table(header(selector.criterion), rows, numeric=numeric, marked=chosen,
                             caption=caption))  # fmt: skip
    parts.append(paragraph(cost_line(selector.cost_).strip()))
    curves = getattr(selector, "reliability_", None)
    if figures and curves:
        title = "Reliability on the validation data"
        draw = lambda: plots.reliability_diagram(curves, title=title)  # noqa: E731
        note = ("Before: the model as it is. After: the chosen candidate, each point predicted "
                "by its fit on the other folds (out of fold).")  # fmt: skip
        parts.append(section("Reliability diagrams", paragraph(note), figure_html(draw, title)))
    text = _html.element("pre", selector.to_markdown())
    parts.append(_html.element("details", _html.join([_html.element("summary", "As text"), text])))
    return parts
