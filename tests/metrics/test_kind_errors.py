"""Bad input to the metrics, diagrams and conformal predictors of binary scorers, multi-label
heads and dense predictions: each case raises the documented error, before any work. The cases
are rendered into docs/errors.md by tests/errors_table.py."""

from __future__ import annotations

from collections.abc import Callable

import torch

import peg
from bad_inputs import raises_test
from peg import metrics, plots
from peg.methods.conformal.kinds import ConformalBinary, ConformalDense, ConformalMultilabel
from peg.metrics.dense import DenseMetrics

p = torch.tensor([0.2, 0.7, 0.9, 0.4])
y = torch.tensor([0, 1, 1, 0])
multi = torch.rand(4, 3)
hot = torch.tensor([[0, 1, 1], [1, 0, 0], [0, 0, 1], [1, 1, 0]])
maps = torch.randn(2, 3, 4, 4)
pixels = torch.zeros(2, 4, 4, dtype=torch.long)

# (area, bad input, call, error type, regex the message must match)
ERROR_CASES: list[tuple[str, str, Callable[[], object], type[BaseException], str]] = [
    ("metrics", "binary: scores (logits) where P(y = 1) is expected",
     lambda: metrics.binary_nll(p * 10 - 3, y), ValueError,
     r"p: expected probabilities of class 1 in \[0, 1\].*torch\.sigmoid\(scores\)"),
    ("metrics", "binary: probabilities of several columns",
     lambda: metrics.binary_ece(multi, hot), ValueError,
     r"p: expected probabilities of class 1 \[N\] \(or \[N, 1\]\), got shape \(4, 3\); for a "
     r"multi-label head, multilabel_\*"),
    ("metrics", "binary: a label that is not 0, 1 or ignore_index",
     lambda: metrics.binary_brier(p, torch.tensor([0, 2, 1, 0])), ValueError,
     r"y: expected labels 0 or 1 \(or ignore_index=-100\), got 2"),
    ("metrics", "binary: labels of another shape",
     lambda: metrics.binary_nll(p, y[:3]), ValueError,
     r"y: expected labels of the shape of p \(4,\), got \(3,\)"),
    ("metrics", "binary: every label ignored",
     lambda: metrics.binary_ece(p, torch.full((4,), -100)), ValueError,
     r"y: every label is ignore_index \(-100\): nothing to score"),
    ("metrics", "binary: AUROC of labels of one class",
     lambda: metrics.binary_auroc(p, torch.ones(4)), ValueError,
     r"y: AUROC needs labels of both classes .* all are 1"),
    ("metrics", "multilabel: an unknown metric",
     lambda: metrics.multilabel_metrics(multi, hot, metrics=["auroc"]), ValueError,
     r"metrics: unknown \['auroc'\]; known: \['nll', 'brier', 'ece', 'mce', 'error', "
     r"'label_ece'\]"),
    ("metrics", "dense: labels not the logits without their class dimension",
     lambda: metrics.dense_metrics(maps, pixels[:, :3]), ValueError,
     r"y: expected labels \[B, \*S\] = \[2, 4, 4\] for logits of shape \(2, 3, 4, 4\) "
     r"\(C = 3 in dim 1\), got \(2, 3, 4\)"),
    ("metrics", "dense: a class out of range",
     lambda: metrics.dense_metrics(maps, pixels + 3), ValueError, r"y: expected .*\[0, 3\)"),
    ("streaming metrics", "dense: no position to score",
     lambda: DenseMetrics().compute(), ValueError, r"y: no position to score"),
    ("plots", "multilabel diagram: a name per label",
     lambda: plots.multilabel_reliability_diagram(multi, hot, per_label=True, label_names=["a"]),
     ValueError, r"label_names: expected 3 names \(K of p\), got 1"),
    ("conformal", "ConformalBinary: an unknown score",
     lambda: ConformalBinary(score="raps"), ValueError, r"score: expected one of"),
    ("conformal", "ConformalMultilabel: too few calibration points for alpha",
     lambda: ConformalMultilabel(alpha=0.1).fit(multi, hot), ValueError,
     r"p: 4 calibration points are too few for alpha=0\.1: conformal risk control needs "
     r"n >= 1/alpha - 1 = 9"),
    ("conformal", "ConformalDense: predict_set before fit",
     lambda: ConformalDense().predict_set(maps.softmax(1)), peg.NotFittedError,
     r"ConformalDense: call fit\(p, y\) before predict_set"),
    ("conformal", "ConformalClassifier on a binary scorer's scores",
     lambda: peg.ConformalClassifier().fit(torch.randn(4), y), ValueError,
     r"predictor: binary scores \[N\] or \[N, 1\] \(one logit per row\) are not multiclass "
     r"logits \[N, C\].*peg\.methods\.conformal\.kinds\.ConformalBinary"),
    ("conformal", "ConformalClassifier on a multi-label head's logits",
     lambda: peg.ConformalClassifier().fit(torch.randn(4, 3), hot), ValueError,
     r"predictor: multilabel logits \[N, 3\] \(K = 3\) are not multiclass .*ConformalMultilabel"),
    ("evaluate", "saved logits read both as [B, C, *S] and [B, *S, C]",
     lambda: peg.evaluate(torch.randn(2, 5, 5), torch.zeros(2, 5, dtype=torch.long)),
     ValueError, r"class_dim: logits \(2, 5, 5\) with labels \(2, 5\) from X read both"),
    ("evaluate", "task='binary' for logits of several columns",
     lambda: peg.evaluate(torch.randn(4, 3), y, task="binary"), ValueError,
     r"task: 'binary' needs one score per row \[N\] or \[N, 1\]"),
]  # fmt: skip


test_bad_input_raises_a_clear_error = raises_test(ERROR_CASES)
