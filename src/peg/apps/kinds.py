"""AutoSelect and compare on saved logits of another kind than multiclass (binary scores `[N]`,
multilabel `[N, K]`, dense `[B, C, *S]`: `peg.source._kinds`): the maps are fitted on the native
logits of whole SAMPLES (a fold's rows of scores, its images `[B]`), and scored on the canonical
rows of the held-out samples whose label is not ignored.

The points averaged are those rows (`Points`, `kind_rows`): the mean of their NLL is the
kind's NLL (binary: the NLL of P(y = 1); multilabel: the mean binary NLL over every label
entry; dense: the mean over the positions not ignored), and the paired differences, the one-SE
rule and the verdict read them as they read a multiclass model's points. compare's columns are
the kind's own metrics where it has them (`kind_scores`: ECE on P(y = 1), ...). A sample's rows
are scored together (a sample is never split across folds), so the SEs, which take the rows as
independent, are on the low side for dense and multilabel inputs.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

from peg.methods._predictors import stateless
from peg.methods.calibration._calibrator import calibrators
from peg.metrics.kinds import KindMetrics
from peg.source._kinds import Kind, read_kind
from peg.source.batches import from_numpy, is_pair


class Points:
    """The selection's points of `kind` with native labels `y` (`[N]`, `[N, K]`, `[B, *S]`):
    the canonical rows not ignored, `len(self)` of them, in the rows' order.

    `of(samples)` gives the points of some samples (indices `[n]` into the native data) and
    `rows(logits, samples)` their member logits `[M, len(of(samples)), W]` and labels."""

    def __init__(self, kind: Kind, y: Tensor) -> None:
        self.kind = kind
        labels = kind.row_labels(y, "val labels")  # [R], validated
        self.per_sample = len(labels) // len(y)  # rows of one sample: 1, K or prod(S)
        self.keep = (labels != kind.ignore_index).cpu()
        self.labels = labels[self.keep.to(labels.device)]
        # each row's point index (-1 where ignored)
        self.index = torch.cumsum(self.keep.long(), 0) - 1
        self.index[~self.keep] = -1
        if not len(self.labels):
            raise ValueError("val labels: every entry equals ignore_index; nothing to select on")

    def __len__(self) -> int:
        return len(self.labels)

    def _row_mask(self, samples: Tensor) -> tuple[Tensor, Tensor]:
        """The rows of `samples` (`[n * per_sample]`, in their order) and which are kept."""
        r = self.per_sample
        rows = (samples.cpu()[:, None] * r + torch.arange(r)).reshape(-1)
        return rows, self.keep[rows]

    def of(self, samples: Tensor) -> Tensor:
        """The point indices of the samples `samples` (their kept rows)."""
        rows, kept = self._row_mask(samples)
        return self.index[rows[kept]]

    def rows(self, logits: Tensor, samples: Tensor) -> tuple[Tensor, Tensor]:
        """Native member logits `[M, n, ...]` of the samples `samples` as their kept canonical
        rows `[M, n_kept, W]`, and those rows' labels."""
        rows = self.kind.rows(logits)
        _, kept = self._row_mask(samples)
        kept = kept.to(rows.device)
        return rows[:, kept], self.labels[self.of(samples).to(self.labels.device)]

    def strata(self, y: Tensor) -> Tensor:
        """What the folds are stratified by, one value per sample: the label where a sample is
        one row (binary), else none (multilabel, dense: the samples dealt out at random)."""
        if self.kind.kind == "binary":
            flat = y.reshape(len(y)).cpu().long()
            return torch.where(flat == self.kind.ignore_index, 2, flat)
        return torch.zeros(len(y), dtype=torch.long)


def kind_options(kind: Kind | None) -> dict[str, Any]:
    """The calibrators' arguments that say how to read the native logits (nothing for
    multiclass: every map's defaults, as before)."""
    if kind is None or kind.kind == "multiclass":
        return {}
    task = "multiclass" if kind.kind == "dense" else kind.kind
    options: dict[str, Any] = {"task": task, "ignore_index": kind.ignore_index}
    if kind.kind == "dense":
        options["class_dim"] = kind.class_dim
    return options


