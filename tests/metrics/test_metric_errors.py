"""Bad input to the metrics, streaming and not: each case raises the documented error,
before any work. The cases are rendered into docs/errors.md by tests/errors_table.py.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

from bad_inputs import (
    _mlp,
    logits,
    raises_test,
)
from peg import metrics
from peg.metrics import diversity, ood, regression
from peg.metrics.streaming import StreamingMetrics, StreamingOOD


def _two_kinds() -> None:
    stream = StreamingMetrics()
    stream.update(logits, torch.tensor([0, 1, 2, 0]))
    stream.update(torch.full((4, 3), 1 / 3), torch.tensor([0, 1, 2, 0]))


probs_bad = torch.tensor([[0.5, 0.4, 0.3]])


# (area, bad input, call, error type, regex the message must match)
ERROR_CASES: list[tuple[str, str, Callable[[], object], type[BaseException], str]] = [
    (
        "metrics",
        "probabilities not summing to 1",
        lambda: metrics.nll(probs_bad, torch.tensor([0])),
        ValueError,
        "sum to 1",
    ),
    (
        "metrics",
        "NaN in predictions",
        lambda: metrics.nll(torch.full((1, 2, 3), float("nan")), torch.tensor([0, 1])),
        ValueError,
        "finite",
    ),
    (
        "metrics",
        "labels out of range",
        lambda: metrics.error(logits, torch.tensor([0, 1, 2, 3])),
        ValueError,
        "y",
    ),
    (
        "metrics",
        "labels of the wrong length",
        lambda: metrics.ece(logits, torch.tensor([0, 1])),
        ValueError,
        "labels",
    ),
    (
        "metrics",
        "wrong rank",
        lambda: metrics.brier(torch.zeros(3), torch.tensor([0])),
        ValueError,
        r"\[N, C\]",
    ),
    (
        "ood",
        "empty OOD scores",
        lambda: ood.auroc(torch.ones(3), torch.ones(0)),
        ValueError,
        "scores_out",
    ),
    (
        "ood",
        "mutual information without members",
        lambda: ood.mutual_information(torch.full((2, 3), 1 / 3)),
        ValueError,
        "member",
    ),
    (
        "regression",
        "negative variance",
        lambda: regression.log_predictive_density(torch.zeros(3), -torch.ones(3), torch.zeros(3)),
        ValueError,
        "var",
    ),
    (
        "diversity",
        "fewer than 2 members",
        lambda: diversity.disagreement(torch.randn(1, 4, 3)),
        ValueError,
        "at least 2 members",
    ),
    # ---------------------------------------------------------------- metrics
    (
        "metrics",
        "non-integer float labels",
        lambda: metrics.nll(logits, torch.tensor([0.5, 1, 2, 0])),
        ValueError,
        "integer labels",
    ),
    (
        "metrics",
        "one-hot labels",
        lambda: metrics.nll(logits, torch.zeros(4, 3)),
        ValueError,
        r"shape \[4\]",
    ),
    (
        "metrics",
        "negative probabilities",
        lambda: metrics.nll(torch.tensor([[1.5, -0.5]]), torch.tensor([0])),
        ValueError,
        "negative",
    ),
    (
        "metrics",
        "empty predictions",
        lambda: metrics.nll(torch.zeros(0, 3), []),
        ValueError,
        "empty",
    ),
    ("metrics", "bins < 1", lambda: metrics.ece(logits, [0, 1, 2, 0], bins=0), ValueError, "bins"),
    ("metrics", "predictions of the wrong type", lambda: metrics.nll("p", [0]), TypeError, "pred"),
    (
        "metrics",
        "ragged nested lists",
        lambda: metrics.nll([[0.5, 0.5], [1.0]], [0, 1]),
        ValueError,
        "pred: not a rectangular array",
    ),
    (
        "metrics",
        "probabilities where member logits are needed",
        lambda: metrics.member_nll(torch.full((2, 3), 1 / 3), torch.tensor([0, 1])),
        ValueError,
        r"\[M, N, C\]",
    ),
    (
        "metrics",
        "predictions on the meta device",
        lambda: metrics.nll(logits.to("meta"), torch.tensor([0, 1, 2, 0])),
        ValueError,
        "pred: on the meta device",
    ),
    (
        "metrics",
        "labels on another device than the predictions (meta)",
        lambda: metrics.ece(logits, torch.tensor([0, 1, 2, 0], device="meta")),
        ValueError,
        "y: on the meta device .* pred is on cpu",
    ),
    ("streaming metrics", "bins < 1", lambda: StreamingMetrics(bins=0), ValueError, "bins"),
    (
        "streaming metrics",
        "min_count < 1",
        lambda: StreamingMetrics(min_count=0),
        ValueError,
        "min_count",
    ),
    (
        "streaming metrics",
        "compute before any batch",
        lambda: StreamingMetrics().compute(),
        ValueError,
        "no batches",
    ),
    (
        "streaming metrics",
        "a batch of another kind",
        lambda: _two_kinds(),
        ValueError,
        "same kind",
    ),
    (
        "streaming metrics",
        "labels out of range",
        lambda: StreamingMetrics().update(logits, torch.tensor([0, 1, 2, 3])),
        ValueError,
        r"labels in \[0, 3\)",
    ),
    (
        "streaming metrics",
        "an unknown metric key",
        lambda: StreamingMetrics(metrics=["nll", "AURC"]),
        ValueError,
        r"metrics: unknown \['AURC'\]",
    ),
    (
        "metrics",
        "adaptive ECE with bins < 1",
        lambda: metrics.adaptive_ece(logits, [0, 1, 2, 0], bins=0),
        ValueError,
        "bins",
    ),
    (
        "metrics",
        "classwise ECE with bins < 1",
        lambda: metrics.classwise_ece(logits, [0, 1, 2, 0], bins=0),
        ValueError,
        "bins",
    ),
    (
        "metrics",
        "an unknown metric key",
        lambda: metrics.classification_metrics(logits, [0, 1, 2, 0], metrics=["auc"]),
        ValueError,
        r"metrics: unknown \['auc'\]; known: \['nll'",
    ),
    (
        "selective",
        "confidence of the wrong shape",
        lambda: metrics.aurc(logits, [0, 1, 2, 0], confidence=torch.zeros(4, 3)),
        ValueError,
        r"confidence: expected one score per point, shape \[4\]",
    ),
    (
        "selective",
        "confidence with NaN",
        lambda: metrics.augrc(logits, [0, 1, 2, 0], confidence=torch.full((4,), math.nan)),
        ValueError,
        "confidence: expected finite",
    ),
    (
        "selective",
        "coverage outside (0, 1]",
        lambda: metrics.risk_at_coverage(logits, [0, 1, 2, 0], 1.5),
        ValueError,
        r"coverage: expected a number in \(0, 1\]",
    ),
    (
        "selective",
        "unknown AURC interpolation",
        lambda: metrics.aurc(logits, [0, 1, 2, 0], interpolation="spline"),
        ValueError,
        "interpolation: expected 'exact' or 'linear'",
    ),
    (
        "selective",
        "coverage 0",
        lambda: metrics.risk_at_coverage(logits, [0, 1, 2, 0], 0),
        ValueError,
        r"coverage: expected a number in \(0, 1\]",
    ),
    ("streaming OOD", "unknown score", lambda: StreamingOOD("odin"), ValueError, "score"),
    (
        "streaming OOD",
        "compute without OOD batches",
        lambda: StreamingOOD().compute(),
        ValueError,
        "both",
    ),
    (
        "ood",
        "tpr outside (0, 1]",
        lambda: ood.fpr_at_tpr(torch.ones(3), torch.ones(3), 1.5),
        ValueError,
        "tpr",
    ),
    (
        "ood",
        "unknown score",
        lambda: ood.ood_metrics(logits, logits, "odin"),
        ValueError,
        "score",
    ),
    (
        "ood",
        "NaN scores",
        lambda: ood.auroc(torch.tensor([float("nan")]), torch.ones(2)),
        ValueError,
        "finite",
    ),
    (
        "regression",
        "targets of the wrong length",
        lambda: regression.rmse(torch.zeros(3), torch.zeros(4)),
        ValueError,
        "y",
    ),
    (
        "regression",
        "NaN targets",
        lambda: regression.rmse(torch.zeros(3), torch.tensor([0, float("nan"), 0])),
        ValueError,
        "finite",
    ),
    (
        "regression",
        "outputs that are not Gaussian heads",
        lambda: regression.split_gaussian(torch.zeros(3, 3)),
        ValueError,
        r"\[\.\.\., 2\]",
    ),
    (
        "regression",
        "y_scale <= 0",
        lambda: regression.rmse(torch.zeros(3), torch.zeros(3), y_scale=-1),
        ValueError,
        "y_scale",
    ),
    (
        "regression",
        "coverage levels outside (0, 1)",
        lambda: regression.interval_coverage(
            torch.zeros(3), torch.ones(3), torch.zeros(3), levels=[1.5]
        ),
        ValueError,
        "levels",
    ),
    (
        "diversity",
        "state dicts of different architectures",
        lambda: diversity.weight_matrix([_mlp().state_dict(), nn.Linear(2, 4).state_dict()]),
        ValueError,
        "differs",
    ),
]


test_bad_input_raises_a_clear_error = raises_test(ERROR_CASES)
