"""The choice of `AutoSelect` from cross-fitted scores (`choose`), and its report as markdown.

Each kept candidate has its CV mean ± SE of the per-point criterion and its paired difference
to the best candidate (mean and SE of the per-point differences, on the same folds). The best is
the lowest mean; with `one_se`, the cheapest candidate whose paired difference to the best is
within one SE of it: cheapest by prediction cost (forwards per input, to 0.1), then by
simplicity (`simplicity()`: fewer fitted parameters first), then by fit seconds.

A candidate indistinguishable from its base (`peg.apps.compare.collapse`: a searched scale that
left the members on the base, measured on the held-out points) costs what it costs and gives
its base's predictions: it is left out of the choice, and says so, unless it is better beyond
noise (by more than one paired SE) than the best of the others; the choice is made among the
rest (TS, or its base where that is a candidate, costs less for the same predictions).

Ties go to the simpler map: a paired difference below `folds.TIE` (1e-6) is a tie whatever its
SE (the fits' numerical noise), and an affine map whose cross-validated shrinkage strengths
made it its simpler parent on every fold (`_affine_select.reduces_to`: vector scaling at a
prior of ∞ points per class is temperature scaling's map) is that parent: with the parent a
kept candidate, it is left out of the choice and says so.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from peg.apps.bench.spec import MethodSpec
from peg.apps.compare.collapse import indistinguishable, note
from peg.apps.compare.methods import MODEL
from peg.apps.select.folds import beyond, mean_se
from peg.apps.select.race import AUTO_BUDGET, MIN_BUDGET_SECONDS
from peg.methods.calibration._affine_select import REDUCED
from peg.methods.calibration._calibrator import Calibrator, display_names
from peg.methods.calibration.temperature import TemperatureScaling
from peg.utils.html import md

# the named candidates besides the maps (`Calibrator.simplicity`), from the simplest to the
# richest: the model, the maps, then these (others after them, in their order)
NETWORK_SIMPLICITY = (
    "Laplace",
    "Last-layer PEG",
    f"{TemperatureScaling.name} → PEG",
    "PEG",
    f"PEG + {TemperatureScaling.name}",
    "PEG (ascent)",
    "PEP",
    "MC dropout",
)


def simplicity() -> tuple[str, ...]:
    """The named candidates from the simplest to the richest: "Model", the registered maps by
    their declared `simplicity`, then `NETWORK_SIMPLICITY`."""
    return ("Model", *display_names("simplicity"), *NETWORK_SIMPLICITY)


def __getattr__(name: str) -> tuple[str, ...]:
    # `SIMPLICITY`, read when asked: a map registered after this import is in it
    if name == "SIMPLICITY":
        return simplicity()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _parent(method: str, kind: str) -> str | None:
    """The key of the simpler map that `method`'s fit is when it reduced to `kind`."""
    cls = Calibrator.registry.get(method)
    return None if cls is None else cls.parents.get(kind)


def _cost(row: dict[str, Any], order: int) -> tuple[float, int, float]:
    fw = row["forwards"]
    ranked = simplicity()
    rank = ranked.index(row["candidate"]) if row["candidate"] in ranked else 99 + order
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
        row["vs_base"] = cross.gaps.get(name)
        row["fit_seconds"] = sum(seconds) / len(seconds) if seconds else None
        row["fold_seconds"] = list(seconds)
        if name in cross.dropped:
            row |= {"status": "dropped", "why": cross.dropped[name]}
            scored = cross.points[name][covered]
            scored = scored[~torch.isnan(scored)]
            if len(scored) > 1:  # raced out or over budget after some folds: on those points
                mean, se = mean_se(scored)
                row |= {"partial_mean": mean, "partial_se": se, "partial_points": len(scored),
                        "partial_folds": len(seconds)}  # fmt: skip
        else:
            mean, se = mean_se(cross.points[name][covered])
            row |= {"cv_mean": mean, "cv_se": se, "status": "kept", "why": ""}
        rows.append(row)
    rows += [{"candidate": k, "status": "dropped", "why": v} for k, v in skipped.items()]
    kept = [r for r in rows if r["status"] == "kept"]
    if not kept:
        raise ValueError("candidates: every candidate failed or was dropped: " + "; ".join(
            f"{r['candidate']}: {r['why']}" for r in rows))  # fmt: skip
    equal = _equal_to_parents(kept, specs, cross)
    pool = _pool([r for r in kept if r not in equal], cross, covered)
    best = min(pool, key=lambda r: r["cv_mean"])
    for r in kept:
        diff = cross.points[r["candidate"]][covered] - cross.points[best["candidate"]][covered]
        r["diff"], r["diff_se"] = mean_se(diff)
        r["within_1se"] = r is best or not beyond(r["diff"], r["diff_se"])
    chosen = best
    if one_se:
        within = [(kept.index(r), r) for r in pool if r["within_1se"]]
        chosen = min(within, key=lambda ir: _cost(ir[1], ir[0]))[1]
    chosen["status"] = "chosen"
    if chosen is not best:
        chosen["why"] = f"the cheapest within one paired SE of the best ({best['candidate']})"
    else:
        chosen["why"] = "the best CV score"
    for r in kept:  # in the choice (better beyond noise than the others), said all the same
        if indistinguishable(r["vs_base"]) and "left out of the choice" not in r["why"]:
            said = f"{r['why']}; " if r["why"] else ""
            base = 'the model as it is ("Model" as a candidate)' if r["base"] == MODEL else (
                f"its base, {r['base']},")  # fmt: skip
            r["why"] = f"{said}{_note(r)}: {base} gives the same predictions for less"
    return rows, chosen["candidate"]


