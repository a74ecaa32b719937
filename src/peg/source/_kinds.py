"""The kind of problem a model's outputs and their labels are, read once (`read_kind`), and the
one translation of every kind into canonical multiclass ROWS and back (`Kind`).

Every consumer (the calibrators, the metrics, conformal) works on rows `[R, W]` of W >= 2
columns whose softmax is a prediction, with labels `[R]` (class indices): the multiclass case.
The other kinds are read into such rows, and the results put back in the input's shape:

- multiclass: logits `[N, C]` (C >= 2), labels `[N]`: the rows are the logits, `[N, C]`.
- binary: one score per row, `[N]` or `[N, 1]`, labels 0/1 `[N]` or `[N, 1]`: rows `[N, 2]` =
  `[0, s]` (their softmax is `(1 - sigmoid(s), sigmoid(s))`), labels the class index 0/1.
- multilabel: logits `[N, K]` with multi-hot labels `[N, K]` (K independent binary labels):
  rows `[N*K, 2]`, row `n*K + k` is `[0, s_nk]` (n-major: label k's rows are `rows[k::K]`),
  labels `[N*K]`.
- dense: logits `[B, C, *S]` (torch's layout, `class_dim=1`) or `[B, *S, C]` (a language
  model's `[B, T, V]`, `class_dim=-1`) with labels `[B, *S]`: rows `[B*prod(S), C]` (the class
  dimension moved last, then flattened in the labels' order), labels `[B*prod(S)]`.

Labels equal to `ignore_index` (torch's `cross_entropy` default, -100) are left out of every
fit (`Kind.kept`); predictions keep every position. Member logits keep their members dimension
M in front: `Kind.rows` maps `[M, *shape]` to `[M, R, W]`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import Tensor

from peg.source._values import as_tensor, refuse_bool_labels

KINDS = ("multiclass", "binary", "multilabel", "dense")
TASKS = ("auto", "multiclass", "binary", "multilabel")
IGNORE_INDEX = -100  # torch's `cross_entropy` default
CLASS_DIMS = (1, -1)  # dense logits `[B, C, *S]` (torch's layout) or `[B, *S, C]` (a LM's)
_SETTLE = "pass task= ('multiclass', 'binary' or 'multilabel') to say which"


@dataclass(frozen=True)
class Kind:
    """A kind of problem (one of `KINDS`) and the shape facts its rows need.

    Attributes:
        kind: one of `KINDS`.
        width: W, the columns of the canonical rows: C (multiclass, dense), 2 (binary,
            multilabel).
        outputs: the model's outputs per row: C (multiclass, dense), 1 (binary), K (multilabel).
        ignore_index: the label left out of fits (never a class in `[0, width)`).
        class_dim: dense only, where the classes are: 1 (`[B, C, *S]`) or -1 (`[B, *S, C]`).
    """

    kind: str
    width: int
    outputs: int
    ignore_index: int = IGNORE_INDEX
    class_dim: int = 1

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind: expected one of {KINDS}, got {self.kind!r}")
        two = self.kind in ("binary", "multilabel")
        if (self.width != 2) if two else (self.width < 2):
            raise ValueError(f"kind: a {self.kind} kind has rows of 2 columns, got {self.width}")
        if (self.outputs != 1 if self.kind == "binary" else self.outputs < 1) or (
            not two and self.outputs != self.width
        ):
            raise ValueError(f"kind: {self.outputs} outputs do not fit a {self.kind} kind")
        if self.class_dim not in CLASS_DIMS or (self.kind != "dense" and self.class_dim != 1):
            raise ValueError(f"kind: class_dim must be 1 or -1 (dense only), got {self.class_dim}")
        if 0 <= self.ignore_index < self.width:
            raise ValueError(_ignored_class(self.ignore_index, self.width))

    # ---------------------------------------------------------------- to rows
    def rows(self, logits: Tensor, name: str = "logits") -> Tensor:
        """Member logits `[M, *shape]` (`shape` this kind's: `[N]`, `[N, 1]`, `[N, C]`,
        `[N, K]`, `[B, C, *S]` or `[B, *S, C]`) as canonical rows `[M, R, width]`, the same
        dtype and device (a ValueError naming `name` for logits of another shape)."""
        self.check(tuple(logits.shape[1:]), name)
        m = logits.shape[0]
        if self.kind == "multiclass":
            return logits
        if self.kind == "dense":
            moved = logits.movedim(2, -1) if self.class_dim == 1 else logits
            return moved.reshape(m, -1, self.width)
        s = logits.reshape(m, -1)  # binary [M, N]; multilabel n-major [M, N*K]
        return torch.stack([torch.zeros_like(s), s], -1)

    def row_labels(self, y: Any, name: str = "labels") -> Tensor:
        """Labels in this kind's shape (`[N]`, `[N, 1]` binary, `[N, K]` multi-hot, `[B, *S]`
        dense; floats that are whole numbers accepted) as class indices `[R]` int64 on their
        own device, in the rows' order; entries equal to `ignore_index` kept as it. A ValueError
        naming `name` for any other value (binary and multilabel: 0 or 1)."""
        t = as_tensor(y, name)
        if self.kind in ("multiclass", "dense"):
            refuse_bool_labels(t, name)
        elif t.dtype == torch.bool:  # True: the positive class
            t = t.long()
        if t.ndim == 0 or t.is_complex():
            raise ValueError(f"{name}: expected labels with a shape, got {tuple(t.shape)}")
        if t.is_floating_point():
            bad = ~torch.isfinite(t) | (t != t.round())
            if bool(bad.any()):
                raise ValueError(
                    f"{name}: expected integer labels, got non-integer values "
                    f"(e.g. {t[bad][0].item()})"
                )
        flat = t.reshape(-1).long()
        bad = ((flat < 0) | (flat >= self.width)) & (flat != self.ignore_index)
        if bool(bad.any()):
            first = int(flat[bad][0])
            what = (
                "0 or 1 (the negative or the positive class)"
                if self.width == 2 and self.kind != "multiclass"
                else f"class indices in [0, {self.width}) (C = {self.width})"
            )
            raise ValueError(
                f"{name}: expected {self._labels_text()} labels, {what}, or ignore_index "
                f"{self.ignore_index}; got {first} ({int(bad.sum())} of {flat.numel()} entries)"
            )
        return flat

    def kept(self, rows: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        """Rows `[M, R, W]` and row labels `[R]` without the rows whose label is `ignore_index`
        (what every fit reads; as they are when none is ignored)."""
        keep = y != self.ignore_index
        if bool(keep.all()):
            return rows, y
        return rows[:, keep], y[keep]

    # ---------------------------------------------------------------- back to the input's shape
    def back(self, rows: Tensor, like_shape: Sequence[int]) -> Tensor:
        """Per-row probabilities `[*lead, R, W]` as the input's shape `[*lead, *like_shape]`
        (`like_shape`: one model's logits' shape): multiclass `[N, C]`; binary P(y = 1), `[N]`
        or `[N, 1]`; multilabel each label's P(y = 1), `[N, K]`; dense `[B, C, *S]` (or
        `[B, *S, C]` with `class_dim=-1`)."""
        if self.kind in ("binary", "multilabel"):
            return rows[..., 1].reshape(*rows.shape[:-2], *like_shape)
        return self._unrows(rows, like_shape)

    def native(self, rows: Tensor, like_shape: Sequence[int]) -> Tensor:
        """Calibrated log-scores rows `[*lead, R, W]` as native logits `[*lead, *like_shape]`
        whose softmax (multiclass, dense) or sigmoid (binary, multilabel: `s1 - s0`) is the
        calibrated prediction: what a calibrated predictor's `member_logits` gives."""
        if self.kind in ("binary", "multilabel"):
            return (rows[..., 1] - rows[..., 0]).reshape(*rows.shape[:-2], *like_shape)
        return self._unrows(rows, like_shape)

    def _unrows(self, rows: Tensor, like_shape: Sequence[int]) -> Tensor:
        lead = rows.shape[:-2]
        if self.kind == "multiclass" or self.class_dim == -1:
            return rows.reshape(*lead, *like_shape)
        b, c, *s = like_shape  # [*lead, B*prod(S), C] -> [*lead, B, *S, C] -> [*lead, B, C, *S]
        return rows.reshape(*lead, b, *s, c).movedim(-1, len(lead) + 1)

    def proba(self, logits: Tensor) -> Tensor:
        """Probabilities `[*shape]` from member logits `[M, *shape]`: each member's sigmoid
        (binary, multilabel) or softmax over the classes (multiclass, dense), averaged."""
        if self.kind in ("binary", "multilabel"):
            return logits.sigmoid().mean(0)
        dim = 2 if self.kind == "dense" and self.class_dim == 1 else -1
        return logits.softmax(dim).mean(0)

    def decide(self, probs: Tensor) -> Tensor:
        """Predicted labels from probabilities `[*shape]`: the class (multiclass `[N]`, dense
        `[B, *S]`), or 0/1 per entry where P(y = 1) > 1/2 (binary, multilabel: the shape of
        `probs`), int64."""
        if self.kind in ("binary", "multilabel"):
            return (probs > 0.5).long()
        dim = 1 if self.kind == "dense" and self.class_dim == 1 else -1
        return probs.argmax(dim)

    # ---------------------------------------------------------------- checks and records
    def check(self, shape: tuple[int, ...], name: str = "logits") -> None:
        """A ValueError naming `name` unless `shape` (one model's logits, no members
        dimension) is one of this kind's, of the width it was read with."""
        ok = len(shape) >= 1 and all(d >= 1 for d in shape)
        if self.kind == "binary":
            ok = ok and (len(shape) == 1 or (len(shape) == 2 and shape[1] == 1))
        elif self.kind in ("multiclass", "multilabel"):
            ok = ok and len(shape) == 2 and shape[1] == self.outputs
        else:
            ok = ok and len(shape) >= 3 and shape[self.class_dim] == self.width
        if not ok:
            raise ValueError(
                f"{name}: this was fitted on {self.describe()}, got logits of shape {shape}"
            )

    def describe(self) -> str:
        """The kind and its shapes in words, for messages."""
        c = self.width
        return {
            "multiclass": f"multiclass logits [N, {c}] (C = {c})",
            "binary": "binary scores [N] or [N, 1] (one logit per row)",
            "multilabel": f"multilabel logits [N, {self.outputs}] (K = {self.outputs})",
            "dense": f"dense logits [B, {c}, *S] (C = {c})"
            if self.class_dim == 1
            else f"dense logits [B, *S, {c}] (C = {c})",
        }[self.kind]

    def _labels_text(self) -> str:
        return {"binary": "binary", "multilabel": "multi-hot"}.get(self.kind, "class")

    def entry(self) -> dict[str, Any]:
        """The kind as JSON (what an archive records)."""
        return asdict(self)

    @classmethod
    def from_entry(cls, entry: Any) -> Kind:
        """The kind an archive recorded (`entry()`'s); a ValueError when it is not one."""
        fields = ("kind", "width", "outputs", "ignore_index", "class_dim")
        if not isinstance(entry, Mapping) or set(entry) - set(fields) or "kind" not in entry:
            raise ValueError(f"kind: expected a mapping of {fields}, got {entry!r}"[:300])
        values = {k: entry[k] for k in fields if k in entry}
        if not all(type(v) is int for k, v in values.items() if k != "kind"):
            raise ValueError(f"kind: expected integers beside the kind, got {values!r}"[:300])
        return cls(**values)


