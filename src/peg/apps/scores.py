"""The metrics the applications report on one evaluation set, from member logits `[M, N, C]`:
NLL, error, Brier, ECE, MCE, adaptive and classwise ECE, AURC and AUGRC on labelled sets;
AUROC, AUPR (OOD positive), AUPR-In and FPR95 on an OOD set, against the in-distribution test
set. The bench and `peg compare` share them; their tables choose which rows to show."""

from __future__ import annotations

from torch import Tensor

from peg import metrics
from peg.metrics.ood import aupr, auroc, fpr_at_tpr, ood_metrics

CLASSIFICATION = (
    "nll",
    "error",
    "brier",
    "ece",
    "mce",
    "adaptive_ece",
    "classwise_ece",
    "aurc",
    "augrc",
)
OOD = ("auroc", "aupr", "aupr_in", "fpr95")


def labelled_metrics(logits: Tensor, y: Tensor) -> dict[str, float]:
    """`CLASSIFICATION` of member logits `[M, N, C]` against labels `[N]`."""
    # one validation, one confidence ranking shared by the adaptive ECE, AURC and AUGRC
    m = metrics.classification_metrics(logits, y, metrics=CLASSIFICATION)
    return {k: float(m[k]) for k in CLASSIFICATION}


def ood_detection(test_logits: Tensor, ood_logits: Tensor, score: str) -> dict[str, float]:
    """`OOD` of an OOD set's member logits `[M, N_out, C]` against the test set's
    `[M, N_in, C]` (OOD is the positive class; `score` names a `peg.metrics.ood` score)."""
    m = ood_metrics(test_logits, ood_logits, score)
    return {
        "auroc": m["auroc"],
        "aupr": m["aupr_out"],
        "aupr_in": m["aupr_in"],
        "fpr95": m["fpr95"],
    }


def scored_detection(scores_in: Tensor, scores_out: Tensor) -> dict[str, float]:
    """`OOD` from a detector's scores `[N_in]`, `[N_out]` (`peg.OODDetector.ood_score`; higher =
    more likely OOD) instead of a score of the logits."""
    return {
        "auroc": auroc(scores_in, scores_out),
        "aupr": aupr(scores_in, scores_out, "ood"),
        "aupr_in": aupr(scores_in, scores_out, "in"),
        "fpr95": fpr_at_tpr(scores_in, scores_out),
    }