def _note(row: dict[str, Any]) -> str:
    return note(row["vs_base"], row["base"], row["forwards"], "the held-out points")


def _equal_to_parents(
    kept: list[dict[str, Any]], specs: Sequence[MethodSpec], cross: Any
) -> list[dict[str, Any]]:
    """The kept affine maps whose strengths made them the same simpler map on every fold, with
    that map (its class's `parents`) a kept candidate on the same base: each says so
    (`equal_to`)."""
    names = {r["candidate"] for r in kept}
    equal = []
    for r in kept:
        kinds = set(getattr(cross, "reduced", {}).get(r["candidate"]) or [None])
        kind = kinds.pop() if len(kinds) == 1 else None
        method = _parent(r["method"], kind) if kind is not None else None
        parent = next((s.name for s in specs if method is not None and s.method == method
                       and s.base == r["base"] and s.name in names), None)  # fmt: skip
        if parent is None:
            continue
        r["equal_to"] = parent
        r["why"] = (f"equal to {parent}: on every fold cross-validation shrank it to "
                    f"{REDUCED[kind]}; left out of the choice ({parent} is the same map, "
                    "simpler)")  # fmt: skip
        equal.append(r)
    return equal


def _pool(kept: list[dict[str, Any]], cross: Any, covered: torch.Tensor) -> list[dict[str, Any]]:
    """The candidates the choice is made among: the kept ones, less those indistinguishable
    from their base that are not better beyond noise (their paired difference to the best of
    the others within one SE); each one left out says why."""
    others = [r for r in kept if not indistinguishable(r["vs_base"])]
    if not others:
        return kept
    rival = min(others, key=lambda r: r["cv_mean"])
    left = []
    for r in kept:
        if r in others:
            continue
        points = cross.points
        diff, se = mean_se(points[r["candidate"]][covered] - points[rival["candidate"]][covered])
        if beyond(-diff, se):
            continue  # better beyond noise than every other candidate: its own merit
        r["why"] = (
            f"{_note(r)}; left out of the choice: not better than {rival['candidate']} beyond "
            f"noise (paired difference {diff:+.4f} ± {se:.4f})"
        )
        left.append(r)
    return [r for r in kept if r not in left]


def _num(value: Any, fmt: str) -> str:
    return "–" if value is None or (isinstance(value, float) and math.isnan(value)) else (
        fmt.format(value))  # fmt: skip


def cost_line(cost: dict[str, Any]) -> str:
    """What the fit cost against a temperature scaling fit, and the rule it ran under."""
    text = (f"\nCost: {cost['seconds']:.1f} s = {cost['times_reference']:.1f} × a temperature "
            f"scaling fit ({cost['reference_seconds']:.2f} s: a forward pass of val and the fit "
            "of T, timed after the one-time imports and warm-up); ")  # fmt: skip
    setup = cost.get("setup_seconds")
    if setup is not None and setup >= 0.05:
        text += f"{setup:.2f} s of it one-time setup (imports, warm-up), outside the budget; "
    if cost["budget_seconds"] is None:
        return text + "no budget (max_fit_seconds=None): every candidate on every fold.\n"
    given = cost["max_fit_seconds"]
    budget = f"budget {cost['budget_seconds']:.1f} s (max_fit_seconds={given!r}"
    load = cost.get("slowdown") or 1.0  # reports saved before it: none
    floor = f"{MIN_BUDGET_SECONDS:g} s" + (f" × {load:.2g} (the load)" if load > 1.05 else "")
    auto = f", {AUTO_BUDGET:g} × the TS fit, at least {floor})"
    budget += auto if given == "auto" else ")"
    race = cost["race"]
    raced = (
        "no race"
        if race is None
        else (f"raced: dropped beyond {race:g} paired SE of the leader from the second fold")
    )
    return (text + f"{budget}; cheap candidates first; {raced}; a dropped candidate's row says "
            "why.\n")  # fmt: skip