def multiclass(classes: int, ignore_index: int = IGNORE_INDEX) -> Kind:
    """The multiclass kind of C = `classes` (what a map fitted before kinds existed is)."""
    return Kind("multiclass", classes, classes, ignore_index)


def read_kind(
    logits_shape: tuple[int, ...],
    labels: Any | None,
    task: str = "auto",
    ignore_index: int = IGNORE_INDEX,
    name: str = "val",
    class_dim: int | None = None,
) -> Kind:
    """The kind of one model's logits of shape `logits_shape` (no members dimension) with
    `labels` (anything with a `.shape`; None: the shape alone decides), read from the shapes
    alone (no value is read, nothing is synchronised):

    - `[N]` or `[N, 1]` with labels `[N]` or `[N, 1]`: binary (`task="multilabel"`: K = 1);
    - `[N, K]` with labels `[N, K]`: multilabel; `[N, C]` with `[N]`: multiclass (C >= 2);
    - `[B, C, *S]` with `[B, *S]`: dense (`class_dim=1`); `[B, *S, C]` with `[B, *S]`: dense
      with the classes last (`class_dim=-1`, a language model's `[B, T, V]`); where both
      read (`[B, 5, 5]` with `[B, 5]`), `class_dim` settles it.

    `task` ("auto" or one of the other `TASKS`) confirms or settles the reading; a reading it
    contradicts is a ValueError naming `task` (and `name`, the data's argument)."""
    if task not in TASKS:
        raise ValueError(f"task: expected one of {list(TASKS)}, got {task!r}")
    if class_dim is not None and class_dim not in CLASS_DIMS:
        raise ValueError(f"class_dim: expected None, 1 or -1, got {class_dim!r}")
    shape = tuple(int(d) for d in logits_shape)
    if len(shape) == 0 or 0 in shape:
        raise ValueError(f"{name}: expected logits with N >= 1 rows, got shape {shape}")
    y = None if labels is None else tuple(int(d) for d in labels.shape)
    if y is not None and (not y or y[0] != shape[0]):
        raise ValueError(f"{name}: {shape[0]} rows of logits {shape} but labels of shape {y}")
    if len(shape) == 1 or (len(shape) == 2 and shape[1] == 1):
        kind = _one_score(shape, y, task, name)
    elif len(shape) == 2:
        kind = _two_d(shape, y, task, name)
    else:
        kind = _dense(shape, y, task, name, class_dim)
    return Kind(kind.kind, kind.width, kind.outputs, ignore_index, kind.class_dim)


