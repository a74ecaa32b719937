"""What the label-free estimators read of a set of predictions, kept in memory flat in N.

`Summary` is one pass over calibrated log-probabilities `[B, C]` batch by batch: the count,
the sum of the top probabilities, the predicted-class counts, fine histograms of each ATC score
per predicted class (`BINS` bins over the score's range: an ATC share is read back to within
a bin, interpolated linearly inside it) and a reservoir of at most `reservoir` rows kept
uniformly at random (Vitter's algorithm R, seeded): what EM and the transport need, capped.
Memory is O(C · BINS + reservoir · C) whatever N.

The scores (`SCORES`): "mc", the top probability max_c p_c in [0, 1]; "ne", the NEGATIVE
entropy Σ_c p_c log p_c in [-log C, 0] (Garg et al.'s `get_entropy` returns it so; higher is
more confident for both, so a point is predicted "right" when its score is AT OR ABOVE the
threshold).
"""

from __future__ import annotations

import math

import numpy as np
from torch import Tensor

BINS = 4096
SCORES = ("mc", "ne")


def score(log_probs: Tensor, kind: str) -> Tensor:
    """The ATC score `[N]` float64 of calibrated log-probabilities `[N, C]` (see the module)."""
    lp = log_probs.double()
    if kind == "mc":
        return lp.max(-1).values.exp()
    p = lp.exp()
    return (p * lp.clamp_min(-1e300)).nan_to_num(0.0).sum(-1)


def score_range(kind: str, classes: int) -> tuple[float, float]:
    return (0.0, 1.0) if kind == "mc" else (-math.log(classes), 0.0)


class Summary:
    """The streamed summary of a set of predictions (see the module). `add(log_probs)` per
    batch `[B, C]` (calibrated log-probabilities, float64); then `n`, `conf_sum`,
    `pred_counts` `[C]`, `hist[kind]` `[C, BINS]`, `rows()` the reservoir `[R, C]`."""

    def __init__(self, classes: int, reservoir: int = 10_000, seed: int = 0) -> None:
        self.classes, self.cap = classes, reservoir
        self.n, self.conf_sum, self.low_energy = 0, 0.0, 0
        self.pred_counts = np.zeros(classes, dtype=np.int64)
        self.hist = {k: np.zeros((classes, BINS), dtype=np.int64) for k in SCORES}
        self._rows: list[np.ndarray] = []
        self._kept = np.zeros((0, classes))
        self._rng = np.random.default_rng(seed)

    def add(self, log_probs: Tensor, lse: Tensor | None = None, below: float | None = None) -> None:
        """One batch: calibrated log-probabilities `[B, C]`; with `lse` `[B]` (logsumexp of the
        raw logits, minus the energy) and `below`, the points with `lse < below` are counted
        in `low_energy` (the OOD share's numerator)."""
        lp = log_probs.detach().double().cpu()
        if len(lp) == 0:
            return
        if lse is not None and below is not None:
            self.low_energy += int((lse.detach().double().cpu() < below).sum())
        pred = lp.argmax(-1).numpy()
        self.pred_counts += np.bincount(pred, minlength=self.classes)
        self.conf_sum += float(lp.max(-1).values.exp().sum())
        for kind in SCORES:
            lo, hi = score_range(kind, self.classes)
            s = score(lp, kind).numpy()
            b = np.clip(((s - lo) / (hi - lo) * BINS).astype(np.int64), 0, BINS - 1)
            np.add.at(self.hist[kind], (pred, b), 1)
        self._reserve(lp.numpy())
        self.n += len(lp)

    def _reserve(self, rows: np.ndarray) -> None:
        """Algorithm R over the stream: every row kept with probability cap / n."""
        room = self.cap - len(self._kept)
        if room > 0:
            self._kept = np.concatenate([self._kept, rows[:room]])
            rows, start = rows[room:], self.n + room
        else:
            start = self.n
        if len(rows) == 0:
            return
        seen = start + np.arange(1, len(rows) + 1)  # the 1-based index of each row
        slot = (self._rng.random(len(rows)) * seen).astype(np.int64)
        take = slot < self.cap
        for i in np.nonzero(take)[0]:  # later rows overwrite earlier ones, as in order
            self._kept[slot[i]] = rows[i]

    def rows(self) -> np.ndarray:
        """The reservoir `[min(n, reservoir), C]` of calibrated log-probabilities."""
        return self._kept

    def share_at_or_above(self, kind: str, threshold: float, weights: np.ndarray | None) -> float:
        """The share of points whose score is ≥ `threshold` (interpolated inside its bin),
        each predicted class weighted by `weights` `[C]` (None: all 1)."""
        lo, hi = score_range(kind, self.classes)
        pos = (threshold - lo) / (hi - lo) * BINS
        h = self.hist[kind].astype(np.float64)
        if weights is not None:
            h = h * weights[:, None]
        per_bin = h.sum(0)
        total = per_bin.sum()
        if total <= 0:
            return float("nan")
        k = int(np.clip(math.floor(pos), 0, BINS))
        above = per_bin[k + 1 :].sum() if k < BINS else 0.0
        if k < BINS:
            above += per_bin[k] * (1.0 - min(max(pos - k, 0.0), 1.0))
        return float(above / total)


