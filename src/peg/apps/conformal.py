"""Conformal prediction in the bench tables and `peg.compare`: coverage and set size per
method, on the test set and on each shifted set, from the member logits they already hold.

The test set is split in two halves (seeded): a `peg.ConformalClassifier` per level α is
calibrated on the first half's logits (`CachedLogits`: no model runs) and its sets scored on the
second half, and on the same rows of every shifted set (the bench's corrupted sets are the test
images corrupted) or, for sets of other rows (`peg.compare`'s), on all of them. The predictor
never saw the test set, so calibration and evaluation halves are exchangeable: coverage on the
clean half is >= 1 − α in expectation, and its fall on a shifted set measures the shift.

A bench spec asks for it with `conformal: {alpha: [0.1, 0.05], score: aps, columns: [...]}`
(`parse_conformal`; every field optional, `columns` default all).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from peg.apps.bench.tables import markdown_table
from peg.errors import SpecError
from peg.methods.conformal._base import CachedLogits
from peg.methods.conformal._split import SCORES, check_alpha
from peg.methods.conformal.classifier import ConformalClassifier
from peg.metrics.conformal import conformal_metrics


@dataclass(frozen=True)
class ConformalSpec:
    """Which levels, which score, on which columns (None: all), split by `seed`."""

    alphas: tuple[float, ...] = (0.1, 0.05)
    score: str = "aps"
    columns: tuple[str, ...] | None = None
    seed: int = 0

    def rows(self) -> tuple[tuple[str, str, float, str], ...]:
        """Table rows (`peg.apps.bench.tables.Row`): coverage % and mean set size per α."""
        out = []
        for a in self.alphas:
            out.append((key("coverage", a), f"Coverage % (α={a:g}, {self.score})", 100, "{:.2f}"))
            out.append((key("set_size", a), f"Set size (α={a:g}, {self.score})", 1, "{:.2f}"))
        return tuple(out)

    def applies(self, column: str) -> bool:
        return self.columns is None or column in self.columns


def key(metric: str, alpha: float) -> str:
    """The result key of a metric at level α, e.g. `coverage@0.1`."""
    return f"{metric}@{alpha:g}"


def parse_conformal(raw: Any, where: str, columns: list[str]) -> ConformalSpec | None:
    """A spec's `conformal:` field (None when absent); `SpecError` naming the field."""
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise SpecError(f"{where}: expected a mapping {{alpha, score, columns}}, got {raw!r}")
    unknown = sorted(set(raw) - {"alpha", "score", "columns"})
    if unknown:
        raise SpecError(f"{where}: unknown field(s) {unknown}; known: alpha, score, columns")
    alphas = raw.get("alpha", [0.1, 0.05])
    alphas = alphas if isinstance(alphas, list) else [alphas]
    try:
        alphas = [check_alpha(a, f"{where}.alpha") for a in alphas]
    except ValueError as e:
        raise SpecError(str(e)) from None
    score = raw.get("score", "aps")
    if score not in SCORES:
        raise SpecError(f"{where}.score: expected one of {list(SCORES)}, got {score!r}")
    chosen = raw.get("columns")
    if chosen is not None:
        bad = [c for c in chosen if c not in columns] if isinstance(chosen, list) else [chosen]
        if bad or not chosen:
            raise SpecError(
                f"{where}.columns: expected a non-empty list of column names, unknown {bad}; "
                f"columns: {columns}"
            )
    return ConformalSpec(tuple(alphas), score, None if chosen is None else tuple(chosen))


def halves(n: int, seed: int) -> tuple[Tensor, Tensor]:
    """A seeded random split of n rows: (calibration rows, evaluation rows)."""
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    return perm[: n // 2], perm[n // 2 :]


def scorer(
    test_logits: Tensor, y: Tensor, spec: ConformalSpec
) -> Callable[[Tensor, Tensor, bool], dict[str, float]]:
    """Calibrated on half the test set (`halves`): `score(logits, labels, same_rows)` gives
    coverage and set size per α of member logits `[M, N, C]`; `same_rows`: the set has the
    test set's rows (the other half is scored), else every row is."""
    cal, rest = halves(len(y), spec.seed)
    points = (test_logits[:, cal].transpose(0, 1), y[cal])
    fitted = [
        ConformalClassifier(alpha=a, score=spec.score).fit(CachedLogits(), points)
        for a in spec.alphas
    ]

    def score(logits: Tensor, labels: Tensor, same_rows: bool = True) -> dict[str, float]:
        if same_rows:
            logits, labels = logits[:, rest], labels[rest]
        out: dict[str, float] = {}
        for a, cp in zip(spec.alphas, fitted, strict=True):
            m = conformal_metrics(cp.sets_fn()(logits), labels, ("coverage", "set_size"))
            out |= {key(k, a): v for k, v in m.items()}
        return out

    return score


def conformal_cells(
    logits: Mapping[str, Tensor], y: Tensor, spec: ConformalSpec
) -> dict[str, dict[str, float]]:
    """The bench's: set name → conformal metrics, for the labelled sets of one column (its
    member logits by set name, "test" among them; OOD sets, "... (OOD)", are left out)."""
    score = scorer(logits["test"], y, spec)
    return {n: score(v, y) for n, v in logits.items() if not n.endswith("(OOD)")}


def conformal_table(columns: Mapping[str, Mapping[str, Any]], spec: ConformalSpec) -> list[str]:
    """Markdown lines: the conformal rows of one set's table, for the columns that have them."""
    chosen = {n: c for n, c in columns.items() if key("coverage", spec.alphas[0]) in c}
    if not chosen:
        return []
    # the smallest sets are bold; coverage has no best (it should be >= 1 − α, no more)
    rows = [
        line.replace("**", "") if line.startswith("| Coverage") else line
        for line in markdown_table(chosen, spec.rows()).splitlines()
    ]
    return [
        f"Conformal prediction ({spec.score}), calibrated on half the test set, scored on the "
        "other half's rows:",
        "",
        *rows,
        "",
    ]
