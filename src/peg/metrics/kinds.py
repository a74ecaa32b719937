"""The metrics of one model's logits of a kind read by `peg.source._kinds.read_kind` (what
`peg.evaluate` reports for saved logits that are not multiclass):

- binary (scores `[N]` or `[N, 1]`, labels 0/1) and multilabel (`[N, K]`, multi-hot): the
  metrics of `peg.metrics.binary` on P(y = 1) = sigmoid(s) (`Kind.proba`), the NLL computed
  from the logits themselves, as the multi-class NLL of the canonical rows `[0, s]` (log-softmax:
  finite where sigmoid(s) rounds to 0 or 1 in float64, |s| > 37);
- dense (`[B, C, *S]` or `[B, *S, C]`, labels `[B, *S]`): `peg.metrics.dense.DenseMetrics`, fed
  `batch_size` images at a time (a float64 copy of one chunk's positions at a time, never of
  all of them).

Labels equal to the kind's `ignore_index` are left out.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from torch import Tensor

from peg.metrics.binary import binary_metrics, multilabel_metrics
from peg.metrics.classification import nll
from peg.metrics.dense import DenseMetrics
from peg.source._kinds import Kind
from peg.source._values import as_tensor, check_finite_logits
from peg.utils.scalars import check_positive_int


def kind_metrics(
    logits: Any,
    labels: Any,
    kind: Kind,
    bins: int = 15,
    min_count: int = 1,
    metrics: str | Iterable[str] | None = None,
    batch_size: int = 512,
) -> dict[str, Any]:
    """The metrics of `logits` (one model's, in `kind`'s shape) on `labels`, by key: binary
    `peg.metrics.BINARY_METRICS`, multilabel `MULTILABEL_METRICS` ("label_ece" a tensor
    `[K]`), dense `DENSE_METRICS` (or `metrics`, any of `CLASSIFICATION_METRICS`)."""
    batch_size = check_positive_int(batch_size, "batch_size")
    z = as_tensor(logits, "logits")
    kind.check(tuple(z.shape), "logits")
    check_finite_logits(z, "logits")
    y = as_tensor(labels, "labels", z.device, owner="pred")
    if kind.kind == "dense":
        stream = DenseMetrics(bins, min_count, metrics, kind.ignore_index, class_dim=kind.class_dim)
        for start in range(0, len(z), batch_size):
            stream.update(z[start : start + batch_size], y[start : start + batch_size])
        return stream.compute()
    if kind.kind not in ("binary", "multilabel"):
        raise ValueError("kind: multiclass logits are read by classification_metrics")
    shape = (-1,) if kind.kind == "binary" else (-1, kind.outputs)
    p = kind.proba(z.double()[None]).reshape(shape)
    y = y.reshape(shape)
    score = binary_metrics if kind.kind == "binary" else multilabel_metrics
    out = score(p, y, bins, min_count, metrics, kind.ignore_index)
    if "nll" in out:
        out["nll"] = _rows_nll(z, y, kind)
    return out


def _rows_nll(z: Tensor, y: Tensor, kind: Kind) -> float:
    """The mean binary NLL from the logits: the multi-class NLL of the rows `[0, s]` kept."""
    rows, labels = kind.kept(kind.rows(z.double()[None]), kind.row_labels(y))
    return nll(rows, labels)
