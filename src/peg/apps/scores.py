"""The metrics the applications report on one evaluation set, from member logits `[M, N, C]`:
NLL, error, Brier, ECE and MCE on labelled sets; AUROC, AUPR (OOD positive), AUPR-In and FPR95
on an OOD set, against the in-distribution test set. The bench and `peg compare` share them."""

from __future__ import annotations

from torch import Tensor

from peg import metrics
from peg.metrics.ood import ood_metrics

CLASSIFICATION = ("nll", "error", "brier", "ece", "mce")
OOD = ("auroc", "aupr", "aupr_in", "fpr95")


def labelled_metrics(logits: Tensor, y: Tensor) -> dict[str, float]:
    """`CLASSIFICATION` of member logits `[M, N, C]` against labels `[N]`."""
    m = metrics.classification_metrics(logits, y)
    return {k: float(m[k]) for k in CLASSIFICATION}


def ood_detection(test_logits: Tensor, ood_logits: Tensor, score: str) -> dict[str, float]:
    """`OOD` of an OOD set's member logits `[M, N_out, C]` against the test set's
    `[M, N_in, C]` (OOD is the positive class; `score` names a `peg.metrics.ood` score)."""
    m = ood_metrics(test_logits, ood_logits, score)
    return {"auroc": m["auroc"], "aupr": m["aupr_out"], "aupr_in": m["aupr_in"],
            "fpr95": m["fpr95"]}  # fmt: skip
