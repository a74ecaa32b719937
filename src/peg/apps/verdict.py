"""The answer first: the one verdict line that opens every report of `peg.compare` and
`AutoSelect` (HTML, markdown, notebook, the command line's text), and the rule that decides
which of a table's cells are bold.

A verdict compares the choice (compare's best test NLL, AutoSelect's chosen candidate) with the
uncalibrated model on the same points: NLL (or the Brier score) before → after with the paired
standard error of the difference (the SE of the per-point differences: both rows are scored on
the same points, so the points' own spread cancels), and ECE before → after with the paired
bootstrap SE of its difference (ECE is not a mean of per-point values: `DRAWS` resamples of the
points, the same resample for both rows). A difference is real beyond `SIGMAS` (2) SE; the
verdict says "a real improvement", "no real difference" or, where the choice is worse than the
model as it is, says that first. Bold marks a cell only where its row is better than every other
row beyond the same 2 paired SE: never a tie, never a column of equal values.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import Tensor

from peg.metrics._inputs import ensemble_log_probs
from peg.metrics.calibration import bin_edges, bin_sums

SIGMAS = 2.0  # a difference beyond this many paired SE is real
TIE = 1e-6  # below this a difference is the fits' numerical noise, whatever its SE
DRAWS = 200  # bootstrap resamples for the ECE's paired SE
BINS = 15  # the ECE's equal-width bins (peg.metrics.ece's default)
MIN_DRAWS = 50  # ... and at least these, whatever the number of points
WORK = 40_000_000  # points × draws of one bootstrap, beyond which it draws fewer
CELLS = 4_000_000  # indices drawn at once by the bootstrap (memory: 32 MB of int64)
# per-point values kept per row: (key, what it is); "error" is 1 - "correct"
POINTS = ("nll", "brier", "confidence", "correct")


def per_point(logits: Tensor, y: Tensor) -> dict[str, Tensor]:
    """Per-point values of member logits `[M, N, C]` against labels `[N]` (on the CPU, compact:
    float32, `correct` bool): NLL and Brier of the averaged prediction, its top-class
    confidence and whether the top class is the label."""
    log_p = ensemble_log_probs(logits)
    y = y.to(log_p.device).long()
    p = log_p.exp()
    top, predicted = p.max(1)
    hit = p.gather(1, y[:, None])[:, 0]
    brier = (p * p).sum(1) - 2 * hit + 1
    return {
        "nll": (-log_p.gather(1, y[:, None])[:, 0]).float().cpu(),
        "brier": brier.float().cpu(),
        "confidence": top.float().cpu(),
        "correct": (predicted == y).cpu(),
    }


def values(points: dict[str, Tensor], metric: str) -> Tensor | None:
    """The per-point values `[N]` (float64) whose mean is `metric` ("nll", "brier", "error"),
    or None where the metric is not such a mean."""
    if metric == "error":
        return 1.0 - points["correct"].double()
    return points[metric].double() if metric in ("nll", "brier") else None


def paired(a: Tensor, b: Tensor) -> tuple[float, float]:
    """Mean and standard error of the per-point differences `a - b` `[N]`."""
    d = a.double() - b.double()
    keep = ~torch.isnan(d)
    d = d[keep]
    n = d.numel()
    se = float(d.std(unbiased=True)) / math.sqrt(n) if n > 1 else float("nan")
    return (float(d.mean()) if n else float("nan")), se


def own_se(points: dict[str, Tensor], metric: str) -> float:
    """The standard error of one row's mean `metric` (not paired: no other row to pair with)."""
    v = values(points, metric)
    return paired(v, torch.zeros_like(v))[1] if v is not None else float("nan")


def ece(confidence: Tensor, correct: Tensor, bins: int = BINS) -> float:
    """The top-label ECE of per-point confidences and correctness `[N]`, binned as every ECE of
    peg (`peg.metrics.calibration.bin_sums`): Σ_b |Σ conf - Σ correct| / N."""
    _, conf_sum, hits = bin_sums(confidence.double(), correct, bins)
    return float((conf_sum - hits).abs().sum()) / max(len(confidence), 1)


