"""Classification metrics: pure functions of predictions and labels, computed in float64.

`pred` is probabilities `[N, C]` or member logits `[M, N, C]` (an ensemble averages member
probabilities); `y` is integer labels `[N]`. Tensors or numpy arrays. Points labelled -100
(torch's `cross_entropy` default `ignore_index`) are left out by every metric
(`classification_metrics` and `StreamingMetrics` take another `ignore_index`).

- `nll(pred, y)`: NLL of the predictive distribution (log-space for ensembles).
- `gibbs_nll(member_logits, y)`, `member_nll(member_logits, y)`: mean and per-member NLL.
- `error(pred, y)`, `accuracy(pred, y)`: fractions in [0, 1].
- `brier(pred, y, normalize=False)`: Brier score (normalize=True divides by C).
- `reliability(pred, y, bins)`, `ece(...)`, `mce(...)`: top-class calibration, equal-width bins.
- `adaptive_ece(pred, y, bins)`: top-class ECE with equal-mass bins; `classwise_ece(pred, y,
  bins)`: the calibration of every class's probability (Kull et al. 2019).
- Selective classification (`peg.metrics.selective`; `confidence=` any score `[N]`, default the
  max averaged probability): `risk_coverage_curve`, `aurc`, `augrc`, `risk_at_coverage`.
- `classification_metrics(pred, y, bins, min_count, metrics)`: the selected ones of the above
  as a dict, by key (`CLASSIFICATION_METRICS`; default `DEFAULT_METRICS`).
- Regression (`peg.metrics.regression`; member means `[M, N]`, variances `[M, N]` or one
  number, targets `[N]`; Gaussian head outputs `[..., 2]` = (mean, log-variance) via
  `split_gaussian`): `rmse`, `log_predictive_density` (mixture), `gaussian_nll`
  (moment-matched), `interval_coverage`, `regression_calibration_error`, `regression_metrics`.
- Conformal prediction (`peg.metrics.conformal`; sets bool `[N, C]` or intervals `[N, 2]`):
  `coverage`, `mean_size`, `size_stratified_coverage`, `class_coverage`,
  `worst_class_coverage`, `conformal_metrics(sets, y, metrics)` (`CONFORMAL_METRICS`).
- Binary scorers and multi-label heads (`peg.metrics.binary`; P(y = 1) `[N]` or `[N, K]`,
  labels 0/1 of the same shape, `ignore_index=-100` left out): `binary_nll`, `binary_brier`,
  `binary_ece`, `binary_auroc`, `binary_reliability`, `binary_metrics`; `multilabel_nll`,
  `multilabel_brier`, `multilabel_ece` (over every label entry), `label_ece` (`[K]`),
  `multilabel_reliability`, `multilabel_metrics`.
- Dense predictions (`peg.metrics.dense`; logits `[B, C, *S]`, labels `[B, *S]`,
  `ignore_index=-100`): `dense_metrics` (NLL, error, Brier, ECE, MCE per position) and
  `DenseMetrics`, the same streamed batch by batch.
- OOD detection (`peg.metrics.ood`; higher score = more likely OOD, OOD is the positive class):
  scores `max_softmax`, `max_logit`, `energy`, `entropy`, `mutual_information`, `variation_ratio`;
  metrics `auroc`, `aupr`, `fpr_at_tpr`, `ood_metrics(pred_in, pred_out, score)`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from peg.metrics._inputs import ensemble_log_probs, ensemble_probs
from peg.metrics._keys import CLASSIFICATION_METRICS, DEFAULT_METRICS, check_metrics
from peg.metrics._predictive import Predictive
from peg.metrics.binary import (
    BINARY_METRICS,
    MULTILABEL_METRICS,
    binary_auroc,
    binary_brier,
    binary_ece,
    binary_metrics,
    binary_nll,
    binary_reliability,
    label_ece,
    multilabel_brier,
    multilabel_ece,
    multilabel_metrics,
    multilabel_nll,
    multilabel_reliability,
)
from peg.metrics.calibration import (
    adaptive_ece,
    adaptive_ece_of,
    binned_classwise_ece,
    classwise_bin_sums,
    classwise_ece,
    ece,
    ece_of,
    mce,
    mce_of,
    reliability,
)
from peg.metrics.classification import (
    accuracy,
    brier,
    brier_of,
    error,
    error_of,
    gibbs_nll,
    gibbs_nll_of,
    member_nll,
    nll,
    nll_of,
)
from peg.metrics.conformal import (
    CONFORMAL_METRICS,
    ConformalStream,
    class_coverage,
    conformal_metrics,
    coverage,
    mean_size,
    size_stratified_coverage,
    worst_class_coverage,
)
from peg.metrics.dense import DENSE_METRICS, DenseMetrics, dense_metrics
from peg.metrics.ood import (
    OOD_SCORES,
    aupr,
    auroc,
    energy,
    entropy,
    fpr_at_tpr,
    max_logit,
    max_softmax,
    mutual_information,
    ood_metrics,
    variation_ratio,
)
from peg.metrics.regression import (
    gaussian_nll,
    interval_coverage,
    log_predictive_density,
    moment_match,
    regression_calibration_error,
    regression_metrics,
    rmse,
    split_gaussian,
)
from peg.metrics.selective import (
    augrc,
    augrc_of,
    aurc,
    aurc_of,
    risk_at_coverage,
    risk_coverage_curve,
)
from peg.source._values import check_labels
from peg.utils.scalars import check_positive_int

__all__ = [
    "BINARY_METRICS",
    "CLASSIFICATION_METRICS",
    "CONFORMAL_METRICS",
    "DEFAULT_METRICS",
    "DENSE_METRICS",
    "MULTILABEL_METRICS",
    "OOD_SCORES",
    "ConformalStream",
    "DenseMetrics",
    "accuracy",
    "adaptive_ece",
    "augrc",
    "aupr",
    "aurc",
    "auroc",
    "binary_auroc",
    "binary_brier",
    "binary_ece",
    "binary_metrics",
    "binary_nll",
    "binary_reliability",
    "brier",
    "check_labels",
    "class_coverage",
    "classification_metrics",
    "classwise_ece",
    "conformal_metrics",
    "coverage",
    "dense_metrics",
    "ece",
    "energy",
    "ensemble_log_probs",
    "ensemble_probs",
    "entropy",
    "error",
    "fpr_at_tpr",
    "gaussian_nll",
    "gibbs_nll",
    "interval_coverage",
    "label_ece",
    "log_predictive_density",
    "max_logit",
    "max_softmax",
    "mce",
    "mean_size",
    "member_nll",
    "moment_match",
    "multilabel_brier",
    "multilabel_ece",
    "multilabel_metrics",
    "multilabel_nll",
    "multilabel_reliability",
    "mutual_information",
    "nll",
    "ood_metrics",
    "regression_calibration_error",
    "regression_metrics",
    "reliability",
    "risk_at_coverage",
    "risk_coverage_curve",
    "rmse",
    "size_stratified_coverage",
    "split_gaussian",
    "variation_ratio",
    "worst_class_coverage",
]


def classification_metrics(
    pred: Any,
    y: Any,
    bins: int = 15,
    min_count: int = 1,
    metrics: str | Iterable[str] | None = None,
    ignore_index: int = -100,
) -> dict[str, float]:
    """The selected metrics of `pred` on `y`, by key, in the order asked.

    Args:
        pred: probabilities `[N, C]` or member logits `[M, N, C]`.
        y: labels `[N]`.
        bins, min_count: the binning of "ece", "mce" (see `ece`), and the bins of
            "adaptive_ece" and "classwise_ece".
        metrics: keys of `CLASSIFICATION_METRICS`: "nll", "error", "brier", "ece", "mce",
            "gibbs_nll" (member logits only: left out for probabilities), "adaptive_ece",
            "classwise_ece",
    "conformal_metrics",
    "coverage", "aurc", "augrc" (confidence: the max averaged probability).
            None: `DEFAULT_METRICS`, the first six.
        ignore_index: points labelled so are left out (default -100, torch's
            `cross_entropy` default; every metric of `peg.metrics` leaves out -100).
    """
    keys = check_metrics(metrics)
    bins = check_positive_int(bins, "bins")
    min_count = check_positive_int(min_count, "min_count")
    # validated once; the maximum, the true class and ranks found once
    pp = Predictive(pred, y, ignore_index=ignore_index)
    compute: dict[str, Callable[[], float]] = {
        "nll": lambda: nll_of(pp),
        "error": lambda: error_of(pp),
        "brier": lambda: brier_of(pp),
        "ece": lambda: ece_of(pp, bins, min_count),
        "mce": lambda: mce_of(pp, bins, min_count),
        "gibbs_nll": lambda: gibbs_nll_of(pp),
        "adaptive_ece": lambda: adaptive_ece_of(pp.ranked, bins),
        "classwise_ece": lambda: binned_classwise_ece(*classwise_bin_sums(pp, bins)),
        "aurc": lambda: aurc_of(pp.ranked),
        "augrc": lambda: augrc_of(pp.ranked),
    }
    return {k: compute[k]() for k in keys if k != "gibbs_nll" or pp.members}