def atc_threshold(scores: np.ndarray, correct: np.ndarray, weights: np.ndarray | None) -> float:
    """Garg et al.'s threshold t: the (weighted) share of source points scoring below t equals
    the (weighted) source error. `scores`, `correct` `[N]`, `weights` `[N]` or None."""
    w = np.ones(len(scores)) if weights is None else weights
    error = float((w * (1 - correct)).sum() / w.sum())
    order = np.argsort(scores, kind="stable")
    cum = np.cumsum(w[order]) / w.sum()  # share at or below each sorted score
    k = int(np.searchsorted(cum, error, side="left"))
    if k >= len(order):
        return float(scores[order[-1]]) + 1e-12
    # the midpoint between the k-th and the next score: ties counted on the "right" side
    nxt = scores[order[min(k + 1, len(order) - 1)]]
    return float(0.5 * (scores[order[k]] + nxt)) if error > 0 else float(scores[order[0]])


def transport_cost(log_probs: np.ndarray, priors: np.ndarray, cap: int, seed: int) -> np.ndarray:
    """COT's optimal transport (Lu et al. 2023) between the target's probability vectors and
    one-hot labels drawn from the source label marginal, with cost ‖p − e_y‖₁ / 2 = 1 − p_y:
    the cost `[m]` each matched point pays. Exact, on at most `cap` points subsampled without
    replacement; the labels are the marginal's largest-remainder rounding to m points (floor
    of m·prior, the leftover units to the largest remainders, ties to the lower class). The
    assignment to m label columns is a transportation problem to C classes of those counts
    (`_transport.transport_labels`: 5 ms for m = 1,000, C = 10) for C ≤ m / 20, else
    scipy's `linear_sum_assignment` on the m × m costs (O(m³); the faster one when C nears
    m / 20, measured); both give the optimal total. (The paper resamples 10k points with
    replacement and calls POT's exact EMD, which scales badly: the cap is the same trade.)"""
    rng = np.random.default_rng(seed)
    rows = log_probs if len(log_probs) <= cap else log_probs[rng.choice(len(log_probs), cap, False)]
    m = len(rows)
    counts = np.floor(priors * m).astype(np.int64)
    rest = np.argsort(-(priors * m - counts), kind="stable")[: m - counts.sum()]
    counts[rest] += 1
    cost = 1.0 - np.exp(rows)
    if 20 * len(priors) <= m:
        from peg.methods.estimation._transport import transport_labels  # scipy: on use

        return cost[np.arange(m), transport_labels(cost, counts)]
    from scipy.optimize import linear_sum_assignment

    full = cost[:, np.repeat(np.arange(len(priors)), counts)]
    r, c = linear_sum_assignment(full)
    return full[r, c]