def ece_se(a: dict[str, Tensor], b: dict[str, Tensor], bins: int = BINS, seed: int = 0) -> float:
    """The paired bootstrap SE of ECE(a) - ECE(b), both on the same `N` points (`DRAWS`
    resamples of the points, the same for both)."""
    n = len(a["confidence"])
    if n < 2 or len(b["confidence"]) != n:
        return float("nan")
    edges = bin_edges(bins)[1:-1].double()
    rows = []
    for p in (a, b):
        conf = p["confidence"].double()
        rows.append((torch.bucketize(conf, edges), conf - p["correct"].double()))
    g = torch.Generator().manual_seed(seed)
    diffs = []
    step = max(1, CELLS // n)
    total = max(MIN_DRAWS, min(DRAWS, WORK // n))  # fewer draws on millions of points
    for start in range(0, total, step):
        draws = min(step, total - start)
        pick = torch.randint(n, (draws, n), generator=g)
        offset = (torch.arange(draws) * bins)[:, None]
        eces = []
        for idx, gap in rows:
            sums = torch.zeros(draws * bins, dtype=torch.float64)
            sums.index_add_(0, (idx[pick] + offset).reshape(-1), gap[pick].reshape(-1))
            eces.append(sums.view(draws, bins).abs().sum(1) / n)
        diffs.append(eces[0] - eces[1])
    return float(torch.cat(diffs).std(unbiased=True))


def real(diff: float, se: float) -> bool:
    """Whether a paired difference is beyond `SIGMAS` SE (and the numerical floor `TIE`)."""
    if math.isnan(diff):
        return False
    return abs(diff) > max(TIE, SIGMAS * se if not math.isnan(se) else math.inf)


def metric_se(a: dict[str, Tensor], b: dict[str, Tensor], metric: str) -> tuple[float, float]:
    """(mean difference, paired SE) of `metric` between two rows' per-point values: a mean's
    from the per-point differences, the ECE's by the paired bootstrap."""
    if metric == "ece":
        return ece(a["confidence"], a["correct"]) - ece(b["confidence"], b["correct"]), ece_se(a, b)
    va, vb = values(a, metric), values(b, metric)
    if va is None or vb is None or len(va) != len(vb):
        return float("nan"), float("nan")
    return paired(va, vb)


def best_beyond_noise(
    scores: dict[str, float], points: dict[str, dict[str, Tensor]], metric: str, higher: bool
) -> str | None:
    """The row whose `metric` is better than every other row's beyond `SIGMAS` paired SE, or
    None (a tie, a column of equal values, a row without per-point values)."""
    known = {k: v for k, v in scores.items() if isinstance(v, (int, float)) and math.isfinite(v)}
    if len(known) < 2:
        return None
    top = (max if higher else min)(known, key=lambda k: known[k])
    if top not in points:
        return None
    for other in known:
        if other == top:
            continue
        if other not in points:
            return None
        diff, se = metric_se(points[top], points[other], metric)
        if not real(diff, se):
            return None
    return top


@dataclass
class Verdict:
    """The choice against the uncalibrated model on the same points (see the module doc).

    `criterion` "nll" or "brier"; `before`/`after` its means, `se` the paired SE of
    after - before; `ece_before`/`ece_after` fractions, `ece_se` the paired bootstrap SE;
    `points` and `where` say what it was measured on; `ties` the rows within noise of the
    choice; `baseline` None where no uncalibrated row was measured (then `se` is the
    choice's own SE)."""

    choice: str
    criterion: str
    after: float
    se: float
    points: int
    where: str
    baseline: str | None = None
    before: float | None = None
    ece_before: float | None = None
    ece_after: float | None = None
    ece_se: float | None = None
    ties: list[str] = field(default_factory=list)
    lead: str = "best"

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "text": self.text(), "judgement": self.judgement()}

    def judgement(self) -> str:
        """The judgement: "better", "worse", "same" (within noise) or "unknown"."""
        if self.before is None:
            return "unknown"
        nll = _sign(self.after - self.before, self.se)
        a, b, se = self.ece_before, self.ece_after, self.ece_se
        ece_ = 0 if a is None or b is None or se is None else _sign(b - a, se)
        if nll > 0 or (nll == 0 and ece_ > 0):
            return "worse"
        return "better" if nll < 0 or ece_ < 0 else "same"

    def text(self) -> str:
        """One line: the choice, before → after with their SEs, and whether it is real."""
        label = "NLL" if self.criterion == "nll" else "Brier"
        ties = f" ({', '.join(self.ties)} within noise of it)" if self.ties else ""
        head = f"{self.lead}: {self.choice}{ties}"
        if self.before is None:
            return (
                f"{head}, {label} {self.after:.3f} ({_se(self.se)}, on {self.points} "
                f'{self.where}); no uncalibrated row to compare it with (add "Model")'
            )
        d = _decimals(self.after - self.before, 3)
        said = (
            f"{head}, {label} {self.before:.{d}f} → {self.after:.{d}f} ({_se(self.se)} paired, "
            f"{self.points} {self.where})"
        )
        a, b = self.ece_before, self.ece_after
        if a is not None and b is not None:
            se = (
                ""
                if self.ece_se is None or math.isnan(self.ece_se)
                else (f" (± {100 * self.ece_se:.2g} paired bootstrap)")
            )
            d = _decimals(100 * (b - a), 1)
            said += f", ECE {100 * a:.{d}f} → {100 * b:.{d}f} %{se}"
        return said + ": " + self._said()

    def _said(self) -> str:
        judgement = self.judgement()
        if self.choice == self.baseline:
            return "no method beats the model as it is beyond noise: keep it uncalibrated"
        if judgement == "worse":
            return (
                f"WORSE than the uncalibrated model beyond noise ({SIGMAS:g} SE): keep the "
                "model as it is"
            )
        if judgement == "better":
            return f"a real improvement (beyond {SIGMAS:g} SE)"
        return f"no real difference from the uncalibrated model (within {SIGMAS:g} SE)"


def _decimals(diff: float, least: int) -> int:
    """Decimals that show a difference `diff` (at least `least`, at most 6): a change of
    0.0004 is not printed as 0.621 → 0.621."""
    if diff == 0 or not math.isfinite(diff):
        return least
    return min(6, max(least, -math.floor(math.log10(abs(diff)))))


def _se(se: float) -> str:
    return "SE unknown: a row resumed without its points" if math.isnan(se) else f"± {se:.2g}"


def _sign(diff: float, se: float) -> int:
    return 0 if not real(diff, se) else (1 if diff > 0 else -1)
