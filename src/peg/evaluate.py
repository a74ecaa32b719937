"""`evaluate`: the paper's metrics for any predictor on labelled data."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

from peg import metrics
from peg._inputs import Data, check_data_device, check_finite
from peg.batches import BatchFn, check_batch_fn
from peg.methods.temperature import logits_and_labels, member_logits_of, predictor_device
from peg.metrics.regression import regression_metrics, split_gaussian


def evaluate(
    predictor: Any,
    X: Data,
    y: Tensor | None = None,
    bins: int = 15,
    min_count: int = 1,
    batch_size: int = 512,
    y_scale: float | None = None,
    batch_fn: BatchFn | None = None,
) -> dict[str, float]:
    """NLL, error, Brier, ECE and MCE of `predictor` on (X, y) (+ Gibbs NLL for ensembles).

    Floating-point targets mean regression with Gaussian heads (outputs `[B, 2]`: mean,
    log-variance): the result is then RMSE, LPD (log predictive density of the mixture), the
    moment-matched Gaussian NLL and the interval calibration error (`y_scale`: the training
    std of y, for original units).

    Args:
        predictor: an nn.Module (one model), a peg method or `Ensemble`, or anything with
            `member_logits(X) -> [M, N, C]`.
        X: inputs `[N, ...]`, or, when `y` is None, labelled data: a pair `(X, y)`, or a
            DataLoader/Dataset of `(x, y, ...)` or mapping batches (labels under "labels" or
            "label", the rest the model's keyword inputs; `peg.batches`), read once without
            gathering the inputs.
        y: labels `[N]`.
        bins, min_count: ECE/MCE binning (equal width).
        batch_fn: `batch_fn(batch) -> (inputs, y)` for loader batches of another shape.

    Error and ECE are fractions in [0, 1] (tables print them as %).
    """
    device = predictor_device(predictor)
    batch_fn = check_batch_fn(batch_fn)
    if y is None:
        logits, y = logits_and_labels(predictor, X, batch_size, batch_fn, "X")
    else:
        if isinstance(X, (Tensor, np.ndarray)):
            X = torch.as_tensor(X)
            check_data_device(X, "X", device)
            check_finite(X, "X")
        logits = member_logits_of(predictor, X, batch_size, batch_fn)
    if torch.is_floating_point(torch.as_tensor(y)):
        if logits.shape[-1] != 2:
            raise ValueError(
                f"y: floating-point targets mean regression, which needs Gaussian heads with "
                f"outputs [B, 2] (mean, log-variance); the predictor gives [B, "
                f"{logits.shape[-1]}]. For classification pass integer labels, e.g. y.long()"
            )
        return regression_metrics(*split_gaussian(logits), y, y_scale)
    out = metrics.classification_metrics(logits, y, bins=bins, min_count=min_count)
    if logits.shape[0] == 1:
        out.pop("gibbs_nll", None)  # one member: Gibbs NLL is the NLL
    return out
