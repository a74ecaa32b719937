"""Classification metrics: pure functions of predictions and labels, computed in float64.

`pred` is probabilities `[N, C]` or member logits `[M, N, C]` (an ensemble averages member
probabilities); `y` is integer labels `[N]`. Tensors or numpy arrays.

- `nll(pred, y)`: NLL of the predictive distribution (log-space for ensembles).
- `gibbs_nll(member_logits, y)`, `member_nll(member_logits, y)`: mean and per-member NLL.
- `error(pred, y)`, `accuracy(pred, y)`: fractions in [0, 1].
- `brier(pred, y, normalize=False)`: Brier score (normalize=True divides by C).
- `reliability(pred, y, bins)`, `ece(...)`, `mce(...)`: top-class calibration, equal-width bins.
- `classification_metrics(pred, y, bins, min_count)`: all of the above as a dict.
- Regression (`peg.metrics.regression`; member means `[M, N]`, variances `[M, N]` or one
  number, targets `[N]`; Gaussian head outputs `[..., 2]` = (mean, log-variance) via
  `split_gaussian`): `rmse`, `log_predictive_density` (mixture), `gaussian_nll`
  (moment-matched), `interval_coverage`, `regression_calibration_error`, `regression_metrics`.
- OOD detection (`peg.metrics.ood`; higher score = more likely OOD, OOD is the positive class):
  scores `max_softmax`, `max_logit`, `entropy`, `mutual_information`, `variation_ratio`;
  metrics `auroc`, `aupr`, `fpr_at_tpr`, `ood_metrics(pred_in, pred_out, score)`.
"""

from __future__ import annotations

from typing import Any

from peg._inputs import check_positive_int
from peg.metrics._inputs import check_labels, ensemble_log_probs, ensemble_probs
from peg.metrics._predictive import Predictive
from peg.metrics.calibration import ece, ece_of, mce, mce_of, reliability
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
from peg.metrics.ood import (
    OOD_SCORES,
    aupr,
    auroc,
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

__all__ = [
    "OOD_SCORES",
    "accuracy",
    "aupr",
    "auroc",
    "brier",
    "check_labels",
    "classification_metrics",
    "ece",
    "ensemble_log_probs",
    "ensemble_probs",
    "entropy",
    "error",
    "fpr_at_tpr",
    "gaussian_nll",
    "gibbs_nll",
    "interval_coverage",
    "log_predictive_density",
    "max_logit",
    "max_softmax",
    "mce",
    "member_nll",
    "moment_match",
    "mutual_information",
    "nll",
    "ood_metrics",
    "regression_calibration_error",
    "regression_metrics",
    "reliability",
    "rmse",
    "split_gaussian",
    "variation_ratio",
]


def classification_metrics(
    pred: Any, y: Any, bins: int = 15, min_count: int = 1
) -> dict[str, float]:
    """All metrics of `pred` on `y`: "nll", "error", "brier", "ece", "mce".

    "gibbs_nll" is added when `pred` is member logits `[M, N, C]`.

    Args:
        pred: probabilities `[N, C]` or member logits `[M, N, C]`.
        y: labels `[N]`.
        bins, min_count: ECE/MCE binning (see `ece`).
    """
    bins = check_positive_int(bins, "bins")
    min_count = check_positive_int(min_count, "min_count")
    pp = Predictive(pred, y)  # validated once; the maximum and the true class found once
    out = {
        "nll": nll_of(pp),
        "error": error_of(pp),
        "brier": brier_of(pp),
        "ece": ece_of(pp, bins, min_count),
        "mce": mce_of(pp, bins, min_count),
    }
    if pp.members:
        out["gibbs_nll"] = gibbs_nll_of(pp)
    return out
