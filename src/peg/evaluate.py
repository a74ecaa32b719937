"""`evaluate`: the paper's metrics for any predictor on labelled data."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import torch
from torch import Tensor

from peg.errors import NotStreamable
from peg.methods._predictors import (
    iter_member_logits_of,
    member_logits_of,
    predictor_device,
    read_predictor,
)
from peg.methods.conformal._split import labelled_batches
from peg.metrics.conformal import split_selection
from peg.metrics.kinds import KindMetrics, kind_metrics
from peg.metrics.regression import regression_metrics, split_gaussian
from peg.metrics.streaming import StreamingMetrics
from peg.source import Data, Source, Tapped
from peg.source._kinds import IGNORE_INDEX, Kind, read_kind
from peg.source._values import as_tensor, check_labels, class_indices, regression_targets
from peg.source.batches import BatchFn, as_array, batch_rows, check_batch_fn


def evaluate(
    predictor: Any,
    X: Data,
    y: Tensor | None = None,
    bins: int = 15,
    min_count: int = 1,
    batch_size: int = 512,
    y_scale: float | None = None,
    batch_fn: BatchFn | None = None,
    metrics: str | Iterable[str] | None = None,
    classes: Any = None,
    task: str = "auto",
    ignore_index: int = IGNORE_INDEX,
    class_dim: int | None = None,
) -> dict[str, Any]:
    """NLL, error, Brier, ECE and MCE of `predictor` on (X, y) (+ Gibbs NLL for ensembles), or
    the classification metrics `metrics` selects.

    Regression or classification is told by one rule (`peg.source._values.regression_targets`,
    as the calibrators' `fit` and `compare` read labels): integer labels, and floating-point
    labels that are all whole numbers in [0, C) for C outputs, are class labels; other
    floating-point targets mean regression with Gaussian heads (outputs `[B, 2]`: mean,
    log-variance): the result is then RMSE, LPD (log predictive density of the mixture), the
    moment-matched Gaussian NLL and the interval calibration error (`y_scale`: the training
    std of y, for original units). A predictor with one output column (a binary scorer) is
    refused on this path: its saved scores are read as binary (`evaluate(scores, labels)`).

    Args:
        predictor: an nn.Module (one model), a peg method or `Ensemble`, or anything with
            `member_logits(X) -> [M, N, C]`; or saved logits `[N, C]` (a tensor or a NumPy
            array), `X` then their labels: `evaluate(logits, labels)`.
        X: inputs `[N, ...]`, or, when `y` is None, labelled data: a pair `(X, y)`, or a
            DataLoader/Dataset of `(x, y, ...)` or mapping batches (labels under "labels" or
            "label", the rest the model's keyword inputs; `peg.source.batches`), read once without
            gathering the inputs.
        y: labels `[N]` (a tensor, an array or an array-like: a list, a pandas Series).
        bins, min_count: ECE/MCE binning (equal width); `bins` also bins the adaptive and
            classwise ECE.
        batch_fn: `batch_fn(batch) -> (inputs, y)` for loader batches of another shape.
        metrics: classification metrics by key (`peg.metrics.CLASSIFICATION_METRICS`: "nll",
            "error", "brier", "ece", "mce", "gibbs_nll", "adaptive_ece", "classwise_ece",
            "aurc", "augrc"), returned in that order; None: the default set above. Not for
            regression targets, which have their own set. A `peg.ConformalClassifier` adds
            the metrics of its prediction sets (`peg.metrics.CONFORMAL_METRICS`: "coverage",
            "set_size", "worst_class_coverage", "worst_size_coverage").
        classes: the class of each logit column, in order, where the labels name their
            classes (strings): each label is read as its class's column (`y`, the labels of a
            pair, or those of `evaluate(logits, labels)`).
        task, ignore_index, class_dim: how saved logits of another kind are read (`read_kind`
            of `peg.source._kinds`; labels equal to `ignore_index` left out) and reported
            (`peg.metrics.kinds.kind_metrics`: binary scores `[N]` on P(y = 1), AUROC too;
            multi-label `[N, K]` over every label entry, and each label's ECE; dense
            `[B, C, *S]` or `[B, *S, C]` per position, streamed); `metrics` picks the kind's.
            A calibrator fitted on such logits (its `kind_`) is evaluated as that kind, its
            member logits read batch by batch; so is a predictor whose member logits are dense
            (`[M, B, C, *S]`, told by the first batch: a segmentation net, `NextToken(lm)`),
            per position, streamed (`DenseMetrics`).

    Error and ECE are fractions in [0, 1] (tables print them as %).

    Memory: classification is computed batch by batch
    (`peg.metrics.streaming.StreamingMetrics`, state O(bins + classes), [C, bins] for
    "classwise_ece", and O(N) scalars when "adaptive_ece", "aurc" or "augrc", which need a
    global sort by confidence, is selected) from the
    predictor's `iter_member_logits`: one batch's member logits `[M, B, C]` are held at a
    time, never `[M, N, C]`, the labels taken from the same pass (a `peg.source.Tapped`
    stream for loaders and Datasets, slices of `y` for tensors). The
    results equal the one-shot `peg.metrics` on `member_logits` up to the last bits (sums in
    another order; error counts exactly). Every peg predictor streams (`Ensemble`, the fitted
    methods, MC dropout/patching, Packed-Ensembles, temperature scaling of any of them, an
    nn.Module) but a lazy PEG/PEP (`lazy=True`: chunks of members regenerated outside the
    batches) and a foreign object with only `member_logits`: those are
    evaluated on their whole `[M, N, C]`, as before. Regression keeps every prediction: it is
    computed by `peg.metrics.regression_metrics`, which takes all of them at once.
    """
    settings = (bins, min_count, metrics, batch_size, batch_fn)
    if done := _other_kind(predictor, X, y, classes, (task, ignore_index, class_dim), settings):
        return done  # saved logits of another kind than multiclass, or a predictor fitted on them
    # evaluate(logits, labels): SavedLogits(); labels named by `classes` read as indices
    predictor, X = read_predictor(predictor, X, classes=classes, data_name="X", labelled=y is None)
    metrics, keys, conformal = split_selection(metrics, predictor)
    stream = StreamingMetrics(bins, min_count, metrics) if metrics != () else None  # checks first
    device = predictor_device(predictor)
    if y is not None:  # labels follow the predictions: checked against their device
        y = as_tensor(class_indices(y, "y", classes), "y", device, owner="pred")
    batch_fn = check_batch_fn(batch_fn)
    tapped: Tapped | None = None
    if y is None:
        X, y = Source(X, batch_fn).labelled(device)
        if isinstance(X, Tapped):
            tapped, batch_fn = X, None  # the stream carries its own
    elif isinstance(X, (Tensor, np.ndarray)):
        X = Source(X).xy(need_labels=False, device=device)[0]
    if y is not None and not isinstance(X, Tapped) and (isinstance(X, (Tensor, Mapping))):
        _check_count(y, batch_rows(X))
    try:
        batches = iter_member_logits_of(predictor, X, batch_size, batch_fn)
    except NotStreamable:  # a lazy PEG/PEP, a predictor with member_logits only: held whole
        batches = iter([member_logits_of(predictor, X, batch_size, batch_fn)])
    held: list[tuple[Tensor, Tensor]] = []  # regression: every prediction, kept
    dense: KindMetrics | None = None  # a predictor's dense outputs, told by the first batch
    members = n = 0
    regression: bool | None = None  # told on the first batch, by every label at hand
    for logits in batches:
        members, rows = logits.shape[0], logits.shape[1]
        labels = _batch_labels(tapped, y, n, rows, device)
        n += rows
        if regression is None and dense is None:  # dense [M, B, C, *S]: per position
            dense = _dense(logits, labels, (task, ignore_index, class_dim), settings)
        if dense is not None:
            dense.update(logits, labels)
            continue
        if regression is None:
            _check_width(logits)
            regression = regression_targets(labels if y is None else y, logits.shape[-1])
        if regression:
            _check_gaussian(logits, metrics)
            held.append((logits, labels))
        else:
            if torch.is_floating_point(labels):  # whole numbers in [0, C): class labels
                labels = check_labels(labels, rows, logits.shape[-1], "X" if y is None else "y")
            if stream is not None:
                stream.update(logits, labels)
            if conformal is not None:
                conformal.update(logits, labels)
    if y is not None:
        _check_count(y, n)
    if dense is not None:
        return dense.compute()
    if held:
        targets = torch.cat([t for _, t in held]) if y is None else y
        logits = torch.cat([p for p, _ in held], dim=1)
        return regression_metrics(*split_gaussian(logits), targets, y_scale)
    out = {} if stream is None else stream.compute()
    if members == 1:
        out.pop("gibbs_nll", None)  # one member: Gibbs NLL is the NLL
    if conformal is not None:
        out |= conformal.compute()
        out = {k: out[k] for k in keys if k in out}
    return out


def _other_kind(
    predictor: Any,
    X: Any,
    y: Any,
    classes: Any,
    reading: tuple[str, int, int | None],
    settings: tuple[int, int, Any, int, BatchFn | None],
) -> dict[str, Any] | None:
    """The metrics of another kind than multiclass (`peg.metrics.kinds`): of saved logits of
    that kind (`_saved_kind`), or of a predictor fitted on such (a calibrator's `kind_`), read
    batch by batch in one pass; None for everything else (read as before)."""
    bins, min_count, metrics, batch_size, batch_fn = settings
    saved = _saved_kind(predictor, X, y, classes, reading)
    if saved is not None:
        return kind_metrics(as_array(predictor), *saved, bins, min_count, metrics, batch_size)
    kind = getattr(predictor, "kind_", None)  # None before fit (NotFittedError is one)
    if not isinstance(kind, Kind) or kind.kind == "multiclass":
        return None
    stream = KindMetrics(kind, bins, min_count, metrics)
    data = X if y is None else (X, y)
    for logits, labels in labelled_batches(predictor, data, batch_size, batch_fn, "X"):
        stream.update(logits, labels)
    return stream.compute()


def _saved_kind(
    predictor: Any, labels: Any, y: Any, classes: Any, reading: tuple[str, int, int | None]
) -> tuple[Tensor, Kind] | None:
    """The labels of saved logits `evaluate(logits, labels)` and their kind (`read_kind`; named
    classes mapped by `classes`: a binary scorer's two), None where they are read as before:
    multiclass, and whatever is not saved logits with their labels. Logits `[N, C]` (C >= 2)
    with labels `[N]` and `task` "auto" or "multiclass" are not read again (their checks and
    messages are the multiclass path's)."""
    if y is not None and isinstance(predictor, (Tensor, np.ndarray)):
        raise ValueError("y: evaluate(logits, labels) takes the labels second, not as y")
    task, ignore_index, class_dim = reading
    logits = as_array(predictor)
    if y is not None or labels is None or not isinstance(logits, (Tensor, np.ndarray)):
        return None
    shape = tuple(logits.shape)
    named = class_indices(labels, "labels", classes)
    target = as_tensor(named, "labels")
    plain = len(shape) == 2 and shape[1] >= 2 and target.ndim == 1
    if plain and task in ("auto", "multiclass"):
        return None
    kind = read_kind(shape, target, task, ignore_index, "X", class_dim)
    return None if kind.kind == "multiclass" else (target, kind)


def _batch_labels(
    tapped: Tapped | None, y: Tensor | None, n: int, rows: int, device: Any
) -> Tensor:
    """The labels of the batch of `rows` predictions from row `n`: those the `tapped` stream
    recorded as the predictor read it, or a slice of `y`."""
    if tapped is not None:
        return check_labels(tapped.take_labels(), rows, None, "X", device, targets=True)
    assert y is not None
    labels = y[n : n + rows]
    if labels.shape[0] != rows:
        raise ValueError(f"y: expected more than {len(y)} labels (N of pred)")
    return labels


def _dense(
    logits: Tensor,
    labels: Tensor,
    reading: tuple[str, int, int | None],
    settings: tuple[int, int, Any, int, BatchFn | None],
) -> KindMetrics | None:
    """The metrics of a predictor's dense member logits `[M, B, C, *S]` (or `[M, B, *S, C]`)
    with labels `[B, *S]` per position, streamed (`read_kind` of the first batch: an error
    naming what does not fit); None for member logits `[M, B, C]`, read as before."""
    if logits.ndim <= 3:
        return None
    task, ignore_index, class_dim = reading
    kind = read_kind(tuple(logits.shape[1:]), labels, task, ignore_index, "X", class_dim)
    return KindMetrics(kind, *settings[:3])


def _check_count(y: Any, n: int) -> None:
    if len(y) != n:
        raise ValueError(f"y: expected {n} labels (N of pred), got {len(y)}")


def _check_width(logits: Tensor) -> None:
    """A ValueError for one output column: a binary scorer, which no metric here reads (its
    softmax is 1 whatever the score: every metric would be 0)."""
    if logits.shape[-1] == 1:
        raise ValueError(
            "predictor: gives 1 column of logits [N, 1], a binary scorer, which evaluate reads "
            "as saved scores: evaluate(scores, labels) with labels 0/1; or pass two columns, "
            "the logits [0, s] of a score s of class 1 (softmax: 1 - sigmoid(s), sigmoid(s))"
        )


def _check_gaussian(logits: Tensor, metrics: Any) -> None:
    """What regression targets need: Gaussian heads `[B, 2]`, and no classification metrics."""
    if metrics is not None:
        raise ValueError(
            "metrics: selects classification metrics; floating-point targets mean "
            "regression, whose metrics (rmse, lpd, nll, calibration_error) are fixed"
        )
    if logits.shape[-1] != 2:
        C = logits.shape[-1]
        raise ValueError(
            f"y: floating-point targets that are not class indices (whole numbers in [0, {C})) "
            f"mean regression, which needs Gaussian heads with outputs [B, 2] (mean, "
            f"log-variance); the predictor gives [B, {C}]. For classification pass class "
            f"indices in [0, {C})"
        )
