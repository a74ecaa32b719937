"""How far a target is from the source, read without labels; the interval that grows with it,
and when it is too wide to be of use.

Four distances, each in [0, 1], from the target's streamed `Summary` and the base estimates
(`distances`), each net of the sampling noise of the target and the source (a small chunk of
an unshifted stream is not "far"):
- "disagreement": the range (max − min) of the base estimators' accuracies (`SPREAD`: AC,
  ATC-MC, ATC-LS, COT-EM). Each is right where its own assumption holds; where they part, at
  least one is wrong by half the range, and nothing without labels says which. (COT with the
  source's class mix is left out: it charges every label shift as error.)
- "prediction shift": the total-variation distance between the predicted-class shares of the
  target and of the source (reported; a label shift moves it with the estimate still right).
- "confidence shift": |2 · AUROC − 1| of telling the target from the source by the top
  probability alone, a one-feature domain classifier read from the histograms the summary
  already holds (reported; a confidence tilt moves it with the estimate still right).
- "label-shift residual": the total-variation distance between the target's (predicted class,
  coarse confidence) shares and the source's reweighted to EM's class priors (`residual`):
  what a label shift does not explain, a collapse of the predictions included.

The half-width is q · (FLOOR + disagreement + residual) (`scale`), q the split-conformal
`confidence` quantile, over the synthetic shifts of the source (`_shifts`: label shift, tilts,
logit scale and noise, a weaker class signal, a collapse), of the least q whose interval holds
each one's error (`fit_q`; Lei et al. 2018's locally weighted residuals, with shifts of the
source as the calibration sets). It covers a target shifted as some of those are, with an
error in proportion to how far it is; a target whose error is out of proportion to every
distance (a change of p(y | x) that leaves the predictions as they were: a relabelling) is not
covered, and nothing without labels can cover it.

Past `UNRELIABLE` (0.15: an interval 30 points wide says little beyond "it changed") the
estimate is flagged `reliable=False`, with the distance that drove the width named (`reasons`).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from peg.methods.estimation._stats import BINS

#: the base estimators whose range is the disagreement
SPREAD = ("ac", "atc-mc", "atc-ls", "cot-em")
DISTANCES = ("disagreement", "prediction shift", "confidence shift", "label-shift residual")
#: the width's scale never below FLOOR: the error of an estimator on an unshifted target
FLOOR = 0.02
#: a half-width past this makes the estimate unreliable
UNRELIABLE = 0.15


def confidence_auroc(source: np.ndarray, target: np.ndarray) -> float:
    """P(a source point's top probability > a target point's) + half the ties, from the
    counts `[BINS]` of each over the same bins of [0, 1]."""
    ns, nt = source.sum(), target.sum()
    if ns == 0 or nt == 0:
        return 0.5
    below = np.cumsum(target) - target  # target points in lower bins
    wins = (source * below).sum() + 0.5 * (source * target).sum()
    return float(wins / (ns * nt))


def confidence_counts(top: np.ndarray) -> np.ndarray:
    """The counts `[BINS]` of top probabilities `[N]` in the summary's "mc" bins."""
    b = np.clip((top * BINS).astype(np.int64), 0, BINS - 1)
    return np.bincount(b, minlength=BINS)


#: the coarse confidence bins of the label-shift residual
COARSE = 16


def joint_counts(pred: np.ndarray, top: np.ndarray, classes: int, y: np.ndarray) -> np.ndarray:
    """The source's counts `[C (true), C (predicted), COARSE]` of (label, prediction, coarse
    confidence bin) from predictions `[N]`, top probabilities `[N]`, labels `[N]`."""
    b = np.clip((top * COARSE).astype(np.int64), 0, COARSE - 1)
    flat = (y * classes + pred) * COARSE + b
    return np.bincount(flat, minlength=classes * classes * COARSE).reshape(classes, classes, -1)