def _one_score(shape: tuple[int, ...], y: tuple[int, ...] | None, task: str, name: str) -> Kind:
    """`[N]` or `[N, 1]`: one score per row, a binary scorer."""
    if task == "multiclass":
        raise ValueError(
            f"task: 'multiclass' needs logits [N, C] with C >= 2, got one score per row "
            f"{shape} from {name}: one logit per row is a binary scorer (task='binary' or "
            "'auto'), or pass every class's logit"
        )
    if y is not None and y not in ((shape[0],), (shape[0], 1)):
        raise ValueError(
            f"{name}: binary scores {shape} need labels [N] or [N, 1] (0 or 1), got shape {y}"
        )
    return Kind("multilabel" if task == "multilabel" else "binary", 2, 1)


def _two_d(shape: tuple[int, ...], y: tuple[int, ...] | None, task: str, name: str) -> Kind:
    """`[N, C]` with `[N]` (multiclass) or `[N, K]` with `[N, K]` (multilabel)."""
    n, c = shape
    if task == "binary":
        raise ValueError(
            f"task: 'binary' needs one score per row [N] or [N, 1], got logits {shape} from "
            f"{name}: two or more columns are multiclass (task='multiclass') or one score per "
            "label (task='multilabel')"
        )
    multi = y == shape if y is not None else task == "multilabel"
    if y is not None and y not in (shape, (n,)):
        raise ValueError(
            f"{name}: logits {shape} need labels [N] (class indices: multiclass) or [N, K] "
            f"(multi-hot: multilabel), got shape {y}"
        )
    if task == "multiclass" and multi:
        raise ValueError(
            f"task: 'multiclass' needs labels [N] (class indices), got labels {y} like the "
            f"logits {shape} from {name} (multi-hot: task='multilabel' or 'auto'; one-hot "
            "labels of one class each: labels.argmax(1))"
        )
    if task == "multilabel" and not multi:
        raise ValueError(
            f"task: 'multilabel' needs multi-hot labels [N, K] like the logits {shape}, got "
            f"labels {y} from {name} (class indices [N]: task='multiclass' or 'auto')"
        )
    return Kind("multilabel", 2, c) if multi else Kind("multiclass", c, c)