BASELINE = "Uncalibrated"  # the baseline row's name: the model as it is, nothing fitted


def baseline_row(mean: float, se: float, diff: float, diff_se: float) -> dict[str, Any]:
    """The uncalibrated model's row (the verdict's "before"): its mean criterion `mean` ± `se`
    on the same validation points as the candidates, and its paired difference to the best."""
    return {
        "candidate": BASELINE,
        "base": None,
        "method": None,
        "forwards": 1.0,
        "vs_base": None,
        "fit_seconds": None,
        "fold_seconds": [],
        "cv_mean": mean,
        "cv_se": se,
        "diff": diff,
        "diff_se": diff_se,
        "status": "baseline",
        "why": "the model as it is, nothing fitted",
    }


def footnoted(report: Sequence[dict[str, Any]]) -> tuple[list[list[str]], list[str]]:
    """`row_cells` of every row, a reason shared by several rows said once: their status cells
    end in "(note k)" and the k-th note says why (saved logits' "no weights to change or sample",
    once for every candidate it left out)."""
    counts: dict[str, int] = {}
    for r in report:
        counts[r.get("why") or ""] = counts.get(r.get("why") or "", 0) + 1
    notes: list[str] = []
    rows = []
    for r in report:
        why = r.get("why") or ""
        if why and counts[why] > 1:
            if why not in notes:
                notes.append(why)
            r = {**r, "why": f"(note {notes.index(why) + 1})"}
        rows.append(row_cells(r))
    for cells in rows:
        cells[-1] = cells[-1].replace(": (note ", " (note ")
    return rows, [f"Note {k + 1}: {why}" for k, why in enumerate(notes)]


def to_table(report: Sequence[dict[str, Any]], criterion: str) -> str:
    """The report as a markdown table (a row per candidate, the baseline's first where given;
    every cell escaped: `peg.utils.html.md`), the chosen row's status bold, shared reasons as
    numbered notes under it."""
    lines = ["| " + " | ".join(header(criterion)) + " |", "|---|---:|---:|---:|---:|---|"]
    rows, notes = footnoted(report)
    for r, cells in zip(report, rows, strict=True):
        cells = [md(c) for c in cells]
        if r["status"] == "chosen":
            cells[-1] = f"**{cells[-1]}**"
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines + ([""] if notes else []) + [md(n) for n in notes]) + "\n"


def header(criterion: str) -> list[str]:
    """The report table's column names."""
    return ["candidate", f"CV {criterion} (mean ± SE)", "vs best (paired, ± SE)",
            "forwards / input", "fit s (per fold)", "status"]  # fmt: skip


def row_cells(r: dict[str, Any]) -> list[str]:
    """A report row's cells as text: candidate, CV score, paired difference to the best,
    forwards / input, fit seconds per fold, status (and why)."""
    score = f"{r['cv_mean']:.4f} ± {r['cv_se']:.4f}" if "cv_mean" in r else "–"
    if "partial_mean" in r:  # a dropped candidate's score on the folds it ran: not comparable
        folds = r.get("partial_folds")
        on = f"on {folds} fold{'s' if folds != 1 else ''} only" if folds else "on some folds only"
        score = (f"({r['partial_mean']:.4f} ± {r['partial_se']:.4f} {on}, "
                 f"{r['partial_points']} pts)")  # fmt: skip
    diff = f"{r['diff']:+.4f} ± {r['diff_se']:.4f}" if "diff" in r else "–"
    status = r["status"] + (f": {r['why']}" if r.get("why") else "")
    return [str(r["candidate"]), score, diff, _num(r.get("forwards"), "{:.2f}"),
            _num(r.get("fit_seconds"), "{:.2f}"), status]  # fmt: skip