def residual(hist: np.ndarray, joint: np.ndarray, w: np.ndarray, shares: np.ndarray) -> float:
    """The total-variation distance between the target's (prediction, coarse confidence)
    shares (`hist`: the summary's "mc" histograms `[C, BINS]`) and the source's reweighted to
    the target's label mix (`joint` `[C, C, COARSE]`, weights q(y) / p(y) `[C]`), less its
    sampling noise: near 0 when a label shift explains the target, large when the inputs
    changed (a collapse of the predictions that EM would read as a label shift included)."""
    n = hist.sum()
    if n == 0:
        return 0.0
    target = hist.reshape(hist.shape[0], COARSE, -1).sum(-1) / n
    source = (joint * w[:, None, None]).sum(0)
    source = source / max(source.sum(), 1e-12)
    # both sides are samples: the target's n points and the source's (a small validation set
    # spread over C · COARSE cells is as noisy as the target)
    m = 1.0 / n + 1.0 / max(float(joint.sum()), 1.0)
    noise = 0.5 * float(np.sqrt(2 * source * (1 - source) * m / np.pi).sum())
    return max(0.5 * float(np.abs(target - source).sum()) - noise, 0.0)


def distances(
    values: Mapping[str, float],
    shares: np.ndarray,
    source_shares: np.ndarray,
    counts: np.ndarray,
    source_counts: np.ndarray,
    unexplained: float = 0.0,
) -> np.ndarray:
    """The four distances `[4]` (`DISTANCES`): the base `values` (`SPREAD` among them), the
    predicted-class shares `[C]` of target and source, their top-probability counts `[BINS]`,
    the label-shift residual (`residual`, computed by the caller from EM's priors)."""
    spread = [values[k] for k in SPREAD if k in values]
    disagreement = max(spread) - min(spread) if spread else 0.0
    n, ns = max(int(counts.sum()), 1), max(int(source_counts.sum()), 1)
    # each distance less what the target's sampling alone gives on average (a small chunk
    # of an unshifted stream is not "far"): E|p̂ − p̂_s| ≈ sqrt(2 p (1 − p) (1/n + 1/ns) / π)
    # per class;
    # AUROC's null standard deviation sqrt((n + ns + 1) / (12 n ns)) (Mann-Whitney)
    p = np.asarray(source_shares, dtype=np.float64)
    noise = 0.5 * float(np.sqrt(2 * p * (1 - p) * (1 / n + 1 / ns) / np.pi).sum())
    prediction = max(0.5 * float(np.abs(shares - p).sum()) - noise, 0.0)
    sd = np.sqrt((n + ns + 1) / (12.0 * n * ns))
    auc = abs(2.0 * confidence_auroc(source_counts, counts) - 1.0)
    confidence = max(auc - 2 * sd * np.sqrt(2 / np.pi), 0.0)
    return np.asarray([disagreement, prediction, confidence, unexplained])


def scale(distance: np.ndarray) -> np.ndarray:
    """The width's scale: `FLOOR` + disagreement + label-shift residual (`[..., 4]` → `[...]`)."""
    d = np.asarray(distance)
    return FLOOR + d[..., 0] + d[..., 3]


def fit_q(
    errors: np.ndarray, distance: np.ndarray, confidence: float, sampling: np.ndarray | float = 0.0
) -> float:
    """The scale q at `confidence` from the synthetic shifts' errors `[S]` and distances
    `[S, 4]`: for each shift the least q whose interval, hypot(q · scale, its `sampling`
    error `[S]`) as `PerformanceEstimator` builds it, holds its error; then their
    ⌈(S + 1) · confidence⌉-th smallest (split conformal's finite-sample quantile)."""
    if len(errors) == 0:
        return 1.0
    beyond = np.sqrt(np.maximum(np.square(errors) - np.square(sampling), 0.0))
    ratios = np.sort(beyond / scale(distance))
    k = min(int(np.ceil((len(ratios) + 1) * confidence)), len(ratios)) - 1
    return float(ratios[k])


def reasons(distance: np.ndarray, half: float) -> tuple[str, ...]:
    """Why an estimate with this half-width is unreliable (empty when it is reliable)."""
    if half <= UNRELIABLE:
        return ()
    d = dict(zip(DISTANCES, distance, strict=True))
    said = {
        "disagreement": f"the estimators disagree by {d['disagreement']:.2f}",
        "prediction shift": (
            f"the predicted classes moved (total variation {d['prediction shift']:.2f} from the "
            "source's)"
        ),
        "confidence shift": (
            f"the confidences moved (AUROC {0.5 + d['confidence shift'] / 2:.2f} against the "
            "source's)"
        ),
        "label-shift residual": (
            f"a label shift does not explain the predictions (residual "
            f"{d['label-shift residual']:.2f})"
        ),
    }
    worst = max(("disagreement", "label-shift residual"), key=lambda k: d[k])
    return (
        f"the target is far from the source: the interval is ±{half:.2f} (over ±{UNRELIABLE:.2f})"
        f"; {said[worst]}",
    )
