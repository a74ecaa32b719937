"""What the monitor finds, as records the reports format: a chunk's result (`ChunkResult`) and
its alerts (`Alert`: what fired, its value, the limit it crossed, its p-value).

A `ChunkResult` reads as the dict it replaces (`chunk["accuracy"]`, `chunk["reasons"]`) and
goes to results.json as one (`to_dict`; `from_dict` takes it back when a run resumes).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar

# an alert's kinds: the estimate outside the band, each of the three tests, and the estimate
# saying it cannot be trusted (`Estimate.reliable` False)
BAND, LABEL_SHIFT, COVARIATE_SHIFT, OOD, UNRELIABLE = (
    "band",
    "label shift",
    "covariate shift",
    "OOD share",
    "unreliable",
)
KINDS = (BAND, LABEL_SHIFT, COVARIATE_SHIFT, OOD, UNRELIABLE)


@dataclass(frozen=True)
class Alert:
    """One reason a chunk alerts.

    Attributes:
        kind: "band", "label shift", "covariate shift", "OOD share" or "unreliable".
        value: what was judged: the estimated accuracy (band, unreliable), the domain
            classifier's AUROC, the OOD share, or the p-value (label shift).
        limit: the limit it crossed: the band's bound, or the tests' level (alpha / 3).
        p: the test's p-value (None for the band and an unreliable estimate).
        detail: why the estimate is unreliable (the estimator's reason), else "".
    """

    kind: str
    value: float | None
    limit: float | None = None
    p: float | None = None
    detail: str = ""

    def text(self) -> str:
        """The alert in one line, as the reports show it."""
        if self.kind == BAND and self.value is not None and self.limit is not None:
            side = "below" if self.value < self.limit else "above"
            return f"estimate {self.value:.3f} {side} the band's {self.limit:.3f}"
        if self.kind == UNRELIABLE:
            return f"estimate unreliable: {self.detail or 'no reason given'}"
        return f"{self.kind}: p = {self.p:.2g} < {self.limit:.2g}"

    def __str__(self) -> str:
        return self.text()

    def to_dict(self) -> dict[str, Any]:
        """The alert as plain values (results.json's `alerts`)."""
        return dataclasses.asdict(self)


@dataclass
class ChunkResult:
    """One chunk: its estimate and the tests against the source (docs/monitor.md).

    Attributes:
        chunk: its number in the stream (0 first).
        source: the names of the batches it holds, joined by " + " (None: unnamed).
        n: its points.
        accuracy: the estimated accuracy (`PerformanceEstimator.estimate`'s).
        interval: its interval [lo, hi].
        method: the estimator that gave it.
        band: [lo, hi] the estimate is judged by (for a chunk of this size).
        priors: EM's target class priors `[C]`.
        label_shift_p: the label-shift test's p-value (None below 20 points, as every test).
        domain_auroc: the domain classifier's AUROC, chunk against source.
        covariate_p: its p-value.
        ood_share: the share of points whose energy is below the source's 5% quantile.
        ood_p: its test's p-value.
        realized_accuracy: the accuracy from its labels, where every point came with one.
        labelled: its points that came with a label.
        alerts: what fired (`Alert`s); `alert`, `reasons` read them.
        reliable: False when the estimator said its estimate cannot be trusted.
    """

    FIELDS: ClassVar[tuple[str, ...]]

    chunk: Any
    source: str | None
    n: int
    accuracy: float
    interval: list[float]
    method: str
    band: list[float]
    priors: list[float] | None = None
    label_shift_p: float | None = None
    domain_auroc: float | None = None
    covariate_p: float | None = None
    ood_share: float | None = None
    ood_p: float | None = None
    realized_accuracy: float | None = None
    labelled: int = 0
    alerts: list[Alert] = field(default_factory=list)
    reliable: bool = True

    @property
    def alert(self) -> bool:
        """Whether anything fired."""
        return bool(self.alerts)

    @property
    def reasons(self) -> list[str]:
        """The alerts in words, one line each."""
        return [a.text() for a in self.alerts]

    def __getitem__(self, key: str) -> Any:
        """`chunk["accuracy"]`: the dict a chunk was before it was a record."""
        if key not in ChunkResult.FIELDS and key not in ("alert", "reasons"):
            raise KeyError(key)
        return getattr(self, key)

    def get(self, key: str, default: Any = None) -> Any:
        """`chunk[key]`, or `default` where the chunk has no such field."""
        try:
            return self[key]
        except KeyError:
            return default

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready values, `alert` and `reasons` included (results.json's row)."""
        out = {f: getattr(self, f) for f in ChunkResult.FIELDS if f != "alerts"}
        out["interval"], out["band"] = list(self.interval), list(self.band)
        out["alert"], out["reasons"] = self.alert, self.reasons
        out["alerts"] = [a.to_dict() for a in self.alerts]
        return out

    @classmethod
    def from_dict(cls, row: dict[str, Any]) -> ChunkResult:
        """A row of results.json back as a record (`alert` and `reasons` follow from `alerts`)."""
        values = {f: row[f] for f in ChunkResult.FIELDS if f in row}
        values["alerts"] = [Alert(**a) for a in row.get("alerts", [])]
        return cls(**values)


ChunkResult.FIELDS = tuple(f.name for f in dataclasses.fields(ChunkResult))