def _dense(
    shape: tuple[int, ...], y: tuple[int, ...] | None, task: str, name: str, class_dim: int | None
) -> Kind:
    """`[B, C, *S]` or `[B, *S, C]` with labels `[B, *S]`: multiclass at every position."""
    if task in ("binary", "multilabel"):
        raise ValueError(
            f"task: {task!r} takes scores [N] or [N, K], got logits {shape} from {name}: "
            "logits [B, C, *S] with labels [B, *S] are multiclass at every position "
            "(task='multiclass' or 'auto'); flatten them to rows to read them otherwise"
        )
    first = y is None or y[1:] == shape[2:]
    last = y is not None and y[1:] == shape[1:-1]
    if y is not None and len(y) != len(shape) - 1:
        first = last = False
    if class_dim is None and first and last:
        raise ValueError(
            f"class_dim: logits {shape} with labels {y} from {name} read both as [B, C, *S] "
            "and as [B, *S, C]; pass class_dim=1 (torch's layout) or class_dim=-1 (the classes "
            "last, a language model's [B, T, V])"
        )
    dim = class_dim if class_dim is not None else (1 if first else -1)
    if not (first if dim == 1 else last):
        layout = "[B, C, *S] with labels [B, *S]" if dim == 1 else "[B, *S, C] with [B, *S]"
        wanted = " (class_dim)" if class_dim is not None else ""
        raise ValueError(
            f"{name}: logits {shape} need labels [B, *S] (the logits without their class "
            f"dimension: {layout}{wanted}), got labels of shape {y}"
        )
    c = shape[dim]
    if c < 2:
        raise ValueError(
            f"{name}: dense logits {shape} have C = 1 class: one score per position is a "
            "binary scorer; pass its scores flattened, [N] with labels [N] (0 or 1)"
        )
    return Kind("dense", c, c, class_dim=dim)


def _ignored_class(ignore_index: int, width: int) -> str:
    return (
        f"ignore_index: {ignore_index} is a class of these labels (in [0, {width})), so its "
        f"labels would be left out; pass a value outside it (default {IGNORE_INDEX})"
    )


def rows_count(kind: Kind, shape: Sequence[int]) -> int:
    """R, the canonical rows of one model's logits of `shape` (`math.prod` of all but the
    class dimension; binary N)."""
    if kind.kind in ("binary", "multilabel"):
        return math.prod(shape)
    return math.prod(shape) // kind.width