def saved_kind(val: Any, task: str, ignore_index: int, nested: bool) -> Kind | None:
    """The kind of saved logits `val = (logits, labels)`, None where multiclass (the path every
    multiclass fit takes, as before) or not a pair of arrays (a loader through
    `nn.Identity()`); with `nested`, another kind is refused."""
    if not (is_pair(val) and hasattr(val[1], "shape")):
        return None
    logits, y = val
    shape = tuple(logits.shape)
    if len(shape) == 2 and len(y.shape) == 1 and task in ("auto", "multiclass"):
        return None
    kind = read_kind(shape, y, task, ignore_index)
    if kind.kind == "multiclass":
        return None
    if nested:
        raise ValueError(
            f"nested: scores multiclass selections only; got {kind.describe()} (pass nested=False)"
        )
    return kind


def fitted_kind(predictor: Any) -> Any:
    """`predictor` where it is a map fitted on another kind than multiclass (it predicts in
    that kind's shapes), else None."""
    kind = getattr(predictor, "kind_", None)
    return predictor if isinstance(kind, Kind) and kind.kind != "multiclass" else None


def kind_rows(kind: Kind, logits: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
    """Native member logits `[M, *shape]` and labels as the kind's canonical rows not ignored
    `[M, R, W]` and their labels `[R]`: what compare scores and keeps per point."""
    return kind.kept(kind.rows(logits), kind.row_labels(y, "labels").to(logits.device))


def kind_scores(kind: Kind, logits: Tensor, y: Tensor, bins: int, keys: Any) -> dict[str, float]:
    """The kind's own metrics (`peg.metrics.kinds`: binary ones on P(y = 1), multilabel ones
    over every label entry, dense ones per position) of native member logits, among `keys`."""
    stream = KindMetrics(kind, bins, 1, None)
    stream.update(logits, y)
    return {k: float(v) for k, v in stream.compute().items() if k in keys}


def kind_points(kind: Kind, points: dict[str, Tensor]) -> dict[str, Tensor]:
    """Per-row values (`apps.verdict.per_point` of the rows) in the kind's units: the Brier
    score of a 2-column row is twice the binary one, (p - y)^2, which the kind reports."""
    if kind.kind in ("binary", "multilabel"):
        points = {**points, "brier": points["brier"] / 2}
    return points


def check_sets(kind: Kind, sets: dict[str, Any], task: str) -> None:
    """Each labelled set `name → (logits, labels)` of saved logits read as `kind` (the shapes
    and the label values), before any fitting: a ValueError naming the set otherwise."""
    for name, data in sets.items():
        if not (is_pair(data) and hasattr(data[1], "shape")):
            raise ValueError(
                f"{name}: expected saved logits and their labels (logits, labels) like val's, "
                f"{kind.describe()}, got {type(data).__name__}"
            )
        logits, y = data
        read = read_kind(tuple(logits.shape), y, task, kind.ignore_index, name, kind.class_dim)
        if (read.kind, read.width, read.outputs) != (kind.kind, kind.width, kind.outputs):
            raise ValueError(f"{name}: {read.describe()}, but val's are {kind.describe()}")
        read.row_labels(y, f"{name} labels")


def compared_kind(
    model: Any, val: Any, methods: Any, task: str, ignore_index: int
) -> tuple[Kind | None, Any]:
    """compare's kind of saved logits (None: multiclass, or a model), and its methods: by
    default on another kind, the model and the maps that take the kind (`calibrators(kind)`)."""
    kind = saved_kind(val, task, ignore_index, False) if stateless(model) else None
    if methods is None and kind is not None:
        methods = ["Model", *(c.name for c in calibrators(kind.kind))]
    return kind, methods


def read_saved(
    X: Any, y: Any, options: tuple[str, str], task: str, ignore_index: int, paths: Any
) -> tuple[Tensor, Tensor]:
    """Saved logits `X` of another kind than multiclass and their labels `y` (NumPy arrays
    read from the `.npy` files `paths`), checked as `task` reads them (the shapes, the label
    values: a ValueError naming the option, `options`), as tensors (labels int64)."""
    what, labels_what = options
    if X.dtype.kind != "f":
        raise ValueError(
            f"{what}: expected floating-point logits, got dtype {X.dtype} in {paths[0]}"
        )
    if y.dtype.kind not in "iufb":
        raise ValueError(f"{labels_what}: expected integer labels, got {y.dtype} in {paths[1]}")
    kind = read_kind(tuple(X.shape), y, task, ignore_index, what)
    kind.row_labels(torch.from_numpy(np.asarray(y)), labels_what)  # the values, 0/1 or classes
    return from_numpy(X), torch.from_numpy(np.asarray(y).astype(np.int64))
